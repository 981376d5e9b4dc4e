"""The clock fit's per-link and per-rank medians as arrays (pipeline/pair_stats.py) against
``np.median`` of each group's values, and the offset lookup against the dict."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.pipeline.pair_stats import group_medians, offsets_of


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(-(2**62), 2**62)),
        max_size=40,
    )
)
def test_group_medians_equal_np_median(rows: list[tuple[int, int]]) -> None:
    key = np.array([k for k, _ in rows], np.int64)
    val = np.array([v for _, v in rows], np.int64)
    ks, med, count, first = group_medians(key, val)
    assert ks.tolist() == sorted(set(key.tolist()))
    for i, k in enumerate(ks.tolist()):
        m = key == k
        assert float(med[i]) == float(np.median(val[m]))
        assert int(count[i]) == int(m.sum())
        assert int(first[i]) == int(np.flatnonzero(m)[0])


def test_group_medians_even_count_is_the_mean_of_the_middle_two() -> None:
    # key 7: values 1, 2, 10, 4 -> sorted 1 2 4 10 -> (2 + 4) / 2 = 3.0; key 3: 5 alone -> 5.0
    ks, med, count, first = group_medians(np.array([7, 7, 3, 7, 7]), np.array([1, 2, 5, 10, 4]))
    assert ks.tolist() == [3, 7] and med.tolist() == [5.0, 3.0]
    assert count.tolist() == [1, 4] and first.tolist() == [2, 0]


def test_offsets_of_reads_the_dict_and_misses_loudly() -> None:
    off = {0: -5, 3: 7, 10: 100}
    assert offsets_of(off, np.array([3, 0, 10, 3])).tolist() == [7, -5, 100, 7]
    with pytest.raises(KeyError):
        offsets_of(off, np.array([0, 4]))
    with pytest.raises(KeyError):
        offsets_of({}, np.array([1]))
