"""Nsight Systems input: SQLite exports (``nsys export --type sqlite``) and ``.nsys-rep`` reports.

One export becomes one :class:`RankTimeline` per process with GPU activity (one report per rank, or
one report holding every process of a torchrun job). Kernels, copies, memsets and sync rows become
device intervals with the host call that enqueued them (``launch``); NVTX ranges become host ranges
(steps, pipeline labels, NCCL API calls); NCCL kernels get p2p/collective semantics, direction,
bytes and peer from the NCCL API calls that launched them (NSYS.md §6), else from their names.

Timestamps: exports made with ``--ts-normalize`` are already on the UTC epoch clock; others are
shifted by the capture's session start time (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``) so that
the files of different ranks share one clock, to the precision of the hosts' clocks.

Communicator-local NCCL peers are mapped to global ranks inside one export (from the
``ncclCommInitRank`` payloads of its processes) and, across one-file-per-rank runs, by
:func:`resolve_nccl_peers`, which the run loader calls once every file is parsed and ranked.
Without payloads, peers come from PyTorch's ``nccl:send a->b`` / ``nccl:recv a<-b`` ranges
(``emit_nvtx``), whose process-group ranks :func:`resolve_nccl_peers` maps to global ranks; where
nothing names a peer it stays -1 (the pipeline layer may infer it from timing) and the direction is
kept. How each p2p kernel's peer was decided is in ``meta["p2p_peer_source"]`` (counts of
``metadata`` / ``nvtx name`` / ``none``) and per interval, in parse order, in
``meta["p2p_peer_how"]`` (0 none, 1 metadata, 2 nvtx name).

Rows with unusable ``start``/``end`` (NULL, TEXT, REAL, BLOB, or ``end < start``) are dropped in
SQL and counted per file in one warning (and in ``events_lost``); how the file is opened so that
only committed rows are read is :func:`ppdiag.parsers.nsys_db.open_export`'s business.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.model.timeline import (
    Direction,
    Intervals,
    Kind,
    NameTable,
    Phase,
    ProcessGroup,
    RangeKind,
    Ranges,
    RankTimeline,
)
from ppdiag.parsers import ParseOptions, register
from ppdiag.parsers.nsys_comm import inside_spans, project_nccl, project_torch_p2p
from ppdiag.parsers.nsys_db import BadTimes, NsysDb, factorize, open_export, sniff_sqlite
from ppdiag.parsers.nsys_gpu import GpuOps, read_gpu_ops
from ppdiag.parsers.nsys_nvtx import API_COLL, API_INIT, API_P2P, NvtxData, Spans, read_nvtx
from ppdiag.parsers.nsys_ranks import RankDecision, decide_ranks
from ppdiag.parsers.nsys_rep import ensure_sqlite, is_report

I64 = npt.NDArray[np.int64]

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
# How a p2p kernel's peer was decided (``meta["p2p_peer_how"]``, one code per interval).
PEER_NONE, PEER_METADATA, PEER_NVTX_NAME = 0, 1, 2
PEER_HOW_NAMES = {PEER_NONE: "none", PEER_METADATA: "metadata", PEER_NVTX_NAME: "nvtx name"}
# A timestamp above this is already on the epoch clock (2001-09-09); relative ones are far below.
_EPOCH_FLOOR = 10**18


class NsysParser:
    """Nsight Systems SQLite exports and ``.nsys-rep`` reports."""

    name = "nsys"

    def sniff(self, path: Path, head: bytes) -> bool:
        """``.nsys-rep``/``.qdrep`` by suffix; SQLite files by magic plus nsys tables."""
        if is_report(path):
            return True
        return sniff_sqlite(path, head)

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        """One timeline per rank found in the file; :class:`InputError` on unusable input."""
        path = Path(path)
        source = str(path)
        sqlite_path = ensure_sqlite(path, options.nsys_cache_dir) if is_report(path) else path
        db = open_export(sqlite_path)
        try:
            return parse_export(db, source)
        except sqlite3.Error as exc:
            raise InputError(source, f"corrupt or truncated SQLite export ({exc})") from None
        except MemoryError:
            raise InputError(source, "export too large for the available memory") from None
        finally:
            db.close()


PARSER = register(NsysParser())


@dataclass
class _Clock:
    offset: int
    how: str
    warning: str | None


@dataclass
class _Ctx:
    db: NsysDb
    source: str
    gpu: GpuOps
    nvtx: NvtxData
    clock: _Clock
    decisions: dict[int, RankDecision]
    comm_members: dict[int, dict[int, int]]  # communicator → {local rank: global rank}
    comm_info: dict[int, dict[int, tuple[int, int]]]  # pid → communicator → (local rank, nranks)
    meta: dict[str, Any] = field(default_factory=dict)
    autograd_tids: dict[int, set[int]] = field(default_factory=dict)  # pid → autograd engine threads


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
    ctx = _Ctx(
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
    )
    out = [_build_rank(ctx, p, proc_names.get(p, "")) for p in pids]
    if db.bad_utf8:
        file_warnings.append(f"{db.bad_utf8} text value(s) with invalid UTF-8 read with U+FFFD replacements")
    out.sort(key=lambda t: t.rank)
    lost_rows = sum(b.total for b in gpu.bad_times.values()) + nvtx.bad_times.total
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


def _clock(db: NsysDb, first: int) -> _Clock:
    kv = dict(db.name_values("META_DATA_EXPORT") or db.name_values("EXPORT_META_DATA"))
    normalized = kv.get("EXPORT_PARAM_TIME_NORMALIZE", "").strip().lower() == "true"
    if normalized or first >= _EPOCH_FLOOR:
        return _Clock(0, "ts-normalize (UTC epoch)", None)
    start = None
    if "utcEpochNs" in db.columns("TARGET_INFO_SESSION_START_TIME"):
        row = db.execute(
            "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME WHERE utcEpochNs IS NOT NULL LIMIT 1"
        ).fetchone()
        start = int(row[0]) if row else None
    if start:
        return _Clock(
            start,
            "session start time",
            (
                "exported without --ts-normalize; timestamps put on the epoch clock with the capture's "
                "session start time, so aligning ranks of different files relies on session start times "
                "(host clocks)"
            ),
        )
    return _Clock(
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


# --- one rank ----------------------------------------------------------------------------------


def _build_rank(ctx: _Ctx, pid: int, proc_name: str) -> RankTimeline:
    gpu, nvtx, dec = ctx.gpu, ctx.nvtx, ctx.decisions[pid]
    warnings: list[str] = []
    if dec.warning:
        warnings.append(dec.warning)
    off = ctx.clock.offset
    # GPU rows are ordered by (process, start): this process is one slice, already in time order.
    lo, hi = np.searchsorted(gpu.pid, [pid, pid + 1])
    sel = slice(int(lo), int(hi))
    n = int(hi - lo)
    kind = gpu.kind[sel]  # views: every process owns its slice, edited in place
    direction = gpu.direction[sel]
    nbytes = gpu.bytes[sel]
    launch_raw = gpu.launch[sel]
    ltid = gpu.ltid[sel]
    peer = np.full(n, -1, dtype=np.int32)
    group = np.full(n, -1, dtype=np.int32)
    comm_col = np.zeros(n, dtype=np.int64)
    local_peer = np.full(n, -1, dtype=np.int64)

    comm_idx = np.flatnonzero((kind == Kind.P2P) | (kind == Kind.COLLECTIVE))
    backend = "nccl" if len(comm_idx) else None
    no_payloads = False
    unmatched: tuple[I64, int, int] | None = None
    if len(comm_idx):
        proj = project_nccl(nvtx.nccl, nvtx.nccl.pid == pid, launch_raw[comm_idx], ltid[comm_idx])
        hit = comm_idx[proj.matched]
        kind[hit] = proj.kind[proj.matched]
        direction[hit] = proj.direction[proj.matched]
        nbytes[hit] = proj.bytes[proj.matched]
        comm_col[hit] = proj.comm[proj.matched]
        local_peer[hit] = proj.peer_local[proj.matched]
        miss = comm_idx[~proj.matched]
        if len(miss):
            sr = gpu.sendrecv[sel][miss]
            a2a = inside_spans(nvtx.all_to_all, pid, launch_raw[miss], ltid[miss]) & sr
            kind[miss[a2a]] = Kind.COLLECTIVE
            direction[miss[a2a]] = Direction.NONE
            unmatched = (miss, int(sr.sum()), int(a2a.sum()))
        elif not (proj.peer_local[proj.matched] >= 0).any() and (kind[hit] == Kind.P2P).any():
            no_payloads = True

    names = NameTable()
    inv, uniq = factorize(gpu.name[sel])
    name_ids = np.array([names.id(gpu.names[int(u)]) for u in uniq], dtype=np.int32)[inv]

    groups: list[ProcessGroup] = []
    comm_index: dict[int, int] = {}
    pending: dict[str, list[Any]] = {"interval": [], "range": []}

    def group_of(comm: int) -> int:
        if comm not in comm_index:
            _, nranks = ctx.comm_info.get(pid, {}).get(comm, (-1, -1))
            members = ctx.comm_members.get(comm, {})
            ranks = (
                [members[i] for i in range(nranks)]
                if nranks > 0 and all(i in members for i in range(nranks))
                else []
            )
            comm_index[comm] = len(groups)
            groups.append(
                ProcessGroup(
                    name=f"nccl:{comm & 0xFFFFFFFFFFFFFFFF:016x}",
                    desc="NCCL communicator",
                    ranks=ranks,
                    backend="nccl",
                )
            )
        return comm_index[comm]

    _resolve_peers(ctx, pid, dec, comm_col, local_peer, peer, group, group_of, pending["interval"], warnings)

    # Peers the NCCL payloads did not give, from PyTorch's "nccl:send a->b" ranges (group ranks,
    # mapped to global ranks by resolve_nccl_peers once every rank is known); their direction is
    # kept wherever NCCL's own ranges left it unknown.
    how = np.zeros(n, dtype=np.int8)
    how[(kind == Kind.P2P) & (local_peer >= 0)] = PEER_METADATA
    hr = nvtx.ranges
    tp = np.flatnonzero((hr.pid == pid) & hr.torch_p2p)
    named = project_torch_p2p(
        hr.start[tp],
        hr.tid[tp],
        hr.direction[tp],
        hr.group_rank[tp],
        hr.group_peer[tp],
        kind,
        launch_raw,
        ltid,
    )
    fill_dir = (kind == Kind.P2P) & (direction == Direction.NONE) & (named.direction != Direction.NONE)
    direction[fill_dir] = named.direction[fill_dir]
    by_name = np.flatnonzero((kind == Kind.P2P) & (local_peer < 0) & (named.group_peer >= 0))
    how[by_name] = PEER_NVTX_NAME
    name_pending: dict[str, dict[str, I64]] = {}
    if len(by_name):
        name_pending["interval"] = {
            "index": by_name,
            "me": named.group_rank[by_name],
            "peer": named.group_peer[by_name],
        }
    p2p_all = kind == Kind.P2P
    if unmatched is not None:
        miss, n_sr, n_a2a = unmatched
        n_named = int((named.direction[miss] != Direction.NONE).sum())
        warnings.append(_unmatched_warning(ctx, len(miss), n_sr, n_a2a, n_named))
    if no_payloads:
        if len(by_name) and (how[p2p_all] > 0).all():
            warnings.append(
                "NCCL NVTX payloads (peer, bytes) are not in this export; p2p peers taken from "
                "PyTorch's 'nccl:send a->b' / 'nccl:recv a<-b' ranges, bytes unknown"
            )
        else:
            warnings.append(
                "NCCL NVTX payloads (peer, bytes) are not in this export; "
                f"p2p peers unknown for {int((how[p2p_all] == 0).sum())} of {int(p2p_all.sum())} p2p "
                "kernel(s) (export with 'nsys export --include-blobs=true')"
            )
    if int(fill_dir.sum()):
        warnings.append(
            f"direction of {int(fill_dir.sum())} p2p kernel(s) taken from PyTorch 'nccl:send' / "
            "'nccl:recv' ranges"
        )

    phase = np.full(n, Phase.UNKNOWN, dtype=np.int8)
    # PyTorch's autograd engine launches the backward from its own device threads (pt_autograd_N),
    # as the Kineto trace shows it inside autograd::engine ops.
    bwd_tids = ctx.autograd_tids.get(pid)
    if bwd_tids:
        phase[np.isin(ltid, np.fromiter(bwd_tids, dtype=np.int64)) & (launch_raw >= 0)] = Phase.BWD
    # Work launched inside an optimizer range of the same thread is the optimizer step.
    opt = (hr.pid == pid) & (hr.phase == Phase.OPTIM)
    if opt.any():
        spans = Spans(hr.start[opt], hr.end[opt], hr.pid[opt], hr.tid[opt])
        phase[inside_spans(spans, pid, launch_raw, ltid)] = Phase.OPTIM

    devs = gpu.device[sel]
    stream = gpu.stream[sel]
    # Sync rows carry no meaningful device (device-wide waits report device 0).
    dev_counts = np.bincount(devs[kind != Kind.SYNC], minlength=1)
    udev = np.flatnonzero(dev_counts)
    dev_counts = dev_counts[udev]
    if len(udev) > 1:
        # Stream ids are per device context: keep streams of different GPUs apart.
        stream = (devs << 32) | stream
        warnings.append(
            f"process {pid} used {len(udev)} GPUs "
            f"({', '.join(str(d) for d in udev.tolist())}); their streams are kept apart as "
            "device<<32|stream"
        )
    stream[stream == 0xFFFFFFFF] = -1

    launch = np.where(launch_raw >= 0, launch_raw + off, -1)
    iv = Intervals.from_columns(
        n,
        {
            "start": gpu.start[sel] + off,
            "end": gpu.end[sel] + off,
            "stream": stream,
            "kind": kind,
            "name": name_ids,
            "phase": phase,
            "peer": peer,
            "direction": direction,
            "bytes": nbytes,
            "launch": launch,
            "group": group,
        },
    )

    rg = _ranges(ctx, pid, dec, names, group_of, pending["range"], warnings)
    # PyTorch p2p ranges of this process sit first in the range table, in the order of ``hr``.
    rsel = np.flatnonzero(hr.pid == pid)
    rnamed = np.flatnonzero(hr.torch_p2p[rsel] & (hr.group_peer[rsel] >= 0))
    if len(rnamed):
        name_pending["range"] = {
            "index": rnamed,
            "me": hr.group_rank[rsel][rnamed],
            "peer": hr.group_peer[rsel][rnamed],
        }

    meta = dict(ctx.meta)
    meta.update({"pid": pid, "process": proc_name, "devices": udev.tolist(), "clock": ctx.clock.how})
    if ctx.comm_info.get(pid):
        meta["nccl_comms"] = {
            f"{c & 0xFFFFFFFFFFFFFFFF:016x}": {"rank": r, "nranks": nr}
            for c, (r, nr) in ctx.comm_info[pid].items()
        }
    if pending["interval"] or pending["range"]:
        # row indices into the (final) interval and range tables, for resolve_nccl_peers
        meta["nccl_pending"] = {t: _pack_pending(v) for t, v in pending.items() if v}
    if name_pending:
        meta["nvtx_p2p_pending"] = name_pending
    meta["p2p_peer_how"] = how
    meta["p2p_peer_source"] = peer_source_counts(iv, how)
    overhead = _profiler_overhead(ctx.db, pid, off)
    if len(overhead):
        meta["profiler_overhead_ns"] = overhead
    main_dev = int(udev[np.argmax(dev_counts)]) if len(udev) else 0
    return RankTimeline(
        rank=dec.rank,
        source=ctx.source,
        format="nsys",
        names=names.names,
        intervals=iv,
        ranges=rg,
        world_size=dec.world_size,
        backend=backend,
        device=f"cuda:{main_dev}",
        cpu_only=False,
        process_groups=groups,
        rank_source=dec.source,
        events_total=n + len(rg),
        events_lost=0,
        warnings=warnings,
        meta=meta,
    )


def _unmatched_warning(ctx: _Ctx, n_miss: int, n_sendrecv: int, n_a2a: int, n_named: int) -> str:
    why = (
        "no NCCL NVTX ranges in this export (trace with 'nsys profile -t cuda,nvtx' and keep "
        "NCCL_NVTX_DISABLE unset)"
        if not ctx.nvtx.nccl_domain
        else "their launch lies in no NCCL API range"
    )
    n_p2p = n_sendrecv - n_a2a
    named = (
        f" ({n_named} of them with direction, and peer where named, from PyTorch "
        "'nccl:send a->b' / 'nccl:recv a<-b' ranges)"
        if n_named
        else " with unknown peer"
    )
    tail = f"; {n_p2p} SendRecv kernel(s) taken as p2p{named}" if n_p2p else ""
    a2a = f"; {n_a2a} SendRecv kernel(s) inside all-to-all ranges taken as collective" if n_a2a else ""
    return f"{n_miss} NCCL kernel(s) classified by name only: {why}{tail}{a2a}"


def _resolve_peers(
    ctx: _Ctx,
    pid: int,
    dec: RankDecision,
    comm: I64,
    local_peer: I64,
    peer: npt.NDArray[np.int32],
    group: npt.NDArray[np.int32],
    group_of: Any,
    pending: list[Any],
    warnings: list[str],
) -> int:
    """Global peer ranks from communicator-local ones; what this file cannot map is left pending
    (``pending`` gets (row indices, communicators, local peers) arrays)."""
    has_comm = comm != 0
    for c in np.unique(comm[has_comm]).tolist():
        rows = np.flatnonzero(comm == c)
        group[rows] = group_of(c)
        local, nranks = ctx.comm_info.get(pid, {}).get(c, (-1, -1))
        lp = local_peer[rows]
        mapped = _lookup(ctx.comm_members.get(c, {}), lp)
        # A communicator as large as the world in which this process has its own global rank is
        # the world communicator: local ranks are global ranks.
        if nranks > 0 and dec.world_size == nranks and local == dec.rank:
            mapped = np.where(mapped >= 0, mapped, lp)
        known = lp >= 0
        peer[rows] = np.where(known, mapped, -1).astype(np.int32)
        left = rows[known & (mapped < 0)]
        if len(left):
            pending.append((left, np.full(len(left), c, dtype=np.int64), local_peer[left]))
    # Payloads without a communicator (JSON style): assume world ranks.
    no_comm = ~has_comm & (local_peer >= 0)
    if no_comm.any():
        peer[no_comm] = local_peer[no_comm].astype(np.int32)
        warnings.append(
            f"{int(no_comm.sum())} NCCL p2p payload(s) without a "
            "communicator id; their peer ranks are taken as global ranks"
        )
    mine = list(ctx.comm_info.get(pid, {}))
    unresolvable = sum(int((~np.isin(c, mine)).sum()) for _, c, _ in pending)
    if unresolvable:
        warnings.append(
            f"peers of {unresolvable} NCCL p2p kernel(s) are "
            "communicator-local and the communicator's creation was not captured; "
            "their global peer ranks are unknown"
        )
    return len(pending)


def _lookup(members: dict[int, int], local: I64) -> I64:
    """Global rank of each communicator-local rank in ``local`` (-1 when not a known member)."""
    if not members:
        return np.full(len(local), -1, dtype=np.int64)
    keys = np.array(sorted(members), dtype=np.int64)
    vals = np.array([members[k] for k in keys.tolist()], dtype=np.int64)
    pos = np.minimum(np.searchsorted(keys, local), len(keys) - 1)
    return np.where(keys[pos] == local, vals[pos], -1)


def _pack_pending(parts: list[tuple[I64, I64, I64]], base: int = 0) -> dict[str, I64]:
    if not parts:
        return {}
    return {
        "index": np.concatenate([p[0] for p in parts]) + base,
        "comm": np.concatenate([p[1] for p in parts]),
        "local": np.concatenate([p[2] for p in parts]),
    }


def _ranges(
    ctx: _Ctx,
    pid: int,
    dec: RankDecision,
    names: NameTable,
    group_of: Any,
    pending: list[Any],
    warnings: list[str],
) -> Ranges:
    off = ctx.clock.offset
    hr = ctx.nvtx.ranges
    sel = np.flatnonzero(hr.pid == pid)
    cols: dict[str, Any] = {}
    if len(sel):
        uniq, inv = np.unique(hr.name[sel], return_inverse=True)
        nid = np.array([names.id(hr.names[int(u)]) for u in uniq], dtype=np.int32)[inv]
        kind = hr.kind[sel]
        num = hr.num[sel].copy()
        unnumbered = (kind == RangeKind.STEP) & ~hr.numbered[sel]
        if unnumbered.any():
            # Step ranges without a number ("train_step"): number them in time order.
            u = np.flatnonzero(unnumbered)
            num[u[np.argsort(hr.start[sel][u], kind="stable")]] = np.arange(len(u))
        cols = {
            "start": hr.start[sel] + off,
            "end": hr.end[sel] + off,
            "kind": kind,
            "name": nid,
            "tid": hr.tid[sel],
            "num": num,
            "stage": hr.stage[sel],
            "mb": hr.mb[sel],
            "phase": hr.phase[sel],
            "direction": hr.direction[sel],
        }
    parts = [Ranges.from_columns(len(sel), cols)] if len(sel) else []

    calls = ctx.nvtx.nccl
    csel = (
        np.flatnonzero((calls.pid == pid) & ((calls.api == API_P2P) | (calls.api == API_COLL)))
        if len(calls)
        else np.empty(0, np.int64)
    )
    if len(csel):
        m = len(csel)
        peer = np.full(m, -1, dtype=np.int32)
        group = np.full(m, -1, dtype=np.int32)
        sub_pending: list[Any] = []
        _resolve_peers(
            ctx,
            pid,
            dec,
            calls.comm[csel].copy(),
            np.where(calls.api[csel] == API_P2P, calls.peer_local[csel], -1),
            peer,
            group,
            group_of,
            sub_pending,
            [],
        )
        base = len(sel)
        pending.extend((i + base, c, lp) for i, c, lp in sub_pending)
        parts.append(
            Ranges.from_columns(
                m,
                {
                    "start": calls.start[csel] + off,
                    "end": calls.end[csel] + off,
                    "kind": np.full(m, RangeKind.COMM_OP, np.int8),
                    "name": np.array([names.id(x) for x in calls.names], dtype=np.int32)[calls.name[csel]]
                    if calls.names
                    else np.zeros(m, np.int32),
                    "tid": calls.tid[csel],
                    "direction": calls.direction[csel],
                    "peer": peer,
                    "bytes": calls.bytes[csel],
                    "group": group,
                },
            )
        )
    if not parts:
        return Ranges.empty()
    return Ranges(**{c: np.concatenate([getattr(p, c) for p in parts]) for c in Ranges.COLUMNS})


def _profiler_overhead(db: NsysDb, pid: int, off: int) -> I64:
    """nsys/CUPTI buffer-flush spans of this process as an (n, 2) array (gaps there are the profiler's)."""
    if not {"start", "end", "globalTid"} <= set(db.columns("PROFILER_OVERHEAD")):
        return np.empty((0, 2), dtype=np.int64)
    rows = db.fetch(
        'SELECT start, "end" FROM PROFILER_OVERHEAD WHERE "end" IS NOT NULL AND '
        "((globalTid >> 24) & 16777215) = ?",
        np.dtype([("s", np.int64), ("e", np.int64)]),
        (pid,),
    )
    return np.stack([rows["s"] + off, rows["e"] + off], axis=1) if len(rows) else np.empty((0, 2), np.int64)


# --- run level ---------------------------------------------------------------------------------


def peer_source_counts(iv: Intervals, how: npt.NDArray[np.int8]) -> dict[str, int]:
    """``meta["p2p_peer_source"]``: how many p2p kernels got their peer from each source
    (``metadata``: NCCL payloads; ``nvtx name``: PyTorch ``nccl:send a->b`` ranges; ``none``)."""
    p2p = iv.kind == Kind.P2P
    if len(how) != len(iv):
        return {}
    known = p2p & (iv.peer >= 0)
    return {
        PEER_HOW_NAMES[PEER_METADATA]: int((known & (how == PEER_METADATA)).sum()),
        PEER_HOW_NAMES[PEER_NVTX_NAME]: int((known & (how == PEER_NVTX_NAME)).sum()),
        # a peer decided by nothing, or named but never mapped to a global rank
        PEER_HOW_NAMES[PEER_NONE]: int((p2p & ~known).sum()),
    }


def _group_stride(triples: I64, ranks: set[int]) -> tuple[int | None, str]:
    """Map PyTorch's process-group ranks to global ranks: (stride, how) or (None, why not).

    ``triples`` holds distinct (global rank, own group rank, peer group rank) columns. Groups of
    a regular layout hold ranks ``base + i * stride`` (stride 1: consecutive ranks, as a world or
    node-local group; larger: Megatron-style pipeline groups), so the peer's global rank is
    ``rank + (peer - own) * stride``. A stride is accepted when every op's peer is then a traced
    rank that names this rank back (its own group rank and peer swapped); when every process's
    group rank equals its global rank the group is the world (stride 1) even without that check.
    """
    r, g, h = triples
    if (r == g).all():
        return 1, "group ranks equal global ranks"
    moving = h != g
    if not moving.any():
        return None, "every op names its own rank as the peer"
    # Keys of (rank, own, peer) for membership tests; the mirror of (r, g, h) is (t, h, g).
    span = int(max(int(triples.max()), max(ranks, default=0))) + 1
    known = np.unique((r * span + g) * span + h)
    rank_arr = np.array(sorted(ranks), dtype=np.int64)
    # Candidate strides come from the first moving op: the ranks that name it back.
    i0 = int(np.flatnonzero(moving)[0])
    back = r[(g == h[i0]) & (h == g[i0])]
    step = int(h[i0] - g[i0])
    cands = sorted({int(d) // step for d in (back - r[i0]).tolist() if d and d % step == 0 and d // step > 0})
    fits: list[int] = []
    for stride in cands:
        tgt = r + (h - g) * stride
        in_run = np.isin(tgt, rank_arr)
        mirrored = np.isin((tgt * span + h) * span + g, known)
        if (in_run & mirrored).all():
            fits.append(stride)
    if len(fits) == 1:
        return fits[0], f"group ranks map to global ranks with stride {fits[0]}"
    if not fits:
        return None, "no regular group layout fits every send and its matching receive"
    return None, f"several group layouts fit (strides {fits})"


def _resolve_named_peers(ranks: list[RankTimeline]) -> list[str]:
    """Global peers for the PyTorch-named p2p ops (``meta["nvtx_p2p_pending"]``)."""
    pend = [(tl, tl.meta.pop("nvtx_p2p_pending", None)) for tl in ranks]
    pend = [(tl, p) for tl, p in pend if p]
    if not pend:
        return []
    cols = [
        np.stack([np.full(len(v["me"]), tl.rank, dtype=np.int64), v["me"], v["peer"]])
        for tl, p in pend
        for v in p.values()
        if len(v["me"])
    ]
    triples = np.unique(np.concatenate(cols, axis=1), axis=1)
    stride, how = _group_stride(triples, {tl.rank for tl in ranks})
    if stride is None:
        n = sum(len(p.get("interval", {}).get("index", ())) for _, p in pend)
        for tl, p in pend:
            tl.meta["nvtx_p2p_pending"] = p  # kept: a later call with more ranks may map them
        return [
            f"{n} p2p kernel(s) name their peers by process-group rank (PyTorch 'nccl:send a->b') "
            f"and the group's global ranks are unknown ({how}); their peers stay unknown"
        ]
    for tl, p in pend:
        for table, rows in (("interval", tl.intervals), ("range", tl.ranges)):
            v = p.get(table)
            if not v:
                continue
            idx = v["index"]
            ok = idx < len(rows)
            glob = tl.rank + (v["peer"] - v["me"]) * stride
            rows.peer[idx[ok]] = glob[ok].astype(rows.peer.dtype)
        how_arr = tl.meta.get("p2p_peer_how")
        if how_arr is not None:
            tl.meta["p2p_peer_source"] = peer_source_counts(tl.intervals, how_arr)
    return []


def resolve_nccl_peers(ranks: list[RankTimeline]) -> list[str]:
    """Map communicator-local NCCL peers to global ranks across the files of one run.

    Each nsys rank records which communicators it belongs to and its local rank there
    (``meta["nccl_comms"]``); intervals and ranges whose peer could not be mapped from their own file
    are listed in ``meta["nccl_pending"]``. Peers named only by PyTorch's ``nccl:send a->b`` ranges
    (process-group ranks, ``meta["nvtx_p2p_pending"]``) are mapped to global ranks here too
    (:func:`_group_stride`), and ``meta["p2p_peer_source"]`` is brought up to date. Call once after
    parsing and rank resolution, before anything reorders the tables; calling it again is
    harmless. Returns run-level warnings.
    """
    members: dict[str, dict[int, int]] = {}
    for tl in ranks:
        for comm, info in (tl.meta.get("nccl_comms") or {}).items():
            members.setdefault(comm, {})[int(info["rank"])] = tl.rank
    unresolved = 0
    for tl in ranks:
        # Communicators' members, for every rank: one whose p2p peers needed no mapping (or whose
        # p2p payloads are missing) still holds collectives on communicators made in other files.
        for pg in tl.process_groups:
            key = pg.name.removeprefix("nccl:")
            mem = members.get(key)
            if pg.backend == "nccl" and mem and not pg.ranks and sorted(mem) == list(range(len(mem))):
                pg.ranks = [mem[i] for i in range(len(mem))]
        pend = tl.meta.pop("nccl_pending", None)
        if not pend:
            continue
        for table, rows in (("interval", tl.intervals), ("range", tl.ranges)):
            p = pend.get(table)
            if not p:
                continue
            idx, comm, local = p["index"], p["comm"], p["local"]
            for c in np.unique(comm).tolist():
                m = comm == c
                g = _lookup(members.get(f"{c & 0xFFFFFFFFFFFFFFFF:016x}", {}), local[m])
                ok = (g >= 0) & (idx[m] < len(rows))
                rows.peer[idx[m][ok]] = g[ok]
                unresolved += int((~ok).sum())
    out = _resolve_named_peers(ranks)
    for tl in ranks:
        how_arr = tl.meta.get("p2p_peer_how")
        if how_arr is not None:
            tl.meta["p2p_peer_source"] = peer_source_counts(tl.intervals, how_arr)
    if unresolved:
        out.insert(
            0,
            f"{unresolved} NCCL p2p operation(s) keep an unknown peer: their communicator's other "
            "members are not among the parsed files",
        )
    return out
