""":func:`ppdiag.facts.starts_inside` against the plain definition (a time lies in some [a, b))."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.facts import starts_inside


def test_touching_overlapping_and_empty_spans() -> None:
    # spans [10, 20), [20, 30) touch; [25, 28) lies inside; [40, 40) and [60, 50) are empty
    spans = [(20, 30), (10, 20), (25, 28), (40, 40), (60, 50)]
    t = np.array([9, 10, 19, 20, 29, 30, 40, 55], np.int64)
    assert starts_inside(t, spans).tolist() == [False, True, True, True, True, False, False, False]
    assert starts_inside(t, []).tolist() == [False] * 8


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.integers(-50, 150), max_size=40),
    spans=st.lists(st.tuples(st.integers(-50, 150), st.integers(-50, 150)), max_size=8),
)
def test_matches_the_definition(times: list[int], spans: list[tuple[int, int]]) -> None:
    t = np.array(times, np.int64)
    want = np.zeros(len(t), bool)
    for a, b in spans:
        want |= (t >= a) & (t < b)
    assert starts_inside(t, spans).tolist() == want.tolist()
