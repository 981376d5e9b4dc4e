"""factorize: codes and distinct values in first-seen order, the same through the dense table as
through the sort (pandas.factorize's answer)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.parsers import nsys_db
from ppdiag.parsers.nsys_db import factorize


def _first_seen(values: list[int]) -> tuple[list[int], list[int]]:
    """The answer by hand: each value's code is the order of its first row."""
    seen: dict[int, int] = {}
    codes = [seen.setdefault(x, len(seen)) for x in values]
    return codes, list(seen)


def test_a_hand_built_column() -> None:
    # names 7, 3, 7, 9, 3 -> codes 0 1 0 2 1, distinct 7 3 9
    codes, uniq = factorize(np.array([7, 3, 7, 9, 3], dtype=np.int64))
    assert codes.tolist() == [0, 1, 0, 2, 1]
    assert uniq.tolist() == [7, 3, 9]
    assert codes.dtype == np.int64


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(-50, 50), min_size=1, max_size=60),
    base=st.sampled_from([0, -(2**63), 2**63 - 101, 1 << 40]),
    dtype=st.sampled_from([np.int64, np.int32, np.int8]),
)
def test_dense_table_gives_first_seen_order(values: list[int], base: int, dtype: type) -> None:
    info = np.iinfo(dtype)
    if dtype is not np.int64:
        base = 0
    vals = [min(max(base + 50 + x, info.min), info.max) for x in values]  # near the type's edges too
    arr: np.ndarray = np.array(vals, dtype=dtype)
    assert nsys_db._factorize_dense(arr) is not None  # a narrow range: the table answers
    codes, uniq = factorize(arr)
    want_codes, want_uniq = _first_seen(vals)
    assert codes.tolist() == want_codes
    assert uniq.tolist() == want_uniq
    assert uniq.dtype == arr.dtype


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=30))
def test_wide_ranges_are_sorted_instead(values: list[int]) -> None:
    arr = np.array(values, dtype=np.int64)
    if max(values) - min(values) > 2 * len(values) + 65536:
        assert nsys_db._factorize_dense(arr) is None
    codes, uniq = factorize(arr)
    want_codes, want_uniq = _first_seen(values)
    assert codes.tolist() == want_codes
    assert uniq.tolist() == want_uniq
