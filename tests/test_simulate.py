"""The schedule simulator against closed-form bubbles, hand-computed steps and torch's orders."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from ppdiag.model import Phase
from ppdiag.simulate import (
    SimConfig,
    SimResult,
    canonical_schedule,
    closed_form_bubble,
    rank_orders,
    simulate,
    stage_to_rank,
)
from ppdiag.simulate.schedules import OP_NAMES

PM = [(2, 1), (2, 3), (3, 5), (4, 4), (4, 8), (5, 7), (8, 16), (8, 3)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), PM)
@pytest.mark.parametrize("bwd", [1.0, 2.0])
def test_gpipe_1f1b_bubble_is_textbook(schedule: str, p: int, m: int, bwd: float) -> None:
    res = simulate(SimConfig(schedule, p, m, fwd_ns=1.0, bwd_ns=bwd))
    expected = (p - 1) / (m + p - 1)
    assert res.bubble_ratio == pytest.approx(expected, rel=1e-12)
    # every rank waits the same (P-1)(F+B); the step is (M+P-1)(F+B)
    assert res.step_ns == pytest.approx((m + p - 1) * (1.0 + bwd))
    assert np.allclose(res.per_rank_idle_ns, (p - 1) * (1.0 + bwd))
    assert closed_form_bubble(schedule, p, m) == pytest.approx(expected)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (4, 12), (8, 16), (8, 32)])
@pytest.mark.parametrize("bwd", [1.0, 2.0])
def test_interleaved_bubble_reduction_v2(p: int, m: int, bwd: float) -> None:
    # one model split in 2 chunks per rank: chunk costs are half the stage costs
    res = simulate(SimConfig("interleaved_1f1b", p, m, virtual=2, fwd_ns=0.5, bwd_ns=bwd / 2))
    assert res.bubble_ratio == pytest.approx((p - 1) / (2 * m + p - 1), rel=1e-12)
    plain = simulate(SimConfig("1f1b", p, m, fwd_ns=1.0, bwd_ns=bwd))
    assert res.step_ns < plain.step_ns
    assert res.per_rank_busy_ns == pytest.approx(plain.per_rank_busy_ns)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 3), (4, 12, 4), (2, 6, 3)])
def test_interleaved_more_chunks(p: int, m: int, v: int) -> None:
    res = simulate(SimConfig("interleaved", p, m, virtual=v, fwd_ns=1.0, bwd_ns=2.0))
    assert res.bubble_ratio == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12)
    assert res.bubble_ratio == pytest.approx(closed_form_bubble("interleaved_1f1b", p, m, v))


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_zero_bubble_beats_1f1b(p: int, m: int) -> None:
    # same work per micro-batch: 1F1B's B = ZB's I + W
    zb = simulate(SimConfig("zero_bubble", p, m, fwd_ns=1.0, bwd_ns=1.0, wgrad_ns=1.0))
    one = simulate(SimConfig("1f1b", p, m, fwd_ns=1.0, bwd_ns=1.0, wgrad_ns=1.0))
    assert np.allclose(zb.per_rank_busy_ns, one.per_rank_busy_ns)
    assert zb.bubble_ratio < one.bubble_ratio
    assert zb.step_ns < one.step_ns
    # ZB-H1 with T_F = T_B = T_W: (P-1) T of bubble per rank instead of 1F1B's 3 (P-1) T
    assert np.allclose(zb.per_rank_idle_ns, p - 1)
    assert np.allclose(one.per_rank_idle_ns, 3 * (p - 1))
    assert zb.bubble_ratio == pytest.approx(closed_form_bubble("zero_bubble", p, m))
    assert (zb.phase == Phase.WGRAD).sum() == p * m


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_v_schedules(schedule: str, p: int, m: int) -> None:
    res = simulate(SimConfig(schedule, p, m, virtual=2, fwd_ns=1.0, bwd_ns=1.0, wgrad_ns=1.0))
    assert res.stage_to_rank == [*range(p), *range(p - 1, -1, -1)]
    assert res.bubble_ratio == pytest.approx((p - 1) / (6 * m + p - 1), rel=1e-12)
    assert res.bubble_ratio == pytest.approx(closed_form_bubble(schedule, p, m, 2))
    zb = simulate(SimConfig("zero_bubble", p, m, fwd_ns=2.0, bwd_ns=2.0, wgrad_ns=2.0))
    assert res.bubble_ratio < zb.bubble_ratio


def test_slow_last_stage_sets_the_clock() -> None:
    # 1F1B, P=4, M=8, F=1, B=2, last stage twice as slow (F=2, B=4). The last stage never waits
    # once started, so step = (its start: the forwards of the 3 stages before it) + M (F*+B*)
    # + (the backwards of the 3 stages after its last B): 3*1 + 8*6 + 3*2 = 57.
    res = simulate(SimConfig("1f1b", 4, 8, fwd_ns=[1, 1, 1, 2], bwd_ns=[2, 2, 2, 4]))
    assert res.step_ns == 57
    assert res.per_rank_idle_ns[3] == 9
    assert list(res.per_rank_idle_ns[:3]) == [57 - 24] * 3


def test_slow_first_stage_hand_computed() -> None:
    # 1F1B, P=4, M=8, stage 0 slow (F=2, B=4), others F=1, B=2. Stage 0 runs F0..F3 back to back
    # (0..8). B0 needs F0 (ends at 2) through stages 1-3 (3*1) and back (3*2): ready at 11, so
    # stage 0 idles 11 - 8 = 3; from then on it is the bottleneck and never waits again:
    # step = 8 * (2 + 4) + 3 = 51.
    res = simulate(SimConfig("1f1b", 4, 8, fwd_ns=[2, 1, 1, 1], bwd_ns=[4, 2, 2, 2]))
    assert res.per_rank_idle_ns[0] == 11 - 4 * 2
    assert res.step_ns == 8 * 6 + 3
    first_b = np.flatnonzero((res.rank == 0) & (res.phase == Phase.BWD))[0]
    assert res.start_ns[first_b] == 11


def _producer_rows(res: SimResult) -> list[tuple[int, int, bool]]:
    """(row, producer row, remote) for every block with an input, derived from the columns."""
    n_st = len(res.stage_to_rank)
    idx = {}
    for i in range(len(res)):
        slot = {int(Phase.FWD): 0, int(Phase.BWD): 1, int(Phase.WGRAD): 2}[int(res.phase[i])]
        idx[(int(res.stage[i]), slot, int(res.mb[i]))] = i
    out = []
    for i in range(len(res)):
        s, ph, mb = int(res.stage[i]), int(res.phase[i]), int(res.mb[i])
        if ph == Phase.FWD:
            dep = (s - 1, 0, mb) if s > 0 else None
        elif ph == Phase.WGRAD:
            dep = (s, 1, mb)
        else:
            dep = (s, 0, mb) if s == n_st - 1 else (s + 1, 1, mb)
        if dep is not None:
            j = idx[dep]
            out.append((i, j, res.stage_to_rank[dep[0]] != res.stage_to_rank[s]))
    return out


@pytest.mark.parametrize(
    ("schedule", "p", "m", "v"),
    [
        ("gpipe", 4, 6, 1),
        ("1f1b", 5, 9, 1),
        ("interleaved_1f1b", 4, 8, 2),
        ("zero_bubble", 4, 8, 1),
        ("zbv", 3, 7, 2),
        ("dualpipev", 3, 8, 2),
        ("zero_bubble", 2, 8, 2),
    ],
)
def test_dependencies_and_rank_exclusivity(schedule: str, p: int, m: int, v: int) -> None:
    rng = np.random.default_rng(3)
    n_st = p * v
    p2p = 0.37
    res = simulate(
        SimConfig(
            schedule,
            p,
            m,
            virtual=v,
            fwd_ns=list(rng.uniform(0.5, 2.0, n_st)),
            bwd_ns=list(rng.uniform(0.5, 3.0, n_st)),
            wgrad_ns=list(rng.uniform(0.2, 1.0, n_st)),
            p2p_ns=p2p,
        )
    )
    deps = _producer_rows(res)
    assert len(deps) > 0
    for i, j, remote in deps:
        assert res.start_ns[i] >= res.end_ns[j] + (p2p if remote else 0.0) - 1e-9
    # a rank runs one block at a time, in its schedule order
    for r in range(p):
        rows = res.rank_rows(r)
        assert np.all(res.start_ns[rows][1:] >= res.end_ns[rows][:-1] - 1e-9)
    # every (stage, mb) has exactly one forward and one backward, on the stage's rank
    c = Counter((int(s), int(ph), int(mb)) for s, ph, mb in zip(res.stage, res.phase, res.mb, strict=True))
    for s in range(n_st):
        for mb in range(m):
            assert c[(s, int(Phase.FWD), mb)] == 1
            assert c[(s, int(Phase.BWD), mb)] == 1
    assert all(res.stage_to_rank[int(s)] == int(r) for s, r in zip(res.stage, res.rank, strict=True))
    assert res.per_rank_busy_ns + res.per_rank_idle_ns == pytest.approx(np.full(p, res.step_ns))


def test_p2p_latency_and_host_delays_only_add_time() -> None:
    base = simulate(SimConfig("1f1b", 4, 8, fwd_ns=10, bwd_ns=20))
    lat = simulate(SimConfig("1f1b", 4, 8, fwd_ns=10, bwd_ns=20, p2p_ns=1))
    assert lat.step_ns > base.step_ns
    stall = simulate(SimConfig("1f1b", 4, 8, fwd_ns=10, bwd_ns=20, host_stall_ns=[0, 5, 0, 0]))
    # the stalled host issues each block 5 after its GPU went idle: rank 1 never starts sooner
    rows = stall.rank_rows(1)
    prev_end = np.concatenate([[0.0], stall.end_ns[rows][:-1]])
    assert np.all(stall.start_ns[rows] >= prev_end + 5)
    assert stall.per_rank_idle_ns[1] > base.per_rank_idle_ns[1]
    assert np.all(stall.per_rank_idle_ns >= base.per_rank_idle_ns)


def test_step_tail_sync_and_optimizer() -> None:
    res = simulate(
        SimConfig(
            "1f1b",
            4,
            4,
            fwd_ns=10,
            bwd_ns=20,
            tail_comm_ns=7,
            sync_ns=3,
            optim_ns=5,
            launch_latency_ns=2,
            end_latency_ns=1,
        )
    )
    last = res.last_end_ns
    assert np.allclose(res.tail_end_ns, last + 7)
    assert np.allclose(res.sync_end_ns, res.tail_end_ns.max() + 3)
    assert np.allclose(res.optim_start_ns, res.sync_end_ns + 2)
    assert res.step_ns == pytest.approx(res.optim_end_ns.max() + 1)


def test_comm_on_compute_exposes_the_transfer() -> None:
    cfg = SimConfig("1f1b", 4, 8, fwd_ns=10, bwd_ns=20, p2p_ns=2)
    ovl = simulate(cfg)
    onc = simulate(cfg.replace(comm_on_compute=True))
    assert onc.step_ns > ovl.step_ns
    # a rank that sends after a block is busy for the transfer before its next block
    rows = onc.rank_rows(0)
    fwd_rows = [i for i in rows[:-1] if onc.phase[i] == Phase.FWD]
    nxt = {int(a): int(b) for a, b in itertools.pairwise(rows)}
    for i in fwd_rows:
        assert onc.start_ns[nxt[i]] >= onc.end_ns[i] + 2


def test_simulator_speed() -> None:
    cfg = SimConfig("interleaved_1f1b", 8, 64, virtual=2, fwd_ns=1.0, bwd_ns=2.0, p2p_ns=0.1)
    simulate(cfg)
    t = time.perf_counter()
    res = simulate(cfg)
    dt = time.perf_counter() - t
    assert len(res) == 8 * 64 * 2 * 2
    assert dt < 0.25, f"simulate took {dt * 1e3:.1f} ms"


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        simulate(SimConfig("bogus", 4, 8))
    with pytest.raises(ValueError, match="virtual"):
        simulate(SimConfig("zbv", 4, 8, virtual=3))
    with pytest.raises(ValueError, match="expected 1 or 4"):
        simulate(SimConfig("1f1b", 4, 8, fwd_ns=[1, 2]))
    with pytest.raises(ValueError):
        closed_form_bubble("nope", 4, 8)
    assert canonical_schedule("Interleaved-1F1B") == "interleaved_1f1b"
    assert canonical_schedule("ZBVZeroBubble") == "zbv"
    assert stage_to_rank("zbv", 3, 2) == [0, 1, 2, 2, 1, 0]
    assert stage_to_rank("interleaved", 3, 2) == [0, 1, 2, 0, 1, 2]


def _torch_schedules() -> ModuleType:
    try:
        import torch.distributed.pipelining.schedules as tsched
    except Exception:  # torch missing or built without distributed
        pytest.skip("torch.distributed.pipelining not importable")
    return tsched


def _flatten_torch(actions: Iterable[Any]) -> list[tuple[int, str, int]]:
    out: list[tuple[int, str, int]] = []
    for a in actions:
        if a is None:
            continue
        if a.computation_type.value == "OVERLAP_F_B":
            out.extend((s.stage_index, s.computation_type.value, s.microbatch_index) for s in a.sub_actions)
        else:
            out.append((a.stage_index, a.computation_type.value, a.microbatch_index))
    return out


def test_orders_match_torch_pipeline_order() -> None:
    """Our orders equal torch's own rank orders (computed through its schedule classes)."""
    from types import SimpleNamespace

    ts = _torch_schedules()
    checked = 0
    for p in (2, 3, 4, 8):
        for m in (p, 2 * p, 2 * p + 2, 4 * p):
            rounds = max(1, m // p)
            for v in (1, 2, 3):
                if m % rounds:
                    continue
                for cls, name in (
                    (ts.ScheduleInterleaved1F1B, "interleaved_1f1b"),
                    (ts.ScheduleInterleavedZeroBubble, "zero_bubble"),
                ):
                    fake = SimpleNamespace(
                        n_local_stages=v,
                        pp_group_size=p,
                        _n_microbatches=m,
                        microbatches_per_round=m // rounds,
                    )
                    ours = rank_orders(name, p, m, v)
                    for r in range(p):
                        try:
                            theirs = _flatten_torch(cls._calculate_single_rank_operations(fake, r))
                        except (AttributeError, TypeError):
                            pytest.skip("torch schedule internals changed")
                        mine = [(a.stage, OP_NAMES[a.op], a.mb) for a in ours[r]]
                        assert theirs == mine, (name, p, m, v, r)
                        checked += 1
            for cls, name in ((ts.ScheduleZBVZeroBubble, "zbv"), (ts.ScheduleDualPipeV, "dualpipev")):
                if name == "dualpipev" and m < 2 * p:
                    continue
                fake = SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
                ours = rank_orders(name, p, m, 2)
                for r in range(p):
                    try:
                        theirs = _flatten_torch(cls._calculate_single_rank_operations(fake, r))
                    except (AttributeError, TypeError):
                        pytest.skip("torch schedule internals changed")
                    assert theirs == [(a.stage, OP_NAMES[a.op], a.mb) for a in ours[r]], (name, p, m, r)
                    checked += 1
    assert checked > 100


def test_1f1b_order_is_megatron() -> None:
    orders = rank_orders("1f1b", 4, 6)
    fmt = ["".join(f"{OP_NAMES[a.op]}{a.mb}" for a in o) for o in orders]
    assert fmt[0] == "F0F1F2F3B0F4B1F5B2B3B4B5"
    assert fmt[3] == "F0B0F1B1F2B2F3B3F4B4F5B5"
    assert fmt[1] == "F0F1F2B0F3B1F4B2F5B3B4B5"
