"""Nsight Systems reader: the real exports in ../shared/traces/nsys, hand-built exports for each
rule (NCCL projection, ranks, clocks), bad input and ``.nsys-rep`` handling.

Expected values come from the files themselves through independent SQL, or from the rows a test
writes, never from the reader's own output.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import shared_trace

from ppdiag.errors import InputError
from ppdiag.model import Direction, Kind, Phase, RangeKind, RankTimeline
from ppdiag.parsers import PARSERS, ParseOptions
from ppdiag.parsers.nsys import NsysParser, resolve_nccl_peers
from ppdiag.parsers.nsys_names import classify_kernel
from ppdiag.parsers.nsys_ranks import rank_from_filename
from ppsynth.nsys import (
    _SCHEMAS,
    SCHEMA_COMM_INIT,
    SCHEMA_SENDRECV,
    create_tables,
    insert,
    nvtx_row,
    payload_blob,
)

PARSER = NsysParser()
FSDP = "nsys/nsysai_h100_fsdp_2gpu.sqlite"
Y2024 = "nsys/pipit_cloverleaf_nsys2024.sqlite"
Y2022 = "nsys/pipit_saxpy_mpi_nsys2022.sqlite"


def parse(path: Path, **opts: Any) -> list[RankTimeline]:
    return PARSER.parse(path, ParseOptions(**opts))


def sql(path: Path, q: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(q).fetchall()
    finally:
        conn.close()


def head(path: Path) -> bytes:
    with path.open("rb") as fh:
        return fh.read(4096)


# ----------------------------------------------------------------------------------------------
# the real exports
# ----------------------------------------------------------------------------------------------


def test_registered_and_sniffs_real_exports() -> None:
    assert PARSERS["nsys"] is not None
    for rel in (FSDP, Y2024, Y2022):
        p = shared_trace(rel)
        assert PARSER.sniff(p, head(p))


@pytest.mark.parametrize("rel", [FSDP, Y2024, Y2022])
def test_every_export_parses_with_all_gpu_rows(rel: str) -> None:
    p = shared_trace(rel)
    tls = parse(p)
    assert tls
    n_k = sql(p, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    n_m = sql(p, "SELECT COUNT(*), coalesce(SUM(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY")[0]
    got_k = sum(int(np.isin(t.intervals.kind, (Kind.COMPUTE, Kind.P2P, Kind.COLLECTIVE)).sum()) for t in tls)
    got_m = sum(int((t.intervals.kind == Kind.MEMCPY).sum()) for t in tls)
    got_b = sum(int(t.intervals.bytes[t.intervals.kind == Kind.MEMCPY].sum()) for t in tls)
    assert got_k == n_k
    assert (got_m, got_b) == (n_m[0], n_m[1])
    for t in tls:
        iv = t.intervals
        assert t.format == "nsys"
        assert (iv.end >= iv.start).all()
        assert (np.diff(iv.start) >= 0).all()  # sorted
        assert all(0 <= i < len(t.names) for i in np.unique(iv.name))


def test_fsdp_report_splits_into_two_ranks() -> None:
    p = shared_trace(FSDP)
    tls = parse(p)
    assert [t.rank for t in tls] == [0, 1]
    per_pid = dict(
        sql(p, "SELECT (globalPid >> 24) & 16777215, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1")
    )
    dev_of = dict(
        sql(p, "SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL")
    )
    # ranks follow the GPU order; each has only its own process's kernels
    by_dev = sorted(per_pid, key=lambda pid: dev_of[pid])
    for tl, pid in zip(tls, by_dev, strict=True):
        assert tl.meta["pid"] == pid
        assert tl.device == f"cuda:{dev_of[pid]}"
        assert int((tl.intervals.kind == Kind.COMPUTE).sum()) == per_pid[pid]
        assert "order of the GPU" in tl.rank_source
        assert any("GPU processes in one report" in w for w in tl.warnings)
    # their own timelines: different streams, interleaved in time
    s0 = set(np.unique(tls[0].intervals.stream[tls[0].intervals.kind == Kind.COMPUTE]).tolist())
    s1 = set(np.unique(tls[1].intervals.stream[tls[1].intervals.kind == Kind.COMPUTE]).tolist())
    assert s0.isdisjoint(s1)


@pytest.mark.parametrize("rel", [FSDP, Y2024, Y2022])
def test_launch_join(rel: str) -> None:
    """Kernels get their launching call (same process, runtime/driver class only): exactly the
    kernels SQL can join, and every launch precedes its kernel."""
    p = shared_trace(rel)
    joinable = sql(
        p,
        """
        SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS (
          SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId
          AND (r.globalTid >> 24) = (k.globalPid >> 24) AND r.eventClass IN (0, 1))""",
    )[0][0]
    tls = parse(p)
    launch_known = 0
    ok = 0
    for t in tls:
        iv = t.intervals
        k = np.isin(iv.kind, (Kind.COMPUTE, Kind.P2P, Kind.COLLECTIVE))
        known = k & (iv.launch >= 0)
        launch_known += int(known.sum())
        ok += int((iv.launch[known] <= iv.start[known]).sum())
    assert launch_known == joinable
    assert ok == launch_known  # fraction 1.0 of the joined kernels
    if rel != FSDP:  # the FSDP fixture's runtime rows were cut to a shorter window by its author
        assert launch_known == sql(p, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]


def test_backtrace_duplicates_do_not_duplicate_kernels() -> None:
    p = shared_trace(Y2022)
    dup = sql(p, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 67")[0][0]
    assert dup > 0  # the file has them
    tl = parse(p)[0]
    launch = sql(
        p,
        """SELECT k.start, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                       ON r.correlationId = k.correlationId AND r.eventClass = 0 ORDER BY k.start""",
    )
    off = sql(p, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    k = tl.intervals.kind == Kind.COMPUTE
    assert tl.intervals.start[k].tolist() == [s + off for s, _ in launch]
    assert tl.intervals.launch[k].tolist() == [r + off for _, r in launch]


def test_session_start_clock_and_names() -> None:
    p = shared_trace(Y2024)
    tl = parse(p)[0]
    off, first = sql(
        p,
        "SELECT (SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME), "
        "(SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL)",
    )[0]
    k = tl.intervals.kind == Kind.COMPUTE
    assert int(tl.intervals.start[k].min()) == off + first
    assert any("session start" in w for w in tl.warnings)
    names = {
        r[0]
        for r in sql(
            p,
            "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = k.demangledName",
        )
    }
    assert {tl.names[i] for i in np.unique(tl.intervals.name[k])} == names
    # rank from the capture environment (PMI_RANK / SLURM_PROCID = 0)
    assert tl.rank == 0 and tl.rank_source.startswith("env ")
    # sync rows: device-wide waits have no stream
    sync = tl.intervals.kind == Kind.SYNC
    assert int(sync.sum()) == sql(p, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")[0][0]
    assert (tl.intervals.stream[sync] == -1).all()


def test_mpi_export_rank_and_ranges() -> None:
    p = shared_trace(Y2022)
    tl = parse(p)[0]
    assert tl.rank == 0 and "MPI Rank" in tl.rank_source
    rg = tl.ranges
    n_send = sql(
        p,
        "SELECT COUNT(*) FROM NVTX_EVENTS ne LEFT JOIN StringIds s ON s.id = ne.textId "
        "WHERE coalesce(s.value, ne.text) = 'MPI_Send' AND eventType = 59",
    )[0][0]
    sends = (rg.kind == RangeKind.COMM_OP) & (rg.direction == Direction.SEND)
    assert int(sends.sum()) == n_send > 0
    user = [tl.names[i] for i in rg.name[rg.kind == RangeKind.OTHER]]
    assert "saxpy" in user


# ----------------------------------------------------------------------------------------------
# hand-built exports
# ----------------------------------------------------------------------------------------------

PID = 4242
GPID = (1 << 48) | (PID << 24)
EPOCH = 1_700_000_000_000_000_000


class Export:
    """A tiny nsys export written row by row (real DDL)."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.kernels: list[tuple[Any, ...]] = []
        self.runtime: list[tuple[Any, ...]] = []
        self.nvtx: list[tuple[Any, ...]] = []
        self.meta_export: list[tuple[str, str]] = []
        self.capture: list[tuple[str, str]] = []
        self.session: int | None = EPOCH
        self.corr = 100
        self.streams: list[tuple[Any, ...]] = []

    def sid(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings) + 1)

    def kernel(
        self,
        start: int,
        end: int,
        name: str,
        *,
        stream: int = 7,
        pid: int = PID,
        tid: int | None = None,
        launch: int | None = None,
        device: int = 0,
    ) -> None:
        self.corr += 1
        gpid = (1 << 48) | (pid << 24)
        self.kernels.append(
            (
                start,
                end,
                device,
                1,
                None,
                stream,
                self.corr,
                gpid,
                self.sid(name),
                self.sid(name.split("(")[0]),
                None,
                1,
                0,
                32,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                0,
                0,
                0,
                self.corr,
                0,
                None,
                None,
            )
        )
        if launch is not None:
            self.runtime.append(
                (
                    launch,
                    launch + 500,
                    0,
                    gpid | (tid if tid is not None else pid),
                    self.corr,
                    self.sid("cuLaunchKernelEx"),
                    0,
                    None,
                )
            )

    def range(
        self,
        start: int,
        end: int | None,
        name: str,
        *,
        tid: int = PID,
        domain: int = 0,
        registered: bool = False,
        blob: bytes | None = None,
        pid: int = PID,
        event_type: int = 59,
    ) -> None:
        gtid = (1 << 48) | (pid << 24) | tid
        text, text_id = (None, self.sid(name)) if registered else (name, None)
        self.nvtx.append(
            nvtx_row(
                start, end, gtid, text=text, text_id=text_id, event_type=event_type, domain=domain, blob=blob
            )
        )

    def nccl_domain(self, pid: int = PID) -> None:
        self.range(0, None, "NCCL", domain=1, event_type=75, pid=pid, tid=pid)

    def nccl(
        self,
        start: int,
        end: int,
        api: str,
        *,
        tid: int = PID,
        pid: int = PID,
        payload: tuple[int, dict[str, int]] | None = None,
    ) -> None:
        blob = payload_blob(payload[0], payload[1]) if payload else None
        self.range(start, end, api, tid=tid, domain=1, registered=True, blob=blob, pid=pid)

    def write(self, path: Path) -> Path:
        conn = sqlite3.connect(path)
        create_tables(
            conn,
            [
                "StringIds",
                "CUPTI_ACTIVITY_KIND_KERNEL",
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                "META_DATA_EXPORT",
                "META_DATA_CAPTURE",
                "TARGET_INFO_CUDA_STREAM",
            ],
        )
        insert(conn, "CUPTI_ACTIVITY_KIND_KERNEL", _cols("CUPTI_ACTIVITY_KIND_KERNEL"), self.kernels)
        insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", _cols("CUPTI_ACTIVITY_KIND_RUNTIME"), self.runtime)
        if self.nvtx:
            create_tables(conn, ["NVTX_EVENTS", "NVTX_PAYLOAD_SCHEMAS", "NVTX_PAYLOAD_SCHEMA_ENTRIES"])
            insert(conn, "NVTX_EVENTS", _cols("NVTX_EVENTS"), self.nvtx)
            for sid_, (size, entries) in _SCHEMAS.items():
                insert(
                    conn,
                    "NVTX_PAYLOAD_SCHEMAS",
                    _cols("NVTX_PAYLOAD_SCHEMAS"),
                    [(1, sid_, None, 1, None, len(entries), size, None)],
                )
                insert(
                    conn,
                    "NVTX_PAYLOAD_SCHEMA_ENTRIES",
                    _cols("NVTX_PAYLOAD_SCHEMA_ENTRIES"),
                    [(1, sid_, i, None, t, n, None, None, o or None) for i, (n, t, o) in enumerate(entries)],
                )
        if self.session is not None:
            create_tables(conn, ["TARGET_INFO_SESSION_START_TIME"])
            insert(
                conn,
                "TARGET_INFO_SESSION_START_TIME",
                ("utcEpochNs", "utcTime", "localTime"),
                [(self.session, "", "")],
            )
        insert(conn, "StringIds", ("id", "value"), [(i, s) for s, i in self.strings.items()])
        insert(conn, "META_DATA_EXPORT", ("name", "value"), self.meta_export)
        insert(conn, "META_DATA_CAPTURE", ("name", "value"), self.capture)
        insert(conn, "TARGET_INFO_CUDA_STREAM", _cols("TARGET_INFO_CUDA_STREAM"), self.streams)
        conn.commit()
        conn.close()
        return path


def _cols(table: str) -> list[str]:
    from ppsynth.nsys import DDL

    return [c.strip().split()[0] for c in DDL[table].split(",")]


SR = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"


def _env(e: Export, **env: str) -> None:
    e.capture += [("PROCESS_0:ENVIRONMENT_VARIABLE", f'{k}="{v}"') for k, v in env.items()]


def test_nccl_ranges_give_p2p_peer_direction_bytes(tmp_path: Path) -> None:
    e = Export()
    _env(e, RANK="1", WORLD_SIZE="4")
    e.nccl_domain()
    world, pair = 0xAAAA, 0xBBBB
    # the world communicator (local == global) and a 2-rank pair communicator (1,2): rank 1 is its rank 0
    e.nccl(
        10,
        20,
        "ncclCommInitRank",
        payload=(SCHEMA_COMM_INIT, {"NCCL communicator ID": world, "No. of ranks": 4, "Rank": 1}),
    )
    e.nccl(
        30,
        40,
        "ncclCommInitRank",
        payload=(SCHEMA_COMM_INIT, {"NCCL communicator ID": pair, "No. of ranks": 2, "Rank": 0}),
    )
    e.nccl(
        1000,
        2000,
        "ncclSend",
        payload=(
            SCHEMA_SENDRECV,
            {"NCCL communicator ID": world, "Message size [bytes]": 4096, "Peer rank": 2},
        ),
    )
    e.kernel(5000, 9000, SR, stream=20, launch=1500)
    e.nccl(
        3000,
        4000,
        "ncclRecv",
        payload=(
            SCHEMA_SENDRECV,
            {"NCCL communicator ID": world, "Message size [bytes]": 8192, "Peer rank": 0},
        ),
    )
    e.kernel(9500, 12000, SR, stream=24, launch=3500)
    # on the pair communicator the peer is local rank 1: global 2 is only known from the other file
    e.nccl(
        13000,
        14000,
        "ncclSend",
        payload=(SCHEMA_SENDRECV, {"NCCL communicator ID": pair, "Message size [bytes]": 16, "Peer rank": 1}),
    )
    e.kernel(15000, 16000, SR, stream=28, launch=13500)
    e.kernel(20000, 30000, "gemm_kernel(float*)", launch=19000)
    tl = parse(e.write(tmp_path / "a.sqlite"))[0]
    iv = tl.intervals
    assert tl.rank == 1 and tl.world_size == 4
    p2p = iv.kind == Kind.P2P
    assert iv.direction[p2p].tolist() == [Direction.SEND, Direction.RECV, Direction.SEND]
    assert iv.bytes[p2p].tolist() == [4096, 8192, 16]
    assert iv.peer[p2p].tolist() == [2, 0, -1]
    assert tl.process_groups[iv.group[p2p][0]].name == f"nccl:{world:016x}"
    comm_ops = tl.ranges.kind == RangeKind.COMM_OP
    assert tl.ranges.peer[comm_ops].tolist() == [2, 0, -1]
    assert int((iv.kind == Kind.COMPUTE).sum()) == 1
    # the other member of the pair communicator, parsed from its own file, resolves the peer
    other = Export()
    _env(other, RANK="2", WORLD_SIZE="4")
    other.nccl_domain()
    other.nccl(
        30,
        40,
        "ncclCommInitRank",
        payload=(SCHEMA_COMM_INIT, {"NCCL communicator ID": pair, "No. of ranks": 2, "Rank": 1}),
    )
    other.nccl(
        13000,
        14000,
        "ncclRecv",
        payload=(SCHEMA_SENDRECV, {"NCCL communicator ID": pair, "Message size [bytes]": 16, "Peer rank": 0}),
    )
    other.kernel(15000, 16000, SR, stream=28, launch=13500)
    tl2 = parse(other.write(tmp_path / "b.sqlite"))[0]
    assert tl2.intervals.peer[tl2.intervals.kind == Kind.P2P].tolist() == [-1]
    assert resolve_nccl_peers([tl, tl2]) == []
    assert tl.intervals.peer[p2p].tolist() == [2, 0, 2]
    assert tl2.intervals.peer[tl2.intervals.kind == Kind.P2P].tolist() == [1]
    assert tl.ranges.peer[comm_ops].tolist() == [2, 0, 2]
    pg = tl.process_groups[tl.intervals.group[p2p][2]]
    assert pg.ranks == [1, 2]


def test_grouped_calls_and_all_to_all(tmp_path: Path) -> None:
    e = Export()
    _env(e, RANK="0", WORLD_SIZE="8")
    e.nccl_domain()
    comm = 0x1234
    pl = {"NCCL communicator ID": comm, "Message size [bytes]": 100}
    e.nccl(
        10,
        20,
        "ncclCommInitRank",
        payload=(SCHEMA_COMM_INIT, {"NCCL communicator ID": comm, "No. of ranks": 8, "Rank": 0}),
    )
    # group 1: send to 1 + recv from 1 → one fused p2p kernel, both directions, peer 1
    e.nccl(100, 110, "ncclGroupStart")
    e.nccl(120, 130, "ncclSend", payload=(SCHEMA_SENDRECV, {**pl, "Peer rank": 1}))
    e.nccl(140, 150, "ncclRecv", payload=(SCHEMA_SENDRECV, {**pl, "Peer rank": 1}))
    e.nccl(160, 400, "ncclGroupEnd")
    e.kernel(1000, 2000, SR, stream=30, launch=300)
    # group 2: sends and receives with 3 peers → an all-to-all, a collective
    e.nccl(3000, 3010, "ncclGroupStart")
    for i, p in enumerate((1, 2, 3)):
        e.nccl(3020 + 40 * i, 3030 + 40 * i, "ncclSend", payload=(SCHEMA_SENDRECV, {**pl, "Peer rank": p}))
        e.nccl(3040 + 40 * i, 3050 + 40 * i, "ncclRecv", payload=(SCHEMA_SENDRECV, {**pl, "Peer rank": p}))
    e.nccl(3200, 3500, "ncclGroupEnd")
    e.kernel(4000, 5000, SR, stream=30, launch=3400)
    # a nested group: the launch happens in the outermost end
    e.nccl(6000, 6010, "ncclGroupStart")
    e.nccl(6020, 6030, "ncclGroupStart")
    e.nccl(6040, 6050, "ncclSend", payload=(SCHEMA_SENDRECV, {**pl, "Peer rank": 2}))
    e.nccl(6060, 6070, "ncclGroupEnd")
    e.nccl(6080, 6300, "ncclGroupEnd")
    e.kernel(7000, 8000, SR, stream=30, launch=6200)
    # an all-reduce launched inside its own range; another thread's ranges do not count
    e.nccl(9000, 9300, "ncclAllReduce", payload=(SCHEMA_SENDRECV, {**pl}))
    e.nccl(9900, 10300, "ncclSend", tid=PID + 1, payload=(SCHEMA_SENDRECV, {**pl, "Peer rank": 5}))
    e.kernel(10000, 11000, AR, stream=31, launch=9100)
    e.kernel(12000, 13000, SR, stream=30, launch=10100)  # launched on the main thread, no range there
    tl = parse(e.write(tmp_path / "g.sqlite"))[0]
    iv = tl.intervals
    comm_rows = np.flatnonzero(np.isin(iv.kind, (Kind.P2P, Kind.COLLECTIVE)))
    assert iv.kind[comm_rows].tolist() == [Kind.P2P, Kind.COLLECTIVE, Kind.P2P, Kind.COLLECTIVE, Kind.P2P]
    assert iv.direction[comm_rows].tolist() == [
        Direction.BOTH,
        Direction.NONE,
        Direction.SEND,
        Direction.NONE,
        Direction.NONE,
    ]
    assert iv.peer[comm_rows].tolist() == [1, -1, 2, -1, -1]
    assert iv.bytes[comm_rows].tolist()[:3] == [200, 600, 100]
    assert any("1 NCCL kernel(s) classified by name only" in w for w in tl.warnings)


def test_comm_kernels_without_nccl_ranges(tmp_path: Path) -> None:
    e = Export()
    _env(e, RANK="3")
    e.range(100, 900, "c10d::alltoall_base_, seq = 4, op_id = 77")  # emit_nvtx style
    e.kernel(1000, 2000, SR, stream=30, launch=500)
    e.kernel(3000, 4000, SR, stream=30, launch=2500)
    e.kernel(5000, 6000, AR, stream=31, launch=4500)
    tl = parse(e.write(tmp_path / "n.sqlite"))[0]
    iv = tl.intervals
    comm = np.isin(iv.kind, (Kind.P2P, Kind.COLLECTIVE))
    assert iv.kind[comm].tolist() == [Kind.COLLECTIVE, Kind.P2P, Kind.COLLECTIVE]
    assert (iv.peer[comm] == -1).all()
    w = " ".join(tl.warnings)
    assert "3 NCCL kernel(s) classified by name only" in w and "no NCCL NVTX ranges" in w
    assert "all-to-all" in w
    assert len(tl.ranges) == 0  # operator ranges are not annotations


def test_missing_payloads_say_peer_unknown(tmp_path: Path) -> None:
    e = Export()
    _env(e, RANK="0")
    e.nccl_domain()
    e.nccl(100, 400, "ncclSend")
    e.kernel(1000, 2000, SR, stream=30, launch=300)
    tl = parse(e.write(tmp_path / "p.sqlite"))[0]
    p2p = tl.intervals.kind == Kind.P2P
    assert tl.intervals.direction[p2p].tolist() == [Direction.SEND]
    assert tl.intervals.peer[p2p].tolist() == [-1]
    assert any("--include-blobs" in w for w in tl.warnings)


def test_user_ranges_steps_labels_and_phases(tmp_path: Path) -> None:
    e = Export()
    _env(e, RANK="0")
    e.range(0, 10_000, "ProfilerStep#7, op_id = 3")  # emit_nvtx tail is cut
    e.range(10_000, 20_000, "iteration 8")
    e.range(20_000, 30_000, "train_step")
    e.range(30_000, 40_000, "train_step")
    e.range(100, 900, "PP:2F5")
    e.range(1000, 1900, "Backward 4")
    e.range(2000, 2900, "forward")
    e.range(3000, 3900, "aten::mm, seq = 1, op_id = 9")
    e.range(5000, 6000, "Optimizer.step#AdamW.step")
    e.range(6100, 6200, "my region", registered=True)
    e.kernel(7000, 8000, "adam_kernel", launch=5500)
    e.kernel(9000, 9500, "adam_kernel", launch=6500)
    tl = parse(e.write(tmp_path / "u.sqlite"))[0]
    rg = tl.ranges
    names = [tl.names[i] for i in rg.name]
    steps = rg.kind == RangeKind.STEP
    assert rg.num[steps].tolist() == [7, 8, 0, 1]
    assert "aten::mm" not in " ".join(names)
    assert names[:1] == ["ProfilerStep#7"]
    lab = {
        names[i]: (int(rg.stage[i]), int(rg.mb[i]), int(rg.phase[i])) for i in np.flatnonzero(rg.kind == 1)
    }
    assert lab == {
        "PP:2F5": (2, 5, Phase.FWD),
        "Backward 4": (-1, 4, Phase.BWD),
        "forward": (-1, -1, Phase.FWD),
    }
    assert "my region" in names
    assert tl.intervals.phase.tolist() == [Phase.OPTIM, Phase.UNKNOWN]


def test_rank_sources(tmp_path: Path) -> None:
    def one(name: str, **env: str) -> RankTimeline:
        e = Export()
        _env(e, **env)
        e.kernel(100, 200, "k", launch=50)
        return parse(e.write(tmp_path / name))[0]

    assert (one("x.sqlite", OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="8").rank, "env") == (5, "env")
    t = one("x2.sqlite", SLURM_PROCID="6", LOCAL_RANK="2")
    assert (t.rank, t.rank_source) == (6, "env SLURM_PROCID")
    t = one("report_3.sqlite")
    assert (t.rank, t.rank_source) == (3, "file name") and any("file name" in w for w in t.warnings)
    t = one("prof.sqlite", LOCAL_RANK="2")
    assert t.rank == 2 and "local rank" in t.rank_source
    t = one("prof2.sqlite")
    assert t.rank == -1 and t.warnings  # the loader decides
    assert rank_from_filename(Path("run.rank12.sqlite")) == 12
    assert rank_from_filename(Path("pipit_saxpy_mpi_nsys2022.sqlite")) is None
    assert rank_from_filename(Path("nsysai_h100_fsdp_2gpu.sqlite")) is None


def test_one_report_several_processes(tmp_path: Path) -> None:
    e = Export()
    for j, pid in enumerate((500, 300, 400)):  # devices 2, 0, 1: ranks follow the devices
        e.kernel(1000 + j, 2000 + j, "k", pid=pid, device=(2, 0, 1)[j], launch=900, tid=pid)
        e.streams.append((7, 0, 1, pid, 1, 0, 1))
    e.streams.append((7, 0, 1, 600, 1, 0, 1))  # a CUDA process that ran nothing
    tls = parse(e.write(tmp_path / "multi.sqlite"))
    assert [(t.rank, t.meta["pid"]) for t in tls] == [(0, 300), (1, 400), (2, 500)]
    # said once for the file, on its first rank
    said = [t.rank for t in tls if any("without GPU activity" in w and "600" in w for w in t.warnings)]
    assert said == [0]
    # same device ids everywhere: process order
    e2 = Export()
    for pid in (20, 10):
        e2.kernel(1000, 2000, "k", pid=pid, launch=900, tid=pid)
    tls = parse(e2.write(tmp_path / "multi2.sqlite"))
    assert [(t.rank, t.meta["pid"]) for t in tls] == [(0, 10), (1, 20)]
    assert "process order" in tls[0].rank_source


def test_clock_variants(tmp_path: Path) -> None:
    e = Export()
    e.meta_export = [("EXPORT_PARAM_TIME_NORMALIZE", "true")]
    e.kernel(EPOCH + 5, EPOCH + 10, "k", launch=EPOCH + 1)
    tl = parse(e.write(tmp_path / "norm_0.sqlite"))[0]
    assert tl.intervals.start.tolist() == [EPOCH + 5] and not any("session" in w for w in tl.warnings)
    e = Export()
    e.session = None
    e.kernel(5, 10, "k", launch=1)
    tl = parse(e.write(tmp_path / "rel_0.sqlite"))[0]
    assert tl.intervals.start.tolist() == [5] and tl.intervals.launch.tolist() == [1]
    assert any("cannot be aligned" in w for w in tl.warnings)


def test_payload_without_header_is_decoded(tmp_path: Path) -> None:
    e = Export()
    _env(e, RANK="0", WORLD_SIZE="2")
    e.nccl_domain()
    body = struct.pack("<QQi4x", 0x77, 64, 1)  # bare SendRecv struct (no nsys header)
    e.range(100, 400, "ncclRecv", domain=1, registered=True, blob=body)
    e.kernel(1000, 2000, SR, stream=30, launch=300)
    tl = parse(e.write(tmp_path / "bare.sqlite"))[0]
    p2p = tl.intervals.kind == Kind.P2P
    assert tl.intervals.bytes[p2p].tolist() == [64]
    assert tl.intervals.direction[p2p].tolist() == [Direction.RECV]


def test_kernel_name_rules() -> None:
    assert (
        classify_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)").kind
        == Kind.COLLECTIVE
    )
    assert classify_kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)").sendrecv
    assert classify_kernel("ncclDevKernel_Generic(x)").kind == Kind.COLLECTIVE
    assert classify_kernel("void at::native::vectorized_elementwise_kernel<4>(int)").kind == Kind.COMPUTE
    assert classify_kernel("ncclKernel_Send_RING(x)").direction == Direction.SEND


# ----------------------------------------------------------------------------------------------
# bad input and .nsys-rep
# ----------------------------------------------------------------------------------------------


def _one_line_error(path: Path, **opts: Any) -> str:
    with pytest.raises(InputError) as ei:
        parse(path, **opts)
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_bad_inputs(tmp_path: Path) -> None:
    p = tmp_path / "fake.sqlite"
    p.write_text('{"traceEvents": []}')
    assert "not a valid SQLite database" in _one_line_error(p)
    # named like an export: the nsys reader takes it and says what is wrong with it
    assert PARSER.sniff(p, head(p))
    q = tmp_path / "fake.json"
    q.write_text('{"traceEvents": []}')
    assert not PARSER.sniff(q, head(q))
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    assert "empty file" in _one_line_error(p)
    p = tmp_path / "other.sqlite"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    assert "not an Nsight Systems export" in _one_line_error(p)
    assert not PARSER.sniff(p, head(p))
    e = Export()
    p = e.write(tmp_path / "nogpu.sqlite")
    assert PARSER.sniff(p, head(p))
    assert "no GPU activity" in _one_line_error(p)


def test_truncated_export(tmp_path: Path) -> None:
    src = shared_trace(Y2024)
    data = src.read_bytes()
    p = tmp_path / "cut.sqlite"
    p.write_bytes(data[: len(data) // 3])
    msg = _one_line_error(p)
    assert "SQLite" in msg or "GPU" in msg


def test_nsys_rep_without_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    rep = tmp_path / "my run" / "report_1.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"\x00nsys-rep-binary")
    assert PARSER.sniff(rep, head(rep))
    msg = _one_line_error(rep)
    out = rep.with_name("report_1.sqlite")
    assert msg.endswith(
        f"cannot read .nsys-rep without nsys; run: nsys export --type sqlite --output '{out}' '{rep}'"
    )


def test_nsys_rep_export_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``nsys`` on PATH: the export runs once, then the cached SQLite is reused."""
    src = shared_trace(Y2024)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bindir / "nsys"
    fake.write_text(f"""#!/bin/sh
echo "$@" >> "{calls}"
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--output" ]; then out="$2"; fi
  shift
done
cp "{src}" "$out"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    rep = tmp_path / "rep" / "job_0.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"\x00rep")
    cache = tmp_path / "cache"
    tls = parse(rep, nsys_cache_dir=str(cache))
    assert tls[0].source == str(rep)
    n_k = sql(src, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert int((tls[0].intervals.kind == Kind.COMPUTE).sum()) == n_k
    parse(rep, nsys_cache_dir=str(cache))
    lines = calls.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("export --type sqlite")
    assert len(list(cache.glob("job_0-*.sqlite"))) == 1
    # a newer report invalidates the cache
    os.utime(rep, (rep.stat().st_atime, rep.stat().st_mtime + 100))
    parse(rep, nsys_cache_dir=str(cache))
    assert len(calls.read_text().splitlines()) == 2
    # a failing export is one clear line
    fake.write_text("#!/bin/sh\necho 'ERROR: report is corrupted' >&2\nexit 3\n")
    os.utime(rep, (rep.stat().st_atime, rep.stat().st_mtime + 200))
    assert "nsys export failed: ERROR: report is corrupted" in _one_line_error(rep, nsys_cache_dir=str(cache))


def test_runtime_and_driver_rows_for_one_launch(tmp_path: Path) -> None:
    """A kernel whose correlation id has both a runtime and a driver row stays one interval, and
    its launch is the outer (earlier) call."""
    e = Export()
    _env(e, RANK="0")
    e.kernel(10_000, 20_000, "k1", launch=5_000)
    e.kernel(30_000, 40_000, "k2", launch=25_000)
    corr = e.corr  # k2's correlation id: add the driver call nested in the runtime call
    e.runtime.append((25_200, 25_400, 1, GPID | PID, corr, e.sid("cuLaunchKernel"), 0, None))
    e.runtime.append(
        (24_000, 24_100, 67, GPID | PID, corr, e.sid("cudaLaunchKernel"), 0, 7)
    )  # backtrace copy
    tl = parse(e.write(tmp_path / "dup.sqlite"))[0]
    assert tl.intervals.start.tolist() == [EPOCH + 10_000, EPOCH + 30_000]
    assert tl.intervals.launch.tolist() == [EPOCH + 5_000, EPOCH + 25_000]


def test_payload_blob_lengths_count_only_non_empty_blobs() -> None:
    """NULL, empty and non-BLOB values (a TEXT in binaryData) carry no payload."""
    from ppdiag.parsers.nsys_arrow import Blobs

    vals = np.empty(5, dtype=object)
    vals[:] = [None, b"", b"\x01\x02\x03", "text", bytearray(b"ab")]
    blobs = Blobs.from_objects(vals)
    assert blobs.lengths.tolist() == [0, 0, 3, 0, 2]
    assert blobs.data.tobytes() == b"\x01\x02\x03ab"
    assert Blobs.from_objects(np.empty(0, dtype=object)).lengths.tolist() == []
