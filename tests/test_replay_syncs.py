"""The replay's step-end sync points when the ranks' step-end collectives do not all end together:
groups that end together are syncs of their own only where they can be one job-wide collective on
unlinked clocks, never when the trace names each rank's collective and none spans the job."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.replay_syncs import GroupSpans, sync_members
from ppdiag.model import Intervals, Kind, ProcessGroup, Ranges, RankTimeline

US, MS = 1_000, 1_000_000

# 2 replicas x 2 stages, ranks 0/1 = stage 0 of replicas 0/1, 2/3 = stage 1: each stage's
# reduce-scatter across the replicas. Replica 1 is 4 ms late (a slow worker): rank 0 waits 4 ms for
# rank 1 in stage 0's, rank 2 for rank 3 in stage 1's; the two end 2 ms apart (the cool-down).
ENDS = np.array([10 * MS, 10 * MS + 5 * US, 8 * MS, 8 * MS + 5 * US], dtype=np.int64)
DURS = np.array([4 * MS + 400 * US, 400 * US, 4 * MS + 400 * US, 400 * US], dtype=np.int64)


def _sorted(groups: list[npt.NDArray[np.intp]]) -> list[list[int]]:
    return sorted(sorted(g.tolist()) for g in groups)


def test_named_stage_collectives_that_end_apart_are_no_sync() -> None:
    # the late replica explains the gap: the early ranks' wait is left to the collective waits,
    # which charge it to the late member's cause (two syncs of the replay would hide it)
    assert sync_members(ENDS, DURS, lambda: np.ones(4, dtype=bool)) == []
    # one member named narrower than the job is enough
    assert sync_members(ENDS, DURS, lambda: np.array([False, True, False, False])) == []


def test_unnamed_groups_that_end_together_stay_syncs_of_their_own() -> None:
    # nothing names the collectives: each group can be the replicas' job-wide collective on its
    # own clock (tests/test_healthy_runs.py::test_unlinked_replicas_keep_their_own_step_end_sync)
    got = sync_members(ENDS, DURS, lambda: np.zeros(4, dtype=bool))
    assert _sorted(got) == [[0, 1], [2, 3]]


def test_ends_together_are_one_sync_whatever_the_groups() -> None:
    def never() -> npt.NDArray[np.bool_]:
        raise AssertionError("the groups are read only when the ends do not all agree")

    ends = np.array([10 * MS, 10 * MS + 5 * US, 10 * MS + 10 * US, 10 * MS], dtype=np.int64)
    assert _sorted(sync_members(ends, DURS, never)) == [[0, 1, 2, 3]]


def _tl(rank: int, spans: list[tuple[int, int, int]], groups: list[list[int]]) -> RankTimeline:
    """Collectives (start µs, end µs, process group index or -1) on ``rank``."""
    n = len(spans)
    iv = Intervals.from_columns(
        n,
        {
            "start": [s * US for s, _, _ in spans],
            "end": [e * US for _, e, _ in spans],
            "stream": [20] * n,
            "kind": [int(Kind.COLLECTIVE)] * n,
            "name": [0] * n,
            "group": [g for _, _, g in spans],
        },
    )
    tl = RankTimeline(rank, f"rank{rank}", "kineto", [""], iv, Ranges.empty(), world_size=4)
    tl.process_groups = [ProcessGroup(f"pg{i}", "", r) for i, r in enumerate(groups)]
    return tl


def test_group_spans_read_the_collectives_of_the_step_end() -> None:
    stage = [[0, 1], [0, 1, 2, 3]]  # a stage's data-parallel group, and the whole job
    tls = {
        0: _tl(0, [(5_600, 10_000, 0)], stage),  # the reduce-scatter alone
        1: _tl(1, [(9_600, 10_000, 0), (10_000, 10_500, 1)], stage),  # then the job-wide clip
        2: _tl(2, [(3_600, 8_000, -1)], stage),  # a collective that names no group
        3: _tl(3, [], stage),
    }
    spans = GroupSpans(tls, 4)
    assert spans.narrower(0, 5_600 * US, 10_000 * US)
    # a span cut a few ns short by the compute after it still reads the collective
    assert spans.narrower(0, 5_600 * US, 10_000 * US - 7)
    assert not spans.narrower(1, 9_600 * US, 10_500 * US)  # the clip spans the job
    assert spans.narrower(1, 9_600 * US, 10_000 * US - 7)
    assert not spans.narrower(2, 3_600 * US, 8_000 * US)  # no name: it may be job-wide
    assert not spans.narrower(3, 0, 10 * MS)  # nothing there
