"""The replay's step-end sync points: which ranks' step-end collectives are one sync.

A sync point makes its early members wait for the last arriver, which only pays the transfer; so
it stands for one collective that every rank of the job joins. When the ends do not all agree, the
groups that end together are each a sync of their own only where that can be the job-wide
collective seen on clocks nothing in the trace links (the replicas of a run without comm args).
Where the trace names a rank's step-end collectives and none of them spans the job (a stage's
reduce-scatter across the replicas), the groups are separate collectives: an early member waits
there for a late replica, and that wait is left to the collective waits, which charge it to the
late member's own cause (see :func:`ppdiag.attribution.collective_steps.run_waits`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

from ppdiag.model import Kind, RankTimeline


def _end_together(ends: npt.NDArray[np.int64], durs: npt.NDArray[np.int64]) -> list[npt.NDArray[np.intp]]:
    """The members of each sync point among collectives that end at ``ends`` after lasting
    ``durs``: all of them when they end together (within half the shortest one, at least 50 µs),
    else the runs of two or more whose ends, in order, stay that close to their run's first."""
    if int(ends.max() - ends.min()) <= max(int(durs.min()) // 2, 50_000):
        return [np.arange(ends.size)]
    order = np.argsort(ends, kind="stable")
    e_l, d_l = ends[order].tolist(), durs[order].tolist()
    runs: list[npt.NDArray[np.intp]] = []
    first, shortest = 0, d_l[0]
    for j in range(1, len(e_l) + 1):
        if j < len(e_l) and e_l[j] - e_l[first] <= max(min(shortest, d_l[j]) // 2, 50_000):
            shortest = min(shortest, d_l[j])
            continue
        if j - first >= 2:
            runs.append(order[first:j])
        if j < len(e_l):
            first, shortest = j, d_l[j]
    return runs


def sync_members(
    ends: npt.NDArray[np.int64],
    durs: npt.NDArray[np.int64],
    narrower: Callable[[], npt.NDArray[np.bool_]],
) -> list[npt.NDArray[np.intp]]:
    """The sync points among step-end collectives that end at ``ends`` after lasting ``durs``
    (indices into them). ``narrower``: per member, whether the trace names its collectives and
    none spans the job (asked only when the ends do not all agree). All of them are one sync when
    they end together; else the groups that end together are syncs of their own, unless a
    member's collectives are known not to be job-wide: then there is none."""
    runs = _end_together(ends, durs)
    if len(runs) == 1 and runs[0].size == ends.size:
        return runs
    return [] if bool(narrower().any()) else runs


class GroupSpans:
    """Per rank, its collectives sorted by end (with their starts, the longest one's duration and
    the size of the process group each names, 0 where the trace names none), built once per rank
    on demand."""

    def __init__(self, timelines: Mapping[int, RankTimeline], n_ranks: int) -> None:
        self._tl = timelines
        self._n = n_ranks
        self._by_rank: dict[
            int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int, npt.NDArray[np.int64]]
        ] = {}

    def _of(
        self, rank: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int, npt.NDArray[np.int64]]:
        hit = self._by_rank.get(rank)
        if hit is None:
            tl = self._tl[rank]
            iv = tl.intervals
            sel = np.flatnonzero(iv.kind == int(Kind.COLLECTIVE))
            sizes = np.array([len(pg.ranks) for pg in tl.process_groups] + [0], dtype=np.int64)
            g = iv.group[sel].astype(np.int64)
            size = sizes[np.where(g >= 0, g, sizes.size - 1)]
            starts, ends = iv.start[sel].astype(np.int64), iv.end[sel].astype(np.int64)
            o = np.argsort(ends, kind="stable")
            longest = int((ends - starts).max()) if sel.size else 0
            hit = self._by_rank[rank] = (ends[o], starts[o], longest, size[o])
        return hit

    def narrower(self, rank: int, c0: int, c1: int) -> bool:
        """Whether the trace names the group of every collective of ``rank`` that overlaps
        [c0, c1] (the step-end span, which the compute around it may have cut by a few ns) and none
        of them spans the job."""
        ends, starts, longest, size = self._of(rank)
        lo, hi = np.searchsorted(ends, [c0, c1 + longest], side="right")
        s = size[lo:hi][starts[lo:hi] < c1]
        return bool(s.size) and bool((s > 0).all()) and int(s.max()) < self._n
