"""Interval algebra against a brute-force reference on random sets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.model import intervals as ivs


def _mask(starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    for s, e in zip(starts, ends, strict=False):
        m[max(s, 0) : max(min(e, n), 0)] = True
    return m


def _random(rng: np.random.Generator, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    s = rng.integers(0, n, size=k)
    e = s + rng.integers(0, n // 5 + 1, size=k)
    return s.astype(np.int64), e.astype(np.int64)


@pytest.mark.parametrize("seed", range(20))
def test_set_operations_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 400  # room for intervals that start near 300 and run up to 60 further
    a = ivs.union(*_random(rng, 12, 300))
    b = ivs.union(*_random(rng, 9, 300))
    ma, mb = _mask(*a, n), _mask(*b, n)
    # union is disjoint, sorted, and non-touching
    assert np.all(a[1] > a[0]) and np.all(a[0][1:] > a[1][:-1])
    assert ivs.measure(a) == ma.sum()
    assert np.array_equal(_mask(*ivs.subtract(a, b), n), ma & ~mb)
    assert np.array_equal(_mask(*ivs.intersect(a, b), n), ma & mb)
    lo, hi = 40, 250
    window = np.zeros(n, dtype=bool)
    window[lo:hi] = True
    assert np.array_equal(_mask(*ivs.clip(a, lo, hi), n), ma & window)
    assert np.array_equal(_mask(*ivs.complement(a, lo, hi), n), window & ~ma)


def test_empty_inputs() -> None:
    e = ivs.empty()
    assert ivs.measure(ivs.union(np.array([5]), np.array([5]))) == 0
    assert ivs.measure(ivs.subtract(e, e)) == 0
    assert ivs.measure(ivs.complement(e, 0, 10)) == 10


def test_window_and_measure_in_agree_with_clip() -> None:
    import numpy as np

    from ppdiag.model import intervals as ivs_

    rng = np.random.default_rng(3)
    s = np.sort(rng.integers(0, 10_000, 200))
    iset = ivs_.union(s, s + rng.integers(1, 80, 200))
    for lo, hi in [(-5, 20_000), (0, 0), (500, 501), (1234, 5678), (9_990, 12_000), (30, 10)]:
        a, b = ivs_.window(iset, lo, hi), ivs_.clip(iset, lo, hi)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        assert ivs_.measure_in(iset, lo, hi) == ivs_.measure(b)


def test_prefix_measure_by_hand() -> None:
    from ppdiag.model import intervals as mivs

    # set [10, 20) and [30, 35): measure before t = 0, 15, 25, 32, 40 -> 0, 5, 10, 12, 15
    iset = mivs.union(np.array([10, 30]), np.array([20, 35]))
    t = np.array([0, 15, 25, 32, 40], np.int64)
    assert mivs.prefix_measure(iset, t).tolist() == [0, 5, 10, 12, 15]
    assert mivs.prefix_measure(mivs.empty(), t).tolist() == [0] * 5


@pytest.mark.parametrize("seed", range(8))
def test_prefix_measure_on_the_padded_set_is_the_reference(seed: int) -> None:
    from ppdiag.model import intervals as mivs

    rng = np.random.default_rng(seed)
    starts = rng.integers(-1000, 1000, int(rng.integers(1, 40)))
    iset = mivs.union(starts, starts + rng.integers(0, 60, starts.size))
    s, e = iset
    lens = e - s
    before = np.concatenate([[0], np.cumsum(lens)])
    # times before, inside, between and after the pieces, at their very bounds, in any order
    t = np.concatenate([rng.integers(-1200, 1200, 200), s, e, s - 1, e + 1]).astype(np.int64)
    rng.shuffle(t)
    want = mivs._prefix_at(s, lens, before, t)
    got = mivs.prefix_measure(iset, t)
    assert got.dtype == np.int64 and got.tolist() == want.tolist()
    # (a slow but obvious check of the reference itself)
    assert want.tolist() == [int(np.clip(np.minimum(e, x) - s, 0, None).sum()) for x in t.tolist()]
    t2 = t[:200].reshape(20, 10)
    assert mivs.prefix_measure(iset, t2).tolist() == mivs._prefix_at(s, lens, before, t2).tolist()


@pytest.mark.parametrize("seed", range(5))
def test_sorted_unique_is_numpy_unique(seed: int) -> None:
    # a few sorted runs (as the callers concatenate them), duplicates within and across runs
    rng = np.random.default_rng(seed)
    runs = [np.sort(rng.integers(-50, 50, int(rng.integers(0, 30)))) for _ in range(int(rng.integers(0, 4)))]
    x = np.concatenate([np.empty(0, np.int64), *runs]).astype(np.int64)
    got = ivs.sorted_unique(x)
    assert got.dtype == np.int64
    assert got.tolist() == np.unique(x).tolist()
    assert ivs.sorted_unique(np.array([7, 3, 7, 3], np.int64)).tolist() == [3, 7]


_ends = st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 12)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(a=_ends, b=_ends, raw_b=st.booleans())
def test_subtract_by_gaps_is_the_sweep(
    a: list[tuple[int, int]], b: list[tuple[int, int]], raw_b: bool
) -> None:
    # ``a`` as given (overlapping, touching, empty intervals); ``b`` a union (sorted, disjoint:
    # the gap path) or as given (unsorted or overlapping: the sweep itself)
    a_s = np.array([s for s, _ in a], dtype=np.int64)
    a_e = a_s + np.array([n for _, n in a], dtype=np.int64)
    b_s = np.array([s for s, _ in b], dtype=np.int64)
    b_e = b_s + np.array([n for _, n in b], dtype=np.int64)
    if not raw_b:
        b_s, b_e = ivs.union(b_s, b_e)
    got = ivs.subtract((a_s, a_e), (b_s, b_e))
    if a_s.size and b_s.size:
        want = ivs._subtract_sweep(a_s, a_e, b_s, b_e)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    # and the point set is a minus b: every integer point in [-60, 70)
    pts = np.arange(-60, 70)
    in_a = ((pts[:, None] >= a_s) & (pts[:, None] < a_e)).any(axis=1)
    in_b = ((pts[:, None] >= b_s) & (pts[:, None] < b_e)).any(axis=1)
    in_got = ((pts[:, None] >= got[0]) & (pts[:, None] < got[1])).any(axis=1)
    assert (in_got == (in_a & ~in_b)).all()


def test_subtract_by_hand() -> None:
    # a = [0, 10) [10, 20) [30, 40); b = [5, 12) [15, 15) [35, 50)
    # → [0, 5) [12, 20) [30, 35): touching pieces merge, the empty b interval cuts nothing
    a = (np.array([0, 10, 30], np.int64), np.array([10, 20, 40], np.int64))
    b = (np.array([5, 15, 35], np.int64), np.array([12, 15, 50], np.int64))
    s, e = ivs.subtract(a, b)
    assert s.tolist() == [0, 12, 30] and e.tolist() == [5, 20, 35]
