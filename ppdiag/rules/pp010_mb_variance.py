"""PP010: micro-batch cost variance: the pipeline and the DP collectives wait for the longest block."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.model import Phase
from ppdiag.pipeline.blocks import Blocks
from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, finding, r3
from ppdiag.rules.block_replay import ReplayPlan

F64 = npt.NDArray[np.float64]
# within-rank coefficient of variation of block costs beyond which a stage's micro-batches vary
# by more than timer noise (timers and kernels repeat to 1-2 % for the same work)
CV_MIN = 0.05
_PHASES = (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD))


# replays of the measured blocks, the replay plan and slow-worker gains, shared by PP009 and PP010
# within one analysis, by the pipeline's identity (a frozen dataclass hashes by its fields, which
# hold dicts, so it cannot key a WeakKeyDictionary: that cache never shared anything); an entry
# goes with its pipeline
_CACHE: dict[int, dict[Any, Any]] = {}


def _cached(ctx: RuleContext) -> dict[Any, Any]:
    key = id(ctx.pipeline)
    if key not in _CACHE:
        try:
            weakref.finalize(ctx.pipeline, _CACHE.pop, key, None)
        except TypeError:  # an object without weak references: no sharing
            return {}
        _CACHE[key] = {}
    return _CACHE[key]


def _plan(
    ctx: RuleContext, blocks: dict[int, Blocks], lines: Sequence[Sequence[int]], last: int
) -> ReplayPlan:
    """The replay plan of ``lines`` (built once per analysis: every replay reuses it)."""
    c = _cached(ctx)
    key = ("plan", tuple(tuple(line) for line in lines), last)
    if key not in c:
        c[key] = ReplayPlan(lines, blocks, last)
    plan: ReplayPlan = c[key]
    return plan


def _measured_replays(
    ctx: RuleContext, blocks: dict[int, Blocks], lines: Sequence[Sequence[int]], last: int
) -> dict[int, float]:
    """Per step index: the replayed step time (ns) of the measured block costs."""
    c = _cached(ctx)
    if "measured" not in c:
        measured = {r: b.busy.astype(np.float64) for r, b in blocks.items()}
        c["measured"] = _plan(ctx, blocks, lines, last).run(measured)
    out: dict[int, float] = c["measured"]
    return out


class StageSpread(msgspec.Struct, frozen=True):
    """One stage's spread of block costs, of the phase that varies most within a rank."""

    cv: float
    cv_within_rank: float
    cv_across_ranks: float
    phase: str  # forward / backward / wgrad


class WorstMicrobatch(msgspec.Struct, frozen=True):
    """A micro-batch slow on every stage: its mean cost over the mean (``worst_microbatches[]``)."""

    step_index: int
    pipeline: int
    mb: int
    cost_vs_mean: float


class MicrobatchVarianceEvidence(Evidence, frozen=True):
    """PP010's evidence: the spread per stage, what it follows, and the replay's gain."""

    per_stage: dict[str, StageSpread]
    follows: str  # "micro-batch (data)" or "rank (hardware)"
    microbatch_share: float  # of the within-rank variation the micro-batch means explain
    worst_microbatches: list[WorstMicrobatch]
    cv_threshold: float
    replay_gain_ms: float
    explained_by_slow_workers_ms: float  # PP009's part, not counted twice


class MicrobatchVarianceRule:
    """What it detects:
    Block costs of one stage vary from micro-batch to micro-batch (and replica to replica) far
    beyond timer noise: the same stage's forward or backward takes much longer for some
    micro-batches than for others, typically variable sequence lengths. Every stage waits for the
    longest micro-batch each time it is its turn, and the DP collectives wait for the replica that
    drew the longest ones. The evidence gives the coefficient of variation (CV) per stage, split
    into the part within each rank (follows the micro-batch: data) and the part between the ranks
    of the stage (follows the rank: hardware, PP009's), the worst micro-batches, and whether the
    variation follows the micro-batch (the same micro-batch slow on every stage of its pipeline).

    Why it matters:
    A pipeline is as fast as its slowest block at every hand-off: the variance turns into waiting
    on the other stages and in the data-parallel collectives, growing with the spread, not the mean.

    How to fix:
    Sequence packing (concatenate samples up to the context length); length-grouped or
    token-balanced micro-batches (sort or bin samples by length before forming micro-batches); a
    fixed token budget per micro-batch instead of a fixed sample count.

    Example:
    4 stages x 2 replicas, M=8, forward 2 ms and backward 4 ms per micro-batch on average, with a
    CV of 0.3 from micro-batch to micro-batch (the same micro-batch slow on every stage of its
    pipeline): the step takes 88.4 ms where every block at its stage's mean cost would take 70.0 ms.
    PP010 reports CV 0.28 within the ranks, following the micro-batch, gain 18.5 ms per step (the
    replay with every block at its stage's mean cost, less what a slow worker (PP009) explains).
    """

    code = "PP010"
    name = "microbatch-variance"
    cause = Cause.IMBALANCE
    summary = "Micro-batch cost variance (e.g. sequence lengths): the pipe waits for the longest block."
    evidence = MicrobatchVarianceEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        topo = ctx.pipeline.topology
        if topo.pp <= 1 or not ctx.step_ms:
            return []
        blocks = {r: b for r, b in ctx.pipeline.blocks.items() if len(b)}
        if not blocks:
            return []
        per_stage, worst_cv = _stage_spread(blocks, topo.stage_of)
        if not per_stage or worst_cv < CV_MIN:
            return []
        # the replay: measured costs vs every block at its stage's mean for its phase; the part a
        # slow worker explains (PP009's gain, replayed the same way) is not counted twice
        lines = [line for line in topo.pipelines if any(r in blocks for r in line)]
        gains = _replay_gains_ns(ctx, blocks, lines, topo.pp * topo.virtual - 1, _stage_mean_costs(blocks))
        if not gains:
            return []
        slow = slow_workers(ctx)
        explained = (slow_worker_gain_ms(ctx, sorted(slow)) or 0.0) if slow else 0.0
        gain = max(float(np.mean(gains)) / 1e6 - explained, 0.0)
        if 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        follows, share, worst_mb = _follows(blocks, lines)
        stages = sorted(s for s, d in per_stage.items() if d["cv_within_rank"] >= CV_MIN)
        title = (
            f"micro-batch cost variance: block costs vary by CV {worst_cv:.2f} within a rank "
            f"(stage(s) {', '.join(map(str, stages))}), following the {follows}; the pipeline waits "
            "for the longest micro-batches"
        )
        evidence = MicrobatchVarianceEvidence(
            per_stage=_per_stage_evidence(per_stage),
            follows=follows,
            microbatch_share=r3(share),
            worst_microbatches=worst_mb,
            cv_threshold=CV_MIN,
            replay_gain_ms=r3(gain + explained),
            explained_by_slow_workers_ms=r3(explained),
        )
        fixes = [
            "pack sequences (samples concatenated up to the context length): the same tokens per micro-batch",
            "form length-grouped or token-balanced micro-batches (bin samples by length before batching)",
            "use a fixed token budget per micro-batch instead of a fixed number of samples",
        ]
        if follows != "micro-batch (data)":
            fixes.append("the variation follows the rank: compare the ranks' clocks and thermals (PP009)")
        return [finding(ctx, self.code, self.cause, title, gain, evidence, fixes, stages=stages)]


def _per_stage_evidence(per_stage: dict[int, dict[str, float]]) -> dict[str, StageSpread]:
    return {
        str(s): StageSpread(
            cv=r3(d["cv"]),
            cv_within_rank=r3(d["cv_within_rank"]),
            cv_across_ranks=r3(d["cv_across_ranks"]),
            phase=Phase(int(d["phase"])).name.lower(),
        )
        for s, d in sorted(per_stage.items())
    }


def _stage_spread(
    blocks: dict[int, Blocks], stage_of: Mapping[int, int]
) -> tuple[dict[int, dict[str, float]], float]:
    """Per stage, the coefficient of variation of its block costs (of the phase that varies most
    within a rank): overall, within each rank (normalised by the rank's mean for the phase) and
    of the rank means (what follows the rank); and the worst within-rank CV of the run."""
    by_stage: dict[tuple[int, int], list[F64]] = {}
    for r, b in blocks.items():
        for ph in _PHASES:
            m = (b.phase == ph) & (b.mb >= 0)
            if int(m.sum()) >= 2:
                by_stage.setdefault((stage_of.get(r, 0), ph), []).append(b.busy[m].astype(np.float64))
    per_stage: dict[int, dict[str, float]] = {}
    worst_cv = 0.0
    for (s, ph), parts in sorted(by_stage.items()):
        allc = np.concatenate(parts)
        mean = float(allc.mean())
        if mean <= 0:
            continue
        within = np.concatenate([c / c.mean() - 1.0 for c in parts if c.mean() > 0])
        rank_means = np.array([c.mean() for c in parts]) / mean
        cv_w = float(within.std())
        d = per_stage.setdefault(s, {"cv": 0.0, "cv_within_rank": 0.0, "cv_across_ranks": 0.0})
        if cv_w >= d["cv_within_rank"]:
            d.update(
                cv=float(allc.std() / mean),
                cv_within_rank=cv_w,
                cv_across_ranks=float(rank_means.std()),
                phase=float(ph),
            )
        worst_cv = max(worst_cv, cv_w)
    return per_stage, worst_cv


def _stage_mean_costs(blocks: dict[int, Blocks]) -> dict[int, F64]:
    """Every block's cost replaced by the mean cost of its (stage, phase) over the run."""
    sums: dict[tuple[int, int], list[float]] = {}
    for b in blocks.values():
        for ph in _PHASES:
            m = b.phase == ph
            for st in np.unique(b.stage[m]):
                c = b.busy[m & (b.stage == st)]
                acc = sums.setdefault((int(st), ph), [0.0, 0.0])
                acc[0] += float(c.sum())
                acc[1] += float(c.size)
    flat = {}
    for r, b in blocks.items():
        v = b.busy.astype(np.float64)
        for (st, ph), (tot, n) in sums.items():
            m = (b.phase == ph) & (b.stage == st)
            if m.any():
                v[m] = tot / n
        flat[r] = v
    return flat


def _replay_gains_ns(
    ctx: RuleContext,
    blocks: dict[int, Blocks],
    lines: list[list[int]],
    last: int,
    costs: dict[int, F64],
) -> list[float]:
    """Per analyzed step: the measured replay's step time minus the replay with ``costs`` (ns),
    for the steps where both replays finished."""
    steps = np.unique(np.concatenate([b.step for b in blocks.values()]))
    base = _measured_replays(ctx, blocks, lines, last)
    fixed = _plan(ctx, blocks, lines, last).run(costs)
    out: list[float] = []
    for st in steps:
        a = base[int(st)]
        f = fixed[int(st)]
        if np.isfinite(a) and np.isfinite(f):
            out.append(float(a - f))
    return out


def _follows(
    blocks: dict[int, Blocks], lines: Sequence[Sequence[int]]
) -> tuple[str, float, list[WorstMicrobatch]]:
    """Whether the within-rank variation follows the micro-batch: the share of it that the
    (step, pipeline, micro-batch) means explain (the same micro-batch slow on every stage), and
    the worst micro-batches by that mean."""
    keys, vals = [], []
    for pi, line in enumerate(lines):
        for r in line:
            b = blocks.get(r)
            if b is None:
                continue
            for ph in _PHASES:
                m = (b.phase == ph) & (b.mb >= 0)
                if int(m.sum()) < 2:
                    continue
                c = b.busy[m].astype(np.float64)
                keys.append(
                    np.stack([b.step[m].astype(np.int64), np.full(c.size, pi), b.mb[m].astype(np.int64)], 1)
                )
                vals.append(c / c.mean() - 1.0)
    if not vals:
        return "rank (hardware)", 0.0, []
    k = np.concatenate(keys)
    v = np.concatenate(vals)
    uk, inv, cnt = _unique_rows(k)
    gmean = np.bincount(inv, weights=v) / cnt
    total = float((v**2).sum())
    share = float((gmean[inv] ** 2).sum() / total) if total > 0 else 0.0
    order = np.argsort(-gmean)[:5]
    worst = [
        WorstMicrobatch(
            step_index=int(uk[i, 0]),
            pipeline=int(uk[i, 1]),
            mb=int(uk[i, 2]),
            cost_vs_mean=r3(1.0 + float(gmean[i])),
        )
        for i in order
    ]
    return ("micro-batch (data)" if share >= 0.5 else "rank (hardware)"), share, worst


def _unique_rows(
    k: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``np.unique(k, axis=0, return_inverse=True, return_counts=True)`` for rows of non-negative
    integers: one int64 code per row in the same lexicographic order (a row-wise unique sorts a
    structured view, several times slower); the row-wise unique where the codes would overflow."""
    span = k.max(axis=0) + 1 if k.size else np.ones(k.shape[1], np.int64)
    if k.size == 0 or int(k.min()) < 0 or float(np.prod(span.astype(np.float64))) >= 2.0**62:
        uk, inv, cnt = np.unique(k, axis=0, return_inverse=True, return_counts=True)
        return uk, inv.ravel(), cnt
    code = np.zeros(k.shape[0], np.int64)
    for j in range(k.shape[1]):
        code = code * span[j] + k[:, j]
    _, first, inv, cnt = np.unique(code, return_index=True, return_inverse=True, return_counts=True)
    return k[first], inv.ravel(), cnt


def rank_step_ms(blocks: dict[int, Blocks]) -> dict[int, F64]:
    """Per rank: its block compute per step (ns), one value per step it has blocks in."""
    out: dict[int, F64] = {}
    for r, b in blocks.items():
        if not len(b):
            continue
        _, inv = np.unique(b.step, return_inverse=True)
        out[r] = np.bincount(inv.ravel(), weights=b.busy.astype(np.float64)).astype(np.float64)
    return out


# a rank counts as a slow worker from this excess over its stage peers, at least (and from 4
# standard errors of the peers' spread: micro-batch variance alone moves whole replicas)
SLOW_WORKER_MIN = 0.03


def slow_workers(ctx: RuleContext) -> dict[int, float]:
    """Ranks whose block compute per step is well above the same stage in the other DP replicas:
    ``{rank: excess}`` (0.3 = 30 % above the peers' median). Empty without replicated pipelines."""
    topo = ctx.pipeline.topology
    if topo.pp <= 1 or len(topo.pipelines) < 2:
        return {}
    c = _cached(ctx)
    if "slow" not in c:  # PP009 and PP010 both ask
        c["slow"] = _slow_workers(ctx)
    out: dict[int, float] = c["slow"]
    return out


def _slow_workers(ctx: RuleContext) -> dict[int, float]:
    topo = ctx.pipeline.topology
    per = rank_step_ms({r: b for r, b in ctx.pipeline.blocks.items() if len(b)})
    by_stage: dict[int, list[int]] = {}
    for r in per:
        by_stage.setdefault(topo.stage_of.get(r, 0), []).append(r)
    out: dict[int, float] = {}
    for ranks in by_stage.values():
        if len(ranks) < 2:
            continue
        means = np.array([per[r].mean() for r in ranks], dtype=np.float64)
        n_steps = np.array([per[r].size for r in ranks], dtype=np.float64)
        stds = np.array([per[r].std() for r in ranks], dtype=np.float64)
        # each rank against the others of its stage: their median and spread, all at once
        ref, others_std = _leave_one_out(means)
        ok = ref > 0
        safe = np.where(ok, ref, 1.0)
        se_r = stds / np.maximum(np.sqrt(n_steps), 1.0) / safe
        spread = others_std / safe if len(ranks) > 2 else se_r * np.sqrt(2.0)
        excess = means / safe - 1.0
        hit = ok & (excess > np.maximum(np.maximum(SLOW_WORKER_MIN, 4.0 * spread), 4.0 * se_r))
        out.update((ranks[i], float(excess[i])) for i in np.flatnonzero(hit))
    return out


def _leave_one_out(x: F64) -> tuple[F64, F64]:
    """For each value of ``x`` (at least 2): the median and the standard deviation of the other
    values, in O(n log n), where one median per value over the others was quadratic.

    The median: ``x`` sorted once; without the value at sorted position ``p``, the others' ``j``-th
    smallest is ``sorted[j]`` below ``p`` and ``sorted[j + 1]`` from it (tied values leave the same
    others whichever copy goes). The spread: the sum of squared deviations of all, less the one
    value's share (the update of Welford's method run backwards), never below 0."""
    n = x.size
    order = np.argsort(x, kind="stable")
    s = x[order]
    pos = np.empty(n, dtype=np.intp)
    pos[order] = np.arange(n)

    def kth(j: int) -> F64:
        """The j-th smallest of the others, for every value."""
        out: F64 = np.where(j < pos, s[j], s[min(j + 1, n - 1)])
        return out

    m = n - 1  # how many others
    median = kth(m // 2) if m % 2 else (kth(m // 2 - 1) + kth(m // 2)) / 2
    mean = x.mean()
    m2 = float(np.square(x - mean).sum())
    mean_others = (mean * n - x) / m
    var = np.maximum(m2 - (x - mean) * (x - mean_others), 0.0) / m
    return median, np.sqrt(var)


def slow_worker_gain_ms(ctx: RuleContext, ranks: Sequence[int]) -> float | None:
    """Mean step time saved when ``ranks`` run their blocks at their stage peers' cost (replay)."""
    key = ("slow_gain", tuple(sorted(ranks)))
    c = _cached(ctx)
    if key not in c:
        c[key] = _slow_worker_gain_ms(ctx, ranks)
    out: float | None = c[key]
    return out


def _slow_worker_gain_ms(ctx: RuleContext, ranks: Sequence[int]) -> float | None:
    topo = ctx.pipeline.topology
    blocks = {r: b for r, b in ctx.pipeline.blocks.items() if len(b)}
    per = rank_step_ms(blocks)
    measured = {r: b.busy.astype(np.float64) for r, b in blocks.items()}
    fixed = dict(measured)
    for r in ranks:
        if r not in per:
            continue
        s = topo.stage_of.get(r, 0)
        peers = [float(per[x].mean()) for x in per if x != r and topo.stage_of.get(x, 0) == s]
        if not peers:
            return None
        fixed[r] = measured[r] * (float(np.median(peers)) / float(per[r].mean()))
    lines = [line for line in topo.pipelines if any(r in blocks for r in line)]
    last = topo.pp * topo.virtual - 1
    diffs = _replay_gains_ns(ctx, blocks, lines, last, fixed)
    return float(np.mean(diffs)) / 1e6 if diffs else None


register(MicrobatchVarianceRule())
