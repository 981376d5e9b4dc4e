"""Write a :class:`~ppdiag.synth.run.SynthRun` as Nsight Systems SQLite exports.

The files have the tables and columns real exports have (the nsys 2024.5 schema, exported
``--lazy``: tables without rows are left out): ``StringIds``, ``CUPTI_ACTIVITY_KIND_KERNEL`` /
``MEMCPY`` / ``MEMSET`` / ``SYNCHRONIZATION`` / ``RUNTIME``, ``NVTX_EVENTS`` with the NCCL domain's
API ranges and their binary payloads (``--include-blobs``), the payload schemas, ``ThreadNames``,
``PROCESSES``, ``TARGET_INFO_*`` and ``META_DATA_*`` with the launcher environment (``RANK``...).

What nsys would see of a PyTorch job, and so what is written:

* every GPU activity with its launching CUDA runtime/driver call (``correlationId``);
* annotation ranges (``ProfilerStep#N``, pipeline labels, ``Optimizer.step#...``) as NVTX push/pop
  ranges of the default domain — PyTorch's own ``nccl:*`` profiler titles and CPU ops are not NVTX
  and are left out;
* NCCL's NVTX ranges: one ``ncclCommInitRank`` per communicator (PyTorch keeps one communicator
  per p2p pair, where the lower global rank is rank 0, and one per process group) and one
  ``ncclSend`` / ``ncclRecv`` / ``ncclAllReduce``... around each NCCL kernel launch, with the
  communicator id, message size and communicator-local peer rank in the payload;
* timestamps relative to the session start (``TARGET_INFO_SESSION_START_TIME``) unless
  ``ts_normalize`` asks for absolute ones. A rank's local time of true time ``t`` is
  ``epoch_ns + t + clock_skew_ns``, exactly what the Kineto writer emits.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import sqlite3
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Direction, Kind, Phase
from ppdiag.synth.run import ApiKind, HostCat, StreamRole, SynthRank, SynthRun

I64 = npt.NDArray[np.int64]

PRODUCT_VERSION = "2024.5.1.113"
SCHEMA_VERSION = "3.13.2"
VM_ID = 1  # nsys serialises GlobalIds as 0xHHVVPPPPPPTTTTTT; local captures use VM 1
NCCL_DOMAIN_ID = 1

# NVTX event types (ENUM_NSYS_EVENT_TYPE)
NVTX_PUSHPOP = 59
NVTX_DOMAIN_CREATE = 75
# NVTX payload entry types (nvToolsExtPayload.h)
T_INT, T_UINT64, T_SIZE = 5, 18, 22

# NCCL payload schemas as NCCL registers them (nvtx_payload_schemas.h); ids in NCCL's static range.
SCHEMA_COMM_INIT = 16777218
SCHEMA_COLL = 16777220
SCHEMA_ALLREDUCE = 16777221
SCHEMA_SENDRECV = 16777226
_SCHEMAS: dict[int, tuple[int, list[tuple[str, int, int]]]] = {
    SCHEMA_COMM_INIT: (
        24,
        [
            ("NCCL communicator ID", T_UINT64, 0),
            ("No. of ranks", T_INT, 8),
            ("Rank", T_INT, 12),
            ("CUDA device", T_INT, 16),
        ],
    ),
    SCHEMA_COLL: (16, [("NCCL communicator ID", T_UINT64, 0), ("Message size [bytes]", T_SIZE, 8)]),
    SCHEMA_ALLREDUCE: (
        24,
        [
            ("NCCL communicator ID", T_UINT64, 0),
            ("Message size [bytes]", T_SIZE, 8),
            ("Reduction operation", T_INT, 16),
        ],
    ),
    SCHEMA_SENDRECV: (
        24,
        [
            ("NCCL communicator ID", T_UINT64, 0),
            ("Message size [bytes]", T_SIZE, 8),
            ("Peer rank", T_INT, 16),
        ],
    ),
}

# PyTorch collective names → NCCL API (the NVTX range name is NCCL's C ``__func__``).
_COLL_API = {
    "allreduce": "ncclAllReduce",
    "all_reduce": "ncclAllReduce",
    "allreduce_coalesced": "ncclAllReduce",
    "allgather": "ncclAllGather",
    "all_gather": "ncclAllGather",
    "_allgather_base": "ncclAllGather",
    "allgather_into_tensor_coalesced": "ncclAllGather",
    "reduce_scatter": "ncclReduceScatter",
    "_reduce_scatter_base": "ncclReduceScatter",
    "reduce_scatter_tensor_coalesced": "ncclReduceScatter",
    "broadcast": "ncclBroadcast",
    "reduce": "ncclReduce",
}
_RUNTIME_SUFFIX = {
    "cudaLaunchKernel": "_v7000",
    "cudaLaunchKernelExC": "_v11060",
    "cudaMemcpyAsync": "_v3020",
    "cudaMemsetAsync": "_v3020",
    "cudaEventRecord": "_v3020",
    "cudaStreamWaitEvent": "_v3020",
    "cudaStreamSynchronize": "_v3020",
    "cudaDeviceSynchronize": "_v3020",
    "cudaEventSynchronize": "_v3020",
    "cudaMemcpy": "_v3020",
}
_TORCH_COMM_TITLE = re.compile(r"(nccl|gloo|mpi|ucc|xccl):")
_COPY_KIND = {
    "HtoD": 1,
    "DtoH": 2,
    "HtoA": 3,
    "AtoH": 4,
    "AtoA": 5,
    "AtoD": 6,
    "DtoA": 7,
    "DtoD": 8,
    "HtoH": 9,
    "PtoP": 10,
}
_MEM_KIND = {"pageable": 0, "pinned": 1, "device": 2, "array": 3, "managed": 4}

# --- DDL (nsys 2024.5.1 export, schema 3.13.2) ---------------------------------------------------

DDL: dict[str, str] = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, "
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, "
        "launchType INTEGER, "
        "cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, "
        "gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, "
        "blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
        "localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, "
        "sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, "
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, "
        "dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, "
        "dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, "
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, "
        "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "syncType INTEGER NOT NULL, eventId INTEGER NOT NULL"
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, "
        "correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER"
    ),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER, "
        "color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, "
        "domainId INTEGER, "
        "uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
        "floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT"
    ),
    "NVTX_PAYLOAD_SCHEMAS": (
        "domainId INTEGER, schemaId INTEGER, name TEXT, type INTEGER, flags INTEGER, numEntries INTEGER, "
        "payloadSize INTEGER, alignTo INTEGER"
    ),
    "NVTX_PAYLOAD_SCHEMA_ENTRIES": (
        "domainId INTEGER NOT NULL, schemaId INTEGER NOT NULL, idx INTEGER NOT NULL, flags INTEGER, "
        "type INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset INTEGER"
    ),
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "TARGET_INFO_SYSTEM_ENV": (
        "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, nameEnum INTEGER NOT NULL, "
        "value TEXT NOT NULL"
    ),
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, "
        "l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, "
        "smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER, "
        "ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, "
        "maxIPC INTEGER, maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, "
        "maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, "
        "threadsPerWarp INTEGER, asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, "
        "maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER, "
        "maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER, "
        "computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER"
    ),
    "TARGET_INFO_CUDA_STREAM": (
        "streamId INTEGER NOT NULL, hwId INTEGER NOT NULL, vmId INTEGER NOT NULL, "
        "processId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, priority INTEGER NOT NULL, flag INTEGER NOT NULL"
    ),
    "TARGET_INFO_CUDA_CONTEXT_INFO": (
        "nullStreamId INTEGER NOT NULL, hwId INTEGER NOT NULL, vmId INTEGER NOT NULL, "
        "processId INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
        "parentContextId INTEGER, isGreenContext INTEGER"
    ),
    "META_DATA_EXPORT": "name TEXT NOT NULL, value TEXT",
    "META_DATA_CAPTURE": "name TEXT NOT NULL, value TEXT",
}


def create_tables(conn: sqlite3.Connection, tables: Iterable[str]) -> None:
    """Create the named tables with the real export's DDL."""
    for t in tables:
        conn.execute(f"CREATE TABLE {t} ({DDL[t]})")


def insert(
    conn: sqlite3.Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    cols = ", ".join(f'"{c}"' for c in columns)
    marks = ", ".join("?" for _ in columns)
    conn.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)


def global_pid(pid: int) -> int:
    return (VM_ID << 48) | ((pid & 0xFFFFFF) << 24)


def global_tid(pid: int, tid: int) -> int:
    return global_pid(pid) | (tid & 0xFFFFFF)


def comm_hash(*key: Any) -> int:
    """A stable 64-bit communicator id (NCCL uses a hash of the unique id)."""
    return int.from_bytes(hashlib.sha1(repr(key).encode()).digest()[:8], "little")


def payload_blob(schema: int, values: dict[str, int]) -> bytes:
    """nsys ``binaryData``: 32-byte header (domain, schema, payload size, total) + the struct."""
    size, entries = _SCHEMAS[schema]
    body = bytearray(size)
    for name, typ, off in entries:
        v = int(values.get(name, 0))
        if typ == T_INT:
            struct.pack_into("<i", body, off, v)
        else:
            struct.pack_into("<Q", body, off, v & 0xFFFFFFFFFFFFFFFF)
    return struct.pack("<QQQQ", NCCL_DOMAIN_ID, schema, size, 32 + size) + bytes(body)


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = len(self.ids) + 1
            self.ids[s] = i
        return i

    def rows(self) -> list[tuple[int, str]]:
        return [(i, s) for s, i in self.ids.items()]


@dataclass
class _Comm:
    id: int
    nranks: int
    local: int  # this rank's rank in the communicator


@dataclass
class _File:
    """Rows of one export being assembled (one or several processes)."""

    strings: _Strings = field(default_factory=_Strings)
    kernels: list[tuple[Any, ...]] = field(default_factory=list)
    memcpy: list[tuple[Any, ...]] = field(default_factory=list)
    memset: list[tuple[Any, ...]] = field(default_factory=list)
    sync: list[tuple[Any, ...]] = field(default_factory=list)
    runtime: list[tuple[Any, ...]] = field(default_factory=list)
    nvtx: list[tuple[Any, ...]] = field(default_factory=list)
    threads: list[tuple[Any, ...]] = field(default_factory=list)
    processes: list[tuple[Any, ...]] = field(default_factory=list)
    gpus: list[tuple[Any, ...]] = field(default_factory=list)
    streams: list[tuple[Any, ...]] = field(default_factory=list)
    contexts: list[tuple[Any, ...]] = field(default_factory=list)
    schemas: list[tuple[Any, ...]] = field(default_factory=list)
    schema_entries: list[tuple[Any, ...]] = field(default_factory=list)
    grid_id: int = 0


@dataclass
class _Clock:
    """Local time of a rank in the file's stored time base."""

    base: int  # subtracted from epoch-based local times (the session start, or 0 when normalized)
    epoch: int
    skew: int

    def __call__(self, t: I64) -> I64:
        return (t + (self.epoch + self.skew - self.base)).astype(np.int64)

    def one(self, t: int) -> int:
        return int(t + self.epoch + self.skew - self.base)


def write_nsys(
    run: SynthRun,
    out_dir: str | Path,
    per_rank_files: bool = True,
    *,
    ts_normalize: bool = False,
    nccl_payloads: bool = True,
    comm_init: bool = True,
) -> list[Path]:
    """Write ``run`` as nsys SQLite exports; returns the files written.

    ``per_rank_files``: one ``report_<rank>.sqlite`` per rank (``nsys profile -o report_%q{RANK}``)
    with ``RANK`` in the capture environment; else one ``report.sqlite`` holding every rank's process
    (``nsys profile torchrun ...``), where only the launcher's environment is recorded.
    ``ts_normalize``: absolute UTC timestamps, as ``nsys export --ts-normalize=true`` writes.
    ``nccl_payloads``: the NCCL ranges' payload blobs (``--include-blobs=true``).
    ``comm_init``: the ``ncclCommInitRank`` ranges (absent when the capture started later).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    comms = _communicators(run)
    groups = [[r] for r in run.ranks] if per_rank_files else [list(run.ranks)]
    paths: list[Path] = []
    for members in groups:
        first = min(_first_time(r) + run.epoch_ns + r.clock_skew_ns for r in members)
        # Real sessions start a little before the first event; whole microseconds like nsys.
        session = (first - 250_000_000) // 1000 * 1000
        base = 0 if ts_normalize else session
        f = _File()
        for r in members:
            _add_rank(
                f,
                run,
                r,
                _Clock(base, run.epoch_ns, r.clock_skew_ns),
                comms[r.rank],
                nccl_payloads,
                comm_init,
            )
        name = f"report_{members[0].rank}.sqlite" if per_rank_files else "report.sqlite"
        path = out / name
        path.unlink(missing_ok=True)
        env = _launcher_env(run, members[0]) if per_rank_files else _torchrun_env(run)
        _write_file(path, f, session, env, ts_normalize, nccl_payloads, members)
        paths.append(path)
    return paths


def _first_time(r: SynthRank) -> int:
    vals = [int(a.min()) for a in (r.gpu.start, r.runtime.start, r.host.start) if len(a)]
    return min(vals) if vals else 0


def _communicators(run: SynthRun) -> dict[int, dict[tuple[Any, ...], _Comm]]:
    """Per rank: the NCCL communicators it uses, keyed like PyTorch keys them."""
    out: dict[int, dict[tuple[Any, ...], _Comm]] = {r.rank: {} for r in run.ranks}
    for r in run.ranks:
        g = r.gpu
        comm_rows = np.flatnonzero((g.kind == Kind.P2P) | (g.kind == Kind.COLLECTIVE))
        for i in comm_rows.tolist():
            key, comm = _comm_of(r, int(g.kind[i]), int(g.peer[i]), int(g.group[i]))
            out[r.rank].setdefault(key, comm)
    return out


def _comm_of(r: SynthRank, kind: int, peer: int, group: int) -> tuple[tuple[Any, ...], _Comm]:
    if kind == Kind.P2P and peer >= 0:
        # ProcessGroupNCCL: one 2-rank communicator per peer pair, the lower global rank is rank 0.
        lo, hi = min(r.rank, peer), max(r.rank, peer)
        key: tuple[Any, ...] = ("p2p", lo, hi)
        return key, _Comm(comm_hash(*key), 2, 0 if r.rank == lo else 1)
    ranks = r.process_groups[group].ranks if 0 <= group < len(r.process_groups) else []
    if not ranks or r.rank not in ranks:
        ranks = list(range(r.world_size))
    key = ("pg", tuple(ranks))
    return key, _Comm(comm_hash(*key), len(ranks), ranks.index(r.rank))


def _add_rank(
    f: _File,
    run: SynthRun,
    r: SynthRank,
    clock: _Clock,
    comms: dict[tuple[Any, ...], _Comm],
    payloads: bool,
    comm_init: bool,
) -> None:
    s = f.strings
    gpid = global_pid(r.pid)
    names = run.names
    g = r.gpu
    dev = int(r.device_index)
    start, end = clock(g.start), clock(g.end)
    corr = g.correlation
    name_ids = {int(i): s.id(names[int(i)] if 0 <= int(i) < len(names) else "") for i in np.unique(g.name)}

    # Rows in the column order of the DDL; constants stand for what nsys records but ppdiag ignores
    # (launch geometry, registers, memory kinds).
    # fmt: off
    kern = np.flatnonzero(np.isin(g.kind, (Kind.COMPUTE, Kind.P2P, Kind.COLLECTIVE)))
    if len(kern):
        short = {i: s.id(_short_name(names[i])) for i in name_ids}
        kn = g.name[kern].tolist()
        grid = list(range(f.grid_id + 1, f.grid_id + 1 + len(kern)))
        f.grid_id += len(kern)
        f.kernels.extend(_zip_rows(
            len(kern), start[kern].tolist(), end[kern].tolist(), dev, 1, None, g.stream[kern].tolist(),
            _opt_list(corr[kern]), gpid, [name_ids[i] for i in kn], [short[i] for i in kn], None, 1, 0, 32,
            1, 1, 1, 128, 1, 1, 0, 0, 0, 0, grid, 0, None, None,
        ))
    mc = np.flatnonzero(g.kind == Kind.MEMCPY)
    if len(mc):
        kinds = [_copy_kinds(names[i]) for i in g.name[mc].tolist()]
        f.memcpy.extend(_zip_rows(
            len(mc), start[mc].tolist(), end[mc].tolist(), dev, 1, None, g.stream[mc].tolist(),
            _opt_list(corr[mc]), gpid, np.maximum(g.bytes[mc], 0).tolist(), [k[0] for k in kinds], None,
            [k[1] for k in kinds], [k[2] for k in kinds], dev, 1, dev, 1, None, None, None,
        ))
    ms = np.flatnonzero(g.kind == Kind.MEMSET)
    if len(ms):
        f.memset.extend(_zip_rows(
            len(ms), start[ms].tolist(), end[ms].tolist(), dev, 1, None, g.stream[ms].tolist(),
            _opt_list(corr[ms]), gpid, 0, np.maximum(g.bytes[ms], 0).tolist(), None, 2,
        ))
    sy = np.flatnonzero(g.kind == Kind.SYNC)
    if len(sy):
        f.sync.extend(_zip_rows(
            len(sy), start[sy].tolist(), end[sy].tolist(), dev, 1, None,
            np.where(g.stream[sy] >= 0, g.stream[sy], 0xFFFFFFFF).tolist(), _opt_list(corr[sy]), gpid, 3,
            0xFFFFFFFF,
        ))
    # fmt: on

    rt = r.runtime
    if len(rt):
        rstart, rend = clock(rt.start), clock(rt.end)
        driver = rt.api == ApiKind.DRIVER
        label_ids = {}
        for i, d in set(zip(rt.name.tolist(), driver.tolist(), strict=True)):
            api = names[i]
            label_ids[(i, d)] = s.id(api if d else api + _RUNTIME_SUFFIX.get(api, "_v3020"))
        f.runtime.extend(
            _zip_rows(
                len(rt),
                rstart.tolist(),
                rend.tolist(),
                driver.astype(np.int64).tolist(),
                [global_tid(r.pid, t) for t in rt.tid.tolist()],
                _opt_list(rt.correlation),
                [label_ids[k] for k in zip(rt.name.tolist(), driver.tolist(), strict=True)],
                0,
                None,
            )
        )

    h = r.host
    hstart, hend = clock(h.start), clock(h.end)
    for i in np.flatnonzero(h.cat == HostCat.ANNOTATION).tolist():
        text = names[int(h.name[i])]
        if _TORCH_COMM_TITLE.match(text):
            continue  # PyTorch's collective titles exist only in its own profiler
        f.nvtx.append(nvtx_row(int(hstart[i]), int(hend[i]), global_tid(r.pid, int(h.tid[i])), text=text))

    _add_nccl(f, run, r, clock, comms, payloads, comm_init)

    tids = sorted({int(t) for t in rt.tid.tolist()} | {int(t) for t in h.tid.tolist()} | {int(r.tid)})
    for t in tids:
        # PyTorch names its main thread and the autograd engine's device threads like this.
        tname = (
            "pt_main_thread"
            if t == r.tid
            else f"pt_autograd_{r.device_index}"
            if _runs_backward(r, t)
            else f"python3-{t}"
        )
        f.threads.append((s.id(tname), 20, global_tid(r.pid, t)))
    f.processes.append((gpid, r.pid, "python3"))
    f.gpus.append(_gpu_row(r))
    f.contexts.append((7, 0, VM_ID, r.pid, dev, 1, None, 0))
    for st in r.streams:
        nccl = st.role != StreamRole.COMPUTE
        f.streams.append((int(st.id), 0, VM_ID, r.pid, 1, -1 if nccl else 0, 2 if nccl else 1))
    if payloads:
        for sid, (size, entries) in _SCHEMAS.items():
            f.schemas.append((NCCL_DOMAIN_ID, sid, None, 1, None, len(entries), size, None))
            for idx, (ename, typ, off) in enumerate(entries):
                f.schema_entries.append((NCCL_DOMAIN_ID, sid, idx, None, typ, ename, None, None, off or None))


def _runs_backward(r: SynthRank, tid: int) -> bool:
    sel = r.host.tid == tid
    return bool(sel.any() and np.isin(r.host.phase[sel], (Phase.BWD, Phase.WGRAD)).any())


def _short_name(full: str) -> str:
    """``void ns::kern<T>(args)`` → ``kern`` (nsys ``shortName``)."""
    base = full.split("(", 1)[0].removeprefix("void ").split("<", 1)[0].strip()
    return base.rsplit("::", 1)[-1] or full


def _opt_list(a: npt.NDArray[np.int64]) -> list[int | None]:
    return [v if v >= 0 else None for v in a.tolist()]


def _zip_rows(n: int, *cols: Any) -> list[tuple[Any, ...]]:
    """Rows from columns given as lists or as one value for every row."""
    return list(zip(*(c if isinstance(c, list) else itertools.repeat(c, n) for c in cols), strict=True))


def nvtx_row(
    start: int,
    end: int | None,
    gtid: int,
    *,
    text: str | None = None,
    text_id: int | None = None,
    event_type: int = NVTX_PUSHPOP,
    domain: int = 0,
    blob: bytes | None = None,
) -> tuple[Any, ...]:
    """One ``NVTX_EVENTS`` row in the column order of the writer's DDL."""
    return (
        start,
        end,
        event_type,
        None,
        None,
        None,
        text,
        gtid,
        None,
        text_id,
        domain,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        blob,
    )


def _add_nccl(
    f: _File,
    run: SynthRun,
    r: SynthRank,
    clock: _Clock,
    comms: dict[tuple[Any, ...], _Comm],
    payloads: bool,
    comm_init: bool,
) -> None:
    """NCCL's own NVTX ranges around every NCCL kernel launch, plus communicator creation."""
    g, rt, h = r.gpu, r.runtime, r.host
    comm_rows = np.flatnonzero(((g.kind == Kind.P2P) | (g.kind == Kind.COLLECTIVE)) & (g.correlation >= 0))
    if not len(comm_rows) and not comms:
        return
    s = f.strings
    gpid_main = global_tid(r.pid, r.tid)
    first = clock.one(_first_time(r))
    f.nvtx.append(
        nvtx_row(
            first - 2_000_000,
            None,
            gpid_main,
            text="NCCL",
            event_type=NVTX_DOMAIN_CREATE,
            domain=NCCL_DOMAIN_ID,
        )
    )
    if comm_init:
        t = first - 1_900_000
        for comm in comms.values():
            blob = (
                payload_blob(
                    SCHEMA_COMM_INIT,
                    {
                        "NCCL communicator ID": comm.id,
                        "No. of ranks": comm.nranks,
                        "Rank": comm.local,
                        "CUDA device": r.device_index,
                    },
                )
                if payloads
                else None
            )
            f.nvtx.append(
                nvtx_row(
                    t,
                    t + 150_000,
                    gpid_main,
                    text_id=s.id("ncclCommInitRank"),
                    domain=NCCL_DOMAIN_ID,
                    blob=blob,
                )
            )
            t += 200_000
    rt_order = np.argsort(rt.correlation, kind="stable")
    rt_corr = rt.correlation[rt_order]
    rpc = np.flatnonzero(h.name == _name_id(run, "record_param_comms"))
    rpc_ext = h.ext_id[rpc]
    for i in comm_rows.tolist():
        j = int(np.searchsorted(rt_corr, g.correlation[i]))
        if j >= len(rt_corr) or rt_corr[j] != g.correlation[i]:
            continue
        call = int(rt_order[j])
        c_start, c_end, tid = int(rt.start[call]), int(rt.end[call]), int(rt.tid[call])
        lo, hi = c_start - 1_000, c_end + 1_000
        k = np.flatnonzero(rpc_ext == g.ext_id[i]) if g.ext_id[i] >= 0 else np.empty(0, np.int64)
        if len(k):
            # NCCL's API call runs inside PyTorch's record_param_comms op.
            lo = max(lo, int(h.start[rpc[k[0]]]) + 200)
            hi = min(hi, int(h.end[rpc[k[0]]]) - 200)
        _, comm = _comm_of(r, int(g.kind[i]), int(g.peer[i]), int(g.group[i]))
        gtid = global_tid(r.pid, tid)
        nbytes = max(int(g.bytes[i]), 0)
        for text, t0, t1, schema, vals in _api_ranges(run, r, i, comm, lo, hi, nbytes):
            blob = payload_blob(schema, vals) if payloads and schema else None
            f.nvtx.append(
                nvtx_row(
                    clock.one(t0), clock.one(t1), gtid, text_id=s.id(text), domain=NCCL_DOMAIN_ID, blob=blob
                )
            )


def _api_ranges(
    run: SynthRun, r: SynthRank, i: int, comm: _Comm, lo: int, hi: int, nbytes: int
) -> list[tuple[str, int, int, int, dict[str, int]]]:
    """The NCCL API ranges (name, start, end, schema, payload) of one NCCL kernel's launch."""
    g = r.gpu
    base = {"NCCL communicator ID": comm.id, "Message size [bytes]": nbytes}
    if int(g.kind[i]) == Kind.P2P:
        peer_local = 1 - comm.local if comm.nranks == 2 else -1
        d = int(g.direction[i])
        ops = {
            Direction.SEND: ["ncclSend"],
            Direction.RECV: ["ncclRecv"],
            Direction.BOTH: ["ncclSend", "ncclRecv"],
        }.get(Direction(d), [])
        if len(ops) == 1:
            return [(ops[0], lo, hi, SCHEMA_SENDRECV, {**base, "Peer rank": peer_local})]
        # A grouped call: ops are queued, the fused kernel is launched inside ncclGroupEnd.
        out: list[tuple[str, int, int, int, dict[str, int]]] = [
            ("ncclGroupStart", lo - 3_000, lo - 2_500, 0, {})
        ]
        for n, op in enumerate(ops):
            out.append(
                (
                    op,
                    lo - 2_400 + 800 * n,
                    lo - 1_900 + 800 * n,
                    SCHEMA_SENDRECV,
                    {**base, "Peer rank": peer_local},
                )
            )
        out.append(("ncclGroupEnd", lo, hi, 0, {}))
        return out
    coll = run.name(int(g.coll[i])).lower()
    api = _COLL_API.get(coll)
    if api is None and "all_to_all" in coll.replace("alltoall", "all_to_all"):
        # all-to-all is grouped send/recv with every member
        out = [("ncclGroupStart", lo - 3_000, lo - 2_800, 0, {})]
        t = lo - 2_700
        for p in range(comm.nranks):
            if p == comm.local:
                continue
            for op in ("ncclSend", "ncclRecv"):
                out.append((op, t, t + 50, SCHEMA_SENDRECV, {**base, "Peer rank": p}))
                t += 60
        out.append(("ncclGroupEnd", lo, hi, 0, {}))
        return out
    api = api or "ncclAllReduce"
    schema = SCHEMA_ALLREDUCE if api in ("ncclAllReduce", "ncclReduceScatter", "ncclReduce") else SCHEMA_COLL
    return [(api, lo, hi, schema, {**base, "Reduction operation": 0})]


def _name_id(run: SynthRun, name: str) -> int:
    try:
        return run.names.index(name)
    except ValueError:
        return -2


def _copy_kinds(name: str) -> tuple[int, int, int]:
    """``Memcpy HtoD (Pageable -> Device)`` → (copyKind, srcKind, dstKind)."""
    parts = name.replace("(", " ").replace(")", " ").split()
    ck = next((_COPY_KIND[p] for p in parts if p in _COPY_KIND), 8)
    kinds = [_MEM_KIND[p.lower()] for p in parts if p.lower() in _MEM_KIND]
    src, dst = [*kinds, 2, 2][:2]
    return ck, src, dst


def _gpu_row(r: SynthRank) -> tuple[Any, ...]:
    vals: list[Any] = [
        VM_ID,
        int(r.device_index),
        r.device_name,
        f"0000:{0x18 + r.device_index:02x}:00.0",
        1,
        52428800,
        85520809984,
        3352320000000,
        1980000000,
        132,
        0,
        f"GPU-{hashlib.md5(f'{r.host_name}/{r.device_index}'.encode()).hexdigest()}",
        0,
        "GH100",
        int(r.device_index),
        None,
        None,
        0,
        1,
        65536,
        4,
        65536,
        49152,
        232448,
        233472,
        65536,
        32,
        3,
        64,
        32,
        1024,
        1024,
        1024,
        64,
        2147483647,
        65535,
        65535,
        9,
        0,
        9,
        0,
    ]
    return tuple(vals)


def _launcher_env(run: SynthRun, r: SynthRank) -> dict[str, str]:
    """Environment of a per-rank process as torchrun / srun set it."""
    return {
        "RANK": str(r.rank),
        "WORLD_SIZE": str(run.world_size),
        "LOCAL_RANK": str(r.device_index),
        "LOCAL_WORLD_SIZE": str(min(run.world_size, 8)),
        "MASTER_ADDR": "node00",
        "MASTER_PORT": "29500",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_DEBUG": "WARN",
    }


def _torchrun_env(run: SynthRun) -> dict[str, str]:
    """The launcher (torchrun) itself: its children's ranks are not in its environment."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"}


def _write_file(
    path: Path,
    f: _File,
    session: int,
    env: dict[str, str],
    ts_normalize: bool,
    payloads: bool,
    members: list[SynthRank],
) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        present = {
            "CUPTI_ACTIVITY_KIND_KERNEL": f.kernels,
            "CUPTI_ACTIVITY_KIND_MEMCPY": f.memcpy,
            "CUPTI_ACTIVITY_KIND_MEMSET": f.memset,
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": f.sync,
            "CUPTI_ACTIVITY_KIND_RUNTIME": f.runtime,
            "NVTX_EVENTS": f.nvtx,
            "NVTX_PAYLOAD_SCHEMAS": f.schemas,
            "NVTX_PAYLOAD_SCHEMA_ENTRIES": f.schema_entries,
            "ThreadNames": f.threads,
            "PROCESSES": f.processes,
            "TARGET_INFO_GPU": f.gpus,
            "TARGET_INFO_CUDA_STREAM": f.streams,
            "TARGET_INFO_CUDA_CONTEXT_INFO": f.contexts,
        }
        create_tables(
            conn,
            [
                "StringIds",
                "TARGET_INFO_SESSION_START_TIME",
                "TARGET_INFO_SYSTEM_ENV",
                "META_DATA_EXPORT",
                "META_DATA_CAPTURE",
            ],
        )
        for table, rows in present.items():
            if rows:  # --lazy: empty tables are not exported
                create_tables(conn, [table])
                insert(conn, table, _columns(table), rows)
        insert(conn, "StringIds", ("id", "value"), f.strings.rows())
        utc = datetime.fromtimestamp(session / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        insert(
            conn,
            "TARGET_INFO_SESSION_START_TIME",
            ("utcEpochNs", "utcTime", "localTime"),
            [(session, utc, utc)],
        )
        host = members[0].host_name
        sysenv = [
            ("Hostname", host),
            ("CpuCores", "64"),
            ("CudaDriverVersion", "12040"),
            ("NvDriverVersion", "550.54.15"),
            ("OsDescription", "Ubuntu 22.04.4 LTS"),
        ]
        insert(
            conn,
            "TARGET_INFO_SYSTEM_ENV",
            ("globalVid", "devStateName", "name", "nameEnum", "value"),
            [(VM_ID << 48, "Initial", k, i, v) for i, (k, v) in enumerate(sysenv)],
        )
        export = [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
            ("EXPORT_PRODUCT_VERSION", PRODUCT_VERSION),
            ("EXPORT_SCHEMA_VERSION", SCHEMA_VERSION),
            ("EXPORT_PARAM_EXPORT_TYPE", "SQLite"),
            ("EXPORT_PARAM_INPUT_FILE", path.with_suffix(".nsys-rep").name),
            ("EXPORT_PARAM_LAZY", "true"),
            ("EXPORT_PARAM_INCLUDE_BLOBS", "true" if payloads else "false"),
            ("EXPORT_PARAM_TIME_NORMALIZE", "true" if ts_normalize else "false"),
            ("EXPORT_PARAM_TIME_SHIFT", "0"),
        ]
        insert(conn, "META_DATA_EXPORT", ("name", "value"), export)
        capture = [
            ("CAPTURE_EVENT_TYPE", "Cuda"),
            ("CAPTURE_EVENT_TYPE", "NvtxEvents"),
            ("PROCESS_0:HOW_TO_ATTACH", "LaunchAnother"),
            ("PROCESS_0:COMMAND", "python" if len(members) == 1 else "torchrun"),
            ("PROCESS_0:PID", "0"),
            ("PROCESS_0:COLLECT_NVTX_TRACE", "true"),
            ("PROCESS_0:COLLECT_CUDA_TRACE", "true"),
        ]
        capture += [("PROCESS_0:ENVIRONMENT_VARIABLE", f'{k}="{v}"') for k, v in env.items()]
        insert(conn, "META_DATA_CAPTURE", ("name", "value"), capture)
        conn.commit()
    finally:
        conn.close()


def _columns(table: str) -> list[str]:
    return [c.strip().split()[0] for c in DDL[table].split(",")]
