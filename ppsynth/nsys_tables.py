"""The Nsight Systems export schema the synthetic writer fills: the nsys 2024.5 DDL of every table
it writes, the NCCL NVTX payload schemas, id encodings and row helpers (shared with the tests that
build exports by hand)."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

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
SCHEMAS: dict[int, tuple[int, list[tuple[str, int, int]]]] = {
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
COLL_API = {
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
RUNTIME_SUFFIX = {
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
TORCH_COMM_TITLE = re.compile(r"(nccl|gloo|mpi|ucc|xccl):")
COPY_KIND = {
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
MEM_KIND = {"pageable": 0, "pinned": 1, "device": 2, "array": 3, "managed": 4}

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
    """nsys GlobalId of a process."""
    return (VM_ID << 48) | ((pid & 0xFFFFFF) << 24)


def global_tid(pid: int, tid: int) -> int:
    """nsys GlobalId of a thread."""
    return global_pid(pid) | (tid & 0xFFFFFF)


def comm_hash(*key: Any) -> int:
    """A stable 64-bit communicator id (NCCL uses a hash of the unique id)."""
    return int.from_bytes(hashlib.sha1(repr(key).encode()).digest()[:8], "little")


def payload_blob(schema: int, values: dict[str, int]) -> bytes:
    """nsys ``binaryData``: 32-byte header (domain, schema, payload size, total) + the struct."""
    size, entries = SCHEMAS[schema]
    body = bytearray(size)
    for name, typ, off in entries:
        v = int(values.get(name, 0))
        if typ == T_INT:
            struct.pack_into("<i", body, off, v)
        else:
            struct.pack_into("<Q", body, off, v & 0xFFFFFFFFFFFFFFFF)
    return struct.pack("<QQQQ", NCCL_DOMAIN_ID, schema, size, 32 + size) + bytes(body)


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


def columns(table: str) -> list[str]:
    """The column names of ``table`` in the DDL's order."""
    return [c.strip().split()[0] for c in DDL[table].split(",")]


I64 = npt.NDArray[np.int64]


class Strings:
    """The export's ``StringIds``: one id per distinct string, from 1."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, s: str) -> int:
        """The id of ``s`` (a new one the first time)."""
        i = self.ids.get(s)
        if i is None:
            i = len(self.ids) + 1
            self.ids[s] = i
        return i

    def rows(self) -> list[tuple[int, str]]:
        """``(id, value)`` rows."""
        return [(i, s) for s, i in self.ids.items()]


@dataclass
class ExportRows:
    """Rows of one export being assembled (one or several processes)."""

    strings: Strings = field(default_factory=Strings)
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
class Clock:
    """Local time of a rank in the file's stored time base."""

    base: int  # subtracted from epoch-based local times (the session start, or 0 when normalized)
    epoch: int
    skew: int

    def __call__(self, t: I64) -> I64:
        return (t + (self.epoch + self.skew - self.base)).astype(np.int64)

    def one(self, t: int) -> int:
        """One time."""
        return int(t + self.epoch + self.skew - self.base)
