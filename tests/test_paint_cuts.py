"""The paint's sweeps (segment cover, cut points) against the searches they replace."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ppdiag.attribution.paint import _covers, _cut_points, _points
from ppdiag.model import intervals as ivs


def _covers_by_search(pts: np.ndarray, iset: ivs.ISet) -> np.ndarray:
    """The former cover: the piece of the last start at or before each segment's start."""
    s, e = iset
    seg_s = pts[:-1]
    if s.size == 0:
        return np.zeros(seg_s.size, np.bool_)
    j = np.searchsorted(s, seg_s, side="right") - 1
    return (j >= 0) & (seg_s < e[np.maximum(j, 0)])


def _cut_points_by_search(cum: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, ...]:
    pos = ivs.sorted_unique(np.concatenate([[0], cum, bounds]).astype(np.int64))
    lo = pos[:-1]
    return pos, np.searchsorted(cum, lo, side="right"), np.searchsorted(bounds, lo, side="right")


_pieces = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=12)


@given(_pieces, st.lists(st.integers(-3, 90), max_size=30), st.booleans())
def test_cover_sweep_is_the_search(pieces: list[tuple[int, int]], extra: list[int], own: bool) -> None:
    # pieces laid one after another (gap, length), zero lengths and touching pieces included
    s, e, t = [], [], 0
    for gap, n in pieces:
        s.append(t + gap)
        e.append(t + gap + n)
        t += gap + n
    iset = (np.array(s, np.int64), np.array(e, np.int64))
    # the set's bounds among the points (as the paint has them) or points that miss some of them
    pts = ivs.sorted_unique(np.array(extra + (s + e if own else []), np.int64))
    assert _covers(pts, iset).tolist() == _covers_by_search(pts, iset).tolist()


def test_cover_of_overlapping_pieces_keeps_the_last_start() -> None:
    # [0, 10) and [2, 4): the search asks the piece of the last start only, and so does the fallback
    pts = np.array([0, 2, 4, 10], np.int64)
    iset = (np.array([0, 2], np.int64), np.array([10, 4], np.int64))
    assert _covers(pts, iset).tolist() == _covers_by_search(pts, iset).tolist() == [True, True, False]


def test_cover_sweep_by_hand() -> None:
    # segments [0,3) [3,5) [5,9) [9,12); pieces [3,5) and [5,9) touch, [12,12) is empty
    pts = np.array([0, 3, 5, 9, 12], np.int64)
    iset = (np.array([3, 5, 12], np.int64), np.array([5, 9, 12], np.int64))
    assert _covers(pts, iset).tolist() == [False, True, True, False]


@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=15),
    st.lists(st.integers(0, 200), max_size=15),
)
def test_cut_points_slotted_are_the_sort_and_searches(lengths: list[int], raw: list[int]) -> None:
    cum = np.cumsum(np.array(lengths, np.int64))
    bounds = np.sort(np.minimum(np.array(raw, np.int64), int(cum[-1])))
    got = _cut_points(cum, bounds)
    want = _cut_points_by_search(cum, bounds)
    assert [x.tolist() for x in got] == [x.tolist() for x in want]


def test_cut_points_by_hand() -> None:
    # pieces of 3 and 4 ns end at 3 and 7; takes end at 0, 3 (an end already) and 5
    pos, k, nb = _cut_points(np.array([3, 7], np.int64), np.array([0, 3, 5], np.int64))
    assert pos.tolist() == [0, 3, 5, 7]
    assert k.tolist() == [0, 1, 1]  # ends at or before 0, 3, 5
    assert nb.tolist() == [1, 2, 3]  # bounds at or before 0, 3, 5


def test_cut_points_of_an_unsorted_or_empty_piece_take_the_searches() -> None:
    cum = np.array([2, 2, 5], np.int64)  # a piece of no length
    bounds = np.array([1, 5], np.int64)
    got = _cut_points(cum, bounds)
    assert [x.tolist() for x in got] == [x.tolist() for x in _cut_points_by_search(cum, bounds)]


@given(st.lists(st.lists(st.integers(-20, 20), max_size=12), min_size=1, max_size=5))
def test_points_are_the_unique_sort_and_each_values_index(arrays: list[list[int]]) -> None:
    arrs = [np.array(a, np.int64) for a in arrays]
    pts, at = _points(arrs)
    want = ivs.sorted_unique(np.concatenate(arrs))
    assert pts.tolist() == want.tolist()
    assert [x.tolist() for x in at] == [np.searchsorted(want, a).tolist() for a in arrs]
