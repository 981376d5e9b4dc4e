"""Schedule detection from the order of blocks on each rank."""

from __future__ import annotations

import numpy as np

from ppdiag.model import Phase, RangeKind, RankTimeline
from ppdiag.model.schedule import Schedule
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.topology import Topology


def detect_schedule(
    topo: Topology, blocks: dict[int, Blocks], timelines: dict[int, RankTimeline]
) -> Schedule:
    """Name the schedule that produced the per-rank block orders."""
    if topo.pp <= 1:
        return Schedule.NONE
    if any(_has_overlap_labels(tl) for tl in timelines.values()):
        return Schedule.DUALPIPEV
    has_w = any((b.phase == int(Phase.WGRAD)).any() for b in blocks.values())
    if has_w:
        return Schedule.ZBV if topo.placement == "v" and topo.virtual > 1 else Schedule.ZERO_BUBBLE
    if topo.virtual > 1:
        if topo.placement == "v":
            return Schedule.ZBV
        return (
            Schedule.LOOPED_BFS
            if all(_all_fwd_first(b) for b in blocks.values() if len(b))
            else Schedule.INTERLEAVED_1F1B
        )
    usable = [b for b in blocks.values() if len(b)]
    if not usable:
        return Schedule.UNKNOWN
    if not any((b.phase == int(Phase.BWD)).any() for b in usable):
        return Schedule.UNKNOWN
    return Schedule.GPIPE if all(_all_fwd_first(b) for b in usable) else Schedule.ONE_F_ONE_B


def _all_fwd_first(b: Blocks) -> bool:
    """True when, in every step, no backward block precedes a forward block."""
    for s in np.unique(b.step):
        m = b.step == s
        ph = b.phase[m]
        f = np.flatnonzero(ph == int(Phase.FWD))
        bw = np.flatnonzero(ph == int(Phase.BWD))
        if f.size < 2 or bw.size == 0:
            continue
        if bw[0] < f[-1]:
            return False
    return True


def _has_overlap_labels(tl: RankTimeline) -> bool:
    r = tl.ranges
    m = r.kind == int(RangeKind.OTHER)
    if not m.any():
        return False
    return any("OVERLAP_F_B" in tl.names[i] for i in np.unique(r.name[m]))


def microbatch_count(
    blocks: dict[int, Blocks], virtual: int, timelines: dict[int, RankTimeline] | None = None
) -> int | None:
    """Micro-batches per step: the highest labelled micro-batch + 1 when labels number them (some
    blocks, e.g. DualPipeV's overlapped F&B pairs, carry no F label of their own), else the forward
    blocks of one virtual stage in one step (median over ranks and steps)."""
    labelled = [
        int(b.mb[b.phase == int(Phase.FWD)].max()) + 1
        for b in blocks.values()
        if len(b) and b.labelled and (b.phase == int(Phase.FWD)).any()
    ]
    for tl in (timelines or {}).values():
        r = tl.ranges
        m = (r.kind == int(RangeKind.OTHER)) & (r.mb >= 0)
        if m.any() and labelled:
            labelled.append(int(r.mb[m].max()) + 1)
    if labelled:
        return max(labelled)
    counts: list[int] = []
    for b in blocks.values():
        f = b.phase == int(Phase.FWD)
        for s in np.unique(b.step[f]):
            n = int((f & (b.step == s)).sum())
            counts.append(n // virtual if virtual > 1 else n)
    if not counts:
        return None
    return int(np.median(counts))


def label_from_order(blocks: dict[int, Blocks], topo: Topology, schedule: str, m: int | None) -> int:
    """Give unlabelled blocks their virtual stage and micro-batch from the schedule's known order.

    Used where counting cannot tell chunks apart (interleaved runs without labels): a step whose
    sequence of phases is exactly the schedule's gets the schedule's (stage, micro-batch) per block.
    Returns the number of steps that did not match.
    """
    if not m or topo.pp <= 1 or schedule in ("none", "unknown"):
        return 0
    try:
        from ppdiag.simulate.schedules import B, F, I, W, rank_orders

        orders = rank_orders(schedule, topo.pp, m, topo.virtual)
    except (ImportError, ValueError):
        return 0
    op_phase = {F: int(Phase.FWD), B: int(Phase.BWD), I: int(Phase.BWD), W: int(Phase.WGRAD)}
    mismatched = 0
    for r, b in blocks.items():
        if not len(b) or b.labelled:
            continue
        pos = topo.stage_of.get(r)
        if pos is None or pos >= len(orders):
            continue
        want = orders[pos]
        want_ph = np.array([op_phase[a.op] for a in want], dtype=np.int8)
        for s in np.unique(b.step):
            idx = np.flatnonzero(b.step == s)
            if idx.size != want_ph.size or not np.array_equal(b.phase[idx], want_ph):
                mismatched += 1
                continue
            b.stage[idx] = [a.stage for a in want]
            b.mb[idx] = [a.mb for a in want]
    return mismatched
