"""Critical path on hand-built aligned timelines, the expected chain worked out in comments.

Times are µs on one aligned clock. F = forward, B = backward; transfers are (src, dst, send start,
receive end).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.critical_path import Transfers, _Walk, _walk_step, critical_paths
from ppdiag.diagnosis import GapTable, StepWindow
from ppdiag.model import Phase
from ppdiag.pipeline.blocks import Blocks
from ppdiag.report_types import PATH_CATEGORIES, Cause, path_by_stage

US = 1000
F, B = int(Phase.FWD), int(Phase.BWD)


def _blocks(rows: list[tuple[int, int, int, int]], stage: int) -> Blocks:
    """(start µs, end µs, phase, micro-batch) of one rank, step 0."""
    n = len(rows)
    return Blocks(
        np.zeros(n, np.int32),
        np.array([r[0] * US for r in rows], np.int64),
        np.array([r[1] * US for r in rows], np.int64),
        np.array([(r[1] - r[0]) * US for r in rows], np.int64),
        np.full(n, -1, np.int64),
        np.array([r[2] for r in rows], np.int8),
        np.array([r[3] for r in rows], np.int32),
        np.full(n, stage, np.int32),
    )


def _gaps(rows: list[tuple[int, int, Cause]]) -> GapTable:
    n = len(rows)
    return GapTable(
        np.array([r[0] * US for r in rows], np.int64),
        np.array([r[1] * US for r in rows], np.int64),
        np.array([r[2].code for r in rows], np.int8),
        np.full(n, -1, np.int32),
        np.zeros(n, np.int32),
    )


def _two_stage() -> tuple[list[StepWindow], dict[int, Blocks], Transfers, dict[int, GapTable]]:
    """Two stages, M = 2, GPipe order, F = 10, B = 20 on both ranks, 1 µs transfers.

    rank 0: F0 [0,10) F1 [10,20) ............ B0 [52,72) ........ B1 [93,113)   step [0, 113)
    rank 1:   F0 [11,21) F1 [21,31) B0 [31,51) ....... B1 [72,92)              step [0, 113)
    transfers: 0->1 F0 (send 10, recv end 11), 0->1 F1 (20 -> 21),
               1->0 B0 (51 -> 52), 1->0 B1 (92 -> 93)
    rank 1 idles [51, 72) (painted imbalance here) before its B1.
    """
    b0 = _blocks([(0, 10, F, 0), (10, 20, F, 1), (52, 72, B, 0), (93, 113, B, 1)], 0)
    b1 = _blocks([(11, 21, F, 0), (21, 31, F, 1), (31, 51, B, 0), (72, 92, B, 1)], 1)
    re_b1 = 93
    tr = Transfers.build(
        [0, 0, 1, 1],
        [1, 1, 0, 0],
        [10 * US, 20 * US, 51 * US, 92 * US],
        [10 * US, 20 * US, 51 * US, 92 * US],
        [11 * US, 21 * US, 52 * US, re_b1 * US],
    )
    g0 = _gaps([(20, 52, Cause.BUBBLE), (72, 93, Cause.IMBALANCE)])
    g1 = _gaps([(0, 11, Cause.BUBBLE), (51, 72, Cause.IMBALANCE), (92, 113, Cause.BUBBLE)])
    wins = [StepWindow(0, 0, 5, 0, 113 * US), StepWindow(1, 0, 5, 0, 113 * US)]
    return wins, {0: b0, 1: b1}, tr, {0: g0, 1: g1}


def test_chain_of_two_stages() -> None:
    wins, blocks, tr, gaps = _two_stage()
    (cp,) = critical_paths(wins, blocks, tr, gaps, {0: 0, 1: 1})
    # Step end 113 on rank 0 (ties: lowest rank). Backwards:
    #   B1 on rank 0 [93,113): its previous block B0 ended at 72, the transfer 1->0 ended at 93:
    #   released by the transfer [92,93) from rank 1, which issued it at 92 after B1 on rank 1
    #   [72,92); rank 1's previous block B0 ended at 51 and no transfer into rank 1 ended in
    #   (51, 72]: the gap [51,72) (imbalance) and B0 [31,51), released by F1 [21,31) (the
    #   transfer 0->1 of F1 ended at 21 = the end of F0, not later), F1 by F0 [11,21) (previous
    #   block: none on rank 1, so the transfer 0->1 that ended at 11 released it: [10,11)), then
    #   rank 0's F0 [0,10) and the step start.
    got = [
        (p.kind, p.rank, p.phase, p.mb, p.cause, round(p.t_ms * 1000), round(p.dur_ms * 1000))
        for p in cp.pieces
    ]
    assert got == [
        ("block", 0, "F", 0, None, 0, 10),
        ("transfer", 1, None, None, None, 10, 1),
        ("block", 1, "F", 0, None, 11, 10),
        ("block", 1, "F", 1, None, 21, 10),
        ("block", 1, "B", 0, None, 31, 20),
        ("gap", 1, None, None, "imbalance", 51, 21),
        ("block", 1, "B", 1, None, 72, 20),
        ("transfer", 0, None, None, None, 92, 1),
        ("block", 0, "B", 1, None, 93, 20),
    ]
    assert cp.length_ms * 1000 == 113 and cp.end_rank == 0 and cp.start_rank == 0 and cp.step == 5
    assert [p.peer for p in cp.pieces if p.kind == "transfer"] == [0, 1]
    by = {r.stage: r.ms for r in cp.by_stage}
    # stage 0: F0 + B1 = 30 µs of compute; the transfer 1->0 is charged to its receiver (stage 0)
    assert round(by[0]["compute"] * 1000) == 30 and round(by[0]["transfer"] * 1000) == 1
    # stage 1: F0 + F1 + B0 + B1 = 60 µs, the 0->1 transfer 1 µs, the imbalance gap 21 µs
    assert round(by[1]["compute"] * 1000) == 60 and round(by[1]["imbalance"] * 1000) == 21
    assert round(by[1]["transfer"] * 1000) == 1
    assert round(sum(v for r in cp.by_stage for v in r.ms.values()) * 1000) == 113


def test_slow_transfer_is_on_the_path_and_local_wait_is_split_by_cause() -> None:
    """Rank 0 sends F0 at 10 and it arrives at 40 (slow link): rank 1's F0 [40,50) is released by
    the transfer; [10, 40) is the transfer on the path, then rank 0's F0 [0, 10). A host gap
    [50, 55) sits between rank 1's F0 and its tail to the step end 60: a gap piece (host) then
    compute outside blocks [55, 60) (optimizer)."""
    b0 = _blocks([(0, 10, F, 0)], 0)
    b1 = _blocks([(40, 50, F, 0)], 1)
    tr = Transfers.build([0], [1], [10 * US], [5 * US], [40 * US])
    gaps = {0: _gaps([(10, 60, Cause.BUBBLE)]), 1: _gaps([(0, 40, Cause.COMM_WAIT), (50, 55, Cause.HOST)])}
    wins = [StepWindow(0, 0, -1, 0, 60 * US), StepWindow(1, 0, -1, 0, 60 * US)]
    (cp,) = critical_paths(wins, {0: b0, 1: b1}, tr, gaps, {0: 0, 1: 1})
    got = [(p.kind, p.rank, p.cause, round(p.t_ms * 1000), round(p.dur_ms * 1000)) for p in cp.pieces]
    # the last-ending rank is a tie (both end at 60): the lowest rank, 0, whose last block F0 ended
    # at 10 with nothing after it but a bubble gap: rank 0 alone is the path
    assert got == [("block", 0, None, 0, 10), ("gap", 0, "bubble", 10, 50)]
    # make rank 1 finish last: now the slow transfer is on the path
    wins = [StepWindow(0, 0, -1, 0, 59 * US), StepWindow(1, 0, -1, 0, 60 * US)]
    gaps[0] = _gaps([(10, 59, Cause.BUBBLE)])
    (cp,) = critical_paths(wins, {0: b0, 1: b1}, tr, gaps, {0: 0, 1: 1})
    got = [(p.kind, p.rank, p.cause, round(p.t_ms * 1000), round(p.dur_ms * 1000)) for p in cp.pieces]
    assert got == [
        ("block", 0, None, 0, 10),
        ("transfer", 1, None, 10, 30),
        ("block", 1, None, 40, 10),
        ("gap", 1, "host", 50, 5),
        ("other", 1, None, 55, 5),
    ]
    assert cp.step == 0 and cp.length_ms * 1000 == 60


def test_gap_inside_a_block_keeps_its_cause() -> None:
    """A single rank, one block [0, 30) with a host gap [10, 14) inside: the block is one piece
    that keeps the 4 µs of host inside it; the by_stage table holds 26 µs compute, 4 µs host."""
    b = _blocks([(0, 30, F, 0)], 0)
    gaps = {0: _gaps([(10, 14, Cause.HOST)])}
    (cp,) = critical_paths(
        [StepWindow(0, 0, 1, 0, 30 * US)], {0: b}, Transfers.build([], [], [], [], []), gaps, {0: 0}
    )
    assert [(p.kind, round(p.dur_ms * 1000)) for p in cp.pieces] == [("block", 30)]
    assert cp.pieces[0].lost_ms == {"host": 0.004}
    (row,) = cp.by_stage
    assert round(row.ms["compute"] * 1000) == 26 and round(row.ms["host"] * 1000) == 4


def test_no_blocks_no_path() -> None:
    assert (
        critical_paths(
            [StepWindow(0, 0, 1, 0, 10)], {0: Blocks.empty()}, Transfers.build([], [], [], [], []), {}, {}
        )
        == []
    )


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 4),
    st.integers(1, 4),
    st.lists(st.integers(1, 30), min_size=32, max_size=32),
    st.lists(st.integers(0, 8), min_size=32, max_size=32),
)
def test_pieces_tile_the_path(p: int, m: int, cost: list[int], lat: list[int]) -> None:
    """Random GPipe forward chains: rank s runs F0..F(m-1), each released by its predecessor and
    by the transfer from rank s-1 (latency ``lat``). The pieces never overlap, are in time order,
    and add up to the path length; each table row adds up too."""
    blocks: dict[int, Blocks] = {}
    src: list[int] = []
    dst: list[int] = []
    ss: list[int] = []
    re: list[int] = []
    ends = [0] * m
    k = 0
    end_all = 0
    for s in range(p):
        rows = []
        t = 0
        for mb in range(m):
            start = max(t, ends[mb])
            e = start + cost[k % 32]
            rows.append((start, e, F, mb))
            if s + 1 < p:
                arrive = e + lat[k % 32]
                src.append(s)
                dst.append(s + 1)
                ss.append(e * US)
                re.append(arrive * US)
                ends[mb] = arrive
            t = e
            k += 1
        blocks[s] = _blocks(rows, s)
        end_all = max(end_all, t)
    wins = [StepWindow(s, 0, 0, 0, end_all * US) for s in range(p)]
    (cp,) = critical_paths(wins, blocks, Transfers.build(src, dst, ss, ss, re), {}, {s: s for s in range(p)})
    at = 0.0
    for piece in cp.pieces:
        assert abs(piece.t_ms - at) < 1e-6 and piece.dur_ms > 0
        at = piece.t_ms + piece.dur_ms
    assert abs(at - cp.length_ms) < 1e-6
    tot = sum(v for r in cp.by_stage for v in r.ms.values())
    assert abs(tot - cp.length_ms) < 1e-6
    assert set(cp.by_stage[0].ms) == set(PATH_CATEGORIES)
    # the last stage's last block is always on the path
    assert cp.pieces[-1].kind in ("block", "other") and cp.pieces[-1].rank in range(p)
    assert path_by_stage([cp, cp])[0].ms == cp.by_stage[0].ms


def test_receive_posted_after_the_send_keeps_the_chain_on_the_receiver() -> None:
    """Rank 0 sends F0 at 10; rank 1 is busy with other work until 30 (compute outside blocks),
    posts its receive at 30, gets the data at 31 and runs F0 [31, 41). The data was waiting: the
    receiver set the pace, so the path is rank 1 alone: other [0, 30), transfer [30, 31), F0."""
    b0 = _blocks([(0, 10, F, 0)], 0)
    b1 = _blocks([(31, 41, F, 0)], 1)
    tr = Transfers.build([0], [1], [10 * US], [30 * US], [31 * US])
    wins = [StepWindow(0, 0, 1, 0, 20 * US), StepWindow(1, 0, 1, 0, 41 * US)]
    (cp,) = critical_paths(wins, {0: b0, 1: b1}, tr, {}, {0: 0, 1: 1})
    got = [(p.kind, p.rank, round(p.t_ms * 1000), round(p.dur_ms * 1000)) for p in cp.pieces]
    assert got == [("other", 1, 0, 30), ("transfer", 1, 30, 1), ("block", 1, 31, 10)]
    assert cp.start_rank == 1


def test_parts_of_one_block_are_one_piece() -> None:
    """F0 of rank 0 in two parts [0, 10) and [12, 20) with a host gap [10, 12) between them (a block
    cut per layer): one block piece [0, 20) with 2 µs host inside; then F1 [20, 30) its own piece."""
    b = _blocks([(0, 10, F, 0), (12, 20, F, 0), (20, 30, F, 1)], 0)
    gaps = {0: _gaps([(10, 12, Cause.HOST)])}
    (cp,) = critical_paths(
        [StepWindow(0, 0, 1, 0, 30 * US)], {0: b}, Transfers.build([], [], [], [], []), gaps, {0: 0}
    )
    assert [(p.kind, p.mb, round(p.t_ms * 1000), round(p.dur_ms * 1000)) for p in cp.pieces] == [
        ("block", 0, 0, 20),
        ("block", 1, 20, 10),
    ]
    assert cp.pieces[0].lost_ms == {"host": 0.002}
    (row,) = cp.by_stage
    assert round(row.ms["compute"] * 1000) == 28 and round(row.ms["host"] * 1000) == 2


def test_a_replica_off_the_path_is_never_prepared() -> None:
    # Two replicas of _two_stage in one step: ranks 0, 1 and a copy on ranks 2, 3 (the same times,
    # transfers 2 <-> 3). The step ends at 113 µs on ranks 0 and 2; ties go to the lowest rank, so
    # the walk starts on rank 0 and stays on ranks 0 and 1 (every transfer it meets comes from
    # rank 1 or 0). The path is the one of the first replica alone, and the walk sorts and lists
    # the blocks, gaps and transfers of ranks 0 and 1 only (a run of many replicas pays for one).
    wins, blocks, tr, gaps = _two_stage()
    (alone,) = critical_paths(wins, blocks, tr, gaps, {0: 0, 1: 1})
    both_wins = wins + [StepWindow(r + 2, 0, 5, 0, 113 * US) for r in (0, 1)]
    both_blocks = {**blocks, 2: blocks[0], 3: blocks[1]}
    both_gaps = {**gaps, 2: gaps[0], 3: gaps[1]}
    both_tr = Transfers.build(
        np.r_[tr.src, tr.src + 2],
        np.r_[tr.dst, tr.dst + 2],
        np.r_[tr.send_start, tr.send_start],
        np.r_[tr.recv_start, tr.recv_start],
        np.r_[tr.recv_end, tr.recv_end],
    )
    w = _Walk(both_blocks, both_tr, both_gaps, {0: 0, 1: 1, 2: 0, 3: 1})
    cp = _walk_step(w, both_wins)
    assert cp is not None
    assert cp.pieces == alone.pieces and cp.length_ms == alone.length_ms == 0.113
    assert set(w._bl) == {0, 1} and set(w._tr) <= {0, 1} and set(w._gs) <= {0, 1}


def _random_run(
    seed: int, p: int, steps: int
) -> tuple[list[StepWindow], dict[int, Blocks], Transfers, dict[int, GapTable]]:
    """``p`` ranks and ``steps`` steps of 1 ms (µs units) drawn from ``seed``: blocks of random
    phase, micro-batch and stage (some touching, some unknown), disjoint gaps of random cause that
    fall between and inside blocks, transfers between random ranks posted before or after the
    send, and a rank now and then missing from a step's windows or numbered -1."""
    rng = np.random.default_rng(seed)
    blocks: dict[int, Blocks] = {}
    gaps: dict[int, GapTable] = {}
    horizon = steps * 1000
    for r in range(p):
        starts = np.cumsum(rng.integers(0, 25, 8 * steps * 4)) + rng.integers(0, 20)
        starts = starts[starts < horizon - 40][::2]
        ends = starts + rng.integers(1, 40, starts.size)
        n = starts.size
        blocks[r] = Blocks(
            (starts // 1000).astype(np.int32),
            starts * US,
            ends * US,
            (ends - starts) * US,
            np.full(n, -1, np.int64),
            rng.choice(np.array([F, B, int(Phase.WGRAD), 9], np.int8), n),
            rng.integers(-1, 3, n).astype(np.int32),
            rng.integers(-1, 2, n).astype(np.int32),
        )
        cuts = np.unique(rng.integers(0, horizon * US, 2 * (horizon // 10)))
        gs, ge = cuts[0:-1:2], cuts[1::2]
        m = gs.size
        gaps[r] = GapTable(
            gs.astype(np.int64),
            ge,
            rng.integers(0, len(Cause), m).astype(np.int8),
            np.full(m, -1, np.int32),
            np.zeros(m, np.int32),
        )
    k = 40 * steps * p
    src = rng.integers(0, p, k)
    dst = (src + rng.integers(1, p, k)) % p
    ss = rng.integers(0, horizon * US, k)
    rs = ss + rng.integers(-30, 30, k) * US
    re = np.maximum(ss, rs) + rng.integers(0, 10 * US, k)
    wins = [
        StepWindow(
            r, s, s if seed % 3 else -1, s * 1000 * US + int(rng.integers(0, 30)) * US, (s + 1) * 1000 * US
        )
        for s in range(steps)
        for r in range(p)
        if rng.random() > 0.15
    ]
    return wins, blocks, Transfers.build(src, dst, ss, rs, re), gaps


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 4), st.integers(1, 3))
def test_walk_matches_the_step_at_a_time_reference(seed: int, p: int, steps: int) -> None:
    """The walk with per-rank columns and every step's stretches and lost time cut at once gives
    the very paths of the walk that searched per block and filled per step (the reference)."""
    import msgspec
    from critical_path_reference import critical_paths as reference

    wins, blocks, tr, gaps = _random_run(seed, p, steps)
    stage_of = {r: r % 2 for r in range(p)}
    new = critical_paths(wins, blocks, tr, gaps, stage_of)
    old = reference(wins, blocks, tr, gaps, stage_of)
    assert msgspec.json.encode(new) == msgspec.json.encode(old)
    assert new == old
