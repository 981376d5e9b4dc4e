"""The block finder's column passes against the plain forms they replaced (kept here as
references): binary searches of sorted times by a merge, the phase majority by integer run sums, the
transfer vote's group spans from runs instead of scatter-reductions, and the step windows'
running maximum read only where asked."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.model import Direction, Kind, Phase, RankTimeline
from ppdiag.model.intervals import search_sorted as _search
from ppdiag.model.timeline import Intervals, Ranges
from ppdiag.pipeline.blocks import _Comp, _majority_phase, _transfer_vote
from ppdiag.pipeline.steps import _reach_at

_PHASES = [int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD), int(Phase.OPTIM)]


def _majority_ref(cc: _Comp, group: npt.NDArray[np.int64], ng: int) -> npt.NDArray[np.int8]:
    """The float bincount form."""
    dur = (cc.end - cc.start).astype(np.float64)
    ph = cc.phase
    valid = group >= 0
    bwd = np.where(ph[valid] == int(Phase.BWD), dur[valid], 0.0)
    wg = np.where(ph[valid] == int(Phase.WGRAD), dur[valid], 0.0)
    bwd_t = np.bincount(group[valid], weights=bwd, minlength=ng)
    wg_t = np.bincount(group[valid], weights=wg, minlength=ng)
    all_t = np.bincount(group[valid], weights=dur[valid], minlength=ng)
    phase = np.full(ng, int(Phase.FWD), dtype=np.int8)
    phase[bwd_t > 0.5 * all_t] = int(Phase.BWD)
    phase[wg_t > 0.5 * all_t] = int(Phase.WGRAD)
    return phase


def _spans_ref(cc: _Comp, group: npt.NDArray[np.int64], ng: int) -> tuple[list[int], list[int]]:
    """Each group's first start and last end by scatter-reductions (unused ids: max, -1)."""
    valid = group >= 0
    g_start = np.full(ng, np.iinfo(np.int64).max, np.int64)
    g_end = np.full(ng, -1, np.int64)
    np.minimum.at(g_start, group[valid], cc.start[valid])
    np.maximum.at(g_end, group[valid], cc.end[valid])
    return g_start.tolist(), g_end.tolist()


@st.composite
def _runs(draw: st.DrawFn) -> tuple[_Comp, npt.NDArray[np.int64], int]:
    """Compute in start order cut into runs of rising group ids, some intervals outside any
    (times on a 100 ns grid, so that transfers often meet a group's edge exactly)."""
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.integers(0, 30).map(lambda v: v * 100), min_size=n, max_size=n))
    durs = draw(st.lists(st.integers(0, 50).map(lambda v: v * 100), min_size=n, max_size=n))
    start = np.cumsum(np.array(gaps, np.int64))
    end = start + np.array(durs, np.int64)
    phase = np.array(draw(st.lists(st.sampled_from(_PHASES), min_size=n, max_size=n)), np.int8)
    new = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    skip = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    group = np.cumsum(np.array(new, np.int64)) + draw(st.integers(0, 2))
    group = np.where(np.array(skip), -1, group)
    ng = int(group.max()) + 1 + draw(st.integers(0, 2)) if (group >= 0).any() else draw(st.integers(0, 2))
    idx = np.arange(n, dtype=np.int64)
    return _Comp(idx, start, end, np.full(n, -1, np.int64), phase), group, ng


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(-50, 50), max_size=30),
    st.lists(st.integers(-60, 60), max_size=40),
    st.booleans(),
    st.sampled_from(["left", "right"]),
)
def test_search_is_searchsorted(cuts: list[int], x: list[int], sort_x: bool, side: str) -> None:
    c = np.array(sorted(cuts), np.int64)
    xs = np.array(sorted(x) if sort_x else x, np.int64)
    got = _search(c, xs, side="left" if side == "left" else "right")
    assert got.dtype == np.int64
    assert got.tolist() == np.searchsorted(c, xs, side="left" if side == "left" else "right").tolist()


@settings(max_examples=300, deadline=None)
@given(_runs())
def test_majority_phase_equals_float_bincount(case: tuple[_Comp, npt.NDArray[np.int64], int]) -> None:
    cc, group, ng = case
    assert _majority_phase(cc, group, ng).tolist() == _majority_ref(cc, group, ng).tolist()


def test_majority_phase_half_is_not_more() -> None:
    # group 0: backward 0-2 µs, forward 2-4 µs: exactly half backward -> forward;
    # group 1: weight-gradient 10-13 µs, forward 13-15 µs: 3 of 5 µs -> weight-gradient
    us = 1000
    cc = _Comp(
        np.arange(4, dtype=np.int64),
        np.array([0, 2, 10, 13], np.int64) * us,
        np.array([2, 4, 13, 15], np.int64) * us,
        np.full(4, -1, np.int64),
        np.array([int(Phase.BWD), int(Phase.FWD), int(Phase.WGRAD), int(Phase.FWD)], np.int8),
    )
    got = _majority_phase(cc, np.array([0, 0, 1, 1], np.int64), 2)
    assert got.tolist() == [int(Phase.FWD), int(Phase.WGRAD)]


@settings(max_examples=200, deadline=None)
@given(
    _runs(),
    # distinct times: the order among equal times is no part of the rule
    st.lists(
        st.tuples(st.integers(0, 1_500).map(lambda v: v * 100), st.integers(0, 2), st.integers(0, 3)),
        max_size=20,
        unique_by=lambda x: x[0],
    ),
)
def test_transfer_vote_spans_from_runs(
    case: tuple[_Comp, npt.NDArray[np.int64], int], p2p: list[tuple[int, int, int]]
) -> None:
    """The vote with group spans from runs equals the vote over the reference spans: a block
    whose reference span is replaced by the run span must vote the same."""
    cc, group, ng = case
    n = cc.start.size
    dirs = [int(Direction.SEND), int(Direction.RECV), int(Direction.BOTH), int(Direction.NONE)]
    starts = [int(s) for s in cc.start] + [t for t, _, _ in p2p]
    ends = [int(e) for e in cc.end] + [t + 700 for t, _, _ in p2p]
    kinds = [int(Kind.COMPUTE)] * n + [int(Kind.P2P)] * len(p2p)
    peers = [-1] * n + [p for _, p, _ in p2p]
    direc = [int(Direction.NONE)] * n + [dirs[d] for _, _, d in p2p]
    m = len(starts)
    cols = {"start": starts, "end": ends, "kind": kinds, "peer": peers, "direction": direc}
    iv = Intervals.from_columns(m, cols)
    tl = RankTimeline(1, "t", "nsys", [], iv, Ranges.empty())
    got = _transfer_vote(tl, cc, group, ng, 0, 2, iv.peer, iv.direction)
    g_start, g_end = _spans_ref(cc, group, ng)
    # the reference vote, recomputed from the reference spans by the same rule
    want = []
    s_m = (iv.kind == int(Kind.P2P)) & (iv.peer >= 0)
    snd = s_m & np.isin(iv.direction, [int(Direction.SEND), int(Direction.BOTH)])
    rcv = s_m & np.isin(iv.direction, [int(Direction.RECV), int(Direction.BOTH)])
    sends = sorted(zip(iv.start[snd].tolist(), iv.peer[snd].tolist(), strict=True), key=lambda x: x[0])
    recvs = sorted(zip(iv.end[rcv].tolist(), iv.peer[rcv].tolist(), strict=True), key=lambda x: x[0])
    for a, b in zip(g_start, g_end, strict=True):
        v = 0
        after = [(t, p) for t, p in sends if t >= b]
        if after and after[0][0] - b < max(b - a, 1):
            v += 1 if after[0][1] == 2 else -1 if after[0][1] == 0 else 0
        before = [(t, p) for t, p in recvs if t <= a]
        if before:
            v += 1 if before[-1][1] == 0 else -1 if before[-1][1] == 2 else 0
        want.append(v)
    assert got.tolist() == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1_000, 1_000), min_size=1, max_size=40), st.data())
def test_reach_at_is_the_running_maximum(ends: list[int], data: st.DataObject) -> None:
    e = np.array(ends, np.int64)
    q = np.array(data.draw(st.lists(st.integers(0, e.size - 1), max_size=12)), np.int64)
    got = _reach_at(e, q)
    assert got.dtype == np.int64
    assert got.tolist() == np.maximum.accumulate(e)[q].tolist()
