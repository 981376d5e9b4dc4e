"""Host clocks over several links between two hosts: each link (two ranks) places the offset from
its own waited receives both ways, weighed by its round trip (docs/clocks.md, "What fixes an
offset"). A link whose receives end late (gloo runs a rank's ops in order: a receive completes
behind the ops queued before it) has a long round trip; pooled with a link that does not queue,
its quartiles would set the place.
"""

from __future__ import annotations

import numpy as np
from handbuilt_pairs import pairs_us
from test_host_clock_holds import _bare

from ppdiag.model import Run
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import _Bound, _refined, fit_host_clocks

US = 1000
SKEW = 5000  # µs: host b's clock reads this far ahead of host a's


def _pairs(queued_ms: float) -> Pairs:
    """Rank 0 alone on host a; ranks 1, 2, 3 on host b. Latency 100 µs every way, every receive
    posted 500 µs before its send began. Link 0 <-> 1: five transfers each way. Link 0 <-> 3 (a
    looped schedule's last stage back to the first rank): fifteen each way, and rank 3's receives
    from rank 0 end ``queued_ms`` late (queued behind its own ops). True times (µs), transfer i
    sent at ``1000 * i`` (0 -> 1, 0 -> 3) and ``1000 * i + 500`` (1 -> 0, 3 -> 0); host b's
    timestamps read :data:`SKEW` more."""
    rows = [(0, 1, 5, 0, 0.0), (1, 0, 5, 500, 0.0), (0, 3, 15, 0, queued_ms * 1000), (3, 0, 15, 500, 0.0)]
    src, dst, ss, rs, re = [], [], [], [], []
    for a, b, n, at, late in rows:
        t = np.arange(n) * 1000.0 + at + 20_000
        src += [a] * n
        dst += [b] * n
        ss.append(t + (SKEW if a else 0))
        rs.append(t - 500 + (SKEW if b else 0))
        re.append(t + 100 + late + (SKEW if b else 0))
    return pairs_us(src, dst, ss, rs, re)


def _fit(queued_ms: float) -> int:
    run = Run([_bare(0, "a"), _bare(1, "b"), _bare(2, "b"), _bare(3, "b")], "kineto")
    got = fit_host_clocks(run, _pairs(queued_ms))
    assert got is not None
    off, _, _ = got
    assert off[1] == off[2] == off[3]
    return off[1]


def test_a_queued_link_does_not_move_the_offset() -> None:
    # D = o_b - o_a, truth -5000 µs. Lower bounds (0 -> b): 0 -> 1 gives -5100 (5), 0 -> 3 gives
    # -7100 (15: 2000 µs queued); upper bounds (b -> 0): -4900 (20). Pooled, the upper quartile of
    # the lower ones is -6600 (20 values, 15 of the queued link) and the middle -5750: 750 µs off.
    # Per link: 0 <-> 1 places -5000 with a round trip of 200 (half 100), 0 <-> 3 places -6000 with
    # a round trip of 2200 (half 1100); weighed 1 / 100^2 and 1 / 1100^2: (-5000 - 6000 r) / (1 + r)
    # with r = (100 / 1100)^2 = 0.00826, -5008 µs.
    assert abs(_fit(2.0) + 5_008_200) < 1_000


def test_links_alike_place_the_truth() -> None:
    # no queue: every link places -5000 (the middle of -5100 and -4900), pooled or per link
    assert _fit(0.0) == -5_000_000


def test_waiting_is_judged_on_the_placed_clock() -> None:
    # One link, the true offset 0. a -> b: 10 receives posted 500 µs before their send began,
    # one-way 100 (bound -100); 30 posted 1000 µs after it (they did not wait), ending 50 later
    # (bound -1050). b -> a: 20 receives posted 5000 µs early, one-way 100 (bound +100). The causal
    # interval [-3100, -2900] is off (as transfers that queue put it): judged at its middle -3000,
    # the late receives count as waiting (posted at +1000 - 3000 < -200), the upper quartile of the
    # 40 lower bounds is -1050 + 0.25 * 950 = -812.5 and the place (-812.5 + 100) / 2 = -356.25.
    # Judged again at -356.25 only the 10 that waited count: (-100 + 100) / 2 = 0.
    t = np.arange(40) * 10_000.0
    late = np.arange(40) >= 10
    s_up = t
    r_up = np.where(late, t + 1000, t - 500)
    lo = s_up - np.where(late, t + 1050, t + 100)
    s_dn = np.arange(20) * 10_000.0 + 5000
    hi = np.full(20, 100.0)
    cols = (lo, s_up, r_up, hi, s_dn, s_dn - 5000, lo * 0, hi * 0)
    w = (*(np.asarray(x * US, np.float64) for x in cols), np.ones(40), np.ones(20))
    placed, _ = _refined(_Bound(0, 1, -3_100_000, -2_900_000, 60), w)
    assert (placed.lo + placed.hi) / 2 == 0
