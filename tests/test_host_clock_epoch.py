"""Host clocks on epoch timestamps: a trace's ns since the epoch lie past 2^53, where a float is
256 ns coarse. The "waited" test of a receive (posted before its send began, on a fitted clock)
compared such floats, and a skew rounded there moved a receive across it: a recorded ZBV run,
rank 3 moved 1 ms behind, was 194 µs off the same split without skew. The starts are taken from
one integer origin first, so a skew shifts them by exactly itself."""

from __future__ import annotations

import numpy as np

from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import _transfer_bounds

EPOCH = 1_733_000_000_000_000_123  # ns: December 2024, odd on purpose (not a multiple of 256)


def _pairs(skew: int) -> Pairs:
    """Rank 0 (host 0) sends to rank 1 (host 1) and back; host 1 reads ``skew`` ns ahead. The
    receive on rank 1 is posted 1_000_001 ns before its send began; rank 0's, 777 ns before."""
    send_start = np.array([EPOCH, EPOCH + 5_000_000 + skew], np.int64)
    recv_start = np.array([EPOCH - 1_000_001 + skew, EPOCH + 5_000_000 - 777], np.int64)
    recv_end = np.array([EPOCH + 100_000 + skew, EPOCH + 5_100_000], np.int64)
    src, dst = np.array([0, 1], np.int32), np.array([1, 0], np.int32)
    return Pairs(src, dst, send_start, send_start + 50_000, recv_start, recv_end, False)


def test_posted_before_the_send_to_the_ns() -> None:
    for skew in (0, 1_000_000, -1_000_000, 60_000_000_000 + 1):
        _, _, waits = _transfer_bounds(_pairs(skew), [0, 1], [0, 1], np.zeros(2))
        _, s_up, r_up, _, s_dn, r_dn, *_ = waits[(0, 1)]
        # on the run's own clocks, each exactly: the receive's start less its send's
        assert float(r_up[0] - s_up[0]) == -1_000_001 + skew
        assert float(r_dn[0] - s_dn[0]) == -777 - skew
