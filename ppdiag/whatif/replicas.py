"""The stage split's gain with each replica's own block costs: :func:`rebalance_gain_ns`.

The what-if simulator runs one pipeline with each stage's mean block cost. That is the step of a
job whose replicas and micro-batches cost alike. When they differ (sequence lengths vary per
micro-batch and per replica), the step is set by the replica that drew the longest micro-batches,
and a heavy stage's slack absorbs part of that variance: evening the stages out wins less than
the mean costs say (a 2-stage job with 32 replicas: a third of it).

Here every analyzed step of every replica is laid out again from its own measured blocks, in the
schedule's block order, with the run's normal transfer latency between stages: once as measured,
once with each stage's work brought to the mean stage work of its replica in that step (the same
total work per replica, each micro-batch keeping its own share). The step ends when its slowest
replica does (the data-parallel reduce waits for it); the gain is the mean over the steps of the
difference. Both layouts come from the same model, so what it leaves out (host delays, the reduce
itself, the optimizer) cancels. The steps and replicas are numpy axes: one pass over the
schedule's blocks, not over the run's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model import Phase
from ppdiag.simulate.schedules import B, F, W, rank_orders

F64 = npt.NDArray[np.float64]

_PHASE_AXIS = {int(Phase.FWD): 0, int(Phase.BWD): 1, int(Phase.WGRAD): 2}
_OP_AXIS = {F: 0, B: 1, W: 2}


def block_costs(pipe: Any, microbatches: int) -> F64 | None:
    """Measured block compute (ns), ``[step, replica, stage, F/B/W, micro-batch]``, over the steps
    every rank of every full pipeline analyzed; a block the trace lacks takes its stage's mean.
    None without interleaving's one-chunk-per-rank shape, or without forward and backward blocks."""
    topo = pipe.topology
    pp, m = int(topo.pp), int(microbatches)
    lines = [ln for ln in topo.pipelines if len(ln) == pp]
    if topo.virtual != 1 or pp < 2 or m < 1 or not lines:
        return None
    blocks = [[pipe.blocks.get(r) for r in ln] for ln in lines]
    if any(b is None or not len(b) for row in blocks for b in row):
        return None
    common = set.intersection(*(set(np.unique(b.step).tolist()) for row in blocks for b in row))
    if not common:
        return None
    steps = np.array(sorted(common), dtype=np.int64)
    out = np.zeros((steps.size, len(lines), pp, 3, m), dtype=np.float64)
    seen = np.zeros(out.shape, dtype=bool)
    for i, row in enumerate(blocks):
        for s, b in enumerate(row):
            ph = np.full(b.phase.shape, -1, dtype=np.int64)
            for code, axis in _PHASE_AXIS.items():
                ph[b.phase == code] = axis
            si = np.searchsorted(steps, b.step)
            ok = (ph >= 0) & (b.mb >= 0) & (b.mb < m) & (si < steps.size)
            ok &= steps[np.minimum(si, steps.size - 1)] == b.step
            idx = (si[ok], i, s, ph[ok], b.mb[ok].astype(np.int64))
            np.add.at(out, idx, b.busy[ok].astype(np.float64))
            seen[idx] = True
    if not seen[:, :, :, 0].any() or not seen[:, :, :, 1].any():
        return None
    # a block the trace lacks (a cut step, a lost event): the mean of its stage and phase
    n = seen.sum(axis=(0, 1, 4), keepdims=True)
    mean = np.divide(out.sum(axis=(0, 1, 4), keepdims=True), n, out=np.zeros(n.shape), where=n > 0)
    return np.where(seen, out, np.broadcast_to(mean, out.shape))


def layout_ns(cost: F64, schedule: str, latency_ns: float) -> F64:
    """End of the last block of every (step, replica) laid out in ``schedule``'s order (ns after the
    step's first block starts), ``[step, replica]``: a forward after the previous stage's forward
    of its micro-batch, a backward after the next stage's backward (the last stage: its own
    forward), each ``latency_ns`` later across a stage boundary, every rank one block at a time."""
    n_steps, n_rep, pp, _, m = cost.shape
    orders = rank_orders(schedule, pp, m, 1)
    end: dict[tuple[int, int, int], F64] = {}
    free = np.zeros((pp, n_steps, n_rep), dtype=np.float64)
    ptr = [0] * pp
    total = sum(len(o) for o in orders)
    done = 0
    while done < total:  # one pass per dependency wave; every block is placed once
        moved = False
        for s in range(pp):
            while ptr[s] < len(orders[s]):
                a = orders[s][ptr[s]]
                op = F if a.op == F else (W if a.op == W else B)
                if op == F:
                    dep = (s - 1, F, a.mb) if s > 0 else None
                elif op == B:
                    dep = (s + 1, B, a.mb) if s < pp - 1 else (s, F, a.mb)
                else:
                    dep = (s, B, a.mb)
                if dep is not None and dep not in end:
                    break
                ready = free[s]
                if dep is not None:
                    ready = np.maximum(ready, end[dep] + (latency_ns if dep[0] != s else 0.0))
                fin = ready + cost[:, :, s, _OP_AXIS[op], a.mb]
                end[(s, op, a.mb)] = fin
                free[s] = fin
                ptr[s] += 1
                done += 1
                moved = True
        if not moved:
            raise ValueError(f"the {schedule} order of {pp} stages deadlocks")
    last: F64 = free.max(axis=0)
    return last


def rebalanced_costs(cost: F64) -> F64:
    """Each replica's stages brought to its mean stage work per step and phase; each micro-batch
    keeps its share of its stage's work."""
    tot = cost.sum(axis=4, keepdims=True)
    mean = tot.mean(axis=2, keepdims=True)
    factor = np.divide(mean, tot, out=np.ones(tot.shape), where=tot > 0)
    scaled: F64 = cost * factor
    return scaled


def rebalance_gain_ns(pipe: Any, schedule: str, microbatches: int, latency_ns: float) -> float | None:
    """Mean step time (ns) that evening out every replica's stages wins, laid out with each
    replica's own measured block costs (module docstring); None when the run's shape does not allow
    it (interleaving, missing blocks, a schedule without a one-chunk order)."""
    cost = block_costs(pipe, microbatches)
    if cost is None:
        return None
    try:
        now = layout_ns(cost, schedule, latency_ns).max(axis=1)
        even = layout_ns(rebalanced_costs(cost), schedule, latency_ns).max(axis=1)
    except ValueError:
        return None
    return max(float(np.mean(now - even)), 0.0)


def cap_rebalanced(pred: Any, measured_step_ns: float, gain_ns: float | None, ideal: bool) -> None:
    """Hold a rebalanced prediction of the measured shape to :func:`rebalance_gain_ns`. An ideal
    split (no layer costs: the stages evened out exactly) wins what evening out each replica's own
    stages wins; a split of whole layers at most that. The step, its imbalance, the speed-ups and
    the time per sample follow; a note says both figures."""
    if gain_ns is None or pred.step_ns is None or pred.step_ns <= 0:
        return
    sim_gain = measured_step_ns - float(pred.step_ns)
    if abs(sim_gain - gain_ns) < 1.0 or (sim_gain < gain_ns and not ideal):
        return
    new = measured_step_ns - gain_ns
    k = float(pred.step_ns) / new
    pred.lost_ns["imbalance"] = pred.lost_ns.get("imbalance", 0.0) + (new - float(pred.step_ns))
    pred.step_ns = new
    for name in ("step_speedup", "speedup"):
        v = getattr(pred, name)
        if v is not None:
            setattr(pred, name, v * k)
    if pred.ms_per_sample is not None:
        pred.ms_per_sample = pred.ms_per_sample / k
    pred.notes.append(
        f"with each replica's own block costs evening out the "
        f"stages wins {gain_ns / 1e6:.2f} ms per step; the stages' mean costs give {sim_gain / 1e6:.2f} ms"
    )
