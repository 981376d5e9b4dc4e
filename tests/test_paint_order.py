"""The paint's order of the waits (by step, then nearest the step's edges) by one sort of codes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ppdiag.attribution.paint import _by_group_then


def _two_sorts(g: np.ndarray, d: np.ndarray) -> np.ndarray:
    o = np.argsort(d, kind="stable")
    return o[np.argsort(g[o], kind="stable")]


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(-5, 20)), max_size=80))
def test_one_sort_of_codes_is_the_two_stable_sorts(rows: list[tuple[int, int]]) -> None:
    g = np.array([a for a, _ in rows], np.int64)
    d = np.array([b for _, b in rows], np.int64)
    # ties in (group, distance) keep their input order in both
    assert _by_group_then(g, d).tolist() == _two_sorts(g, d).tolist()


def test_distances_too_wide_for_one_code_take_the_two_sorts() -> None:
    g = np.array([1, 0, 1, 0, 2], np.int64)
    d = np.array([2**62, -(2**62), 5, 5, 0], np.int64)
    assert _by_group_then(g, d).tolist() == [1, 3, 2, 0, 4]
