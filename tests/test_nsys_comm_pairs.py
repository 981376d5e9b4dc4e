"""The distinct (group, peer) pairs of the NCCL projection match numpy's row-wise unique."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ppdiag.parsers.nsys_comm import _pairs

_VALUES = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9)), max_size=60)


@given(_VALUES)
def test_pairs_are_numpys_unique_columns(rows: list[tuple[int, int]]) -> None:
    k = np.array([a for a, _ in rows], np.int64)
    p = np.array([b for _, b in rows], np.int64)
    got = _pairs(k, p)
    want = np.unique(np.stack([k, p]), axis=1) if rows else np.empty((2, 0), np.int64)
    assert got.dtype == np.int64 and got.shape == want.shape
    assert got.tolist() == want.tolist()


def test_pairs_with_huge_peers_take_the_generic_path() -> None:
    # codes k * (max peer + 1) + p would overflow int64
    k = np.array([3, 1, 3, 1], np.int64)
    p = np.array([2**61, 5, 2**61, 7], np.int64)
    assert _pairs(k, p).tolist() == [[1, 1, 3], [5, 7, 2**61]]


def test_pairs_in_key_then_peer_order() -> None:
    # groups 0..2 with peers given out of order: sorted by group, then peer
    k = np.array([2, 0, 2, 1, 0, 0], np.int64)
    p = np.array([1, 3, 0, 2, 3, 1], np.int64)
    assert _pairs(k, p).tolist() == [[0, 0, 1, 2, 2], [1, 3, 2, 0, 1]]
