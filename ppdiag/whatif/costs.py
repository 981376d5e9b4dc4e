"""Measured costs the what-if predictions start from.

:class:`MeasuredRun` — what one step of the analyzed run is made of: the mean forward, backward and
weight-gradient cost of one micro-batch on every (virtual) stage, the normal p2p latency, what
each pipeline rank does before its first block and after its last one, and the measured step time
with the lost time that single-cause removals would win back. The model as a sequence of layers
(to re-cut the stages) is :mod:`ppdiag.whatif.layers`.

Costs are ns per micro-batch at the measured micro-batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.limits import MAX_SIM_CELLS
from ppdiag.model import Phase
from ppdiag.model import intervals as ivs
from ppdiag.pipeline.blocks import Blocks
from ppdiag.report_types import Report
from ppdiag.whatif.replicas import rebalance_gain_ns

F64 = npt.NDArray[np.float64]

MS = 1e6


@dataclass
class MeasuredRun:
    """The analyzed run, reduced to what the schedule simulator needs (times in ns).

    ``fwd_ns`` / ``bwd_ns`` / ``wgrad_ns`` hold one value per virtual stage in model order; with
    ``split_backward`` the backward was measured as separate input-gradient (``bwd_ns``) and
    weight-gradient (``wgrad_ns``) blocks, else ``bwd_ns`` is the whole backward and ``wgrad_ns``
    is zero. ``head_ns`` is the time from the step start to the first block on the first stage;
    ``tail_idle_ns`` / ``tail_busy_ns`` (one per pipeline rank) the idle and compute time after each
    rank's last block (optimizer, step-end collectives). Only the idle all ranks share
    (:attr:`end_ns`) is a cost of its own: the rest is waiting for slower ranks, which the simulator
    produces by itself for every schedule. ``removable_ns`` is the step time that
    removing one cause alone would win back (``comm_wait``, ``host``; ``exposed_comm``: overlapping
    the transfers on top of removing the late ones), from the replay.
    """

    schedule: str
    detected_schedule: str
    pp: int
    virtual: int
    microbatches: int
    fwd_ns: F64
    bwd_ns: F64
    wgrad_ns: F64
    split_backward: bool
    p2p_ns: float
    head_ns: float
    tail_idle_ns: F64
    tail_busy_ns: F64
    step_ns: float
    lost_ms: dict[str, float] = field(default_factory=dict)
    removable_ns: dict[str, float] = field(default_factory=dict)
    bubble_ratio: float | None = None
    from_trace: bool = True
    notes: list[str] = field(default_factory=list)
    # MiB of activations one micro-batch leaves on each virtual stage, from the allocator events
    # (the report's memory[] rows); None when the trace has none
    act_mb: F64 | None = None
    # step time (ns) evening out each replica's own stages wins (ppdiag/whatif/replicas.py); None
    # when the run's shape does not allow laying its blocks out again
    rebalance_gain_ns: float | None = None

    @property
    def stages(self) -> int:
        return self.pp * self.virtual

    @property
    def end_ns(self) -> float:
        """Step-end time every rank spends idle after its last block and optimizer (a final
        collective's transfer, the host noticing the end)."""
        return float(self.tail_idle_ns.min()) if self.tail_idle_ns.size else 0.0

    def stage_total_ns(self) -> F64:
        """Compute of one micro-batch on every virtual stage (forward + whole backward)."""
        return self.fwd_ns + self.bwd_ns + self.wgrad_ns

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "detected_schedule": self.detected_schedule,
            "pp": self.pp,
            "virtual": self.virtual,
            "microbatches": self.microbatches,
            "step_ms": round(self.step_ns / MS, 4),
            "fwd_ms": [round(float(x) / MS, 4) for x in self.fwd_ns],
            "bwd_ms": [round(float(x) / MS, 4) for x in self.bwd_ns],
            "wgrad_ms": [round(float(x) / MS, 4) for x in self.wgrad_ns] if self.split_backward else None,
            "p2p_ms": round(self.p2p_ns / MS, 4),
            "head_ms": round(self.head_ns / MS, 4),
            "tail_ms": [
                round(float(a + b) / MS, 4) for a, b in zip(self.tail_idle_ns, self.tail_busy_ns, strict=True)
            ],
            "from_trace": self.from_trace,
        }


def sim_schedule(name: str | None, virtual: int) -> tuple[str, str | None]:
    """The simulator schedule for a detected schedule name, and a note when it is a stand-in."""
    from ppdiag.model.schedule import SIMULATED_AS, SIMULATED_NOTE, parse_schedule
    from ppdiag.simulate import SCHEDULES

    n = (name or "unknown").lower()
    try:
        s = parse_schedule(n)
    except ValueError:
        s = None
    if s is not None and s.value in SCHEDULES:
        return s.value, None
    if s is not None and s in SIMULATED_AS:
        return SIMULATED_AS[s].value, SIMULATED_NOTE[s]
    fallback = "interleaved_1f1b" if virtual > 1 else "1f1b"
    return fallback, f"schedule {n!r} could not be identified; simulated as {fallback}"


def _per_stage_mean(b_all: list[Blocks], phase: int, n_st: int) -> tuple[F64, npt.NDArray[np.int64]]:
    tot = np.zeros(n_st)
    cnt = np.zeros(n_st, dtype=np.int64)
    for b in b_all:
        m = (b.phase == phase) & (b.stage >= 0) & (b.stage < n_st)
        if m.any():
            np.add.at(tot, b.stage[m], b.busy[m].astype(np.float64))
            np.add.at(cnt, b.stage[m], 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)
    return mean, cnt


def _check_coverage(seen: int, n_st: int) -> None:
    """The trace must show most of the pipeline: the costs of the stages it does not show are the
    mean of those it does, a guess that decides the prediction once they are the majority. This
    also bounds the work by the trace: a process group that lists thousands of ranks of which a
    few were traced is not simulated at the listed size."""
    if 2 * seen < n_st:
        raise InputError(
            None,
            f"only {seen} of the {n_st} pipeline stages have traced blocks: the costs of the other "
            f"{n_st - seen} are unknown; trace at least half of the stages, or give the pipeline's size "
            "(--pp, --stage-map) when its process group lists more ranks than it has",
        )


def _stage_list(stages: npt.NDArray[np.intp]) -> str:
    """Stage numbers for a note; a long list is cut (its length bounded by the note, not the run)."""
    head = ", ".join(map(str, stages[:8].tolist()))
    return head if len(stages) <= 8 else f"{head}, ... ({len(stages)} stages)"


def _fill(vals: F64, what: str, notes: list[str]) -> F64:
    missing = ~np.isfinite(vals)
    if missing.all():
        return np.zeros_like(vals)
    if missing.any():
        notes.append(
            f"no {what} blocks seen on stage(s) {_stage_list(np.flatnonzero(missing))}; "
            "the mean of the other stages is used"
        )
        vals = np.where(missing, float(np.nanmean(vals)), vals)
    return vals


def _mean_step_ms(report: Report) -> float:
    """The mean step (the one denominator of the report, the step its causes add up to);
    InputError when the run has no complete step."""
    step_ms = report.summary.step_mean_ms or report.summary.step_ms
    if not step_ms:
        raise InputError(
            None,
            "the run has no complete step: the step time the predictions are calibrated against is unknown",
        )
    return float(step_ms)


def measure(report: Report, pipe: Any, attr: Any, rank_steps: Sequence[Any]) -> MeasuredRun:
    """Reduce an analyzed run to a :class:`MeasuredRun`; InputError when it has no usable pipeline."""
    topo = pipe.topology
    if topo.pp <= 1:
        raise InputError(
            None,
            "the run has no pipeline parallelism (pp = 1): nothing to predict; "
            "pass --stage-map or --run-pp if the traces do not show the stages",
        )
    n_st = topo.pp * topo.virtual
    blocks = [b for b in pipe.blocks.values() if b is not None and len(b)]
    if not blocks:
        raise InputError(
            None,
            "no micro-batch compute blocks were found in the traces; the per-stage "
            "costs the predictions need are unknown",
        )
    notes: list[str] = []
    m = pipe.microbatches
    if not m:
        raise InputError(None, "the number of micro-batches per step is unknown; pass --run-microbatches")
    sched, note = sim_schedule(pipe.schedule, topo.virtual)
    if note:
        notes.append(note)
    if n_st * int(m) > MAX_SIM_CELLS:
        raise InputError(
            None,
            f"P x M x v = {n_st * int(m)} is above the simulated maximum {MAX_SIM_CELLS}; "
            "the measured pipeline is too large to simulate",
        )
    fwd, fcnt = _per_stage_mean(blocks, int(Phase.FWD), n_st)
    bwd, bcnt = _per_stage_mean(blocks, int(Phase.BWD), n_st)
    _check_coverage(int(((fcnt > 0) | (bcnt > 0)).sum()), n_st)
    wgr, wcnt = _per_stage_mean(blocks, int(Phase.WGRAD), n_st)
    split = bool(wcnt.sum() > 0)
    fwd = _fill(fwd, "forward", notes)
    bwd = _fill(bwd, "backward", notes)
    wgr = _fill(wgr, "weight-gradient", notes) if split else np.zeros(n_st)
    if split and sched not in ("zero_bubble", "zbv", "dualpipev"):
        # W blocks seen but the schedule runs B: fold them into the backward
        bwd, wgr, split = bwd + wgr, np.zeros(n_st), False
    if not split and sched in ("zero_bubble", "zbv", "dualpipev"):
        notes.append("no separate weight-gradient blocks seen; half of each backward is taken as W")
        wgr = bwd * 0.5
        bwd = bwd - wgr
        split = True

    head_ns, ti, tb = _edges(topo, rank_steps)
    step_ms = _mean_step_ms(report)
    lost = dict(report.summary.lost_ms)
    lat = float(getattr(attr, "normal_latency_ns", 0) or 0)
    removable = _removable(getattr(attr, "step_replay_ns", {}) or {}, lost)
    return MeasuredRun(
        schedule=sched,
        detected_schedule=str(pipe.schedule),
        pp=topo.pp,
        virtual=topo.virtual,
        microbatches=int(m),
        fwd_ns=fwd,
        bwd_ns=bwd,
        wgrad_ns=wgr,
        split_backward=split,
        p2p_ns=lat,
        head_ns=head_ns,
        tail_idle_ns=ti,
        tail_busy_ns=tb,
        step_ns=float(step_ms) * MS,
        lost_ms=lost,
        removable_ns=removable,
        bubble_ratio=report.bubble.measured_ratio,
        notes=notes,
        act_mb=_measured_activation(report, topo, n_st, notes),
        rebalance_gain_ns=rebalance_gain_ns(
            pipe, sched, int(m), float(getattr(attr, "normal_latency_ns", 0) or 0)
        ),
    )


def _measured_activation(report: Report, topo: Any, n_st: int, notes: list[str]) -> F64 | None:
    """Activation MiB per micro-batch of every virtual stage from the ranks' allocator events: the
    median over the ranks that hold the stage (replicas); a stage without events takes the mean of
    the others. None without any measured value."""
    per: list[list[float]] = [[] for _ in range(n_st)]
    for row in report.memory or []:
        act = row.activation_per_mb_mb
        if act is None or not act > 0:
            continue
        for st in topo.chunks_of.get(row.rank, []):
            if 0 <= st < n_st:
                per[st].append(float(act))
    vals = np.array([float(np.median(x)) if x else np.nan for x in per])
    if not np.isfinite(vals).any():
        return None
    missing = ~np.isfinite(vals)
    if missing.any():
        notes.append(
            f"no allocator events on stage(s) {_stage_list(np.flatnonzero(missing))}; their activation "
            "memory is the mean of the other stages'"
        )
        vals = np.where(missing, float(np.nanmean(vals)), vals)
    return vals


def _edges(topo: Any, rank_steps: Sequence[Any]) -> tuple[float, F64, F64]:
    """What pipeline ranks do outside their blocks (ns, mean per step): the first rank's time
    before its first block, and per pipeline position the idle and the busy time after its last."""
    pos_of = {r: i for line in topo.pipelines for i, r in enumerate(line)}
    head: list[float] = []
    tail_idle: list[list[float]] = [[] for _ in range(topo.pp)]
    tail_busy: list[list[float]] = [[] for _ in range(topo.pp)]
    for rs in rank_steps:
        b = rs.blocks
        pos = pos_of.get(rs.rank)
        if pos is None or pos >= topo.pp or b is None or not len(b):
            continue
        first, last = int(b.start.min()), int(b.end.max())
        if pos == 0:
            head.append(float(max(first - rs.w0, 0)))
        busy = ivs.measure(ivs.clip(rs.sets.compute, last, rs.w1)) if rs.w1 > last else 0
        tail_busy[pos].append(float(busy))
        tail_idle[pos].append(float(max(rs.w1 - last - busy, 0)))
    ti = np.array([float(np.mean(x)) if x else 0.0 for x in tail_idle])
    tb = np.array([float(np.mean(x)) if x else 0.0 for x in tail_busy])
    return (float(np.mean(head)) if head else 0.0), ti, tb


def _removable(rp: dict[str, float], lost_ms: dict[str, float]) -> dict[str, float]:
    """Step time (ns) the replay says removing each cause wins back (the calibration targets of the
    no_comm_wait, no_host and no_exposed_comm fixes); empty when the replay did not run.

    Each is at most the cause's own mean lost time (``lost_ms``): the replay removes every wait
    inside a collective with its transfer, while the accounting books the wait for a late member
    under that member's cause, which no overlap of the transfer removes."""
    removable: dict[str, float] = {}
    if "measured" in rp:
        for cause, var in (("comm_wait", "gain_comm_wait"), ("host", "gain_host")):
            if var in rp:
                removable[cause] = max(float(rp["measured"] - rp[var]), 0.0)
        if "gain_comm" in rp and "gain_comm_wait" in rp:
            # overlapping the transfers as well as removing the late ones, minus the late ones alone
            removable["exposed_comm"] = max(float(rp["gain_comm_wait"] - rp["gain_comm"]), 0.0)
    return {c: min(v, float(lost_ms.get(c, 0.0)) * MS) for c, v in removable.items()}


def measure_diagnosis(diag: Any) -> MeasuredRun:
    """:func:`measure` on a :class:`ppdiag.diagnosis.Diagnosis`."""
    ctx = diag.context  # an AnalysisContext (reports layer, above this one: not named here)
    if ctx is None or ctx.pipeline is None:
        raise InputError(None, "the analysis kept no pipeline model")
    return measure(diag.result, ctx.pipeline, ctx.attribution, ctx.rank_steps)


# ---- per-block (layer) costs ---------------------------------------------------------------


__all__ = ["MS", "MeasuredRun", "measure", "measure_diagnosis", "sim_schedule"]
