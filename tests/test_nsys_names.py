"""p2p peers and direction from names when the NCCL payloads are not in the export.

Synthetic nsys exports (``ppsynth.nsys``, with payloads) are rewritten with SQL on a copy,
the way exports without ``--include-blobs`` or recorded under ``emit_nvtx`` look: payload blobs
deleted, the NCCL domain-create row deleted, NCCL's ``ncclSend``/``ncclRecv`` ranges joined or
replaced by PyTorch's ``nccl:send a->b`` / ``nccl:recv a<-b`` ranges (process-group ranks). The
expected peers come from the synthetic run's truth, the expected diagnosis from the untouched
export.
"""

from __future__ import annotations

import itertools
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ppdiag.model import Kind, RangeKind, RankTimeline
from ppdiag.parsers import ParseOptions
from ppdiag.parsers.nsys import NsysParser, resolve_nccl_peers
from ppdiag.parsers.nsys_peers import _group_stride
from ppdiag.report_types import Report
from ppsynth.nsys import comm_hash, write_nsys
from ppsynth.run import SynthRun
from ppsynth.scenario import make_scenario

GroupRanks = Callable[[int, int], tuple[int, int]]
BLOB_HEADER = 32  # the writer's payload blob: 4 x u64 header, then the struct (comm id first)


def _parse(paths: list[Path]) -> tuple[list[RankTimeline], list[str]]:
    tls = sorted((t for p in paths for t in NsysParser().parse(p, ParseOptions())), key=lambda t: t.rank)
    return tls, resolve_nccl_peers(tls)


def _world(a: int, b: int) -> tuple[int, int]:
    return a, b


def _pp_group_ranks(run: SynthRun) -> GroupRanks:
    """(own, peer) ranks inside the pipeline process group both belong to, as PyTorch names them."""
    by_rank = {r.rank: r for r in run.ranks}

    def f(me: int, peer: int) -> tuple[int, int]:
        for pg in by_rank[me].process_groups:
            if pg.desc == "PIPELINE_MODEL_PARALLEL_GROUP" and peer in pg.ranks:
                return pg.ranks.index(me), pg.ranks.index(peer)
        raise AssertionError(f"no pipeline group holds {me} and {peer}")

    return f


def emit_nvtx(
    path: Path,
    rank: int | dict[int, int],
    world: int,
    group_ranks: GroupRanks,
    *,
    replace: bool,
    p2p_blobs_only: bool = False,
) -> int:
    """Rewrite one export as if recorded under ``torch.autograd.profiler.emit_nvtx`` without blobs.

    Each NCCL ``ncclSend``/``ncclRecv`` of a 2-rank p2p communicator gets a PyTorch range
    ``nccl:send a->b, seq = N, op_id = M`` (default domain, same thread, a little wider), or is
    renamed into one (``replace``); then every payload blob is deleted (only those of the p2p
    calls with ``p2p_blobs_only``: collectives keep their communicators). ``rank``: the file's rank,
    or {pid: rank} for a report holding several processes. Returns ranges written.
    """
    pairs = {comm_hash("p2p", lo, hi): (lo, hi) for lo, hi in itertools.combinations(range(world), 2)}
    conn = sqlite3.connect(path)
    try:
        ids = dict(conn.execute("SELECT value, id FROM StringIds WHERE value IN ('ncclSend', 'ncclRecv')"))
        rows = conn.execute(
            'SELECT rowid, start, "end", globalTid, textId, binaryData FROM NVTX_EVENTS '
            "WHERE textId IN (?, ?)",
            (ids.get("ncclSend", -1), ids.get("ncclRecv", -1)),
        ).fetchall()
        next_id = int(conn.execute("SELECT max(id) FROM StringIds").fetchone()[0]) + 1
        names: dict[str, int] = {}
        written = 0
        for k, (rowid, start, end, gtid, text_id, blob) in enumerate(rows):
            comm = struct.unpack_from("<Q", blob, BLOB_HEADER)[0]
            if comm not in pairs:
                continue  # an all-to-all member: PyTorch names those ranges differently
            lo, hi = pairs[comm]
            mine = rank if isinstance(rank, int) else rank[(gtid >> 24) & 0xFFFFFF]
            me, peer = group_ranks(mine, hi if mine == lo else lo)
            send = text_id == ids.get("ncclSend")
            name = (f"nccl:send {me}->{peer}" if send else f"nccl:recv {me}<-{peer}") + (
                f", seq = {k}, op_id = {1000 + k}"
            )
            if name not in names:
                names[name] = next_id
                conn.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (next_id, name))
                next_id += 1
            if replace:
                conn.execute(
                    "UPDATE NVTX_EVENTS SET textId = ?, domainId = 0 WHERE rowid = ?", (names[name], rowid)
                )
            else:
                conn.execute(
                    'INSERT INTO NVTX_EVENTS (start, "end", eventType, globalTid, textId, domainId) '
                    "VALUES (?, ?, 59, ?, ?, 0)",
                    (start - 300, end + 300, gtid, names[name]),
                )
            written += 1
        if p2p_blobs_only:
            conn.executemany(
                "UPDATE NVTX_EVENTS SET binaryData = NULL WHERE rowid = ?", [(r[0],) for r in rows]
            )
        else:
            conn.execute("UPDATE NVTX_EVENTS SET binaryData = NULL")
        conn.commit()
    finally:
        conn.close()
    return written


def _sql_all(paths: list[Path], *stmts: str) -> None:
    for p in paths:
        conn = sqlite3.connect(p)
        for q in stmts:
            conn.execute(q)
        conn.commit()
        conn.close()


def _truth_p2p(run: SynthRun, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(peer, direction) of the rank's p2p kernels in start order."""
    g = next(r for r in run.ranks if r.rank == rank).gpu
    order = np.lexsort((g.end, g.start))
    p2p = g.kind[order] == Kind.P2P
    return g.peer[order][p2p], g.direction[order][p2p]


def _parsed_p2p(tl: RankTimeline) -> tuple[np.ndarray, np.ndarray]:
    iv = tl.intervals
    order = np.lexsort((iv.end, iv.start))
    p2p = iv.kind[order] == Kind.P2P
    return iv.peer[order][p2p], iv.direction[order][p2p]


@pytest.fixture(scope="module")
def run_1f1b() -> SynthRun:
    return make_scenario("1f1b", pp=4, microbatches=6, steps=2, clock_skew_ms=2.0, seed=11)


@pytest.mark.parametrize("replace", [False, True], ids=["beside-nccl-ranges", "instead-of-nccl-ranges"])
def test_emit_nvtx_names_give_the_peers(run_1f1b: SynthRun, tmp_path: Path, replace: bool) -> None:
    paths = write_nsys(run_1f1b, tmp_path)
    n = sum(emit_nvtx(p, i, run_1f1b.world_size, _world, replace=replace) for i, p in enumerate(paths))
    assert n > 0
    tls, run_warn = _parse(paths)
    assert run_warn == []
    for tl in tls:
        want_peer, want_dir = _truth_p2p(run_1f1b, tl.rank)
        got_peer, got_dir = _parsed_p2p(tl)
        assert len(want_peer) > 0
        np.testing.assert_array_equal(got_peer, want_peer, err_msg=f"rank {tl.rank}")
        np.testing.assert_array_equal(got_dir, want_dir, err_msg=f"rank {tl.rank}")
        assert tl.meta["p2p_peer_source"] == {"metadata": 0, "nvtx name": len(want_peer), "none": 0}
        w = " ".join(tl.warnings)
        assert "'nccl:send a->b'" in w and "peers unknown" not in w and "unknown peer" not in w
        # the host ranges carry the same global peers (the pipeline's clock and topology use them)
        rg = tl.ranges
        named = np.array(["nccl:" in tl.names[i] for i in rg.name], dtype=bool)
        assert named.any() and (rg.peer[named] >= 0).all()
        assert set(rg.peer[named].tolist()) == set(want_peer.tolist())


def test_one_report_holding_every_process(run_1f1b: SynthRun, tmp_path: Path) -> None:
    (path,) = write_nsys(run_1f1b, tmp_path, per_rank_files=False)
    emit_nvtx(path, {r.pid: r.rank for r in run_1f1b.ranks}, run_1f1b.world_size, _world, replace=True)
    tls, run_warn = _parse([path])
    assert run_warn == [] and [t.rank for t in tls] == [r.rank for r in run_1f1b.ranks]
    for tl in tls:
        want_peer, want_dir = _truth_p2p(run_1f1b, tl.rank)
        got_peer, got_dir = _parsed_p2p(tl)
        np.testing.assert_array_equal(got_peer, want_peer, err_msg=f"rank {tl.rank}")
        np.testing.assert_array_equal(got_dir, want_dir, err_msg=f"rank {tl.rank}")


def test_payload_peers_say_metadata(run_1f1b: SynthRun, tmp_path: Path) -> None:
    tls, _ = _parse(write_nsys(run_1f1b, tmp_path))
    for tl in tls:
        n = int((tl.intervals.kind == Kind.P2P).sum())
        assert tl.meta["p2p_peer_source"] == {"metadata": n, "nvtx name": 0, "none": 0}


def test_pipeline_group_ranks_are_mapped_to_global_ranks(tmp_path: Path) -> None:
    # two replicas of a 3-stage pipeline: pipeline groups [0, 2, 4] and [1, 3, 5] (stride 2), so
    # "nccl:send 0->1" on global rank 1 goes to global rank 3
    run = make_scenario(
        "1f1b", pp=3, microbatches=4, dp=2, steps=2, clock_skew_ms=1.0, gpus_per_node=1, seed=4
    )
    paths = write_nsys(run, tmp_path)
    pg = _pp_group_ranks(run)
    for i, p in enumerate(paths):
        emit_nvtx(p, i, run.world_size, pg, replace=True)
    tls, run_warn = _parse(paths)
    assert run_warn == []
    for tl in tls:
        want_peer, want_dir = _truth_p2p(run, tl.rank)
        got_peer, got_dir = _parsed_p2p(tl)
        np.testing.assert_array_equal(got_peer, want_peer, err_msg=f"rank {tl.rank}")
        np.testing.assert_array_equal(got_dir, want_dir, err_msg=f"rank {tl.rank}")
    # the same ranks read one replica at a time still map (stride found from that replica alone)
    tls, run_warn = _parse([paths[1], paths[3], paths[5]])
    assert run_warn == []
    assert [int(np.unique(_parsed_p2p(t)[0]).size) for t in tls] == [1, 2, 1]
    assert set(_parsed_p2p(tls[1])[0].tolist()) == {1, 5}


def test_group_layout_that_fits_nothing_is_said() -> None:
    # (rank, own group rank, peer group rank): rank 0 says "send 0->1", but no rank names 0 back
    triples = np.array([[0, 5], [0, 1], [1, 2]], dtype=np.int64)
    stride, why = _group_stride(triples, {0, 5})
    assert stride is None and "no regular group layout" in why
    # ranks 0 and 1 are group ranks 0 and 1 of the world: identity without any mirror check
    assert _group_stride(np.array([[0, 1], [0, 1], [1, 0]]), {0, 1})[0] == 1
    # groups [0, 2] and [1, 3] (stride 2) versus [0, 1] and [2, 3] (stride 1): the names decide
    t2 = np.array([[0, 2, 1, 3], [0, 1, 0, 1], [1, 0, 1, 0]], dtype=np.int64)
    assert _group_stride(t2, {0, 1, 2, 3})[0] == 2
    t1 = np.array([[0, 1, 2, 3], [0, 1, 0, 1], [1, 0, 1, 0]], dtype=np.int64)
    assert _group_stride(t1, {0, 1, 2, 3})[0] == 1


def test_unmappable_group_ranks_warn_and_keep_direction(tmp_path: Path) -> None:
    run = make_scenario("gpipe", pp=2, microbatches=2, steps=1, clock_skew_ms=0.0, seed=1)
    paths = write_nsys(run, tmp_path)
    # a group numbering that no regular layout explains (rank 0 calls itself 7, rank 1 calls itself 3)
    odd = {0: 7, 1: 3}
    for i, p in enumerate(paths):
        emit_nvtx(p, i, run.world_size, lambda me, peer: (odd[me], odd[peer]), replace=True)
    tls, run_warn = _parse(paths)
    assert len(run_warn) == 1 and "process-group rank" in run_warn[0] and "peers stay unknown" in run_warn[0]
    for tl in tls:
        peer, d = _parsed_p2p(tl)
        _, want_dir = _truth_p2p(run, tl.rank)
        assert (peer == -1).all()
        np.testing.assert_array_equal(d, want_dir)
        assert tl.meta["p2p_peer_source"]["none"] == len(peer)


def test_without_payloads_direction_stays_and_peers_are_left_to_timing(
    run_1f1b: SynthRun, tmp_path: Path
) -> None:
    paths = write_nsys(run_1f1b, tmp_path)
    _sql_all(paths, "UPDATE NVTX_EVENTS SET binaryData = NULL")
    tls, _ = _parse(paths)
    for tl in tls:
        peer, d = _parsed_p2p(tl)
        _, want_dir = _truth_p2p(run_1f1b, tl.rank)
        assert (peer == -1).all()
        np.testing.assert_array_equal(d, want_dir)
        assert any("--include-blobs" in w for w in tl.warnings)
        assert tl.meta["p2p_peer_source"] == {"metadata": 0, "nvtx name": 0, "none": len(peer)}


def test_nccl_domain_without_its_create_row(run_1f1b: SynthRun, tmp_path: Path) -> None:
    base = write_nsys(run_1f1b, tmp_path / "a")
    want, _ = _parse(base)
    paths = write_nsys(run_1f1b, tmp_path / "b")
    _sql_all(paths, "DELETE FROM NVTX_EVENTS WHERE eventType = 75")
    got, run_warn = _parse(paths)
    assert run_warn == []
    for a, b in zip(want, got, strict=True):
        for c in ("kind", "direction", "peer", "bytes", "group"):
            np.testing.assert_array_equal(getattr(a.intervals, c), getattr(b.intervals, c), err_msg=c)
        w = " ".join(b.warnings)
        assert "no NCCL NVTX ranges" not in w and "classified by name only" not in w
    assert any("no domain-create row" in w for w in got[0].warnings)


def test_nccl_domain_without_create_row_or_payloads(run_1f1b: SynthRun, tmp_path: Path) -> None:
    # recognised by its range names alone: NCCL's ranges still give the direction of each kernel
    paths = write_nsys(run_1f1b, tmp_path)
    _sql_all(
        paths,
        "DELETE FROM NVTX_EVENTS WHERE eventType = 75",
        "UPDATE NVTX_EVENTS SET binaryData = NULL",
        "DROP TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES",
        "DROP TABLE NVTX_PAYLOAD_SCHEMAS",
    )
    tls, _ = _parse(paths)
    for tl in tls:
        _, want_dir = _truth_p2p(run_1f1b, tl.rank)
        np.testing.assert_array_equal(_parsed_p2p(tl)[1], want_dir)
        assert not any("no NCCL NVTX ranges" in w for w in tl.warnings)
        # the NCCL calls are not user annotations
        assert not any(
            tl.names[i].startswith("ncclSend") for i in tl.ranges.name[tl.ranges.kind == RangeKind.OTHER]
        )


def _report(paths: list[Path]) -> Report:
    api = pytest.importorskip("ppdiag.api")
    loader = pytest.importorskip("ppdiag.parsers.loader")
    report: Report = api.analyze_run(loader.load_run(paths, progress=False, jobs=1)).result
    return report


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_diagnosis_with_emit_nvtx_names_equals_the_one_with_payloads(tmp_path: Path, schedule: str) -> None:
    run = make_scenario(schedule, pp=4, microbatches=8, steps=3, clock_skew_ms=3.0, gpus_per_node=1, seed=7)
    ref = _report(write_nsys(run, tmp_path / "payloads"))
    paths = write_nsys(run, tmp_path / "names")
    for i, p in enumerate(paths):
        emit_nvtx(p, i, run.world_size, _world, replace=False)
    got = _report(paths)
    assert ref.run.pp == 4
    # the report says where the peers came from: payloads vs the profiler's range names
    assert ref.run.peer_source == "metadata"
    assert got.run.peer_source == "nvtx name"
    for key in ("pp", "stage_map", "schedule", "microbatches"):
        assert getattr(got.run, key) == getattr(ref.run, key), key
    step, got_step = ref.summary.step_ms, got.summary.step_ms
    assert step is not None and got_step is not None
    assert abs(got_step - step) <= 0.01 * step
    for cause, ms in ref.summary.lost_ms.items():
        assert abs(got.summary.lost_ms[cause] - ms) <= 0.01 * step, cause


def test_p2p_by_names_with_collective_payloads_kept(tmp_path: Path) -> None:
    # two pipeline replicas: only the p2p calls lost their payloads (renamed to emit_nvtx names);
    # the data-parallel all-reduce keeps its communicator, whose members come from other files
    run = make_scenario(
        "1f1b", pp=4, microbatches=8, steps=3, dp=2, clock_skew_ms=3.0, gpus_per_node=1, seed=9
    )
    ref = _report(write_nsys(run, tmp_path / "payloads"))
    paths = write_nsys(run, tmp_path / "names")
    pg = _pp_group_ranks(run)
    for i, p in enumerate(paths):
        emit_nvtx(p, i, run.world_size, pg, replace=True, p2p_blobs_only=True)
    tls, run_warn = _parse(paths)
    assert run_warn == []
    for tl in tls:
        coll = tl.intervals.kind == Kind.COLLECTIVE
        groups = {int(g) for g in tl.intervals.group[coll]}
        assert groups and all(len(tl.process_groups[g].ranks) > 1 for g in groups), tl.rank
        assert (tl.intervals.peer[tl.intervals.kind == Kind.P2P] >= 0).all()
    got = _report(paths)
    for key in ("pp", "stage_map", "schedule", "microbatches"):
        assert getattr(got.run, key) == getattr(ref.run, key), key
    step = ref.summary.step_ms
    assert step is not None
    for cause, ms in ref.summary.lost_ms.items():
        assert abs(got.summary.lost_ms[cause] - ms) <= 0.01 * step, cause


def test_unclosed_pytorch_ranges_still_give_the_peers(run_1f1b: SynthRun, tmp_path: Path) -> None:
    # PyTorch's p2p titles are async record functions: their NVTX range may never be popped on
    # the thread that pushed it, so the export holds no end for them
    paths = write_nsys(run_1f1b, tmp_path)
    for i, p in enumerate(paths):
        emit_nvtx(p, i, run_1f1b.world_size, _world, replace=False)
    _sql_all(
        paths,
        'UPDATE NVTX_EVENTS SET "end" = NULL '
        "WHERE textId IN (SELECT id FROM StringIds WHERE value LIKE 'nccl:%')",
    )
    tls, run_warn = _parse(paths)
    assert run_warn == []
    for tl in tls:
        want_peer, want_dir = _truth_p2p(run_1f1b, tl.rank)
        got_peer, got_dir = _parsed_p2p(tl)
        np.testing.assert_array_equal(got_peer, want_peer, err_msg=f"rank {tl.rank}")
        np.testing.assert_array_equal(got_dir, want_dir, err_msg=f"rank {tl.rank}")
        assert tl.events_lost == 0
        assert any("never closed" in w for w in tl.warnings)
        assert not any("NVTX range(s) dropped" in w for w in tl.warnings)
