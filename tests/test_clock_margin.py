"""The clock margin (docs/clocks.md, "How well an offset is known"): a comparison of two ranks'
times across hosts is decided within the standard error of their hosts' offsets; within a host
the margin is 0 and nothing changes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from test_link_latency import gloo_gpipe, whole_transfers

from ppdiag.model import RankTimeline
from ppdiag.pipeline.clock_se import capped, host_errors, mean_se
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import _place_link
from ppdiag.pipeline.placement_error import known_clock_error

US = 1000


def _gpipe_late_post() -> dict[int, RankTimeline]:
    """:func:`test_link_latency.gloo_gpipe` with stage 1's first receive posted at 1020-1070 and
    waiting (1070-6010) through the transfer: its wait begins 30 µs after the issue (1040), as a
    clock 30 µs off would show a wait that began 30 µs before it."""
    return gloo_gpipe(1020, 1070, 1030)


def _on_hosts(tls: dict[int, RankTimeline], se_us: int) -> dict[int, RankTimeline]:
    """Rank 0 on the reference host, rank 1 on another whose offset is known to ``se_us``."""
    return {
        0: dataclasses.replace(tls[0], clock_domain="host-a", clock_se_ns=0),
        1: dataclasses.replace(tls[1], clock_domain="host-b", clock_se_ns=se_us * US),
    }


def test_a_wait_that_began_within_the_clock_margin_after_the_issue_times_the_whole_transfer() -> None:
    # the first transfer: 6010 - max(issue 1040, wait start 1070) = 4940 µs; its wait began 30 µs
    # after the issue
    tls = _gpipe_late_post()
    # one host: the times are on one clock, 30 µs after is after: only what was left was timed
    assert whole_transfers(tls) == [((0, 1, 10), False), ((0, 1, 10), False), ((0, 1, 4940), False)]
    # two hosts whose offset is known to 50 µs: 30 µs is too close to tell, the wait counts whole
    assert whole_transfers(_on_hosts(tls, 50)) == [
        ((0, 1, 10), False),
        ((0, 1, 10), False),
        ((0, 1, 4940), True),
    ]
    # known to 20 µs: 30 µs after is after again
    assert whole_transfers(_on_hosts(tls, 20))[-1] == ((0, 1, 4940), False)


def test_the_margin_of_two_ranks_is_their_hosts_errors_in_quadrature() -> None:
    tls = _on_hosts(_gpipe_late_post(), 40)
    c = dataclasses.replace(tls[1], rank=2, clock_domain="host-c", clock_se_ns=30 * US)
    assert tls[0].clock_margin_ns(tls[1]) == 40 * US
    assert tls[1].clock_margin_ns(c) == 50 * US  # hypot(40, 30)
    # one host: 0, whatever each rank's error against the reference
    assert tls[1].clock_margin_ns(dataclasses.replace(c, clock_domain="host-b")) == 0


def test_host_errors_add_in_quadrature_along_the_best_path() -> None:
    # hosts 0-1 (30), 1-2 (40), 0-2 (100): host 2 is reached through 1 (hypot 50 < 100); host 3
    # is linked to nothing
    got = host_errors(4, {(0, 1): 30.0, (1, 2): 40.0, (0, 2): 100.0})
    assert got[:3] == [0.0, 30.0, 50.0] and got[3] is None
    assert capped(50.0, 20.0) == 20 and capped(None, 20.0) == 20 and capped(5.0, None) is None


def test_mean_se_is_the_robust_spread_over_the_root_of_the_count() -> None:
    # 100 values, interquartile range 1.349 µs (a normal spread of 1 µs): 0.1 µs; one far
    # outlier does not move it
    v = np.quantile(np.random.default_rng(0).normal(0, 1.0, 100_000), np.linspace(0.005, 0.995, 100))
    assert abs(mean_se(v) - 0.1) < 0.005
    assert abs(mean_se(np.r_[v[:-1], 1e6]) - mean_se(v)) < 0.005


def test_the_placement_error_is_measured_on_links_within_a_host() -> None:
    # one host, ranks 0 and 1; every receive waited (posted 1 ms before its send). 0 -> 1 takes
    # 300 µs, 1 -> 0 takes 100 µs: with no other link to measure the usual latency on, the middle
    # of the two directions places the offset (300 - 100) / 2 = 100 µs off 0, where it is known
    # to be 0
    n = 8
    t = np.arange(n, dtype=np.int64) * 10_000_000
    up = (t, t + 300 * US)
    dn = (t + 5_000_000, t + 5_000_000 + 100 * US)
    src = np.r_[np.zeros(n), np.ones(n)].astype(np.int32)
    s_start = np.r_[up[0], dn[0]]
    r_end = np.r_[up[1], dn[1]]
    pairs = Pairs(src, 1 - src, s_start, s_start + 10 * US, s_start - 1_000_000, r_end, False)
    err = known_clock_error(pairs, {0: "a", 1: "a"}, np.zeros(2 * n), _place_link)
    assert err is not None and math.isclose(err, 100 * US)
    # on two hosts the link is no evidence (its clock is the unknown)
    assert known_clock_error(pairs, {0: "a", 1: "b"}, np.zeros(2 * n), _place_link) is None
