"""The analyzed steps of a run matched into collective waits: each rank's step reduced to the
sets :func:`~ppdiag.attribution.collective_waits.collective_waits` reads, the run's collectives
matched, and in a pipeline run only the groups whose members run the same stages kept (members of
different stages are apart by the schedule, which the replay accounts for).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.accounting import WindowSets
from ppdiag.attribution.collective_waits import CollectiveWaits, RankSets, collective_waits
from ppdiag.attribution.tolerance import timing_tolerance_ns
from ppdiag.model import RankTimeline
from ppdiag.model import intervals as ivs
from ppdiag.model.interval_groups import Line
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.collectives import CollectiveMatch, match_collectives


class StepLike(Protocol):
    """What :func:`run_waits` reads of a rank's step (``causes.RankStep``)."""

    rank: int
    step: int
    w0: int
    w1: int
    sets: WindowSets
    host_set: ivs.ISet
    blocks: Blocks


def run_waits(
    steps: Sequence[StepLike],
    timelines: Mapping[int, RankTimeline],
    exclude: dict[tuple[int, int], tuple[int, int]] | None = None,
    p2p: bool = False,
    pipelines: Sequence[Sequence[int]] | None = None,
    collectives: CollectiveMatch | None = None,
) -> CollectiveWaits:
    """Match the run's collectives (timelines already on the aligned clock) and split their waits.

    ``p2p``: also split point-to-point ops, per rank pair (for runs without a pipeline).
    In a pipeline run only groups whose members run the same stages (data-, tensor-, expert-
    parallel groups) are split here: members of different stages reach a collective at different
    times because of the schedule itself (the bubble), which the replay accounts for. Waits inside
    a pipeline block are the replay's too (it books the block's lost time itself), and so is the
    ``exclude`` span of each (rank, step): the replay's step-end sync.
    ``pipelines``: the ranks of each pipeline replica; without it, each timeline's
    ``meta["pipeline"]`` (set by formats that name the replica) when every rank has one.
    ``collectives``: the run's collectives already matched (``Pipeline.collectives``); with ``p2p``
    the point-to-point ops join the match, so it is made here.
    """
    comm = _comm_sets(steps)
    sets = []
    for rs, cm in zip(steps, comm, strict=True):
        o = np.argsort(rs.blocks.end, kind="stable")
        firsts = [
            int(x[0][0])
            for x in (rs.sets.compute, rs.sets.p2p, rs.sets.collective, rs.sets.copy)
            if x[0].size
        ]
        busy_cum = np.zeros(len(rs.blocks) + 1, np.int64)
        np.cumsum(rs.blocks.busy[o], out=busy_cum[1:])
        sets.append(
            RankSets(
                rs.rank,
                rs.step,
                rs.w0,
                rs.w1,
                rs.sets.compute,
                rs.host_set,
                cm,
                min(firsts, default=rs.w0),
                rs.blocks.end[o].astype(np.int64),
                busy_cum,
            )
        )
    pipeline_of = _pipeline_of(timelines, pipelines)
    match = (
        collectives if collectives is not None and not p2p else match_collectives(dict(timelines), p2p=p2p)
    )
    by_rank: dict[int, list[npt.NDArray[np.int32]]] = defaultdict(list)
    for rs in steps:
        by_rank[rs.rank].append(rs.blocks.stage)
    stages = {r: {int(x) for x in np.unique(np.concatenate(v))} for r, v in by_rank.items()}
    if any(stages.values()) and len(match):
        same = np.array(
            [len({frozenset(stages.get(r, set())) for r in members}) == 1 for members in match.groups],
            dtype=bool,
        )
        match = match.only_groups(same)
    cw = collective_waits(
        sets, match, _block_spans(steps, exclude), pipeline_of, timing_tolerance_ns(timelines)
    )
    cw.notes[:0] = match.warnings
    return cw


def _pipeline_of(
    timelines: Mapping[int, RankTimeline], pipelines: Sequence[Sequence[int]] | None
) -> dict[int, int]:
    """Rank -> pipeline replica index, from ``pipelines`` or the timelines' ``meta["pipeline"]``;
    empty when the replicas are not known for every rank (no partial guess)."""
    if pipelines:
        return {int(r): i for i, line in enumerate(pipelines) for r in line}
    out: dict[int, int] = {}
    for r, tl in timelines.items():
        p = tl.meta.get("pipeline") if isinstance(tl.meta, dict) else None
        if not isinstance(p, int) or isinstance(p, bool):
            return {}
        out[int(r)] = p
    return out


__all__ = ["StepLike", "run_waits"]


def _comm_sets(steps: Sequence[StepLike]) -> list[ivs.ISet]:
    """Each step's exposed p2p and collectives as one set: all steps at once on one line of their
    windows, or one step at a time where a set strays outside its window."""
    w0 = np.array([rs.w0 for rs in steps], np.int64)
    w1 = np.array([rs.w1 for rs in steps], np.int64)
    parts = [rs.sets.p2p for rs in steps] + [rs.sets.collective for rs in steps]
    g = np.repeat(np.tile(np.arange(len(steps), dtype=np.int64), 2), [x[0].size for x in parts])
    s = np.concatenate([x[0] for x in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
    e = np.concatenate([x[1] for x in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
    try:
        line = Line.of(w0, w1)
    except OverflowError:  # windows too long to lay end to end on one int64 line
        line = None
    if line is None or bool((w1 < w0).any()) or not bool(((s >= w0[g]) & (e <= w1[g])).all()):
        return [
            ivs.union(
                np.concatenate([rs.sets.p2p[0], rs.sets.collective[0]]),
                np.concatenate([rs.sets.p2p[1], rs.sets.collective[1]]),
            )
            for rs in steps
        ]
    return line.split(ivs.union(line.put(g, s), line.put(g, e)))


def _block_spans(
    steps: Sequence[StepLike], exclude: dict[tuple[int, int], tuple[int, int]] | None
) -> dict[tuple[int, int], ivs.ISet]:
    """Each (rank, step)'s blocks and its ``exclude`` span as one set (for the steps with one of
    them at least): all steps at once on one line, or one step at a time where the steps' spans do
    not fit on one int64 line."""
    keys = [(rs.rank, rs.step) for rs in steps]
    xs = [exclude.get(k) for k in keys] if exclude else [None] * len(keys)
    has_x = np.array([x is not None for x in xs], bool)
    n = np.array([len(rs.blocks.start) for rs in steps], np.int64) + has_x
    xg = np.flatnonzero(has_x)
    # the blocks of every step, then the excluded spans (a set's order does not change its union)
    g = np.r_[np.repeat(np.arange(len(steps), dtype=np.int64), n - has_x), xg]
    parts_s = [rs.blocks.start for rs in steps] + [np.array([x[0] for x in xs if x is not None], np.int64)]
    parts_e = [rs.blocks.end for rs in steps] + [np.array([x[1] for x in xs if x is not None], np.int64)]
    s = np.concatenate(parts_s).astype(np.int64)
    e = np.concatenate(parts_e).astype(np.int64)
    lo = np.full(len(steps), np.iinfo(np.int64).max, np.int64)
    hi = np.full(len(steps), np.iinfo(np.int64).min, np.int64)
    np.minimum.at(lo, g, np.minimum(s, e))
    np.maximum.at(hi, g, np.maximum(s, e))
    lo[n == 0], hi[n == 0] = 0, 0
    try:
        line = Line.of(lo, hi)
    except OverflowError:
        line = None
    if line is None:
        o = np.argsort(g, kind="stable")
        so, eo, cut = s[o], e[o], np.r_[0, np.cumsum(n)].tolist()
        return {
            keys[i]: ivs.union(so[cut[i] : cut[i + 1]], eo[cut[i] : cut[i + 1]])
            for i in np.flatnonzero(n).tolist()
        }
    sets = line.split(ivs.union(line.put(g, s), line.put(g, e)))
    return {keys[i]: sets[i] for i in np.flatnonzero(n).tolist()}
