"""The reading of one open Nsight Systems export (:func:`parse_export`): its GPU rows, NVTX
ranges, processes, clock and communicators, and one :class:`RankTimeline` per process with GPU
activity. :mod:`ppdiag.parsers.nsys` (the registered parser, what sniffing a run's files imports)
imports this module when it parses a file, so that a run of other traces never loads it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ppdiag.errors import InputError
from ppdiag.model.timeline import Kind, RankTimeline
from ppdiag.parsers.nsys_db import BadTimes, NsysDb, factorize
from ppdiag.parsers.nsys_gpu import read_gpu_ops
from ppdiag.parsers.nsys_memory import memory_warning, read_memory
from ppdiag.parsers.nsys_nvtx import API_INIT, NvtxData, read_nvtx
from ppdiag.parsers.nsys_rank import Clock, ExportCtx, build_rank
from ppdiag.parsers.nsys_ranks import RankDecision, decide_ranks

# A timestamp above this is already on the epoch clock (2001-09-09); relative ones are far below.
_EPOCH_FLOOR = 10**18


def parse_export(db: NsysDb, source: str) -> list[RankTimeline]:
    """All ranks of one open export."""
    gpu = read_gpu_ops(db)
    active = gpu.kind != Kind.SYNC
    dropped = _dropped_gpu_rows(gpu.bad_times)
    if not active.any():
        if dropped:
            raise InputError(source, f"no usable GPU activity in this export: {dropped}")
        raise InputError(
            source,
            "no GPU activity in this export (no kernel, memcpy or memset rows); "
            "profile with CUDA tracing on (nsys profile -t cuda,nvtx)",
        )
    pids = sorted(factorize(gpu.pid[active])[1].tolist())
    nvtx = read_nvtx(db)
    proc_names = _process_names(db)
    devices: dict[int, list[int]] = {}
    for p in pids:
        lo, hi = np.searchsorted(gpu.pid, [p, p + 1])
        devices[p] = np.flatnonzero(np.bincount(gpu.device[lo:hi][active[lo:hi]])).tolist()
    decisions = decide_ranks(db, pids, devices, nvtx.thread_ranks, proc_names)
    clock = _clock(db, int(gpu.start.min()))
    file_warnings: list[str] = list(db.warnings)
    if clock.warning:
        file_warnings.append(clock.warning)
    if dropped:
        file_warnings.append(dropped)
    if nvtx.bad_times.total:
        file_warnings.append(f"{nvtx.bad_times.total} NVTX range(s) dropped: {nvtx.bad_times.describe()}")
    if nvtx.open_torch_p2p:
        file_warnings.append(
            f"{nvtx.open_torch_p2p} PyTorch 'nccl:send'/'nccl:recv' range(s) never closed; kept with "
            "zero length at their start (which is all the peer projection uses)"
        )
    if nvtx.nccl_domain_unnamed:
        file_warnings.append(
            "the NCCL NVTX domain has no domain-create row in this export; recognised by its range "
            "names or payload schemas"
        )
    idle = sorted(_cuda_processes(db) - set(pids))
    if idle:
        shown = ", ".join(f"{proc_names.get(p, 'process')} pid {p}" for p in idle[:8])
        more = f" and {len(idle) - 8} more" if len(idle) > 8 else ""
        file_warnings.append(f"{len(idle)} CUDA process(es) without GPU activity skipped: {shown}{more}")
    comm_members, comm_info = _communicators(nvtx, decisions)
    memory = read_memory(db)
    mem_warning = memory_warning(memory)
    if mem_warning:
        file_warnings.append(mem_warning)
    ctx = ExportCtx(
        db=db,
        source=source,
        gpu=gpu,
        nvtx=nvtx,
        clock=clock,
        decisions=decisions,
        comm_members=comm_members,
        comm_info=comm_info,
        meta=_export_meta(db),
        autograd_tids=_autograd_threads(db),
        memory=memory,
    )
    out = [build_rank(ctx, p, proc_names.get(p, "")) for p in pids]
    if db.bad_utf8:
        file_warnings.append(f"{db.bad_utf8} text value(s) with invalid UTF-8 read with U+FFFD replacements")
    out.sort(key=lambda t: t.rank)
    lost_rows = sum(b.total for b in gpu.bad_times.values()) + nvtx.bad_times.total
    lost_rows += memory.dropped if memory is not None else 0
    out[0].events_lost += lost_rows
    out[0].events_total += lost_rows
    # Facts about the file are said once, on its first rank.
    out[0].warnings[:0] = file_warnings
    return out


# --- file-level facts --------------------------------------------------------------------------


_TABLE_WORDS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "kernel",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "memcpy",
    "CUPTI_ACTIVITY_KIND_MEMSET": "memset",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "sync",
}


def _dropped_gpu_rows(bad: dict[str, BadTimes]) -> str:
    """One line for every GPU row dropped for its times, by table and reason ('' when none)."""
    if not bad:
        return ""
    total = BadTimes()
    for b in bad.values():
        total.add(b)
    per_table = ", ".join(f"{b.total} {_TABLE_WORDS.get(t, t)}" for t, b in bad.items())
    return f"{total.total} GPU row(s) dropped ({per_table}): {total.describe()}"


def _autograd_threads(db: NsysDb) -> dict[int, set[int]]:
    """Per process, the threads PyTorch's autograd engine runs the backward on (``pt_autograd_N``)."""
    if not (db.has("ThreadNames") and db.has("StringIds")):
        return {}
    if not {"nameId", "globalTid"} <= set(db.columns("ThreadNames")):
        return {}
    rows = db.execute(
        "SELECT t.globalTid FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId "
        "WHERE s.value LIKE 'pt_autograd%'"
    ).fetchall()
    out: dict[int, set[int]] = {}
    for (gtid,) in rows:
        g = int(gtid)
        out.setdefault((g >> 24) & 0xFFFFFF, set()).add(g & 0xFFFFFF)
    return out


def _export_meta(db: NsysDb) -> dict[str, Any]:
    kv = dict(db.name_values("META_DATA_EXPORT") or db.name_values("EXPORT_META_DATA"))
    meta: dict[str, Any] = {}
    if "EXPORT_PRODUCT_VERSION" in kv:
        meta["nsys_version"] = kv["EXPORT_PRODUCT_VERSION"]
    if "EXPORT_SCHEMA_VERSION" in kv:
        meta["nsys_schema"] = kv["EXPORT_SCHEMA_VERSION"]
    host = dict(db.name_values("TARGET_INFO_SYSTEM_ENV")).get("Hostname")
    if host:
        # Only "same node or not" matters to the diagnosis; the host name itself stays private.
        meta["node"] = hashlib.sha1(host.encode()).hexdigest()[:12]
    return meta


def _clock(db: NsysDb, first: int) -> Clock:
    kv = dict(db.name_values("META_DATA_EXPORT") or db.name_values("EXPORT_META_DATA"))
    normalized = kv.get("EXPORT_PARAM_TIME_NORMALIZE", "").strip().lower() == "true"
    if normalized or first >= _EPOCH_FLOOR:
        return Clock(0, "ts-normalize (UTC epoch)", None)
    start = None
    if "utcEpochNs" in db.columns("TARGET_INFO_SESSION_START_TIME"):
        row = db.execute(
            "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME WHERE utcEpochNs IS NOT NULL LIMIT 1"
        ).fetchone()
        start = int(row[0]) if row else None
    if start:
        return Clock(
            start,
            "session start time",
            (
                "exported without --ts-normalize; timestamps put on the epoch clock with the capture's "
                "session start time, so aligning ranks of different files relies on session start times "
                "(host clocks)"
            ),
        )
    return Clock(
        0,
        "relative",
        (
            "no session start time and no --ts-normalize; timestamps are relative to this capture "
            "and cannot be aligned with other files"
        ),
    )


def _process_names(db: NsysDb) -> dict[int, str]:
    if not {"pid", "name"} <= set(db.columns("PROCESSES")):
        return {}
    return {
        int(p): str(n or "") for p, n in db.execute("SELECT pid, name FROM PROCESSES WHERE pid IS NOT NULL")
    }


def _cuda_processes(db: NsysDb) -> set[int]:
    """Processes that created CUDA streams or contexts (cheap tables, unlike RUNTIME)."""
    out: set[int] = set()
    for table in ("TARGET_INFO_CUDA_STREAM", "TARGET_INFO_CUDA_CONTEXT_INFO"):
        if "processId" in db.columns(table):
            rows = db.execute(f"SELECT DISTINCT processId FROM {table} WHERE typeof(processId) = 'integer'")
            out |= {int(r[0]) for r in rows}
    return out


def _communicators(
    nvtx: NvtxData, decisions: dict[int, RankDecision]
) -> tuple[dict[int, dict[int, int]], dict[int, dict[int, tuple[int, int]]]]:
    """Communicator membership from the ``ncclCommInitRank``-style payloads of this export."""
    calls = nvtx.nccl
    members: dict[int, dict[int, int]] = {}
    info: dict[int, dict[int, tuple[int, int]]] = {}
    sel = np.flatnonzero((calls.api == API_INIT) & (calls.comm != 0) & (calls.rank >= 0))
    for i in sel.tolist():
        pid, comm = int(calls.pid[i]), int(calls.comm[i])
        local, nranks = int(calls.rank[i]), int(calls.nranks[i])
        info.setdefault(pid, {})[comm] = (local, nranks)
        if pid in decisions:
            members.setdefault(comm, {})[local] = decisions[pid].rank
    return members, info


__all__ = ["parse_export"]
