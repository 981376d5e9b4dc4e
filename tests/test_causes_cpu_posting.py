"""CPU (gloo) runs: the call that only issues a transfer is the rank's own host time, never a wait.

``c10d::recv_`` / ``c10d::send`` on a gloo run post an asynchronous transfer and return; the wait is
the ``gloo:*`` span's blocked tail after the call. On a loaded host the process is descheduled
inside the posting call, and the data, sent long before, is already there when the call returns.
A hand-built two-stage run (µs, one clock) where stage 1's receive call is stretched to 1600 µs
while the activation was issued at 1010 µs: every transfer after both sides were ready takes 50 µs,
so by the counterfactual definitions nothing is ``comm_wait`` (no transfer is slower than the
run's normal latency) and the stretched call is ``host`` on both ranks (stage 0 waits for it).
An earlier build read the call as part of the wait: 590 µs of ``comm_wait`` on both ranks.
"""

from __future__ import annotations

import pytest
from handbuilt_blocks import blocks_us as _blocks

from ppdiag.attribution.causes import attribute, rank_step
from ppdiag.model import Direction, Intervals, Kind, Phase, RangeKind, Ranges, RankTimeline
from ppdiag.pipeline.clocks import p2p_ops
from ppdiag.rules.noise import direct_host_ms

US = 1000
F, B = int(Phase.FWD), int(Phase.BWD)
SEND, RECV = int(Direction.SEND), int(Direction.RECV)
NAMES = ["", "c10d::send", "c10d::recv_", "gloo:send", "gloo:recv", "hold"]
# (start µs, end µs, kind, name id, peer, direction)
Row = tuple[int, int, Kind, int, int, int]


def _tl(rank: int, ops: list[Row], spans: list[Row]) -> RankTimeline:
    """A CPU-mode timeline: top-level ops and blocked gloo tails (``ops``), gloo spans (``spans``)."""
    iv = Intervals.from_columns(
        len(ops),
        {
            "start": [o[0] * US for o in ops],
            "end": [o[1] * US for o in ops],
            "stream": [1] * len(ops),
            "kind": [int(o[2]) for o in ops],
            "name": [o[3] for o in ops],
            "peer": [o[4] for o in ops],
            "direction": [o[5] for o in ops],
            "launch": [o[0] * US for o in ops],
        },
    )
    rg = Ranges.from_columns(
        len(spans),
        {
            "start": [s[0] * US for s in spans],
            "end": [s[1] * US for s in spans],
            "kind": [int(RangeKind.COMM_OP)] * len(spans),
            "name": [s[3] for s in spans],
            "tid": [1] * len(spans),
            "peer": [s[4] for s in spans],
            "direction": [s[5] for s in spans],
        },
    )
    return RankTimeline(rank, f"rank{rank}", "kineto", list(NAMES), iv, rg, world_size=2, cpu_only=True)


C, P = Kind.COMPUTE, Kind.P2P
# stage 0: F, send the activation (call 1000-1050, its span 1010-1200), post the gradient's receive
# (1050-1100) and wait for it (the gloo:recv tail 1100-4710), B
R0_OPS: list[Row] = [
    (0, 1000, C, 5, -1, 0),
    (1000, 1050, P, 1, 1, SEND),
    (1050, 1100, P, 2, 1, RECV),
    (1100, 4710, P, 4, 1, RECV),
    (4710, 6710, C, 5, -1, 0),
    (6710, 6810, Kind.COLLECTIVE, 0, -1, 0),
]
R0_SPANS: list[Row] = [(1010, 1200, P, 3, 1, SEND), (1060, 4710, P, 4, 1, RECV)]
# stage 1: the receive call, descheduled from 0 to 1600 (its span issued at 10), then 50 µs of
# blocked tail (the data was there), F, B, send the gradient (call 4650-4700, span 4660-4710);
# both end the step in an all-reduce (100 µs once both joined)
R1_OPS: list[Row] = [
    (0, 1600, P, 2, 0, RECV),
    (1600, 1650, P, 4, 0, RECV),
    (1650, 2650, C, 5, -1, 0),
    (2650, 4650, C, 5, -1, 0),
    (4650, 4700, P, 1, 0, SEND),
    (4700, 6810, Kind.COLLECTIVE, 0, -1, 0),
]
R1_SPANS: list[Row] = [(10, 1650, P, 4, 0, RECV), (4660, 4710, P, 3, 0, SEND)]


def _causes() -> dict[int, dict[str, float]]:
    tls = {0: _tl(0, R0_OPS, R0_SPANS), 1: _tl(1, R1_OPS, R1_SPANS)}
    blocks = {
        0: [(0, 1000, F, 0, 0), (4710, 6710, B, 0, 0)],
        1: [(1650, 2650, F, 0, 1), (2650, 4650, B, 0, 1)],
    }
    steps = [rank_step(tls[r], 0, 0, 0, 6810 * US, _blocks(blocks[r])) for r in (0, 1)]
    att = attribute(steps, tls, {r: p2p_ops(tl) for r, tl in tls.items()}, 1, True)
    for rs in steps:
        assert sum(att.causes[(rs.rank, 0)].values()) == rs.acct.lost  # the causes add up
    return {r: {k: v / US for k, v in att.causes[(r, 0)].items()} for r in (0, 1)}


def test_a_stretched_posting_call_is_host_not_comm_wait() -> None:
    got = _causes()
    for r in (0, 1):
        # every transfer took the run's normal 50 µs once both sides were ready: no comm_wait
        assert got[r]["comm_wait"] == pytest.approx(0, abs=1), got
        # stage 1 started its F at 1650 where the data was there at 1060 (its own host time), and
        # each producer issued its send 10 µs after its block (at 1010 and 4660)
        assert got[r]["host"] == pytest.approx(1650 - 1060 + 10 + 10, abs=1), got
        # the schedule: (F + B) of the other stage and two transfers at the normal 50 µs
        assert got[r]["bubble"] == pytest.approx(3000 + 2 * 50, abs=1), got


def test_a_call_that_blocks_to_its_span_end_stays_a_wait() -> None:
    """A receive call that holds its gloo span to the end blocked inside it (older builds, or a
    blocking ``recv``): that call is the wait."""
    tl = _tl(1, [(0, 1600, P, 2, 0, RECV), (1600, 2600, C, 5, -1, 0)], [(10, 1590, P, 4, 0, RECV)])
    rs = rank_step(tl, 0, 0, 0, 2600 * US, _blocks([(1600, 2600, F, 0, 1)]))
    assert rs.wait_set[0].tolist() == [0] and rs.wait_set[1].tolist() == [1600 * US]
    assert rs.p2p_host[0].size == 0


def test_a_ranks_own_host_time_counts_its_slow_posting_calls() -> None:
    """PP006 names the ranks whose own host time stands out: time with nothing running, and the
    calls that only issued a transfer where they took longer than this run's such calls do. A
    send call that blocks its rank (a send held in the call itself) is that rank's delay, not
    every rank's behind it; calls a loaded host stretches alike are no rank's own."""
    tls = {0: _tl(0, R0_OPS, R0_SPANS), 1: _tl(1, R1_OPS, R1_SPANS)}
    blocks = {
        0: [(0, 1000, F, 0, 0), (4710, 6710, B, 0, 0)],
        1: [(1650, 2650, F, 0, 1), (2650, 4650, B, 0, 1)],
    }
    steps = [rank_step(tls[r], 0, 0, 0, 6810 * US, _blocks(blocks[r])) for r in (0, 1)]
    # no stretch of either rank is without an event: no late launch
    assert direct_host_ms(steps) == {0: 0.0, 1: 0.0}
    # the posting calls: stage 0's send and receive calls back to back (1000-1100: 100 µs), stage
    # 1's receive call held 0-1600 (1600 µs) and its send call 4650-4700 (50 µs); such a call
    # takes 100 µs here (the median), so stage 1's held call is 1500 µs of its own and nothing
    # else is
    assert direct_host_ms(steps, with_calls=True) == pytest.approx({0: 0.0, 1: 1.5})


# A send held in its call (a transport that does not accept the post at once): stage 0's
# ``c10d::send`` blocks 1000-11250; the data leaves at 11000 and stage 1's receive ends at 11050,
# but the ``gloo:send`` span opens only as the call returns (11240), after the data arrived.
H0_OPS: list[Row] = [
    (0, 1000, C, 5, -1, 0),
    (1000, 11250, P, 1, 1, SEND),
    (11250, 11300, P, 2, 1, RECV),
    (11300, 14110, P, 4, 1, RECV),
    (14110, 16110, C, 5, -1, 0),
    (16110, 16210, Kind.COLLECTIVE, 0, -1, 0),
]
H0_SPANS: list[Row] = [(11240, 11300, P, 3, 1, SEND), (11260, 14110, P, 4, 1, RECV)]
H1_OPS: list[Row] = [
    (0, 50, P, 2, 0, RECV),
    (50, 11050, P, 4, 0, RECV),
    (11050, 12050, C, 5, -1, 0),
    (12050, 14050, C, 5, -1, 0),
    (14050, 14100, P, 1, 0, SEND),
    (14100, 16210, Kind.COLLECTIVE, 0, -1, 0),
]
H1_SPANS: list[Row] = [(10, 11050, P, 4, 0, RECV), (14060, 14110, P, 3, 0, SEND)]


def test_a_send_held_in_its_call_released_the_wait() -> None:
    """Stage 1 waited 50-11050 µs for stage 0's send held in its call: a wait on the producer's
    issue (its blocked send call is its own host time), not stage 1's own communication. When its
    data left is not recorded (its span opened after the data arrived: no transfer of the link is
    timed from it), so the wait takes the normal latency: the gradient's 50 µs (1 -> 0, the one
    timed transfer). Causes on both ranks (µs): ``bubble`` 3100 (the other stage's F + B and two
    transfers at 50), ``comm_wait`` 0, ``host`` 10010 (stage 0 issued its send 11050 - 50 - 1000
    = 10000 after its F, stage 1 its own 10 after its B), ``exposed_comm`` 100 (the step-end
    all-reduce), adding up to the 13210 lost. Taking the span's open (11240) as the issue made
    the wait "no wait": 7250 ``host`` and 2860 ``exposed_comm``, and across hosts an offset a
    few hundred µs off read it as a wait again."""
    tls = {0: _tl(0, H0_OPS, H0_SPANS), 1: _tl(1, H1_OPS, H1_SPANS)}
    blocks = {
        0: [(0, 1000, F, 0, 0), (14110, 16110, B, 0, 0)],
        1: [(11050, 12050, F, 0, 1), (12050, 14050, B, 0, 1)],
    }
    steps = [rank_step(tls[r], 0, 0, 0, 16210 * US, _blocks(blocks[r])) for r in (0, 1)]
    att = attribute(steps, tls, {r: p2p_ops(tl) for r, tl in tls.items()}, 1, True)
    want = {"bubble": 3100, "imbalance": 0, "comm_wait": 0, "host": 10010, "exposed_comm": 100}
    for r in (0, 1):
        got = {k: v / US for k, v in att.causes[(r, 0)].items()}
        assert got == pytest.approx({**want, "exposed_copy": 0, "unexplained": 0}, abs=1), (r, got)
    # the one timed transfer is the gradient's; the held send's wait is counted in a note
    assert att.edges[:, :3].tolist() == [[1, 0, 50 * US]]
    assert any("1 waits are on sends held in their call" in n for n in att.notes), att.notes
