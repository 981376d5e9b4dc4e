"""Host clocks across a held send: a rank whose sends leave late (its ``gloo:send`` span opens at
the issue, the data leaves a hold later) must not put the offset of another host half the hold
off (docs/clocks.md, "What fixes an offset"). The hold is measured where the clock is known, on
the rank's links within its host, and taken off the one-way times of its links to other hosts
where their round trip (no clock in it) holds it.
"""

from __future__ import annotations

import numpy as np

from ppdiag.model import Intervals, Ranges, RankTimeline, Run
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import fit_host_clocks

US = 1000
STEPS = np.arange(5) * 20_000  # µs; five steps: five transfers per link and direction


def _bare(rank: int, host: str) -> RankTimeline:
    return RankTimeline(
        rank, f"rank{rank}", "kineto", [""], Intervals.empty(), Ranges.empty(), cpu_only=True,
        meta={"host_name": host},
    )  # fmt: skip


def _as_pairs(send_start: np.ndarray, recv_start: np.ndarray, recv_end: np.ndarray) -> Pairs:
    """The four links 0 -> 1, 1 -> 0, 1 -> 2, 2 -> 1, five transfers each, from µs times (a send
    call lasts 50 µs)."""
    src, dst = np.repeat([0, 1, 1, 2], 5), np.repeat([1, 0, 2, 1], 5)
    return Pairs(
        src.astype(np.int32),
        dst.astype(np.int32),
        send_start * US,
        (send_start + 50) * US,
        recv_start * US,
        recv_end * US,
        False,
    )


def _pairs(cross_held: bool) -> Pairs:
    """Ranks 0 and 1 on host a, rank 2 on host b, whose clock reads 5000 µs ahead. Rank 1 holds
    its sends 3000 µs (``cross_held``: on every link; else on its link within host a only, a slow
    link and no hold of the rank). Latency 100 µs within a host, 150 µs across. Per step, true
    times (µs), every receive posted before its send began (it waited for the data):

    * 0 -> 1: sent 1000, arrives 1100 (one-way 100: the host's usual time);
    * 1 -> 0: sent 4000, leaves 7000, arrives 7100 (one-way 3100: the hold is 3100 - 100 = 3000);
    * 1 -> 2: sent 8000, leaves 11000 (or 8000), arrives 11150 (8150) = 16150 (13150) on b's clock;
    * 2 -> 1: sent 14000 = 19000 on b's clock, arrives 14150 (receive posted 11500).
    """
    t = np.tile(STEPS, 4)
    cross_end = 16150 if cross_held else 13150
    send_start = t + np.repeat([1000, 4000, 8000, 19000], 5)
    recv_start = t + np.repeat([500, 3500, 12500, 11500], 5)
    recv_end = t + np.repeat([1100, 7100, cross_end, 14150], 5)
    return _as_pairs(send_start, recv_start, recv_end)


def test_a_held_sender_does_not_move_the_other_host() -> None:
    # D = o_b - o_a, truth -5000 µs. The causal bounds: 1 -> 2 gives D >= 8000 - 16150 = -8150,
    # 2 -> 1 gives D <= 14150 - 19000 = -4850; their middle, -6500, is half the hold off. Counted
    # from when the data left (8000 + 3000), the receives that waited give 11000 - 16150 = -5150
    # and -4850: the middle -5000. The round trip 8150 + (-4850) = 3300 holds the 3000 µs hold
    # beside two usual latencies (200).
    run = Run([_bare(0, "a"), _bare(1, "a"), _bare(2, "b")], "kineto")
    got = fit_host_clocks(run, _pairs(cross_held=True))
    assert got is not None
    off, clocks, _ = got
    assert off == {0: 0, 1: 0, 2: -5_000_000}
    # the residual keeps the causal interval: its half-width 1650 plus the move of 1500
    assert [(c.host, c.residual_ns) for c in clocks] == [("a", 0), ("b", 3_150_000)]


def test_one_slow_link_within_a_host_is_no_hold_across() -> None:
    # rank 1's link to rank 0 is slow, its link to rank 2 is not: 1 -> 2 gives D >= 8000 - 13150
    # = -5150 and 2 -> 1 D <= -4850, middle -5000 (the truth). The round trip 5150 - 4850 = 300
    # cannot hold 3000 µs, so no hold is taken off (with it the middle would be (-2150 - 4850) / 2
    # = -3500).
    run = Run([_bare(0, "a"), _bare(1, "a"), _bare(2, "b")], "kineto")
    got = fit_host_clocks(run, _pairs(cross_held=False))
    assert got is not None
    off, _, _ = got
    assert off == {0: 0, 1: 0, 2: -5_000_000}


def _jittered_pairs() -> Pairs:
    """As :func:`_pairs` (rank 1 holds every send 3000 µs, host b 5000 µs ahead), with every
    link's latency 50 µs in steps 0-1 and 150 µs in steps 2-4 (median 150, lower quartile 50):

    * 0 -> 1: sent 1000, arrives 1000 + lat (the host's usual one-way time: median 150);
    * 1 -> 0: sent 4000, leaves 7000, arrives 7000 + lat (median 3150: the hold is 3000);
    * 1 -> 2: sent 8000, leaves 11000, arrives 11000 + lat = 16000 + lat on b's clock;
    * 2 -> 1: sent 14000 = 19000 on b's clock, arrives 14000 + lat (receive posted 11500).
    """
    lat = np.array([50, 50, 150, 150, 150])
    t = np.tile(STEPS, 4)
    send_start = t + np.repeat([1000, 4000, 8000, 19000], 5)
    recv_start = t + np.repeat([500, 3500, 12500, 11500], 5)
    recv_end = t + np.repeat([1000, 7000, 16000, 14000], 5) + np.tile(lat, 4)
    return _as_pairs(send_start, recv_start, recv_end)


def test_a_hold_measured_by_medians_fits_a_round_trip_of_lower_quartiles() -> None:
    # The hold is the median excess: 3150 - 150 = 3000 µs. The link 1 - 2's round trip, lower
    # quartiles (no clock in it): (8000 + 50) + (-5000 + 50) = 3100; less two usual latencies
    # (medians, 300) it is 2800, short of the hold by the quantiles' difference alone. Taken off
    # anyway (within half the host ops' jitter), the waited receives place D = o_b - o_a at the
    # middle of the upper quartile of 1 -> 2's bounds (11000 - 16050 = -5050) and the lower
    # quartile of 2 -> 1's (14050 - 19000 = -4950): -5000, the truth. Refused, the hold stays in
    # 1 -> 2 (8000 - 16050 = -8050) and the middle is (-8050 - 4950) / 2 = -6500, half the hold off.
    run = Run([_bare(0, "a"), _bare(1, "a"), _bare(2, "b")], "kineto")
    got = fit_host_clocks(run, _jittered_pairs())
    assert got is not None
    off, _, _ = got
    assert off == {0: 0, 1: 0, 2: -5_000_000}


def test_sends_queued_now_and_then_are_no_hold() -> None:
    # Ranks 0 and 1 on host a, rank 2 on b (5000 µs ahead). Rank 1's sends to rank 0 leave 3000
    # µs late in steps 2-4 only (queued behind other ops; one-way 100 in steps 0-1, 3100 after):
    # its median excess is 3000 µs, its lower quartile's 0, so no hold. Across, both directions
    # take 1750 µs (queued too, no clock in their 3500 µs round trip, room for a 3000 µs hold):
    # 1 -> 2 sent 8000, arrives 9750 = 14750 on b's clock; 2 -> 1 sent 14000 = 19000 on b's
    # clock, arrives 15750. D = o_b - o_a: (8000 - 14750 + 15750 - 19000) / 2 = -5000, the
    # truth. A 3000 µs hold taken off 1 -> 2 would put it at (11000 - 14750 - 3250) / 2 = -3500.
    t = np.tile(STEPS, 4)
    late = np.tile(np.array([0, 0, 3000, 3000, 3000]), 4) * np.repeat([0, 1, 0, 0], 5)
    send_start = t + np.repeat([1000, 4000, 8000, 19000], 5)
    pairs = Pairs(
        np.repeat([0, 1, 1, 2], 5).astype(np.int32),
        np.repeat([1, 0, 2, 1], 5).astype(np.int32),
        send_start * US,
        (send_start + 50) * US,
        (t + np.repeat([500, 3500, 12500, 11500], 5)) * US,
        (t + np.repeat([1100, 4100, 14750, 15750], 5) + late) * US,
        False,
    )
    run = Run([_bare(0, "a"), _bare(1, "a"), _bare(2, "b")], "kineto")
    got = fit_host_clocks(run, pairs)
    assert got is not None
    assert got[0] == {0: 0, 1: 0, 2: -5_000_000}
