"""Host clocks where one direction of a link ends its receives late: the host's usual latency,
measured where the clock is known (ranks of one host), lets each direction place the offset on
its own, weighed by how far its quartile sits above its least one-way times (docs/clocks.md,
"What fixes an offset"). The middle of the two directions is half the late direction's delay off.
"""

from __future__ import annotations

import numpy as np
from test_host_clock_holds import _bare

from ppdiag.model import Run
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import fit_host_clocks
from ppdiag.pipeline.link_places import host_latency

US = 1000
STEPS = np.arange(5) * 20_000  # µs


def _pairs() -> Pairs:
    """Ranks 0 and 1 on host a, rank 2 on host b, whose clock reads 5000 µs ahead. Per step, true
    times (µs), every receive posted long before its send began:

    * 0 -> 1: sent 1000, arrives 1100; 1 -> 0: sent 3000, arrives 3100 (the host's latency, 100);
    * 1 -> 2: sent 5000, arrives 5100 = 10100 on b's clock (every step: latency 100);
    * 2 -> 1: sent 9000 = 14000 on b's clock, its receive on rank 1 ends 100, 1100, 2100, 2100,
      2100 later in the five steps (queued behind rank 1's own ops).
    """
    late = np.array([100, 1100, 2100, 2100, 2100])
    t = np.tile(STEPS, 4)
    send_start = t + np.repeat([1000, 3000, 5000, 14000], 5)
    recv_end = t + np.concatenate([np.full(5, 1100), np.full(5, 3100), np.full(5, 10100), 9000 + late])
    return Pairs(
        np.repeat([0, 1, 1, 2], 5).astype(np.int32),
        np.repeat([1, 0, 2, 1], 5).astype(np.int32),
        send_start * US,
        (send_start + 50) * US,
        (t + np.repeat([0, 2000, 8000, 7000], 5)) * US,
        recv_end * US,
        False,
    )


def test_the_host_latency_is_measured_within_the_host() -> None:
    # links 0 -> 1 and 1 -> 0: lower quartile 100 µs each, no spread
    dom = {0: "a", 1: "a", 2: "b"}
    assert host_latency(_pairs(), dom, np.zeros(20)) == (100_000.0, 0.0)


def test_a_late_direction_does_not_drag_the_offset() -> None:
    # D = o_b - o_a, truth -5000 µs. 1 -> 2 bounds D >= 5000 - 10100 = -5100 (every step); 2 -> 1
    # D <= recv_end - 14000: -4900, -3900, -2900, -2900, -2900. Their quartiles, -5100 and -3900,
    # have the middle -4500 (500 µs off). With the latency 100 each places it on its own: -5000
    # and -4000, off by as much as their quartile sits above their least one-way times (5 %
    # quantile: 0 and 800 µs) plus 50: weights 1 / 50^2 and 1 / 850^2, so -5000 + 1000 / 290
    # = -4996.6 µs.
    run = Run([_bare(0, "a"), _bare(1, "a"), _bare(2, "b")], "kineto")
    got = fit_host_clocks(run, _pairs())
    assert got is not None
    off, _, _ = got
    assert off[0] == off[1] == 0
    assert abs(off[2] - (-5_000_000 + 1_000_000 / 290)) <= 1
