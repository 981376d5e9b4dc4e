"""The prefix measure of many query times is taken a chunk of times at a time (bounded
temporaries): the same numbers as in one pass."""

from __future__ import annotations

import numpy as np
import pytest

from ppdiag.model import intervals as ivs


def test_prefix_measure_in_chunks_matches_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    iset = ivs.union(*np.sort(rng.integers(0, 10_000, (2, 300)), axis=0))
    # times before, inside, between and after the intervals, unsorted, and the bounds themselves
    t = np.r_[rng.integers(-100, 10_100, 1_000), iset[0], iset[1]].astype(np.int64)
    one = ivs.prefix_measure(iset, t)
    # by hand at a few times: [0, 5) [10, 20) measures 0, 3, 5, 5, 8, 15 at -1, 3, 7, 10, 13, 25
    small = (np.array([0, 10], np.int64), np.array([5, 20], np.int64))
    at = np.array([-1, 3, 7, 10, 13, 25], np.int64)
    monkeypatch.setattr(ivs, "PREFIX_CHUNK", 4)
    assert ivs.prefix_measure(small, at).tolist() == [0, 3, 5, 5, 8, 15]
    monkeypatch.setattr(ivs, "PREFIX_CHUNK", 97)  # chunks that do not divide the times
    chunked = ivs.prefix_measure(iset, t)
    assert chunked.dtype == np.int64
    assert chunked.tolist() == one.tolist()
