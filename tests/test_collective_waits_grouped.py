"""The collective waits' per-rank groupings (the inherited waits, the late ranks) are one sort each:
the same results as the search per rank they replace (kept here as the reference), on random
matches, and a hand-built case for the sorted search they rest on."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution import collective_waits as cwm
from ppdiag.attribution.collective_waits import REASONS, LateRank, _alloc, _Rows, _sync_split
from ppdiag.pipeline.collectives import CollectiveMatch

I64 = npt.NDArray[np.int64]


def test_rows_before_counts_rows_of_the_same_key_that_start_earlier() -> None:
    # rows sorted by (rank, start): rank 0 at 10, 20, 20; rank 2 at 5, 30
    key = np.array([0, 0, 0, 2, 2], np.int32)
    t = np.array([10, 20, 20, 5, 30], np.int64)
    # (0, 20): 1 row before (ties after the query); (0, 99): 3; (1, 0): 3; (2, 30): 4; (2, 0): 3
    q_key = np.array([0, 0, 1, 2, 2], np.int32)
    q_t = np.array([20, 99, 0, 30, 0], np.int64)
    assert cwm._rows_before(key, t, q_key, q_t).tolist() == [1, 3, 3, 4, 3]
    for k, s in zip(q_key.tolist(), q_t.tolist(), strict=True):  # searchsorted within the key's rows
        mine = np.flatnonzero(key == k)
        lo = int(np.searchsorted(key, k, "left"))
        assert int(cwm._rows_before(key, t, np.array([k]), np.array([s]))[0]) == lo + int(
            np.searchsorted(t[mine], s, "left")
        )


def _inherit_per_rank(
    match: CollectiveMatch, seg0: I64, waiting: I64, lrow: I64, shares: I64, rounds: int = 3
) -> I64:
    """The search per late rank that :func:`_inherit` replaced (a mask over the rows per rank)."""
    comm = REASONS.index("comm")
    full = np.zeros((len(match.inst), len(REASONS)), np.int64)
    by_rs = np.lexsort((match.start, match.rank))
    r_sorted = match.rank[by_rs]
    for _ in range(rounds):
        full[:] = 0
        full[waiting] = shares
        seg_tot = np.zeros((waiting.size, len(REASONS)), np.int64)
        lr_rank = match.rank[lrow]
        for r in np.unique(lr_rank).tolist():
            mine = by_rs[np.searchsorted(r_sorted, r, "left") : np.searchsorted(r_sorted, r, "right")]
            cum = np.vstack([np.zeros((1, len(REASONS)), np.int64), np.cumsum(full[mine], axis=0)])
            q = np.flatnonzero(lr_rank == r)
            lo = np.searchsorted(match.start[mine], seg0[lrow[q]], side="left")
            hi = np.searchsorted(match.start[mine], match.start[lrow[q]], side="left")
            seg_tot[q] = cum[hi] - cum[lo]
        passed = cwm.passed_on(shares, seg_tot, comm)
        if passed is None:
            break
        shares = passed
    return shares


def _late_per_rank(
    match: CollectiveMatch, rows: I64, lateness: I64, made: I64, reasons: I64
) -> dict[int, LateRank]:
    """The late ranks' totals as a mask per rank (what :func:`_late_ranks` did before)."""
    late: dict[int, LateRank] = {}
    ranks_late = match.rank[rows]
    for r in np.unique(ranks_late):
        m = ranks_late == r
        lr = LateRank(int(r), int(m.sum()), int(lateness[rows][m].sum()), int(made[m].sum()))
        tot = reasons[m].sum(axis=0)
        lr.reasons_ns = {name: int(tot[j]) for j, name in enumerate(REASONS)}
        lr.groups = {int(g) for g in np.unique(match.group[match.inst[rows][m]])}
        late[int(r)] = lr
    return late


@st.composite
def _matches(draw: st.DrawFn) -> CollectiveMatch:
    """Instances of 2 to 4 distinct ranks of 8, in random groups, members sorted by rank; the
    members of an instance end together (a sync point) and arrive at random."""
    n_inst = draw(st.integers(1, 30))
    ranks, inst, count = [], [], []
    for i in range(n_inst):
        members = sorted(draw(st.sets(st.integers(0, 7), min_size=2, max_size=4)))
        ranks += members
        inst += [i] * len(members)
        count.append(len(members))
    n = len(ranks)
    cnt = np.array(count, np.int64)
    ends = np.array(draw(st.lists(st.integers(60, 400), min_size=n_inst, max_size=n_inst)), np.int64)
    end = np.repeat(ends, cnt) * 1000
    dur = np.array(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), np.int64) * 1000
    start = end - dur
    first = np.r_[0, np.cumsum(cnt)[:-1]].astype(np.int64)
    return CollectiveMatch(
        inst=np.array(inst, np.int64),
        rank=np.array(ranks, np.int32),
        start=start,
        end=end,
        group=np.array(draw(st.lists(st.integers(0, 3), min_size=n_inst, max_size=n_inst)), np.int32),
        method=np.zeros(n_inst, np.int8),
        first=first,
        count=cnt,
        expected=cnt.copy(),
    )


@settings(max_examples=100, deadline=None)
@given(match=_matches(), data=st.data())
def test_inherit_by_one_sort_matches_the_search_per_rank(match: CollectiveMatch, data: st.DataObject) -> None:
    n = len(match.inst)
    waiting = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))), np.int64)
    lrow = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=waiting.size, max_size=waiting.size)))
    # a stretch may begin before, at or after (an empty stretch) the last arriver's start
    seg0 = match.start - np.array(data.draw(st.lists(st.integers(-50, 400), min_size=n, max_size=n))) * 1000
    cells = st.lists(st.integers(0, 9), min_size=len(REASONS), max_size=len(REASONS))
    k = waiting.size
    shares = np.array(data.draw(st.lists(cells, min_size=k, max_size=k)), np.int64) * 1000
    want = _inherit_per_rank(match, seg0.astype(np.int64), waiting, lrow.astype(np.int64), shares)
    got = cwm._inherit(match, seg0.astype(np.int64), waiting, lrow.astype(np.int64), shares)
    assert got.tolist() == want.tolist()


@settings(max_examples=100, deadline=None)
@given(match=_matches(), data=st.data())
def test_late_ranks_by_one_sort_match_the_mask_per_rank(match: CollectiveMatch, data: st.DataObject) -> None:
    n = len(match.inst)
    sy = _sync_split(match)
    key = np.array(data.draw(st.lists(st.integers(-1, 5), min_size=n, max_size=n)), np.int64)
    wall = np.array(data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), np.int64) * 1000
    cells = st.lists(st.integers(0, 90), min_size=len(REASONS), max_size=len(REASONS))
    comps = np.array(data.draw(st.lists(cells, min_size=n, max_size=n)), np.int64) * 1000
    rw = _Rows(key, np.zeros(n, np.int64), comps, wall, wall)
    o_w = np.lexsort((sy.wait, match.inst))
    med_row = o_w[match.first + match.count // 2]
    got = cwm._late_ranks(match, sy, rw, o_w, med_row)
    # the reference: the same rows, lateness, made-wait and reasons, totalled by a mask per rank
    inst = match.inst
    valid = key >= 0
    lateness = np.where(valid & sy.sync[inst], sy.wait[med_row[inst]] - sy.wait, 0).astype(np.int64)
    exposed = np.maximum.reduceat(np.where(valid, wall, 0), sy.safe_first) > 0
    rows = np.flatnonzero((lateness > cwm.LATE_TOL_NS) & exposed[inst])
    ws = sy.wait[o_w]
    cum = np.cumsum(ws)
    pos = np.empty(n, np.int64)
    pos[o_w] = np.arange(n)
    last_pos = (match.first + match.count - 1)[inst]
    made = ((cum[last_pos] - cum[pos]) - (last_pos - pos) * sy.wait)[rows]
    reasons = _alloc(lateness[rows], (comps[rows] - comps[med_row[inst[rows]]]).astype(np.float64))
    reasons[:, REASONS.index("idle")] += lateness[rows] - reasons.sum(axis=1)
    assert got == _late_per_rank(match, rows, lateness, made, reasons)
