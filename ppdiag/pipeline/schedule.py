"""Schedule detection from the order of blocks on each rank (DESIGN.md §4.6)."""

from __future__ import annotations

import numpy as np

from ppdiag.model import Phase, RangeKind, RankTimeline
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.topology import Topology

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zero_bubble", "zbv", "dualpipev",
             "unknown", "none")


def detect_schedule(topo: Topology, blocks: dict[int, Blocks], timelines: dict[int, RankTimeline]) -> str:
    """Name the schedule that produced the per-rank block orders."""
    if topo.pp <= 1:
        return "none"
    if any(_has_overlap_labels(tl) for tl in timelines.values()):
        return "dualpipev"
    has_w = any((b.phase == int(Phase.WGRAD)).any() for b in blocks.values())
    if has_w:
        return "zbv" if topo.placement == "v" and topo.virtual > 1 else "zero_bubble"
    if topo.virtual > 1:
        if topo.placement == "v":
            return "zbv"
        return "looped_bfs" if all(_all_fwd_first(b) for b in blocks.values() if len(b)) else "interleaved_1f1b"
    usable = [b for b in blocks.values() if len(b)]
    if not usable:
        return "unknown"
    if not any((b.phase == int(Phase.BWD)).any() for b in usable):
        return "unknown"
    return "gpipe" if all(_all_fwd_first(b) for b in usable) else "1f1b"


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


def microbatch_count(blocks: dict[int, Blocks], virtual: int) -> int | None:
    """Micro-batches per step: the forward blocks of one virtual stage in one step (median)."""
    counts: list[int] = []
    for b in blocks.values():
        f = b.phase == int(Phase.FWD)
        for s in np.unique(b.step[f]):
            m = f & (b.step == s)
            counts.append(int(m.sum()) // max(virtual, 1) if virtual > 1 else int(m.sum()))
            mbs = b.mb[m]
            if (mbs >= 0).any():
                counts[-1] = max(counts[-1], int(mbs.max()) + 1)
    if not counts:
        return None
    return int(np.median(counts))
