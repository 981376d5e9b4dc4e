"""Facts several consumers need, each defined and computed once.

The JSON report (:mod:`ppdiag.summary`), the rules (PP003 reads :class:`StageBalance`), the gate
and the terminal, Markdown and HTML reports all take these from here, so "the slowest stage" or "the
theoretical bubble" mean the same thing wherever they are shown.

* **Stage balance**: per stage, the mean per-step compute of its micro-batch blocks (forward,
  backward, weight-grad: the work a pipeline stage owns, optimizer and other compute left out;
  with DP replicas, the fastest replica's: what every replica of the stage pays),
  the slowest stage, its ratio to the mean stage, and whether that ratio makes it *the* slow stage
  (:data:`SLOW_STAGE_RATIO`, the one threshold).
* **Bubble**: the schedule's theoretical bubble from the simulator's closed forms, and the
  measured pipeline waits (bubble + imbalance) per step window.
* **Top kernels**: each rank's compute kernels with the most time per analyzed step
  (:func:`top_kernels`, the report's ``kernels[]`` that the HTML lists).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import GapTable
from ppdiag.model import Kind, Run
from ppdiag.model.intervals import union
from ppdiag.pipeline import Pipeline
from ppdiag.report_shares import report_slowest_stage as report_slowest_stage
from ppdiag.report_shares import share_of as share_of
from ppdiag.report_shares import step_share_text as step_share_text
from ppdiag.report_types import Kernel, RankKernels, StageRow

#: slowest / mean stage compute from which one stage counts as setting the pipeline's pace. Below
#: it the stages are within what step-to-step variation and uneven first/last layers give anyway.
SLOW_STAGE_RATIO = 1.08


@dataclass(frozen=True)
class StageBalance:
    """How evenly the compute is spread over the pipeline stages."""

    stage_ms: Mapping[int, float]
    """stage -> mean per-step compute in its micro-batch blocks (ms), stages with blocks only"""
    mean_ms: float | None
    """mean of ``stage_ms`` (None with fewer than 2 stages)"""
    heaviest: int | None
    """the stage with the most compute (None with fewer than 2 stages); ties: the lowest index"""
    ratio: float | None
    """``stage_ms[heaviest] / mean_ms`` (None with fewer than 2 stages or no compute)"""
    spread_ms: float | None
    """max - min of ``stage_ms``: what a perfect split would even out at most"""
    replica_ms: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    """stage -> {rank: its mean per-step block compute (ms)}: the spread across DP replicas"""

    @property
    def slowest(self) -> int | None:
        """The stage that sets the pace: ``heaviest`` when its ratio reaches
        :data:`SLOW_STAGE_RATIO`, else None (no stage stands out)."""
        if self.heaviest is None or self.ratio is None or self.ratio < SLOW_STAGE_RATIO:
            return None
        return self.heaviest


def balance_of(stage_ms: Mapping[int, float]) -> StageBalance:
    """The :class:`StageBalance` of per-stage compute values (any unit; ms by convention)."""
    vals = {int(s): float(v) for s, v in stage_ms.items()}
    if len(vals) < 2:
        return StageBalance(vals, None, None, None, None)
    arr = np.array(list(vals.values()), dtype=np.float64)
    mean = float(arr.mean())
    # max() keeps the first of equal values: the lowest stage index, as the dict is in stage order
    heaviest = max(sorted(vals), key=lambda s: vals[s])
    ratio = vals[heaviest] / mean if mean > 0 else None
    return StageBalance(vals, mean, heaviest, ratio, float(arr.max() - arr.min()))


def stage_block_ms(pipe: Pipeline) -> dict[int, float]:
    """Per stage: the mean over its ranks and steps of one step's micro-batch block compute (ms)."""
    stage_of = pipe.topology.stage_of
    out: dict[int, list[float]] = {}
    for r, b in pipe.blocks.items():
        if not len(b):
            continue
        st = stage_of.get(r, 0)
        # one sum per step: group the blocks by step with a sort, not a scan per step
        steps, inv = np.unique(b.step, return_inverse=True)
        sums = np.bincount(inv, weights=b.busy.astype(np.float64), minlength=steps.size)
        out.setdefault(st, []).extend((sums / 1e6).tolist())
    return {s: float(np.mean(v)) for s, v in sorted(out.items())}


def rank_block_ms(pipe: Pipeline) -> dict[int, dict[int, float]]:
    """Per stage, per rank of it (one per DP replica): the mean per-step compute of its blocks (ms)."""
    stage_of = pipe.topology.stage_of
    out: dict[int, dict[int, float]] = {}
    for r, b in pipe.blocks.items():
        if not len(b):
            continue
        steps, inv = np.unique(b.step, return_inverse=True)
        sums = np.bincount(inv, weights=b.busy.astype(np.float64), minlength=steps.size)
        out.setdefault(stage_of.get(r, 0), {})[r] = float(sums.mean()) / 1e6
    return {s: dict(sorted(v.items())) for s, v in sorted(out.items())}


def stage_balance(pipe: Pipeline) -> StageBalance:
    """The run's stage balance (empty without pipeline parallelism).

    With DP replicas of the pipeline a stage costs what every replica of it pays: its fastest rank.
    One slow worker among fast stage peers is then not a bad split (that is PP009's straggler, a
    node to inspect), while a stage slow in every replica keeps its excess.
    """
    if pipe.topology.pp <= 1:
        return balance_of({})
    per_rank = rank_block_ms(pipe)
    replicated = bool(per_rank) and min(len(v) for v in per_rank.values()) > 1
    if not replicated:
        bal = balance_of(stage_block_ms(pipe))
    else:
        bal = balance_of({s: min(v.values()) for s, v in per_rank.items()})
    return StageBalance(bal.stage_ms, bal.mean_ms, bal.heaviest, bal.ratio, bal.spread_ms, per_rank)


def theoretical_bubble(schedule: str, pp: int, microbatches: int | None, virtual: int) -> float | None:
    """The schedule's bubble ratio with equal stages and free communication (the simulator's closed
    forms), or None when there is no pipeline, M is unknown or the schedule has no closed form."""
    if pp <= 1 or not microbatches:
        return None
    from ppdiag.simulate import closed_form_bubble
    from ppdiag.simulate.schedules import canonical_schedule

    # looped BFS runs each chunk's forwards for all micro-batches before its backwards: its ramp
    # is interleaved 1F1B's, (P-1)/(vM+P-1)
    name = "interleaved_1f1b" if schedule == "looped_bfs" else schedule
    try:
        return float(closed_form_bubble(canonical_schedule(name), pp, microbatches, virtual))
    except ValueError:
        return None  # "unknown", "none": no schedule to take a closed form of


def measured_bubble(waits_ns: Iterable[float], windows_ns: Iterable[float]) -> float | None:
    """Mean over (rank, step) windows of the pipeline waits (bubble + imbalance) / window."""
    w = np.fromiter(waits_ns, dtype=np.float64)
    d = np.fromiter(windows_ns, dtype=np.float64)
    if w.size == 0:
        return None
    ratio = np.divide(w, d, out=np.zeros_like(w), where=d > 0)
    return float(ratio.mean())


def report_stage_values(stages: Sequence[StageRow]) -> list[float] | None:
    """The per-stage compute that decides the slowest stage of a report, one value per row:
    ``block_ms`` (:func:`stage_block_ms`, the measure PP003 and the gate use); for a report written
    before it existed, ``compute_ms`` or the sum of the F/B/W means. None when a stage has none."""
    if stages and all(s.block_ms is not None for s in stages):
        return [float(s.block_ms or 0.0) for s in stages]
    vals: list[float] = []
    for s in stages:
        v = s.compute_ms
        if v is None:
            parts = [d.mean for d in (s.fwd_ms, s.bwd_ms, s.wgrad_ms) if d is not None]
            if not parts:
                return None
            v = sum(parts)
        vals.append(v)
    return vals


#: How many kernels :func:`top_kernels` keeps per rank.
TOP_KERNELS = 6


def step_spans(windows: Iterable[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The analyzed steps on the common clock, in step order: per step index the union over the
    ranks of their ``(index, start, end)`` windows (empty steps left out)."""
    by: dict[int, tuple[int, int]] = {}
    for i, a, b in windows:
        lo, hi = by.get(i, (int(a), int(b)))
        by[i] = (min(lo, int(a)), max(hi, int(b)))
    return [by[k] for k in sorted(by) if by[k][1] > by[k][0]]


def whole_span(run: Run, gaps: Mapping[int, GapTable]) -> tuple[int, int] | None:
    """The run's captured window on the common clock (its intervals and gaps), for a run with no
    step markers; None when it holds nothing."""
    lo: int | None = None
    hi: int | None = None
    for rt in run.ranks:
        if len(rt.intervals):
            a, b = (
                int(rt.intervals.start.min()) + rt.clock_offset_ns,
                int(rt.intervals.end.max()) + rt.clock_offset_ns,
            )
            lo, hi = (a, b) if lo is None or hi is None else (min(lo, a), max(hi, b))
    for g in gaps.values():
        if len(g):
            a, b = int(g.start.min()), int(g.end.max())
            lo, hi = (a, b) if lo is None or hi is None else (min(lo, a), max(hi, b))
    return None if lo is None or hi is None or hi <= lo else (lo, hi)


def starts_inside(st: npt.NDArray[np.int64], spans: Sequence[tuple[int, int]]) -> npt.NDArray[np.bool_]:
    """Which times ``st`` lie in some ``[a, b)`` of ``spans``."""
    # inside some span is inside their union: one binary search per time, not one pass of every
    # time per span (128 steps x 430 k kernels x 4 ranks cost 0.3 s)
    u_start, u_end = union([a for a, _ in spans], [b for _, b in spans])
    if not u_start.size:
        return np.zeros(len(st), dtype=bool)
    j = np.searchsorted(u_start, st, side="right") - 1
    inside: npt.NDArray[np.bool_] = (j >= 0) & (st < u_end[np.clip(j, 0, None)])
    return inside


def top_kernels(run: Run, spans: Sequence[tuple[int, int]], k: int = TOP_KERNELS) -> list[RankKernels]:
    """Each rank's compute kernels with the most time per step, over the compute intervals that
    start inside ``spans`` (:func:`step_spans`, or :func:`whole_span` without steps); ranks with
    none are left out."""
    out: list[RankKernels] = []
    if not spans:
        return out
    for rt in run.ranks:
        iv = rt.intervals
        if len(iv) == 0:
            continue
        st, en = iv.start + rt.clock_offset_ns, iv.end + rt.clock_offset_ns
        m = (iv.kind == int(Kind.COMPUTE)) & starts_inside(st, spans)
        if not m.any():
            continue
        tot = np.bincount(iv.name[m], weights=(en[m] - st[m]).astype(np.float64), minlength=len(rt.names))
        cnt = np.bincount(iv.name[m], minlength=len(rt.names))
        all_t = float(tot.sum())
        n = len(spans)
        top = [
            Kernel(rt.name_of(int(i)), float(tot[i] / 1e6 / n), float(tot[i] / all_t), float(cnt[i] / n))
            for i in np.argsort(-tot)[:k]
            if tot[i] > 0
        ]
        out.append(RankKernels(rt.rank, top))
    return out
