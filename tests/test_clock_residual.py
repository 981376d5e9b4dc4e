"""A host's residual bounds its offset's error (docs/clocks.md, "What fixes an offset"): the
interval of the fewest broken causal bounds, widened by the spans' jitter measured within a host,
is not enough where one transfer across hosts breaks its bound by more than that jitter; every
link's quartiles bound the offset as well, and the residual reaches the farther end of both."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_host_clock_holds import _bare

from ppdiag.model import Run
from ppdiag.pipeline.clock_bounds import _consistent, flow_residuals
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import _Bound, _refined, _transfer_bounds, fit_host_clocks

US = 1000
SKEW = 5000  # µs: host b's clock reads this far ahead of host a's (its true offset is -5000)


def _pairs(lat_up: list[float], lat_dn: list[float]) -> Pairs:
    """Ranks 0 and 1 on host a, ranks 2 and 3 on host b. Within each host (0 <-> 1, 2 <-> 3) six
    transfers each way take 100 µs (no bound broken: the spans' jitter measured there is 0).
    Across, 1 -> 2 takes ``lat_up`` (µs, one transfer each) and 2 -> 1 ``lat_dn``; a negative
    latency is a send span that opened after its data left. Every receive is posted 10 ms before
    its send began (it waited). True times: transfer i sent at ``20_000 * i`` (plus 10 ms for
    the way back); host b's timestamps read :data:`SKEW` more."""
    rows = [(0, 1, [100.0] * 6), (1, 0, [100.0] * 6), (2, 3, [100.0] * 6), (3, 2, [100.0] * 6)]
    rows += [(1, 2, lat_up), (2, 1, lat_dn)]
    src, dst, ss, rs, re = [], [], [], [], []
    for k, (a, b, lat) in enumerate(rows):
        t = np.arange(len(lat)) * 20_000.0 + 10_000.0 * (k % 2) + 50_000
        src += [a] * len(lat)
        dst += [b] * len(lat)
        ss.append(t + (SKEW if a >= 2 else 0))
        rs.append(t - 10_000 + (SKEW if b >= 2 else 0))
        re.append(t + np.asarray(lat) + (SKEW if b >= 2 else 0))
    send = (np.concatenate(ss) * US).astype(np.int64)
    recv_end = (np.concatenate(re) * US).astype(np.int64)
    rank = np.array(src, np.int32), np.array(dst, np.int32)
    return Pairs(*rank, send, send + 50 * US, (np.concatenate(rs) * US).astype(np.int64), recv_end, False)


def _fit(pairs: Pairs) -> tuple[float, float]:
    """Host b's offset error against the truth and its residual (µs)."""
    run = Run([_bare(0, "a"), _bare(1, "a"), _bare(2, "b"), _bare(3, "b")], "kineto")
    got = fit_host_clocks(run, pairs)
    assert got is not None
    off, clocks, _ = got
    (b,) = [c for c in clocks if c.host == "b"]
    assert b.residual_ns is not None and b.se_ns is not None and b.se_ns <= b.residual_ns
    return abs(off[2] + SKEW * US) / US, b.residual_ns / US


def test_one_late_span_across_hosts_stays_within_the_residual() -> None:
    # D = o_b - o_a, truth -5000 µs; below relative to it. 1 -> 2: two transfers of 100 µs, eight
    # of 2000 (queued): lower bounds -100 (2) and -2000 (8). 2 -> 1: nine of 100 µs and one whose
    # send span opened 150 µs after its data left (-50): upper bounds +100 (9) and -50 (1).
    # The fewest broken bounds (none): [-100, -50], which excludes the truth; the jitter within a
    # host is 0. The middle of the quartiles, (-2000 + 100) / 2 = -950, is 950 µs off: the
    # farther end of [-100, -50] from there, 900 µs, would be a residual the truth breaks.
    # Placed with the usual latency measured within the hosts (100 µs), 2 -> 1 places it, as
    # 1 -> 2's receives nearly all end late: 8.732 µs off (the weighted mean of the two ways).
    # The link's quartile interval [-2000, +100] holds the truth; the residual reaches its
    # farther end: 2000 - 8.732 = 1991.268 µs.
    pairs = _pairs([100.0] * 2 + [2000.0] * 8, [100.0] * 9 + [-50.0])
    err, resid = _fit(pairs)
    assert abs(err - 8.732) < 0.01 and abs(resid - 1991.268) < 0.01
    # the interval of the fewest broken bounds, as the middle of the quartiles moves it, misses
    # the truth: placed there, its half-width is below the error
    lows, highs, waits = _transfer_bounds(pairs, [0, 0, 1, 1], [0, 1, 2, 3], np.zeros(len(pairs)))
    lo, hi, _ = _consistent(lows[(0, 1)][0], highs[(0, 1)][0])
    assert lo is not None and hi is not None
    assert (round(lo / US), round(hi / US)) == (-5100, -5050)
    placed, _ = _refined(_Bound(0, 1, lo, hi, 20), waits[(0, 1)])
    mid_off = abs((placed.lo + placed.hi) / 2 / US + SKEW)  # 950 µs
    assert placed.hi < -SKEW * US and abs(mid_off - 950) < 0.01
    assert (placed.hi - placed.lo) / 2 / US < mid_off  # 900 µs: no bound


def test_links_alike_keep_a_tight_residual() -> None:
    # every way 100 µs, no late span: bounds -100 and +100, the quartiles the same; residual 100
    err, resid = _fit(_pairs([100.0] * 10, [100.0] * 10))
    assert err == 0 and abs(resid - 100) < 1


@settings(max_examples=200, deadline=None)
@given(
    up=st.lists(st.floats(0, 3000), min_size=5, max_size=16),
    dn=st.lists(st.floats(0, 3000), min_size=5, max_size=16),
    late=st.floats(0, 400),
    up_late=st.booleans(),
)
def test_the_truth_is_within_the_residual(
    up: list[float], dn: list[float], late: float, up_late: bool
) -> None:
    # latencies of any asymmetry, one send span across hosts opened up to 400 µs after its data
    # left (the jitter within a host is 0): a quarter of a link's transfers are never late, so its
    # quartiles hold the offset and the residual reaches them (the residual of the fewest broken
    # bounds alone fails here within 200 examples: up = [2, 4, 4, 4, 4] µs, back 0 but one send
    # span 2 µs late: the interval [-2, -2] from the truth, placed at -2, residual 0: 2 µs off)
    (up if up_late else dn)[0] = -late
    err, resid = _fit(_pairs(up, dn))
    assert err <= resid + 1


def test_a_host_behind_another_carries_both_pairs() -> None:
    # a chain: host 0 (reference) - host 1, residual 100 µs; host 1 - host 2, 50 µs. Host 2's
    # offset is the sum of both pairs' differences: off by up to 150 µs (its own pair's 50 was
    # the residual before)
    got = flow_residuals(3, [(0, 1, 4.0, 100.0), (1, 2, 9.0, 50.0)])
    assert got == [0.0, 100.0, 150.0]
    # a triangle of equal weights: 2/3 of host 2's flow takes its own pair to 0 (300), 1/3 the
    # way through host 1 (30 + 60): 200 + 30 = 230; host 1: 2/3 * 60 + 1/3 * (30 + 300) = 150
    got = flow_residuals(3, [(0, 1, 1.0, 60.0), (1, 2, 1.0, 30.0), (0, 2, 1.0, 300.0)])
    assert [round(x or 0.0, 6) for x in got] == [0.0, 150.0, 230.0]
    # a host no pair links has none
    assert flow_residuals(3, [(0, 1, 1.0, 10.0)])[2] is None
