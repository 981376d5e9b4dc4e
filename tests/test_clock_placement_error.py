"""The standard error of a host-op offset measures the placement actually used (docs/clocks.md,
"How well an offset is known"): the same placement run on the links within a host, where the
offset is known to be 0, each link left out of what the placement learns there (the usual
latency, the senders' holds)."""

from __future__ import annotations

import math

import numpy as np
from handbuilt_pairs import pairs_us
from test_host_clock_holds import _bare

from ppdiag.model import Run
from ppdiag.pipeline.clock_se import mean_se, quantile_se
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import _place_link, clock_domains, fit_host_clocks
from ppdiag.pipeline.placement_error import known_clock_error, link_errors
from ppdiag.pipeline.send_holds import sender_holds

US = 1000
SKEW = 5000  # µs: host b's clock reads this far ahead of host a's
N = 40  # transfers each way on every link
# one-way times (µs) of a direction whose few receives end early (their send spans opened late):
# 32 at 300, 8 spread from 150 to 281.25
_EARLY = np.r_[150.0 + 18.75 * np.arange(8), np.full(32, 300.0)]


def _pairs() -> Pairs:
    """Ranks 0, 1, 2 on host a, rank 3 on host b. Link 0 <-> 1: 100 µs each way. Links 1 <-> 2
    and 2 <-> 3: 300 µs up, and back 300 µs but for a fifth that end up to 150 µs early
    (:data:`_EARLY`). Every receive is posted 500 µs before its send began; host b's timestamps
    read :data:`SKEW` more."""
    rows = [
        (0, 1, np.full(N, 100.0)),
        (1, 0, np.full(N, 100.0)),
        (1, 2, np.full(N, 300.0)),
        (2, 1, _EARLY),
        (2, 3, np.full(N, 300.0)),
        (3, 2, _EARLY),
    ]
    src, dst, ss, rs, re = [], [], [], [], []
    for k, (a, b, one_way) in enumerate(rows):
        t = np.arange(N) * 2000.0 + 1000.0 * (k % 2) + 20_000
        src += [a] * N
        dst += [b] * N
        ss.append(t + (SKEW if a == 3 else 0))
        rs.append(t - 500 + (SKEW if b == 3 else 0))
        re.append(t + one_way + (SKEW if b == 3 else 0))
    return pairs_us(src, dst, ss, rs, re)


def _run() -> Run:
    return Run([_bare(0, "a"), _bare(1, "a"), _bare(2, "a"), _bare(3, "b")], "kineto")


def test_the_placement_is_tested_on_each_link_left_out() -> None:
    # Link 0 <-> 1 left out, the usual latency is link 1 <-> 2's (300 both ways, the early fifth
    # below the lower quartile): 0 <-> 1's round trip (200) is shorter than two of them, so the
    # middle places it, exactly 0. Link 1 <-> 2 left out, the usual latency is 100 (link 0 <-> 1),
    # spread 0: up places -300 + 100 = -200, back 300 - 100 = +200, weighed by how far each
    # quartile sits above its least times (5 % quantile) plus 50: 1 / 50^2 up, 1 / 163.44^2 back
    # (300 - 186.56 + 50): (-200 * 4e-4 + 200 * 3.7435e-5) / 4.37435e-4 = -165.77 µs.
    pairs, run = _pairs(), _run()
    dom = clock_domains(run)
    errs = link_errors(pairs, dom, sender_holds(pairs, dom), _place_link)
    assert [round(e / US, 1) for e, _ in errs] == [0.0, -165.8]
    known = known_clock_error(pairs, dom, sender_holds(pairs, dom), _place_link)
    assert known is not None and math.isclose(known, 165.77 * US / math.sqrt(2), rel_tol=1e-3)


def test_the_standard_error_covers_the_placement_error() -> None:
    # The link across hosts (2 <-> 3) is shaped as 1 <-> 2. The fit's usual latency is the median
    # of the four directions' lower quartiles (100, 100, 300, 300): 200, spread 100. Up places
    # (-300 + 200) = -100 from the truth, back 300 - 200 = +100, weighed 1 / 150^2 and
    # 1 / 263.44^2: -51.0 µs off. Its standard error is the links' measured placement error,
    # 117.2 µs (the root mean square of 0 and -165.8), not the count's noise (4 µs). Measured by
    # the middle of each link's quartiles, as before, both links within the host placed exactly
    # 0 (symmetric quartiles) and the error's whole standard error was that noise, 0 here.
    got = fit_host_clocks(_run(), _pairs())
    assert got is not None
    off, clocks, _ = got
    err = off[3] + SKEW * US
    assert abs(abs(err) - 51_000) < 500
    se = clocks[1].se_ns
    assert se is not None and abs(err) <= se
    assert math.isclose(se, 117_220, rel_tol=2e-3)
    assert se <= (clocks[1].residual_ns or 0)


def test_a_held_sender_with_no_other_link_keeps_its_own_hold() -> None:
    # Rank 2 holds every send 3 ms: one-way 3300 µs to rank 1 (none early), its only link within
    # its host; every receive posted 5 ms early, so that each still waited on the causal
    # interval's middle. Left out, its hold would be unmeasured and the test would place the link
    # (-200 + 3200) / 2 = 1500 µs off, where a link of rank 2 across hosts takes this very hold.
    # Kept (3300 less the usual 100: 3200), 1 <-> 2 places as if unheld: up -300 + 100, back
    # 3300 - 3200 - 100 (the usual latency now measured on link 0 <-> 1 alone), weighed alike:
    # -100 µs.
    pairs = _pairs()
    held = pairs.src == 2
    pairs.recv_end[held] = pairs.send_start[held] + 3_300 * US
    pairs.recv_start[:] -= 4_500 * US
    dom = clock_domains(_run())
    errs = link_errors(pairs, dom, sender_holds(pairs, dom), _place_link)
    assert len(errs) == 2 and math.isclose(errs[1][0], -100 * US, abs_tol=1 * US)


def test_a_quartile_is_known_by_the_values_around_it_not_by_their_tail() -> None:
    # 400 values of a unit normal: the lower quartile's standard error is sqrt(p (1 - p) / n) over
    # the density there (0.3178): 0.0681. A tail of late values (a third of them 10 to 100 units
    # up) widens the interquartile range a hundredfold; the lower quartile stays as well known.
    v = np.quantile(np.random.default_rng(1).normal(0, 1.0, 100_000), np.linspace(0.001, 0.999, 400))
    assert abs(quantile_se(v, 0.25) - 0.0681) < 0.006
    tail = np.r_[v[:267], np.linspace(10.0, 100.0, 133)]
    assert quantile_se(tail, 0.25) < 2 * quantile_se(v, 0.25)
    assert mean_se(tail) > 50 * mean_se(v) / 10
    assert quantile_se(np.zeros(1), 0.25) == 0.0
