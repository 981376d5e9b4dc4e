"""The clock fit's per-link equations and per-rank residuals, grouped by rank pair and by rank
(ppdiag/pipeline/clocks.py), on hand-built transfers."""

from __future__ import annotations

import numpy as np

from ppdiag.pipeline.clocks import Pairs, _p2p_rows, _transfer_residuals


def _pairs() -> Pairs:
    # six transfers (ns): 0->1 three times, 1->2 twice, one a rank sends itself (2->2)
    #   pair        0     1     2     3     4     5
    #   link       0->1  1->2  0->1  1->2  0->1  2->2
    #   send_end - recv_end: 10, 5, 20, 7, 40, 1; the receive posted before the send started
    #   (recv_start <= send_start) on all but pair 4; every send lasts 50 ns but pair 5 (100)
    i64 = np.int64
    return Pairs(
        np.array([0, 1, 0, 1, 0, 2], np.int32),
        np.array([1, 2, 1, 2, 1, 2], np.int32),
        np.array([50, 150, 250, 350, 450, 600], i64),
        np.array([100, 200, 300, 400, 500, 700], i64),
        np.array([40, 140, 240, 340, 455, 590], i64),
        np.array([90, 195, 280, 393, 460, 699], i64),
        True,
    )


def test_one_equation_per_directed_rank_pair() -> None:
    # all pairs: 0->1 median(10, 20, 40) = 20 over 3; 1->2 median(5, 7) = 6; 2->2: 1
    assert _p2p_rows(_pairs(), None) == [(0, 1, 20.0, 3), (1, 2, 6.0, 2), (2, 2, 1.0, 1)]
    # given a solution (all offsets 0), only pairs whose receive was posted first: pair 4 is out,
    # 0->1 median(10, 20) = 15 over 2
    prior = ({0: 0, 1: 0, 2: 0}, 0)
    assert _p2p_rows(_pairs(), prior) == [(0, 1, 15.0, 2), (1, 2, 6.0, 2), (2, 2, 1.0, 1)]


def test_residual_per_rank_counts_each_transfer_for_both_ends_once() -> None:
    # on the waited pairs (all but 4): residuals 10, 5, 20, 7, 1. Rank 0 sends pairs 0, 2:
    # median(10, 20) = 15 ns; rank 1 pairs 0-3: median(5, 7, 10, 20) = 8.5 ns; rank 2 pairs 1,
    # 3, 5 (its own transfer once): median(1, 5, 7) = 5 ns. Latency: median send 50 ns.
    resid, by_rank, latency = _transfer_residuals(_pairs(), {0: 0, 1: 0, 2: 0}, [0, 1, 2])
    assert resid.tolist() == [10, 5, 20, 7, 1]
    assert by_rank == {0: 0.015, 1: 0.0085, 2: 0.005}
    assert latency == 0.05
