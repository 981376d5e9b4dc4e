"""Each link's normal transfer time and the run's fault-free p2p latency (docs/json.md, "Time accounting").

A transfer at its link's normal time is part of the schedule (bubble); only what a transfer takes
beyond the run's fault-free latency is comm_wait, and PP004 names a link only when it is slower
than the run's other links by more than the noise.
"""

from __future__ import annotations

import numpy as np
from handbuilt_blocks import blocks_us
from hypothesis import given, settings
from hypothesis import strategies as st
from test_causes_cpu_posting import C, P, _tl
from test_causes_handbuilt import RECV, SEND, B, F, Op, _causes, _check

from ppdiag.attribution.causes import attribute, rank_step
from ppdiag.attribution.link_latency import (
    LinkLatencies,
    LinkLatency,
    Z,
    _links_of,
    link_latencies,
    t_quantile,
)
from ppdiag.model import Direction, Kind, RankTimeline
from ppdiag.pipeline.clocks import p2p_ops

US = 1000


def _waits(link: tuple[int, int], taus_us: list[int]) -> list[tuple[int, int, int, int]]:
    return [(link[0], link[1], t * US, t * US) for t in taus_us]


def test_a_links_normal_time_is_a_low_quantile_of_its_transfers() -> None:
    # link 0->1: eight transfers of 100 µs and four of 5000 (a third of them late); its normal time
    # is the lower quartile, 100 µs, where the median of a link with more late transfers would not
    # be. Link 1->0: all 120 µs. Fault-free latency: the lower median of (100, 120) = 100 µs.
    ll = link_latencies(_waits((0, 1), [100] * 8 + [5000] * 4) + _waits((1, 0), [120] * 12))
    assert ll.links[(0, 1)].normal_ns == 100 * US
    assert ll.links[(1, 0)].normal_ns == 120 * US
    assert ll.fault_free_ns == 100 * US
    # lateness per transfer beyond 100 µs, the longest fifth left out (ceil(0.8 x 12) = 10 kept):
    # 0->1 (2 x 4900) / 10 = 980 µs; 1->0 20 µs
    assert ll.links[(0, 1)].late_ns == 2 * 4900 * US / 10
    assert ll.links[(0, 1)].late_sum_ns == 12 * 980 * US
    assert ll.links[(1, 0)].late_ns == 20 * US


def test_a_links_lateness_is_what_most_of_its_transfers_take() -> None:
    # one estimator gates PP004 and gives the late time it reports: a link is as late as most of
    # its transfers. 1->0: twelve transfers of 100 µs; 0->1: ten of 100 µs and two at 20 ms (a
    # process descheduled on a loaded host): left out (ceil(0.8 x 12) = 10 kept), 0->1 is as late
    # as 1->0, no slow link (the plain mean would make it 3.3 ms late per transfer).
    base = _waits((1, 0), [100] * 12)
    ll = link_latencies(base + _waits((0, 1), [100] * 10 + [20_000] * 2))
    assert ll.links[(0, 1)].late_ns == 0.0 and ll.slow() == {}
    # but a link whose transfers are most of them 3 ms late is slow: the 10 kept (2 x 0 and 8 of the
    # 3 ms ones) make 2.4 ms per transfer, 28.8 ms over its 12 transfers
    ll = link_latencies(base + _waits((0, 1), [3100] * 10 + [100] * 2))
    assert ll.links[(0, 1)].late_sum_ns == 12 * (8 * 3000 * US / 10)
    assert list(ll.slow()) == [(0, 1)]


def test_slow_links_do_not_set_the_fault_free_latency() -> None:
    # P = 2 with one slow direction: 0->1 at 600 µs, 1->0 at 100. The lower median of the links'
    # normal times is the fast one: 100 µs, so 0->1's 500 µs per transfer are comm wait.
    ll = link_latencies(_waits((0, 1), [600] * 6) + _waits((1, 0), [100] * 6))
    assert ll.fault_free_ns == 100 * US
    # 0->1 stands out of the other link (lateness 500 µs against 0, no spread): slow by 500 µs
    assert ll.slow() == {(0, 1): 500.0 * US}


def test_most_links_slow_do_not_set_the_fault_free_latency() -> None:
    # P = 4, ranks 1 and 2 send 500 µs late: 1->0, 1->2, 2->1 and 2->3 take 600 µs, 0->1 and
    # 3->2 100 µs. The links' normal times sorted: 100, 100, 600, 600, 600, 600; their lower
    # median would be 600, their lower quartile (index 1 of 0..5) is 100: the fault-free latency.
    slow = [(1, 0), (1, 2), (2, 1), (2, 3)]
    waits = [w for link in slow for w in _waits(link, [600] * 8)]
    waits += _waits((0, 1), [100] * 8) + _waits((3, 2), [100] * 8)
    ll = link_latencies(waits)
    assert ll.fault_free_ns == 100 * US
    # each slow link is 500 µs late against the other links' lower quartile (index 1 of 0..4: 0)
    assert ll.slow() == {k: 500.0 * US for k in slow}


def test_links_late_alike_are_no_slow_link() -> None:
    # every link's transfers spread alike between 100 and 1000 µs (jitter of a loaded host): the
    # links' lateness differs by less than the noise, so none is slow; one link whose transfers
    # are all 3 ms later than the others' does stand out.
    jitter = [100, 150, 200, 300, 450, 600, 800, 1000]
    waits = [w for link in ((0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)) for w in _waits(link, jitter)]
    assert link_latencies(waits).slow() == {}
    slow = _waits((1, 2), [t + 3000 for t in jitter])
    got = link_latencies([w for w in waits if w[:2] != (1, 2)] + slow).slow()
    assert list(got) == [(1, 2)]
    assert got[(1, 2)] > 2500 * US


def test_a_clock_offsets_standard_error_joins_the_noise_in_quadrature() -> None:
    # the jittered links of the test above: a link between two hosts is timed across their fitted
    # offset, whose standard error adds to the difference's in quadrature (independent errors):
    # an offset known far better than the links vary leaves the noise almost where it was, one
    # known as badly as the links vary widens it by the root of two
    jitter = [100, 150, 200, 300, 450, 600, 800, 1000]
    waits = [w for link in ((0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)) for w in _waits(link, jitter)]
    ll = link_latencies(waits)
    k = (1, 2)
    # the link's and the reference's alike; Z at the t quantile of the link's 8 transfers
    se = ll.noise_ns(k) / t_quantile(Z, 7) / 2**0.5
    assert ll.noise_ns(k, 0.0) == ll.noise_ns(k)
    assert ll.noise_ns(k, 0.1 * se) < 1.003 * ll.noise_ns(k)
    assert abs(ll.noise_ns(k, se * 2**0.5) - 2**0.5 * ll.noise_ns(k)) < 1e-6 * ll.noise_ns(k)


def test_z_is_the_student_t_quantile_of_the_links_degrees_of_freedom() -> None:
    # two-sided 95 % (z = 1.95996): the t table's 12.706 (1 degree of freedom), 4.303 (2),
    # 3.182 (3), 2.571 (5), 2.228 (10), 2.042 (30); the normal quantile itself without any
    z = 1.959964
    for dof, want in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)):
        assert abs(t_quantile(z, dof) - want) < 0.01 * want
    assert t_quantile(z, 0) == z and t_quantile(Z, 10**6) < Z * 1.0001


def test_a_link_timed_by_few_transfers_stands_out_by_their_t_quantile() -> None:
    # four links of 12 transfers of 100 µs each (fault-free latency 100 µs, lateness 0, spread 0);
    # link 3->2 has 12 transfers of 100 µs of which its consumer waited through 3 whole, 200, 400
    # and 600 µs: late 100, 300 and 500 µs beyond 100, their mean 300 µs with a standard error of
    # 200 / sqrt(3) = 115.5 µs (all 3 kept: ceil(0.8 x 3) = 3). The others' lateness and standard
    # error are 0. At Z = 2 the noise is 231 µs and the link would be slow by 300; three values
    # estimate their spread with 2 degrees of freedom, whose t quantile (at the confidence of
    # Z = 2) is 4.527: noise 4.527 x 115.5 = 522.7 µs, and 300 µs is no slow link.
    waits = [w for link in ((0, 1), (1, 0), (1, 2), (2, 1)) for w in _waits(link, [100] * 12)]
    whole = [False] * len(waits)
    few = _waits((3, 2), [200, 400, 600] + [100] * 9)
    ll = link_latencies(waits + few, whole + [True] * 3 + [False] * 9)
    x = ll.links[(3, 2)]
    assert x.timed == 3 and x.late_ns == 300 * US
    assert abs(x.late_se_ns - 200 * US / 3**0.5) < 1
    assert abs(ll.noise_ns((3, 2)) - 4.527 * 200 * US / 3**0.5) < 0.001 * ll.noise_ns((3, 2))
    assert ll.slow() == {}
    # the same lateness timed by 12 transfers (100, 300, 500 µs late, 4 each; the 2 longest left
    # out: mean 260 µs; winsorized sd 170.6 / (10/12 x sqrt(12)) = 59.1 µs, t(11) = 2.25):
    # noise 133 µs, slow by 260
    many = _waits((3, 2), [200, 400, 600] * 4)
    got = link_latencies(waits + many, whole + [True] * 12).slow()
    assert list(got) == [(3, 2)] and abs(got[(3, 2)] - 260 * US) < 1


def test_no_waits_no_links() -> None:
    ll = link_latencies([])
    assert ll == LinkLatencies() and ll.fault_free_ns == 0 and ll.slow() == {}


def test_a_links_normal_time_is_bubble_and_only_the_excess_is_comm_wait() -> None:
    # P = 2, M = 2, GPipe; F = 1000, B = 2000 µs. Each direction carries one normal transfer
    # (100 µs) and one slow one (600 µs): F1's activations 0->1 and B1's gradients 1->0. Receives
    # are posted early (on their own stream), so each transfer counts from its send.
    #   stage 0: F0 0-1000, F1 1000-2000 (sends 1000-1100, 2000-2600), B0 5700-7700, B1 8200-10200
    #   stage 1: F0 1100-2100, F1 2600-3600, B0 3600-5600 (send 5600-5700), B1 5600-7600
    #            (send 7600-8200); a step-end all-reduce ends at 10300 on both.
    # Lost per rank: 10300 - 6000 = 4300. With every transfer at 100 µs the run ends at 9300:
    # bubble (P-1)(F+B) + 2 x 100 (fill and drain) = 3200, the all-reduce 100 exposed comm, and
    # the two slow transfers, both on the critical path, add 2 x 500 = 1000 comm wait.
    # Each link's normal time is its lower quartile, 100 µs: the fault-free latency is 100. (The
    # lower median of the links' medians, 350 µs, would book 2 x 250 of the slow transfers as
    # bubble: bubble 3700, comm wait 500.)
    r0 = [
        Op(0, 1000, launch=-50),
        Op(1000, 1100, Kind.P2P, 1, SEND),
        Op(1000, 2000, launch=900),
        Op(2000, 2600, Kind.P2P, 1, SEND),
        Op(2600, 5700, Kind.P2P, 1, RECV),
        Op(5700, 7700, launch=2000),
        Op(5700, 8200, Kind.P2P, 1, RECV),
        Op(8200, 10200, launch=7000),
        Op(10200, 10300, Kind.COLLECTIVE),
    ]
    r1 = [
        Op(0, 1100, Kind.P2P, 0, RECV),
        Op(1100, 2100, launch=1050),
        Op(1100, 2600, Kind.P2P, 0, RECV),
        Op(2600, 3600, launch=2000),
        Op(3600, 5600, launch=3000),
        Op(5600, 5700, Kind.P2P, 0, SEND),
        Op(5600, 7600, launch=5000),
        Op(7600, 8200, Kind.P2P, 0, SEND),
        Op(8200, 10300, Kind.COLLECTIVE),
    ]
    run = {
        0: (r0, [(0, 1000, F, 0, 0), (1000, 2000, F, 1, 0), (5700, 7700, B, 0, 0), (8200, 10200, B, 1, 0)]),
        1: (r1, [(1100, 2100, F, 0, 1), (2600, 3600, F, 1, 1), (3600, 5600, B, 0, 1), (5600, 7600, B, 1, 1)]),
    }
    got = _causes(run, 10300)
    for r in (0, 1):
        _check(got[r], {"bubble": 3200, "comm_wait": 1000, "exposed_comm": 100})


def test_a_link_is_as_late_as_the_transfers_its_consumer_waited_through_whole() -> None:
    # GPipe behind a held link: 0->1 takes 10 ms per transfer, but once the consumer runs that
    # late itself it is only ready after each later transfer has arrived, and those waits time
    # what is left of the transfer: ~100 µs. Per step (3 steps) 8 transfers: the first one the
    # consumer waited through whole (10 000 µs), 7 it came to late (100 µs). 1->0 carries 24
    # transfers of 100 µs, all waited through whole. Fault-free latency 100 µs.
    slow = [(0, 1, 10_000 * US, 10_000 * US)] + [(0, 1, 100 * US, 0)] * 7
    whole = [True] + [False] * 7
    waits = slow * 3 + _waits((1, 0), [100] * 24)
    flags = whole * 3 + [True] * 24
    ll = link_latencies(waits, flags)
    # 0->1 is as late as its 3 transfers timed whole: 9900 µs each, no spread
    assert ll.links[(0, 1)].late_ns == 9900 * US and ll.links[(1, 0)].late_ns == 0.0
    assert ll.slow() == {(0, 1): 9900.0 * US}
    # without the flags every transfer counts alike: the 3 long ones are the longest fifth of 24,
    # left out as a loaded host's, and the held link reads as on time
    assert link_latencies(waits).slow() == {}
    # one transfer timed whole (< MIN_WHOLE) is no lateness of its own: all of them count
    assert link_latencies(slow + _waits((1, 0), [100] * 8), whole + [True] * 8).slow() == {}


def gloo_gpipe(first_post: int, first_wait: int, first_span: int) -> dict[int, RankTimeline]:
    """Two-stage GPipe, M = 3, forward only, F = 1000 µs, on gloo (host ops, µs on one clock).
    Stage 0 issues each send as its block ends (calls 1000-1050, 2050-2100, 3100-3150; its
    gloo:send spans open at 1040, 2090, 3140) and the link delivers 5000 µs later; it waits for
    its sends (gloo:send tail) to 8130, then an all-reduce. Stage 1 posts its first receive at
    ``first_post`` (50 µs) and waits from ``first_wait`` (its span from ``first_span``) to 6010,
    through the first transfer; it is then 5000 µs behind, and each later receive (posted at 7010
    and 8070, after the data arrived at 7050 and 8100) waits 10 µs."""
    send, recv = int(Direction.SEND), int(Direction.RECV)
    r0 = [
        (0, 1000, C, 5, -1, 0),
        (1000, 1050, P, 1, 1, send),
        (1050, 2050, C, 5, -1, 0),
        (2050, 2100, P, 1, 1, send),
        (2100, 3100, C, 5, -1, 0),
        (3100, 3150, P, 1, 1, send),
        (3150, 8130, P, 3, 1, send),
        (8130, 9230, Kind.COLLECTIVE, 0, -1, 0),
    ]
    r0_spans = [(1040, 8130, P, 3, 1, send), (2090, 8130, P, 3, 1, send), (3140, 8130, P, 3, 1, send)]
    r1 = [
        (first_post, first_wait, P, 2, 0, recv),
        (first_wait, 6010, P, 4, 0, recv),
        (6010, 7010, C, 5, -1, 0),
        (7010, 7060, P, 2, 0, recv),
        (7060, 7070, P, 4, 0, recv),
        (7070, 8070, C, 5, -1, 0),
        (8070, 8120, P, 2, 0, recv),
        (8120, 8130, P, 4, 0, recv),
        (8130, 9130, C, 5, -1, 0),
        (9130, 9230, Kind.COLLECTIVE, 0, -1, 0),
    ]
    r1_spans = [(first_span, 6010, P, 4, 0, recv), (7020, 7070, P, 4, 0, recv), (8080, 8130, P, 4, 0, recv)]
    return {0: _tl(0, r0, r0_spans), 1: _tl(1, r1, r1_spans)}


def whole_transfers(tls: dict[int, RankTimeline]) -> list[tuple[tuple[int, int, int], bool]]:
    """The replay's waits of :func:`gloo_gpipe` as ((producer, consumer, transfer µs), timed whole)."""
    blocks = {
        0: [(0, 1000, F, 0, 0), (1050, 2050, F, 1, 0), (2100, 3100, F, 2, 0)],
        1: [(6010, 7010, F, 0, 1), (7070, 8070, F, 1, 1), (8130, 9130, F, 2, 1)],
    }
    steps = [rank_step(tls[r], 0, 0, 0, 9230 * US, blocks_us(blocks[r])) for r in (0, 1)]
    att = attribute(steps, tls, {r: p2p_ops(tl) for r, tl in tls.items()}, 1, True)
    return sorted(((p, c, t // US), w) for (p, c, t, _), w in zip(att.edges, att.edge_whole, strict=True))


def test_the_replay_tells_which_waits_timed_the_whole_transfer() -> None:
    # the first receive is posted at 0-50 and its wait timed the whole transfer (6010 - 1040 =
    # 4970 µs from the issue, where its gloo:send span opens), the other two only their 10 µs
    # remainder
    got = whole_transfers(gloo_gpipe(0, 50, 10))
    assert got == [((0, 1, 10), False), ((0, 1, 10), False), ((0, 1, 4970), True)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 40), st.integers(-2, 40)), min_size=1, max_size=60))
def test_links_of_is_the_row_wise_unique(rows: list[tuple[int, int]]) -> None:
    # the links in (src, dst) order and each wait's link, as np.unique over the rows gives them
    # (negative ranks too: the code is shifted by each column's minimum)
    w = np.array(rows, np.int64)
    keys, inv = np.unique(w, axis=0, return_inverse=True)
    got_keys, got_inv = _links_of(w[:, 0], w[:, 1])
    assert got_keys.tolist() == keys.tolist()
    assert got_inv.tolist() == inv.reshape(-1).tolist()


def _reference_per_link(links: LinkLatencies, key: tuple[int, int]) -> tuple[float, float]:
    """The reference as a quantile over the other links, one link at a time (the definition)."""
    others = [x for k, x in links.links.items() if k != key]
    if not others:
        return 0.0, 0.0
    late = float(np.quantile([x.late_ns for x in others], 0.25, method="lower"))
    return late, float(np.median([x.late_se_ns for x in others]))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2_000_000), st.integers(0, 50_000)),
        min_size=1,
        max_size=40,
    )
)
def test_every_links_reference_from_one_sort_is_the_per_link_quantile(values: list[tuple[int, int]]) -> None:
    # lateness and standard errors with ties (small integers) and without
    rows = {
        (i, i + 1): LinkLatency(i, i + 1, 5, 0, 0.0, float(a), b / 7.0) for i, (a, b) in enumerate(values)
    }
    links = LinkLatencies(rows, 1000)
    for k in links.links:
        assert links.reference_ns(k) == _reference_per_link(links, k)
    assert links.reference_ns((99, 98)) == (0.0, 0.0)  # not a link of the run
