"""The paint's order of the waits (by step, then nearest the step's edges) by one sort of codes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ppdiag.attribution.paint import _order_by


def _two_sorts(g: np.ndarray, d: np.ndarray) -> np.ndarray:
    o = np.argsort(d, kind="stable")
    return o[np.argsort(g[o], kind="stable")]


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(-5, 20)), max_size=80))
def test_one_sort_of_codes_is_the_two_stable_sorts(rows: list[tuple[int, int]]) -> None:
    g = np.array([a for a, _ in rows], np.int64)
    d = np.array([b for _, b in rows], np.int64)
    # ties in (group, distance) keep their input order in both
    assert _order_by(g, d).tolist() == _two_sorts(g, d).tolist()
    assert _order_by(g, d).tolist() == np.lexsort((d, g)).tolist()


def test_distances_too_wide_for_one_code_take_the_two_sorts() -> None:
    g = np.array([1, 0, 1, 0, 2], np.int64)
    d = np.array([2**62, -(2**62), 5, 5, 0], np.int64)
    assert _order_by(g, d).tolist() == [1, 3, 2, 0, 4]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(-3, 9)), max_size=80))
def test_three_keys_are_lexsort(rows: list[tuple[int, int, int]]) -> None:
    a, b, c = (np.array([r[i] for r in rows], np.int64) for i in range(3))
    assert _order_by(a, b, c).tolist() == np.lexsort((c, b, a)).tolist()


def test_three_keys_too_wide_for_one_code_are_lexsort() -> None:
    a = np.array([1, 0, 1, 0], np.int64)
    b = np.array([2**40, 0, 0, 2**40], np.int64)
    c = np.array([2**30, 1, 0, 0], np.int64)
    assert _order_by(a, b, c).tolist() == np.lexsort((c, b, a)).tolist() == [1, 3, 2, 0]
