"""Metamorphic relation: shifting every time of a run by one constant shifts its diagnosis exactly.

Kineto times are epoch nanoseconds (~1.7e18, past 2**53), where a float is 256 ns coarse: a
replay whose float arithmetic ran on them rounded every ``end + local delay`` to 256 ns (ties to
even by the running value), so the same run at another origin got other causes. The replay places
its nodes on times less the graph's integer origin (``ReplayGraph.origin``); these tests hold the
causes, the replay's variants, the waits, the gap tables and the critical path of a run at an
epoch origin to those of the same run at origin 0, to the nanosecond.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import numpy as np
import pytest
from handbuilt_blocks import blocks_us
from hypothesis import given, settings
from hypothesis import strategies as st
from test_causes_handbuilt import Op, _two_stage

from ppdiag.api import Options, diagnose
from ppdiag.attribution.causes import Attribution, attribute, rank_step
from ppdiag.attribution.replay_run import Replay
from ppdiag.model import Intervals, Kind, Ranges, RankTimeline
from ppdiag.pipeline.clocks import P2POps
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

US = 1000
# an odd epoch time (2026-01-01 plus a few odd ns): no time of the run is a multiple of 256 ns there
EPOCH = 1_767_225_600_123_456_789

Run = dict[int, tuple[list[Op], list[tuple[int, int, int, int, int]]]]


def _timeline(rank: int, ops: list[Op], origin: int) -> RankTimeline:
    n = len(ops)
    iv = Intervals.from_columns(
        n,
        {
            "start": [origin + o.start * US for o in ops],
            "end": [origin + o.end * US for o in ops],
            "stream": [7 if o.kind in (Kind.COMPUTE, Kind.MEMCPY, Kind.MEMSET) else 20 for o in ops],
            "kind": [int(o.kind) for o in ops],
            "name": [0] * n,
            "peer": [o.peer for o in ops],
            "direction": [o.direction for o in ops],
            "launch": [origin + o.launch * US if o.launch is not None else -1 for o in ops],
        },
    )
    return RankTimeline(rank, f"rank{rank}", "kineto", [""], iv, Ranges.empty(), world_size=None)


def _attribute(run: Run, w1_us: int, origin: int, levels: bool = False) -> tuple[Attribution, Replay]:
    """The attribution of one step window [0, w1] µs with every time moved by ``origin`` ns, and
    the replay graph of the same steps; ``levels``: the variants placed by levels (a run this small
    takes the node loop)."""
    tls = {r: _timeline(r, ops, origin) for r, (ops, _) in run.items()}
    ops: dict[int, P2POps] = {}
    for r, tl in tls.items():
        iv = tl.intervals
        m = iv.kind == int(Kind.P2P)
        ops[r] = P2POps(iv.start[m], iv.end[m], iv.peer[m], iv.direction[m], True)

    def blocks(rows: list[tuple[int, int, int, int, int]]) -> Any:
        b = blocks_us(rows)
        return dataclasses.replace(b, start=b.start + origin, end=b.end + origin)

    steps = [rank_step(tls[r], 0, 0, origin, origin + w1_us * US, blocks(bl)) for r, (_, bl) in run.items()]
    last = len(run) - 1
    with mock.patch("ppdiag.attribution.replay_run.wide_enough", lambda rp, v: levels):
        return attribute(steps, tls, ops, last, True), Replay(steps, tls, ops, last)


def _assert_shifted(a: Attribution, b: Attribution, shift: int) -> None:
    """``b`` is ``a`` with every time moved by ``shift`` ns: the same causes, variants and waits."""
    assert b.causes == a.causes
    assert b.step_replay_ns == a.step_replay_ns
    assert b.normal_latency_ns == a.normal_latency_ns
    assert np.array_equal(b.edges, a.edges)  # (producer, consumer, transfer, waited): no times
    assert set(b.gaps) == set(a.gaps)
    for r, g in a.gaps.items():
        h = b.gaps[r]
        assert np.array_equal(h.start, g.start + shift) and np.array_equal(h.end, g.end + shift)
        assert np.array_equal(h.cause, g.cause) and np.array_equal(h.blame, g.blame)


def test_the_replay_counts_from_the_earliest_start() -> None:
    # the window starts at the origin and every block after it: the earliest start is the origin
    _, rp = _attribute(_two_stage(), 6300, EPOCH)
    assert rp.origin == EPOCH
    _, rp0 = _attribute(_two_stage(), 6300, 0)
    assert rp0.origin == 0


def test_a_slow_stage_at_an_epoch_origin_keeps_its_hand_worked_causes() -> None:
    # test_causes_handbuilt.py's slow stage (F=2000, B=4000 µs on stage 1, window 9300): bubble
    # 4700 and imbalance 1500 µs on stage 0, bubble 3200 on stage 1, 100 µs all-reduce on both,
    # to the ns. At EPOCH the replay's float sums had rounded to 256 ns: bubble 4,700,107 ns,
    # imbalance 1,499,744 and 149 ns unexplained on stage 0.
    att, _ = _attribute(_two_stage(f1=2000, b1=4000), 9300, EPOCH)
    zero = dict.fromkeys(("comm_wait", "host", "exposed_copy", "unexplained"), 0)
    stage0 = {"bubble": 4_700_000, "imbalance": 1_500_000, "exposed_comm": 100_000}
    assert att.causes[(0, 0)] == {**stage0, **zero}
    assert att.causes[(1, 0)] == {"bubble": 3_200_000, "imbalance": 0, "exposed_comm": 100_000, **zero}
    # the measured replay is the window (9300 µs), the schedule alone 100 µs less (no all-reduce)
    assert att.step_replay_ns["measured"] == 9_300_000
    assert att.step_replay_ns["schedule_only"] == 9_200_000


def test_a_host_stall_at_an_epoch_origin_equals_origin_zero() -> None:
    # the host stall of test_causes_handbuilt.py (stage 1's forward launched 500 µs late): the host
    # variant scales the local delays (floats), which at EPOCH had moved 224 ns into host
    a, _ = _attribute(_two_stage(f_launch1=1600), 6800, 0)
    for levels in (False, True):
        b, _ = _attribute(_two_stage(f_launch1=1600), 6800, EPOCH, levels)
        assert b.causes[(0, 0)]["host"] == 500_000
        _assert_shifted(a, b, EPOCH)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    f1=st.integers(200, 3000),
    b1=st.integers(200, 5000),
    stall=st.integers(0, 900),
    copy=st.sampled_from([0, 0, 137, 400]),
    origin=st.integers(2**60, 2**61),
    levels=st.booleans(),
)
def test_shifting_every_time_shifts_the_attribution_exactly(
    f1: int, b1: int, stall: int, copy: int, origin: int, levels: bool
) -> None:
    # a two-stage run with a random stage cost, host stall and copy, at 0 and at a random epoch
    # origin (odd or even, past 2**60), its variants placed by the node loop or by levels: every
    # cause, variant, wait and gap to the ns
    launch = 1050 + copy + stall if stall else None
    run = _two_stage(f1=f1, b1=b1, f_launch1=launch, copy_us=copy)
    b0_end = max(1100 + copy, launch or 0) + f1 + b1 + 100 + 2000
    a, _ = _attribute(run, b0_end + 100, 0, levels)
    b, _ = _attribute(run, b0_end + 100, origin, levels)
    _assert_shifted(a, b, origin)


SYNTH: dict[str, dict[str, Any]] = {
    "1f1b": dict(schedule="1f1b", pp=4, microbatches=8, faults=[F.SlowStage(2, 1.5), F.HostStall(1, 0.3)]),
    "interleaved_dp2": dict(
        schedule="interleaved_1f1b",
        virtual=2,
        pp=4,
        microbatches=8,
        dp=2,
        faults=[F.SlowStage(2, 1.5), F.HostStall(1, 0.3), F.ExposedAllReduce(2.0), F.SlowLink(1, 0.3)],
    ),
}


def _report(cfg: dict[str, Any], shift: int) -> dict[str, Any]:
    run = make_scenario(steps=2, **cfg)
    run = dataclasses.replace(run, epoch_ns=run.epoch_ns + shift)
    with tempfile.TemporaryDirectory() as d:
        write_kineto(run, d)
        rep = diagnose([Path(d)], Options()).result
    out: dict[str, Any] = json.loads(msgspec.json.encode(rep))
    out["run"].pop("sources")  # (file names carry the epoch)
    return out


@pytest.mark.parametrize("name", list(SYNTH))
def test_a_synthetic_kineto_run_moved_off_the_epoch_gives_the_same_report(name: str) -> None:
    # the same run written at 2026-01-01 (epoch ns) and at 5 s: the whole report (causes, waits in
    # the all-reduce, links, findings, what-if) but the critical paths' absolute starts is the
    # same; those move by the shift exactly. Before the origin, the 1F1B run's bubble, imbalance,
    # host, exposed comm and unexplained differed by up to 1.1 µs.
    shift = 5_000_000_000 - 1_767_225_600_000_000_000
    a, b = _report(SYNTH[name], 0), _report(SYNTH[name], shift)
    starts_a = [cs.pop("start_ns") for cs in a["critical_path"]]
    starts_b = [cs.pop("start_ns") for cs in b["critical_path"]]
    assert starts_b == [t + shift for t in starts_a]
    assert b == a
