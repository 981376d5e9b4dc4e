"""One rank of an nsys export: the process's GPU rows, NVTX ranges and NCCL calls turned into a
:class:`RankTimeline`.

GPU rows get communication semantics (kind, direction, bytes, communicator) from the NCCL API
ranges that launched them (:func:`ppdiag.parsers.nsys_comm.project_nccl`), then peers: global
ranks from the communicator memberships of this export, else PyTorch's ``nccl:send a->b`` ranges
(process-group ranks). What needs the other files of the run is left in ``meta`` for
:func:`ppdiag.parsers.nsys_peers.resolve_nccl_peers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

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
from ppdiag.parsers.nsys_comm import NamedP2P, inside_spans, project_nccl, project_torch_p2p
from ppdiag.parsers.nsys_db import NsysDb, factorize
from ppdiag.parsers.nsys_gpu import GpuOps
from ppdiag.parsers.nsys_memory import MemoryEvents, rank_memory
from ppdiag.parsers.nsys_nvtx import API_COLL, API_P2P, NvtxData, Spans
from ppdiag.parsers.nsys_peers import PEER_METADATA, PEER_NVTX_NAME, lookup, peer_source_counts
from ppdiag.parsers.nsys_ranks import RankDecision

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
# (row indices, communicators, communicator-local peers) of rows whose global peer is unknown yet
Pending = tuple[I64, I64, I64]
GroupOf = Callable[[int], int]


@dataclass
class Clock:
    """How the export's timestamps are put on the epoch clock."""

    offset: int
    how: str
    warning: str | None


@dataclass
class ExportCtx:
    """What every rank of one export reads: the file's tables and facts."""

    db: NsysDb
    source: str
    gpu: GpuOps
    nvtx: NvtxData
    clock: Clock
    decisions: dict[int, RankDecision]
    comm_members: dict[int, dict[int, int]]  # communicator → {local rank: global rank}
    comm_info: dict[int, dict[int, tuple[int, int]]]  # pid → communicator → (local rank, nranks)
    meta: dict[str, Any] = field(default_factory=dict)
    autograd_tids: dict[int, set[int]] = field(default_factory=dict)  # pid → autograd engine threads
    memory: MemoryEvents | None = None  # GPU memory events (--cuda-memory-usage), all processes


@dataclass
class _Rows:
    """One process's GPU rows: views into the file's columns (every process owns its slice, edited
    in place) plus the communication columns this module fills."""

    sel: slice
    kind: I8
    direction: I8
    nbytes: I64
    launch_raw: I64
    ltid: I64
    peer: I32
    group: I32
    comm: I64
    local_peer: I64

    @property
    def n(self) -> int:
        return int(self.kind.shape[0])


def _rows(gpu: GpuOps, pid: int) -> _Rows:
    # GPU rows are ordered by (process, start): this process is one slice, already in time order.
    lo, hi = np.searchsorted(gpu.pid, [pid, pid + 1])
    sel = slice(int(lo), int(hi))
    n = int(hi - lo)
    return _Rows(
        sel=sel,
        kind=gpu.kind[sel],
        direction=gpu.direction[sel],
        nbytes=gpu.bytes[sel],
        launch_raw=gpu.launch[sel],
        ltid=gpu.ltid[sel],
        peer=np.full(n, -1, dtype=np.int32),
        group=np.full(n, -1, dtype=np.int32),
        comm=np.zeros(n, dtype=np.int64),
        local_peer=np.full(n, -1, dtype=np.int64),
    )


@dataclass
class _NcclOutcome:
    """What projecting the NCCL calls onto this rank's kernels left to say."""

    backend: str | None = None
    no_payloads: bool = False
    # kernels no NCCL call claimed: (their rows, SendRecv kernels among them, all-to-all ones)
    unmatched: tuple[I64, int, int] | None = None


def _project(ctx: ExportCtx, pid: int, r: _Rows) -> _NcclOutcome:
    """Kind, direction, bytes, communicator and local peer of the NCCL kernels, from their calls."""
    comm_idx = np.flatnonzero((r.kind == Kind.P2P) | (r.kind == Kind.COLLECTIVE))
    if not len(comm_idx):
        return _NcclOutcome()
    out = _NcclOutcome(backend="nccl")
    nvtx = ctx.nvtx
    proj = project_nccl(nvtx.nccl, nvtx.nccl.pid == pid, r.launch_raw[comm_idx], r.ltid[comm_idx])
    hit = comm_idx[proj.matched]
    r.kind[hit] = proj.kind[proj.matched]
    r.direction[hit] = proj.direction[proj.matched]
    r.nbytes[hit] = proj.bytes[proj.matched]
    r.comm[hit] = proj.comm[proj.matched]
    r.local_peer[hit] = proj.peer_local[proj.matched]
    # Grouped sends and receives launched inside a collective's range (PyTorch's nccl:all_to_all /
    # c10d::alltoall_base_, a user all-to-all range) are that collective, never a pipeline link:
    # a 2-rank all-to-all is one ncclSend and one ncclRecv to the same peer.
    grouped = hit[r.kind[hit] == Kind.P2P]
    in_coll = inside_spans(nvtx.collective, pid, r.launch_raw[grouped], r.ltid[grouped])
    r.kind[grouped[in_coll]] = Kind.COLLECTIVE
    r.direction[grouped[in_coll]] = Direction.NONE
    r.local_peer[grouped[in_coll]] = -1
    miss = comm_idx[~proj.matched]
    if len(miss):
        sr = ctx.gpu.sendrecv[r.sel][miss]
        a2a = inside_spans(nvtx.collective, pid, r.launch_raw[miss], r.ltid[miss]) & sr
        r.kind[miss[a2a]] = Kind.COLLECTIVE
        r.direction[miss[a2a]] = Direction.NONE
        out.unmatched = (miss, int(sr.sum()), int(a2a.sum()))
    elif (r.kind[hit] == Kind.P2P).any():
        # payloads absent: no NCCL call of this process says a peer or a size (a group that talks
        # to several peers has no single peer, yet its calls carry theirs)
        mine = nvtx.nccl.pid == pid
        out.no_payloads = not ((nvtx.nccl.peer_local[mine] >= 0) | (nvtx.nccl.bytes[mine] >= 0)).any()
    return out


class _Groups:
    """The rank's NCCL communicators as process groups, numbered as first met."""

    def __init__(self, ctx: ExportCtx, pid: int) -> None:
        self.ctx, self.pid = ctx, pid
        self.groups: list[ProcessGroup] = []
        self.index: dict[int, int] = {}

    def __call__(self, comm: int) -> int:
        if comm not in self.index:
            _, nranks = self.ctx.comm_info.get(self.pid, {}).get(comm, (-1, -1))
            members = self.ctx.comm_members.get(comm, {})
            ranks = (
                [members[i] for i in range(nranks)]
                if nranks > 0 and all(i in members for i in range(nranks))
                else []
            )
            self.index[comm] = len(self.groups)
            self.groups.append(
                ProcessGroup(
                    name=f"nccl:{comm & 0xFFFFFFFFFFFFFFFF:016x}",
                    desc="NCCL communicator",
                    ranks=ranks,
                    backend="nccl",
                )
            )
        return self.index[comm]


def resolve_peers(
    ctx: ExportCtx,
    pid: int,
    dec: RankDecision,
    comm: I64,
    local_peer: I64,
    peer: I32,
    group: I32,
    group_of: GroupOf,
    pending: list[Pending],
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
        mapped = lookup(ctx.comm_members.get(c, {}), lp)
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


@dataclass
class _Named:
    """Peers and directions from PyTorch's ``nccl:send a->b`` / ``nccl:recv a<-b`` ranges."""

    how: I8  # per row: PEER_* code of where its peer came from
    named: NamedP2P
    fill_dir: npt.NDArray[np.bool_]  # rows whose direction came from those ranges
    by_name: I64  # rows whose peer comes from those ranges (group ranks, mapped run-wide)


def _torch_named(ctx: ExportCtx, pid: int, r: _Rows) -> _Named:
    """Peers the NCCL payloads did not give, from PyTorch's "nccl:send a->b" ranges (group ranks,
    mapped to global ranks by resolve_nccl_peers once every rank is known); their direction is
    kept wherever NCCL's own ranges left it unknown."""
    how = np.zeros(r.n, dtype=np.int8)
    how[(r.kind == Kind.P2P) & (r.local_peer >= 0)] = PEER_METADATA
    hr = ctx.nvtx.ranges
    tp = np.flatnonzero((hr.pid == pid) & hr.torch_p2p)
    named = project_torch_p2p(
        hr.start[tp],
        hr.tid[tp],
        hr.direction[tp],
        hr.group_rank[tp],
        hr.group_peer[tp],
        r.kind,
        r.launch_raw,
        r.ltid,
    )
    p2p = r.kind == Kind.P2P
    fill_dir = p2p & (r.direction == Direction.NONE) & (named.direction != Direction.NONE)
    r.direction[fill_dir] = named.direction[fill_dir]
    by_name = np.flatnonzero(p2p & (r.local_peer < 0) & (named.group_peer >= 0))
    how[by_name] = PEER_NVTX_NAME
    return _Named(how=how, named=named, fill_dir=fill_dir, by_name=by_name)


def _unmatched_warning(ctx: ExportCtx, n_miss: int, n_sendrecv: int, n_a2a: int, n_named: int) -> str:
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


def _comm_warnings(ctx: ExportCtx, r: _Rows, nccl: _NcclOutcome, nm: _Named) -> list[str]:
    """What the NCCL projection and the PyTorch p2p ranges could not decide, said once per rank."""
    out: list[str] = []
    p2p_all = r.kind == Kind.P2P
    if nccl.unmatched is not None:
        miss, n_sr, n_a2a = nccl.unmatched
        n_named = int((nm.named.direction[miss] != Direction.NONE).sum())
        out.append(_unmatched_warning(ctx, len(miss), n_sr, n_a2a, n_named))
    if nccl.no_payloads:
        if len(nm.by_name) and (nm.how[p2p_all] > 0).all():
            out.append(
                "NCCL NVTX payloads (peer, bytes) are not in this export; p2p peers taken from "
                "PyTorch's 'nccl:send a->b' / 'nccl:recv a<-b' ranges, bytes unknown"
            )
        else:
            out.append(
                "NCCL NVTX payloads (peer, bytes) are not in this export; "
                f"p2p peers unknown for {int((nm.how[p2p_all] == 0).sum())} of {int(p2p_all.sum())} p2p "
                "kernel(s) (export with 'nsys export --include-blobs=true')"
            )
    if int(nm.fill_dir.sum()):
        out.append(
            f"direction of {int(nm.fill_dir.sum())} p2p kernel(s) taken from PyTorch 'nccl:send' / "
            "'nccl:recv' ranges"
        )
    return out


def _phases(ctx: ExportCtx, pid: int, r: _Rows) -> I8:
    phase = np.full(r.n, Phase.UNKNOWN, dtype=np.int8)
    # PyTorch's autograd engine launches the backward from its own device threads (pt_autograd_N),
    # as the Kineto trace shows it inside autograd::engine ops.
    bwd_tids = ctx.autograd_tids.get(pid)
    if bwd_tids:
        phase[np.isin(r.ltid, np.fromiter(bwd_tids, dtype=np.int64)) & (r.launch_raw >= 0)] = Phase.BWD
    # Work launched inside an optimizer range of the same thread is the optimizer step.
    hr = ctx.nvtx.ranges
    opt = (hr.pid == pid) & (hr.phase == Phase.OPTIM)
    if opt.any():
        spans = Spans(hr.start[opt], hr.end[opt], hr.pid[opt], hr.tid[opt])
        phase[inside_spans(spans, pid, r.launch_raw, r.ltid)] = Phase.OPTIM
    return phase


def _streams(gpu: GpuOps, pid: int, r: _Rows, warnings: list[str]) -> tuple[I64, I64, I64]:
    """(stream per row, devices used, rows per device)."""
    devs = gpu.device[r.sel]
    stream = gpu.stream[r.sel]
    # Sync rows carry no meaningful device (device-wide waits report device 0).
    dev_counts = np.bincount(devs[r.kind != Kind.SYNC], minlength=1)
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
    return stream, udev, dev_counts


def _intervals(ctx: ExportCtx, r: _Rows, names: NameTable, phase: I8, stream: I64) -> Intervals:
    gpu, off = ctx.gpu, ctx.clock.offset
    inv, uniq = factorize(gpu.name[r.sel])
    name_ids = np.array([names.id(gpu.names[int(u)]) for u in uniq], dtype=np.int32)[inv]
    return Intervals.from_columns(
        r.n,
        {
            "start": gpu.start[r.sel] + off,
            "end": gpu.end[r.sel] + off,
            "stream": stream,
            "kind": r.kind,
            "name": name_ids,
            "phase": phase,
            "peer": r.peer,
            "direction": r.direction,
            "bytes": r.nbytes,
            "launch": np.where(r.launch_raw >= 0, r.launch_raw + off, -1),
            "group": r.group,
        },
    )


def _name_pending(ctx: ExportCtx, pid: int, nm: _Named) -> dict[str, dict[str, I64]]:
    """Rows (intervals, ranges) whose peer is a process-group rank, for resolve_nccl_peers."""
    out: dict[str, dict[str, I64]] = {}
    if len(nm.by_name):
        out["interval"] = {
            "index": nm.by_name,
            "me": nm.named.group_rank[nm.by_name],
            "peer": nm.named.group_peer[nm.by_name],
        }
    # PyTorch p2p ranges of this process sit first in the range table, in the order of ``hr``.
    hr = ctx.nvtx.ranges
    rsel = np.flatnonzero(hr.pid == pid)
    rnamed = np.flatnonzero(hr.torch_p2p[rsel] & (hr.group_peer[rsel] >= 0))
    if len(rnamed):
        out["range"] = {
            "index": rnamed,
            "me": hr.group_rank[rsel][rnamed],
            "peer": hr.group_peer[rsel][rnamed],
        }
    return out


def _user_ranges(ctx: ExportCtx, pid: int, names: NameTable) -> Ranges | None:
    """The process's NVTX user ranges (steps, labels, PyTorch p2p titles first, in file order)."""
    hr = ctx.nvtx.ranges
    sel = np.flatnonzero(hr.pid == pid)
    if not len(sel):
        return None
    uniq, inv = np.unique(hr.name[sel], return_inverse=True)
    nid = np.array([names.id(hr.names[int(u)]) for u in uniq], dtype=np.int32)[inv]
    kind = hr.kind[sel]
    num = hr.num[sel].copy()
    unnumbered = (kind == RangeKind.STEP) & ~hr.numbered[sel]
    if unnumbered.any():
        # Step ranges without a number ("train_step"): number them in time order.
        u = np.flatnonzero(unnumbered)
        num[u[np.argsort(hr.start[sel][u], kind="stable")]] = np.arange(len(u))
    off = ctx.clock.offset
    return Ranges.from_columns(
        len(sel),
        {
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
        },
    )


def _call_ranges(
    ctx: ExportCtx,
    pid: int,
    dec: RankDecision,
    names: NameTable,
    group_of: GroupOf,
    pending: list[Pending],
    base: int,
) -> Ranges | None:
    """The process's NCCL p2p and collective API calls as COMM_OP ranges (after ``base`` rows)."""
    calls = ctx.nvtx.nccl
    if not len(calls):
        return None
    csel = np.flatnonzero((calls.pid == pid) & ((calls.api == API_P2P) | (calls.api == API_COLL)))
    if not len(csel):
        return None
    m = len(csel)
    peer = np.full(m, -1, dtype=np.int32)
    group = np.full(m, -1, dtype=np.int32)
    sub_pending: list[Pending] = []
    local_peer = np.where(calls.api[csel] == API_P2P, calls.peer_local[csel], -1)
    resolve_peers(ctx, pid, dec, calls.comm[csel].copy(), local_peer, peer, group, group_of, sub_pending, [])
    pending.extend((i + base, c, lp) for i, c, lp in sub_pending)
    off = ctx.clock.offset
    name = (
        np.array([names.id(x) for x in calls.names], dtype=np.int32)[calls.name[csel]]
        if calls.names
        else np.zeros(m, np.int32)
    )
    return Ranges.from_columns(
        m,
        {
            "start": calls.start[csel] + off,
            "end": calls.end[csel] + off,
            "kind": np.full(m, RangeKind.COMM_OP, np.int8),
            "name": name,
            "tid": calls.tid[csel],
            "direction": calls.direction[csel],
            "peer": peer,
            "bytes": calls.bytes[csel],
            "group": group,
        },
    )


def _ranges(
    ctx: ExportCtx,
    pid: int,
    dec: RankDecision,
    names: NameTable,
    group_of: GroupOf,
    pending: list[Pending],
) -> Ranges:
    user = _user_ranges(ctx, pid, names)
    base = len(user) if user is not None else 0
    calls = _call_ranges(ctx, pid, dec, names, group_of, pending, base)
    parts = [p for p in (user, calls) if p is not None]
    if not parts:
        return Ranges.empty()
    return Ranges(**{c: np.concatenate([getattr(p, c) for p in parts]) for c in Ranges.COLUMNS})


def _pack_pending(parts: list[Pending], base: int = 0) -> dict[str, I64]:
    if not parts:
        return {}
    return {
        "index": np.concatenate([p[0] for p in parts]) + base,
        "comm": np.concatenate([p[1] for p in parts]),
        "local": np.concatenate([p[2] for p in parts]),
    }


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


def _meta(
    ctx: ExportCtx,
    pid: int,
    proc_name: str,
    udev: I64,
    pending: dict[str, list[Pending]],
    name_pending: dict[str, dict[str, I64]],
    iv: Intervals,
    how: I8,
) -> dict[str, Any]:
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
    overhead = _profiler_overhead(ctx.db, pid, ctx.clock.offset)
    if len(overhead):
        meta["profiler_overhead_ns"] = overhead
    meta.update(rank_memory(ctx.memory, pid, ctx.clock.offset))
    return meta


def build_rank(ctx: ExportCtx, pid: int, proc_name: str) -> RankTimeline:
    """The timeline of process ``pid`` of the export."""
    dec = ctx.decisions[pid]
    warnings: list[str] = [dec.warning] if dec.warning else []
    r = _rows(ctx.gpu, pid)
    nccl = _project(ctx, pid, r)
    names = NameTable()
    groups = _Groups(ctx, pid)
    pending: dict[str, list[Pending]] = {"interval": [], "range": []}
    resolve_peers(ctx, pid, dec, r.comm, r.local_peer, r.peer, r.group, groups, pending["interval"], warnings)
    nm = _torch_named(ctx, pid, r)
    warnings.extend(_comm_warnings(ctx, r, nccl, nm))
    phase = _phases(ctx, pid, r)
    stream, udev, dev_counts = _streams(ctx.gpu, pid, r, warnings)
    iv = _intervals(ctx, r, names, phase, stream)
    rg = _ranges(ctx, pid, dec, names, groups, pending["range"])
    meta = _meta(ctx, pid, proc_name, udev, pending, _name_pending(ctx, pid, nm), iv, nm.how)
    main_dev = int(udev[np.argmax(dev_counts)]) if len(udev) else 0
    return RankTimeline(
        rank=dec.rank,
        source=ctx.source,
        format="nsys",
        names=names.names,
        intervals=iv,
        ranges=rg,
        world_size=dec.world_size,
        backend=nccl.backend,
        device=f"cuda:{main_dev}",
        cpu_only=False,
        process_groups=groups.groups,
        rank_source=dec.source,
        events_total=r.n + len(rg),
        events_lost=0,
        warnings=warnings,
        meta=meta,
    )
