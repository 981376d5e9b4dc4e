"""Every cause on tiny hand-built timelines, with the expected µs worked out by hand.

Each test writes a few blocks per rank on one clock (µs), runs the accounting and the replay
(``ppdiag.attribution.causes.attribute``) and compares with the counterfactual definitions of
docs/json.md "Time accounting": bubble = idle with every stage at the mean cost, normal links, no host stalls;
imbalance = what the actual stage costs add; comm_wait = what the actual transfer times add;
host = what host delays add; exposed_comm / exposed_copy = what exposed communication / copies
add; unexplained = the rest. Every block in these runs has F = 1000 µs and B = 2000 µs unless
the test says otherwise; transfers take 100 µs (the normal latency) unless slowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from handbuilt_blocks import blocks_us as _blocks

from ppdiag.attribution.causes import attribute, rank_step
from ppdiag.model import Direction, Intervals, Kind, Phase, Ranges, RankTimeline
from ppdiag.pipeline.clocks import P2POps

US = 1000
F, B = int(Phase.FWD), int(Phase.BWD)
SEND, RECV = int(Direction.SEND), int(Direction.RECV)


@dataclass
class Op:
    """One interval: start/end µs, kind, peer/direction for p2p, host launch µs (None: unknown)."""

    start: int
    end: int
    kind: Kind = Kind.COMPUTE
    peer: int = -1
    direction: int = 0
    launch: int | None = None


def _tl(rank: int, ops: list[Op]) -> RankTimeline:
    n = len(ops)
    iv = Intervals.from_columns(
        n,
        {
            "start": [o.start * US for o in ops],
            "end": [o.end * US for o in ops],
            "stream": [7 if o.kind in (Kind.COMPUTE, Kind.MEMCPY, Kind.MEMSET) else 20 for o in ops],
            "kind": [int(o.kind) for o in ops],
            "name": [0] * n,
            "peer": [o.peer for o in ops],
            "direction": [o.direction for o in ops],
            "launch": [o.launch * US if o.launch is not None else -1 for o in ops],
        },
    )
    return RankTimeline(rank, f"rank{rank}", "kineto", [""], iv, Ranges.empty(), world_size=None)


def _causes(
    ranks: dict[int, tuple[list[Op], list[tuple[int, int, int, int, int]]]], w1: int, pipelined: bool = True
) -> dict[int, dict[str, float]]:
    """Causes per rank in µs for one step window [0, w1] µs."""
    tls = {r: _tl(r, ops) for r, (ops, _) in ranks.items()}
    p2p_ops: dict[int, P2POps] = {}
    for r, tl in tls.items():
        m = tl.intervals.kind == int(Kind.P2P)
        iv = tl.intervals
        p2p_ops[r] = P2POps(iv.start[m], iv.end[m], iv.peer[m], iv.direction[m], True)
    steps = [rank_step(tls[r], 0, 0, 0, w1 * US, _blocks(bl)) for r, (_, bl) in ranks.items()]
    att = attribute(steps, tls, p2p_ops, max(len(ranks) - 1, 0), pipelined)
    out = {rs.rank: {k: v / US for k, v in att.causes[(rs.rank, 0)].items()} for rs in steps}
    for rs in steps:
        assert sum(att.causes[(rs.rank, 0)].values()) == rs.acct.lost  # the causes add up
    return out


def _check(got: dict[str, float], want: dict[str, float]) -> None:
    full = {k: 0.0 for k in got}
    full.update(want)
    assert got == pytest.approx(full, abs=1.0), (got, full)


def _two_stage(
    f1: int = 1000, b1: int = 2000, f_launch1: int | None = None, copy_us: int = 0
) -> dict[int, tuple[list[Op], list[tuple[int, int, int, int, int]]]]:
    """P=2, M=1: F on stage 0, send (100 µs), F and B on stage 1, send back, B on stage 0, a
    step-end all-reduce (100 µs) that both ranks join. ``f_launch1``: when the host launched
    stage 1's forward (a host stall); ``copy_us``: a copy on stage 0 between its F and its send."""
    c = copy_us
    f1_start = max(1100 + c, f_launch1 or 0)
    f1_end = f1_start + f1
    b1_end = f1_end + b1
    b0_start = b1_end + 100
    b0_end = b0_start + 2000
    r0 = [
        Op(0, 1000, launch=-50),
        Op(1000 + c, 1100 + c, Kind.P2P, 1, SEND),
        Op(1100 + c, b0_start, Kind.P2P, 1, RECV),
        Op(b0_start, b0_end, launch=1100 + c),
        Op(b0_end, b0_end + 100, Kind.COLLECTIVE),
    ]
    if c:
        r0.append(Op(1000, 1000 + c, Kind.MEMCPY, launch=900))
    r1 = [
        Op(0, 1100 + c, Kind.P2P, 0, RECV),
        Op(f1_start, f1_end, launch=f_launch1 if f_launch1 is not None else 1050 + c),
        Op(f1_end, b1_end, launch=f1_end - 50),
        Op(b1_end, b1_end + 100, Kind.P2P, 0, SEND),
        Op(b1_end + 100, b0_end + 100, Kind.COLLECTIVE),
    ]
    return {
        0: (r0, [(0, 1000, F, 0, 0), (b0_start, b0_end, B, 0, 0)]),
        1: (r1, [(f1_start, f1_end, F, 0, 1), (f1_end, b1_end, B, 0, 1)]),
    }


def test_bubble_holds_the_normal_fill_and_drain_latency() -> None:
    # window 6300 µs, compute 3000 per rank: lost 3300. With the all-reduce's 100 µs removed the
    # schedule still waits (P-1)(F+B) = 3000 plus two 100 µs transfers (F to stage 1, B back):
    # bubble 3200. The all-reduce transfer is exposed comm: 100 on both ranks.
    run = _two_stage()
    got = _causes(run, 6300)
    for r in (0, 1):
        _check(got[r], {"bubble": 3200, "exposed_comm": 100})


def test_imbalance_is_what_the_slow_stage_adds() -> None:
    # stage 1 at F=2000, B=4000: window 9300. Mean stage: F=1500, B=3000, so the balanced run
    # waits (F+B) + 200 = 4700 on each rank: bubble 4700 on stage 0, and on stage 1 its actual idle
    # with free comm, 9200 - 6000 = 3200 (bubble is capped by it). Stage 0 idles 9200 - 3000 = 6200
    # with the actual costs: imbalance 1500. All-reduce: 100 exposed comm each.
    got = _causes(_two_stage(f1=2000, b1=4000), 9300)
    _check(got[0], {"bubble": 4700, "imbalance": 1500, "exposed_comm": 100})
    _check(got[1], {"bubble": 3200, "exposed_comm": 100})


def test_host_stall_on_one_rank_is_host_on_both() -> None:
    # stage 1's host launches its forward at 1600, 500 µs after the data arrived (1100): every
    # later block moves 500 µs, window 6800, lost 3800 per rank = bubble 3200 + host 500 + the
    # all-reduce 100. Stage 0 waits for it, and its wait is host too (the root cause).
    got = _causes(_two_stage(f_launch1=1600), 6800)
    for r in (0, 1):
        _check(got[r], {"bubble": 3200, "host": 500, "exposed_comm": 100})


def test_copy_before_the_send_is_exposed_copy_on_both() -> None:
    # a 400 µs copy on stage 0 between its F and its send: the send leaves at 1400, everything
    # after it moves 400 µs, window 6700, lost 3700 per rank = bubble 3200 + copy 400 + the
    # all-reduce 100. Stage 0's copy has no compute beside it.
    got = _causes(_two_stage(copy_us=400), 6700)
    for r in (0, 1):
        _check(got[r], {"bubble": 3200, "exposed_copy": 400, "exposed_comm": 100})


def test_slow_link_is_comm_wait_in_full() -> None:
    # P=3, M=1. The transfer 0 -> 1 takes 600 µs instead of 100; the other three take 100 (the
    # median, so the normal latency). Window 10000, compute 3000: lost 7000 per rank. With normal
    # links the run is 500 µs shorter: bubble (P-1)(F+B) + 4 x 100 = 6400, comm_wait 500, and the
    # all-reduce's 100 exposed comm.
    r0 = [
        Op(0, 1000),
        Op(1000, 1600, Kind.P2P, 1, SEND),
        Op(1600, 7900, Kind.P2P, 1, RECV),
        Op(7900, 9900),
        Op(9900, 10000, Kind.COLLECTIVE),
    ]
    r1 = [
        Op(0, 1600, Kind.P2P, 0, RECV),
        Op(1600, 2600),
        Op(2600, 2700, Kind.P2P, 2, SEND),
        Op(2700, 5800, Kind.P2P, 2, RECV),
        Op(5800, 7800),
        Op(7800, 7900, Kind.P2P, 0, SEND),
        Op(7900, 10000, Kind.COLLECTIVE),
    ]
    r2 = [
        Op(0, 2700, Kind.P2P, 1, RECV),
        Op(2700, 3700),
        Op(3700, 5700),
        Op(5700, 5800, Kind.P2P, 1, SEND),
        Op(5800, 10000, Kind.COLLECTIVE),
    ]
    run = {
        0: (r0, [(0, 1000, F, 0, 0), (7900, 9900, B, 0, 0)]),
        1: (r1, [(1600, 2600, F, 0, 1), (5800, 7800, B, 0, 1)]),
        2: (r2, [(2700, 3700, F, 0, 2), (3700, 5700, B, 0, 2)]),
    }
    got = _causes(run, 10000)
    for r in (0, 1, 2):
        _check(got[r], {"bubble": 6400, "comm_wait": 500, "exposed_comm": 100})


def test_no_pipeline_copies_host_and_unexplained() -> None:
    # one rank, no pipeline: compute 0-1000; a copy 1000-1500; compute 1500-2000 (launched at
    # 900, queued); a copy 1800-2200 (200 µs of it beside nothing); idle 2200-2500 before a
    # kernel launched at 2400: window 0-2600, compute 1600, exposed copy 700, idle 300, of which
    # 200 (2200-2400) is host and 100 is unexplained (the kernel was queued at 2400 but ran at 2500).
    ops = [
        Op(0, 1000, launch=-100),
        Op(1000, 1500, Kind.MEMCPY, launch=950),
        Op(1500, 2000, launch=900),
        Op(1800, 2200, Kind.MEMCPY, launch=1700),
        Op(2500, 2600, launch=2400),
    ]
    got = _causes({0: (ops, [])}, 2600, pipelined=False)
    _check(got[0], {"exposed_copy": 700, "host": 200, "unexplained": 100})


def test_exposed_comm_between_blocks_without_pipeline() -> None:
    # one rank: compute 0-1000, an all-reduce 1000-1400 with nothing beside it, compute 1400-2000
    # (launched early): exposed comm 400, nothing else lost.
    ops = [Op(0, 1000, launch=-50), Op(1000, 1400, Kind.COLLECTIVE), Op(1400, 2000, launch=500)]
    got = _causes({0: (ops, [])}, 2000, pipelined=False)
    _check(got[0], {"exposed_comm": 400})
