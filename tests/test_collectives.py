"""Collectives across ranks: matching instances, waiting vs transfer, the late rank's root cause."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from analysis_parts import attribution

from ppdiag.api import Options, analyze_run
from ppdiag.model import Intervals, Kind, NameTable, ProcessGroup, RangeKind, Ranges, RankTimeline, Run
from ppdiag.pipeline.collectives import BY_ORDER, BY_SEQ, BY_TIME, match_collectives

MS = 1_000_000
BASE = 1_700_000_000_000_000_000  # an epoch-like clock, as Kineto gives


def _rank(
    r: int,
    world: int,
    rows: list[tuple[float, float, float, str]],
    step_ms: tuple[float, float] = (0.0, 20.0),
    seq: list[int] | None = None,
    offset_ns: int = 0,
) -> RankTimeline:
    """A GPU rank: ``rows`` are (start ms, end ms, launch ms, "c" compute | "a" all-reduce | "p" a
    SendRecv kernel whose peer the trace does not name)."""
    names = NameTable()
    comp, coll = names.id("gemm_kernel"), names.id("ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
    code = {"a": int(Kind.COLLECTIVE), "p": int(Kind.P2P), "c": int(Kind.COMPUTE)}
    kinds = [code[k] for *_, k in rows]
    n = len(rows)
    seqs = np.full(n, -1, np.int64)
    if seq is not None:
        seqs[[i for i, k in enumerate(kinds) if k == int(Kind.COLLECTIVE)]] = seq
    iv = Intervals.from_columns(
        n,
        {
            "start": [BASE + round(a * MS) - offset_ns for a, *_ in rows],
            "end": [BASE + round(b * MS) - offset_ns for _, b, *_ in rows],
            "launch": [BASE + round(c * MS) - offset_ns for *_, c, _ in rows],
            "kind": kinds,
            "name": [comp if k == int(Kind.COMPUTE) else coll for k in kinds],
            "stream": [7 if k == int(Kind.COMPUTE) else 20 for k in kinds],
            "group": [0 if k == int(Kind.COLLECTIVE) else -1 for k in kinds],
            "seq": seqs,
        },
    ).sorted()
    st = names.id("ProfilerStep#3")
    rg = Ranges.from_columns(
        1,
        {
            "start": [BASE + round(step_ms[0] * MS) - offset_ns],
            "end": [BASE + round(step_ms[1] * MS) - offset_ns],
            "kind": [int(RangeKind.STEP)],
            "name": [st],
            "num": [3],
        },
    )
    return RankTimeline(
        r,
        f"rank{r}.pt.trace.json",
        "kineto",
        names.names,
        iv,
        rg,
        world_size=world,
        backend="nccl",
        device=f"cuda:{r}",
        process_groups=[ProcessGroup("0", "default_pg", list(range(world)), "nccl")],
    )


def _two_ranks() -> Run:
    # Rank 0: compute [1, 5] ms, all-reduce [5, 12], compute [12, 16].
    # Rank 1: compute [1, 5], then its host stalls: the next kernel is launched at 9 and runs
    # [9, 11] (2 ms more compute than rank 0 before the all-reduce), all-reduce [11, 12] (the
    # transfer: 1 ms), compute [12, 16].
    # Rank 0 therefore waits 7 - 1 = 6 ms for rank 1. Rank 1 arrived 6 ms late: 4 ms host stall
    # (gap [5, 9] with nothing launched) and 2 ms longer compute.
    # Windows are [0, 16] ms (the host's step start to the last kernel): the first kernel is
    # launched at 0.9, so each rank has 0.9 ms host before it and 0.1 ms launch latency
    # (unexplained). Rank 0: lost = 16 - 8 = 8 ms = 1 ms transfer (exposed_comm) + 4 ms host +
    # 2 ms imbalance (the late rank's causes) + 0.9 host + 0.1 unexplained. Rank 1: lost = 16 - 10
    # = 6 ms = 4.9 ms host + 1 ms exposed_comm + 0.1 unexplained.
    r0 = _rank(0, 2, [(1, 5, 0.9, "c"), (5, 12, 4.95, "a"), (12, 16, 5.0, "c")])
    r1 = _rank(1, 2, [(1, 5, 0.9, "c"), (9, 11, 9.0, "c"), (11, 12, 10.9, "a"), (12, 16, 11.0, "c")])
    return Run([r0, r1], "kineto")


def _ms(d: dict[str, int]) -> dict[str, float]:
    return {k: round(v / MS, 3) for k, v in d.items()}


def test_two_rank_wait_is_charged_to_the_late_rank() -> None:
    diag = analyze_run(_two_ranks(), Options())
    attr = attribution(diag)
    c0, c1 = _ms(attr.causes[(0, 0)]), _ms(attr.causes[(1, 0)])
    assert c0 == {
        "bubble": 0.0,
        "imbalance": 2.0,
        "comm_wait": 0.0,
        "exposed_comm": 1.0,
        "host": 4.9,
        "exposed_copy": 0.0,
        "unexplained": 0.1,
    }
    assert c1["host"] == 4.9 and c1["exposed_comm"] == 1.0 and sum(c1.values()) == 6.0
    cw = attr.collective_waits
    assert cw is not None and cw.syncs == 1
    assert list(cw.late) == [1]
    lr = cw.late[1]
    assert lr.lateness_ns == 6 * MS and lr.made_wait_ns == 6 * MS
    assert lr.reasons_ns["host_stall"] == 4 * MS and lr.reasons_ns["compute"] == 2 * MS
    f = next(f for f in diag.findings if f.code == "PP009")
    assert f.ranks == [1]
    assert f.gain_ms is not None and abs(f.gain_ms - 6.0) < 1e-6


def test_without_the_stall_nothing_is_moved() -> None:
    # Same collectives, both ranks arrive together at 5 ms: the 1 ms all-reduce is transfer only.
    r0 = _rank(0, 2, [(1, 5, 0.9, "c"), (5, 6, 4.95, "a"), (6, 10, 5.0, "c")])
    r1 = _rank(1, 2, [(1, 5, 0.9, "c"), (5, 6, 4.95, "a"), (6, 10, 5.0, "c")])
    diag = analyze_run(Run([r0, r1], "kineto"), Options())
    attr = attribution(diag)
    for k in ((0, 0), (1, 0)):
        assert _ms(attr.causes[k])["exposed_comm"] == 1.0
    assert attr.collective_waits is not None and not attr.collective_waits.late
    assert not [f for f in diag.findings if f.code == "PP009"]


def _coll_rank(r: int, ends: list[float], durs: list[float], seq: list[int] | None = None) -> RankTimeline:
    rows = [(e - d, e, e - d - 0.01, "a") for e, d in zip(ends, durs, strict=True)]
    return _rank(r, 3, [(0.0, 0.5, 0.0, "c"), *rows], (0.0, 100.0), seq)


def test_match_by_seq_order_and_time() -> None:
    ends = [10.0, 20.0, 30.0]
    tls = {r: _coll_rank(r, ends, [1.0 + r, 1.0, 2.0], seq=[7, 8, 9]) for r in range(3)}
    m = match_collectives(tls)
    assert len(m) == 3 and set(m.method.tolist()) == {BY_SEQ} and m.missing == 0
    assert m.count.tolist() == [3, 3, 3]
    tls = {r: _coll_rank(r, ends, [1.0, 1.0, 1.0]) for r in range(3)}
    m = match_collectives(tls)
    assert set(m.method.tolist()) == {BY_ORDER}
    # rank 2 misses the middle instance: matched by time, one member slot missing, warned
    tls[2] = _coll_rank(2, [10.0, 30.0], [1.0, 1.0])
    m = match_collectives(tls)
    assert set(m.method.tolist()) == {BY_TIME} and m.missing == 1 and m.warnings
    assert m.count.tolist() == [3, 2, 3]
    last = m.first[2] + m.count[2] - 1
    assert m.rank[last] == 2 and m.end[last] == BASE + 30 * MS


def test_missing_instance_does_not_shift_the_blame() -> None:
    # Rank 2 is 3 ms late to every all-reduce; rank 1 misses the second one.
    ends = [10.0, 20.0, 30.0]
    tls = {0: _coll_rank(0, ends, [4.0, 4.0, 4.0]), 2: _coll_rank(2, ends, [1.0, 1.0, 1.0])}
    tls[1] = _coll_rank(1, [10.0, 30.0], [4.0, 4.0])
    diag = analyze_run(Run([tls[0], tls[1], tls[2]], "kineto"), Options())
    cw = attribution(diag).collective_waits
    assert cw is not None
    assert list(cw.late) == [2]
    assert cw.late[2].instances == 3 and cw.late[2].lateness_ns == 9 * MS
    assert any("were not in its trace" in w for w in diag.result.run.warnings)


def test_p2p_without_peers_waits_for_the_slower_gpu() -> None:
    # Two GPUs exchange data with one SendRecv kernel each, peers unknown (no comm args).
    # Rank 0: compute [1, 5] ms, SendRecv [5, 9.5], compute [9.5, 12].
    # Rank 1: compute [1, 9] (4 ms longer: a slow GPU), SendRecv [9, 9.5] (the 0.5 ms transfer),
    # compute [9.5, 12]. Rank 0 waits 4.5 - 0.5 = 4 ms for rank 1's longer compute: imbalance.
    # Windows [0, 12] (0.9 ms host and 0.1 ms launch latency before the first kernel): rank 0
    # lost = 12 - 6.5 = 5.5 = 4 imbalance + 0.5 exposed_comm + 1; rank 1 lost = 12 - 10.5 = 1.5 =
    # 0.5 exposed_comm + 1.
    r0 = _rank(0, 2, [(1, 5, 0.9, "c"), (5, 9.5, 4.95, "p"), (9.5, 12, 5.0, "c")])
    r1 = _rank(1, 2, [(1, 9, 0.9, "c"), (9, 9.5, 4.95, "p"), (9.5, 12, 5.0, "c")])
    diag = analyze_run(Run([r0, r1], "kineto"), Options())
    assert diag.result.run.pp == 1
    attr = attribution(diag)
    c0, c1 = _ms(attr.causes[(0, 0)]), _ms(attr.causes[(1, 0)])
    assert c0["imbalance"] == 4.0 and c0["exposed_comm"] == 0.5 and sum(c0.values()) == 5.5
    assert c0["host"] == 0.9 and c1["host"] == 0.9
    assert c1["exposed_comm"] == 0.5 and sum(c1.values()) == 1.5
    (f,) = [f for f in diag.findings if f.code == "PP009"]
    assert f.ranks == [1] and f.cause == "imbalance"
    assert cast(Any, f.evidence.as_dict()["late_ranks"])["1"]["reasons_ms_per_step"]["compute"] == 4.0


def _tp_dp_rank(r: int, rows: Sequence[tuple[float, float, str]]) -> RankTimeline:
    """Rank ``r`` of 4 with a tensor-parallel group {0,1}/{2,3} (group 0) and a data-parallel
    group {0,2}/{1,3} (group 1); ``rows``: (start ms, end ms, "c" | "tp" | "dp")."""
    tl = _rank(r, 4, [(a, b, a - 0.05, "c" if k == "c" else "a") for a, b, k in rows])
    order = np.argsort([a for a, _, _ in rows], kind="stable")
    kinds = [rows[i][2] for i in order]
    tl.intervals.group[:] = [{"c": -1, "tp": 0, "dp": 1}[k] for k in kinds]
    tl.process_groups = [
        ProcessGroup("1", "TENSOR_MODEL_PARALLEL_GROUP", [0, 1] if r < 2 else [2, 3], "nccl"),
        ProcessGroup("2", "DATA_PARALLEL_GROUP", [0, 2] if r % 2 == 0 else [1, 3], "nccl"),
    ]
    return tl


def test_waits_propagate_from_tensor_to_data_parallel_groups() -> None:
    # Rank 3's GPU is slow: its first compute takes 6 ms instead of 4.
    # TP all-reduce {2,3}: rank 2 arrives at 5, rank 3 at 7, both leave at 8: rank 2 waits 2 ms
    # (imbalance, rank 3's compute). TP {0,1}: both at 5, leave at 6 (1 ms transfer).
    # Compute B: ranks 0, 1 [6, 8]; ranks 2, 3 [8, 10]. DP all-reduce {0,2} and {1,3}: ranks 0, 1
    # arrive at 8, ranks 2, 3 at 10, all leave at 11: ranks 0 and 1 wait 2 ms. Rank 1 waits for
    # rank 3's longer compute (imbalance); rank 0 waits for rank 2, which was late only because it
    # waited for rank 3 in the TP all-reduce: inherited, imbalance too. Compute C [11, 12].
    # Windows [0, 12], each with 0.95 ms host and 0.05 ms launch latency before its first kernel.
    # Lost: ranks 0, 1, 2: 12 - 7 = 5 = 2 imbalance + 2 transfer + 1; rank 3: 12 - 9 = 3 = 2
    # transfer + 1. With rank 3 on time every rank would leave the DP all-reduce at 9: 2 ms saved.
    fast = [(1, 5, "c"), (5, 6, "tp"), (6, 8, "c"), (8, 11, "dp"), (11, 12, "c")]
    r2 = [(1, 5, "c"), (5, 8, "tp"), (8, 10, "c"), (10, 11, "dp"), (11, 12, "c")]
    r3 = [(1, 7, "c"), (7, 8, "tp"), (8, 10, "c"), (10, 11, "dp"), (11, 12, "c")]
    run = Run([_tp_dp_rank(0, fast), _tp_dp_rank(1, fast), _tp_dp_rank(2, r2), _tp_dp_rank(3, r3)], "kineto")
    diag = analyze_run(run, Options())
    attr = attribution(diag)
    for r in (0, 1, 2):
        c = _ms(attr.causes[(r, 0)])
        assert c["imbalance"] == 2.0 and c["exposed_comm"] == 2.0 and sum(c.values()) == 5.0, (r, c)
    assert _ms(attr.causes[(3, 0)])["exposed_comm"] == 2.0
    (f,) = [f for f in diag.findings if f.code == "PP009"]
    assert f.ranks == [3] and f.cause == "imbalance"
    assert f.evidence.as_dict()["followers"] == {"2": 2.0}
    assert (
        cast(Any, f.evidence.as_dict()["late_ranks"])["3"]["late_ms_per_step"] == 4.0
    )  # 2 ms in TP, 2 ms in DP
    assert f.gain_ms is not None and abs(f.gain_ms - 2.0) < 1e-6


def test_a_wait_hidden_under_compute_names_nobody() -> None:
    # Rank 0 waits 6 ms in the all-reduce [5, 12] but computes beside it the whole time (an
    # overlapped gradient reduce): nothing is lost on rank 0, so rank 1 (compute [1, 11], its
    # all-reduce [11, 12]: the 1 ms transfer) made nobody lose time. (Each window begins at the
    # host's step start 0: 0.9 ms host and 0.1 ms launch latency before the first kernel.)
    r0 = _rank(0, 2, [(1, 5, 0.9, "c"), (5, 12, 4.95, "a"), (5, 12, 4.96, "c")])
    r1 = _rank(1, 2, [(1, 11, 0.9, "c"), (11, 12, 10.9, "a")])
    diag = analyze_run(Run([r0, r1], "kineto"), Options())
    attr = attribution(diag)
    c0 = _ms(attr.causes[(0, 0)])
    assert sum(c0.values()) == 1.0 and c0["host"] == 0.9 and c0["exposed_comm"] == 0.0
    assert _ms(attr.causes[(1, 0)])["exposed_comm"] == 1.0
    assert attr.collective_waits is not None and not attr.collective_waits.late
    assert not [f for f in diag.findings if f.code == "PP009"]


def test_ranks_taking_turns_are_not_stragglers() -> None:
    # Rank 1 computes 3 ms longer before the first all-reduce, rank 0 3 ms longer before the
    # second: each waits 3 ms for the other once (imbalance both times) and neither is a straggler.
    # Rank 0: compute [1, 5], all-reduce [5, 9], compute [9, 13], all-reduce [13, 14].
    # Rank 1: compute [1, 8], all-reduce [8, 9], compute [9, 10], all-reduce [10, 14].
    r0 = _rank(0, 2, [(1, 5, 0.9, "c"), (5, 9, 4.95, "a"), (9, 13, 5.0, "c"), (13, 14, 5.1, "a")])
    r1 = _rank(1, 2, [(1, 8, 0.9, "c"), (8, 9, 7.95, "a"), (9, 10, 8.0, "c"), (10, 14, 8.1, "a")])
    diag = analyze_run(Run([r0, r1], "kineto"), Options())
    attr = attribution(diag)
    for k in ((0, 0), (1, 0)):
        c = _ms(attr.causes[k])
        assert c["imbalance"] == 3.0 and c["exposed_comm"] == 2.0, c
    assert attr.collective_waits is not None and set(attr.collective_waits.late) == {0, 1}
    assert not [f for f in diag.findings if f.code == "PP009"]
