"""GPU mode of the Kineto parser: one interval per GPU op, launched from a runtime call; NCCL-style
kernels classified point-to-point or collective by what launched them."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.model import (
    Direction,
    Intervals,
    Kind,
    NameTable,
    Phase,
)
from ppdiag.parsers.kineto_comm import _args_comm, _CommInfo, _Ctx
from ppdiag.parsers.kineto_host import _Host
from ppdiag.parsers.kineto_names import (
    _RE_KERNEL_COLL,
    _RE_KERNEL_SENDRECV,
    C_COALESCED,
    C_COLL,
    C_NONE,
    C_P2P,
    N_COMM,
    N_OPTIM,
    N_PP_COMM,
    interned_ids,
)
from ppdiag.parsers.kineto_schema import (
    _GPU_KIND,
    _STRICT,
    I64A,
    K_KERNEL,
    K_RUNTIME,
    K_SYNC,
    _as_int,
    _decode_args,
    us_to_ns,
)
from ppdiag.parsers.kineto_table import Events, _is_comm_kernel_name

_EMPTY_ARGS = _STRICT.args()  # the args of an event without any (never written)


def _devices(dev: I64A, stream: I64A, devprops: list[Any], ctx: _Ctx) -> tuple[I64A, I64A, str | None]:
    """(devices, stream keys, device name): streams of different devices are kept apart when one
    process drove several GPUs; the name is that of the device with the most events."""
    devices = np.unique(dev[dev >= 0])
    if len(devices) > 1:
        stream = dev * (1 << 32) + stream
        ctx.warnings.append(
            f"GPU events on {len(devices)} devices {devices.tolist()}; streams are keyed by (device, stream)"
        )
    main_dev = int(np.bincount(dev[dev >= 0]).argmax()) if (dev >= 0).any() else -1
    device_name = None
    for p in devprops:
        if isinstance(p, dict) and _as_int(p.get("id")) == main_dev and p.get("name"):
            device_name = str(p["name"])
    if device_name is None and devprops and isinstance(devprops[0], dict) and devprops[0].get("name"):
        device_name = str(devprops[0]["name"])
    return devices, stream, device_name


def _launches(ev: Events, codes: npt.NDArray[np.int8], corr: I64A, base: int) -> tuple[I64A, I64A]:
    """(launch time, launch thread) of each GPU op: the runtime call with the same correlation id
    (a vectorized join), -1 where there is none."""
    n = len(corr)
    rt = np.flatnonzero(codes == K_RUNTIME)
    launch = np.full(n, -1, dtype=np.int64)
    launch_tid = np.full(n, -1, dtype=np.int64)
    if len(rt):
        rt_corr = ev.corr[rt]
        rt_ts = us_to_ns(ev.ts[rt], base)
        rt_tid = ev.tid[rt]
        order = np.argsort(rt_corr, kind="stable")
        sc = rt_corr[order]
        pos = np.minimum(np.searchsorted(sc, corr), len(sc) - 1)
        ok = (corr >= 0) & (sc[pos] == corr)
        launch[ok] = rt_ts[order[pos[ok]]]
        launch_tid[ok] = rt_tid[order[pos[ok]]]
    return launch, launch_tid


def _comm_kernels(
    ev: Events, gpu_idx: npt.NDArray[np.intp], gcodes: npt.NDArray[np.int8]
) -> npt.NDArray[np.intp]:
    """Positions (among the GPU ops) of the communication kernels, told by their names (one
    test per distinct name, see :func:`_is_comm_kernel_name`)."""
    ccl = np.fromiter(map(_is_comm_kernel_name, ev.names), dtype=bool, count=len(ev.names))
    return np.flatnonzero((gcodes == K_KERNEL) & ccl[ev.name[gpu_idx]])


def _comm_columns(
    comm_idx: npt.NDArray[np.intp],
    cargs: list[Any],  # the args of each comm kernel, aligned with comm_idx
    gname: list[str],
    launch: I64A,
    launch_tid: I64A,
    host: _Host,
    ctx: _Ctx,
    kind: npt.NDArray[np.int8],
    nbytes: I64A,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int8], I64A, npt.NDArray[np.int32]]:
    """(peer, direction, seq, group) of every GPU op from its comm kernel's classification; the
    kind and byte columns of comm kernels are filled in place. Unclassified kernels are warned."""
    n = len(gname)
    peer = np.full(n, -1, dtype=np.int32)
    direction = np.zeros(n, dtype=np.int8)
    seq = np.full(n, -1, dtype=np.int64)
    group = np.full(n, -1, dtype=np.int32)
    if not len(comm_idx):
        return peer, direction, seq, group
    infos, unclassified = _classify_comm_kernels(comm_idx, cargs, gname, launch, launch_tid, host, ctx)
    for j, info in zip(comm_idx.tolist(), infos, strict=True):
        kind[j] = Kind.P2P if info.comm == C_P2P else Kind.COLLECTIVE
        peer[j] = info.peer
        direction[j] = info.direction
        seq[j] = info.seq
        group[j] = info.group
        if info.nbytes >= 0:
            nbytes[j] = info.nbytes
    if unclassified:
        ctx.warnings.append(
            f"{unclassified} communication kernel(s) had no launcher evidence (no comm args, no "
            "record_param_comms, no enclosing comm op): classified from the kernel name and the "
            "rank's other comm ops"
        )
    ctx.comm_unclassified = unclassified
    return peer, direction, seq, group


def _gpu_mode(
    ev: Events,
    gpu_idx: npt.NDArray[np.intp],
    codes: npt.NDArray[np.int8],
    host: _Host,
    base: int,
    ctx: _Ctx,
    names: NameTable,
    devprops: list[Any],
) -> tuple[Intervals, str | None, dict[str, Any]]:
    """The intervals of a trace with GPU events: one per GPU op, with its launch, phase and comm
    facts; plus the device name and the counts the metadata reports."""
    n = len(gpu_idx)
    gcodes = codes[gpu_idx]
    start = us_to_ns(ev.ts[gpu_idx], base)
    dur = np.maximum(us_to_ns(ev.dur[gpu_idx], 0), 0)
    stream = ev.stream[gpu_idx]
    stream = np.where(stream >= 0, stream, ev.tid[gpu_idx])
    dev = ev.pid[gpu_idx]
    dev = np.where(dev >= 0, dev, ev.device[gpu_idx])
    corr = ev.corr[gpu_idx]
    g_nid = ev.name[gpu_idx]
    gname = list(map(ev.names.__getitem__, g_nid.tolist()))
    name_id = interned_ids(names, ev.names, g_nid)
    nbytes = ev.nbytes[gpu_idx]
    devices, stream, device_name = _devices(dev, stream, devprops, ctx)

    lut = np.zeros(K_SYNC + 1, dtype=np.int8)
    for code, k in _GPU_KIND.items():
        lut[code] = k
    kind = lut[gcodes]
    launch, launch_tid = _launches(ev, codes, corr, base)

    comm_idx = _comm_kernels(ev, gpu_idx, gcodes)
    empty = msgspec.Raw()
    cargs = [
        a if a is not None else _EMPTY_ARGS
        for a in _decode_args([ev.args.get(r, empty) for r in gpu_idx[comm_idx].tolist()])
    ]
    peer, direction, seq, group = _comm_columns(
        comm_idx, cargs, gname, launch, launch_tid, host, ctx, kind, nbytes
    )
    cols: dict[str, Any] = {
        "start": start,
        "end": start + dur,
        "stream": stream,
        "kind": kind,
        "name": name_id,
        "bytes": nbytes,
        "launch": launch,
        "peer": peer,
        "direction": direction,
        "seq": seq,
        "group": group,
        "phase": _launch_phases(launch, launch_tid, host),
    }
    extra = {
        "gpu_devices": devices.tolist(),
        "gpu_events": n,
        "kernels": int((gcodes == K_KERNEL).sum()),
        "launch_matched": int((launch >= 0).sum()),
        "comm_kernels": len(comm_idx),
        "comm_unclassified": ctx.comm_unclassified,
    }
    return Intervals.from_columns(n, cols), device_name, extra


def _launch_phases(launch: I64A, launch_tid: I64A, host: _Host) -> npt.NDArray[np.int8]:
    """Phase of GPU work from what launched it: BWD inside an autograd backward op, OPTIM inside an
    ``Optimizer.*`` range of the same thread (the optimizer wins: it can run autograd ops too)."""
    phase = np.zeros(len(launch), dtype=np.int8)
    if host.bwd is not None:
        _mark_inside(phase, launch, launch_tid, *host.bwd, Phase.BWD)
    opt = [i for i, inf in enumerate(host.info) if inf.cls == N_OPTIM]
    if not opt:
        return phase
    o_start = np.array([host.start[i] for i in opt], dtype=np.int64)
    o_end = np.array([host.end[i] for i in opt], dtype=np.int64)
    o_tid = np.array([host.tid[i] for i in opt], dtype=np.int64)
    _mark_inside(phase, launch, launch_tid, o_start, o_end, o_tid, Phase.OPTIM)
    return phase


def _mark_inside(
    phase: npt.NDArray[np.int8],
    launch: I64A,
    launch_tid: I64A,
    o_start: I64A,
    o_end: I64A,
    o_tid: I64A,
    value: int,
) -> None:
    """Set ``phase`` to ``value`` for launches inside one of the ranges on the same thread."""
    for t in np.unique(o_tid):
        m = o_tid == t
        s, e = o_start[m], o_end[m]
        order = np.argsort(s)
        s, e = s[order], np.maximum.accumulate(e[order])
        q = (launch_tid == t) & (launch >= 0)
        qi = np.flatnonzero(q)
        k = np.searchsorted(s, launch[qi], side="right") - 1
        inside = (k >= 0) & (e[np.maximum(k, 0)] >= launch[qi])
        phase[qi[inside]] = value


def _parents(starts: I64A, ends: I64A) -> npt.NDArray[np.int64]:
    """Parent index of each range (sorted by start, longer first) in its nesting, -1 for roots."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    s_list, e_list = starts.tolist(), ends.tolist()
    for i in range(len(s_list)):
        while stack and e_list[stack[-1]] < s_list[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def _classify_comm_kernels(
    comm_idx: npt.NDArray[np.intp],
    cargs: list[Any],  # the args of each comm kernel, aligned with comm_idx
    gname: list[str],
    launch: I64A,
    launch_tid: I64A,
    host: _Host,
    ctx: _Ctx,
) -> tuple[list[_CommInfo], int]:
    """Classify NCCL-style kernels P2P / collective by what launched them."""
    infos, pending = _infos_from_args(cargs, host, ctx)
    if pending:
        _enclosing_comm(comm_idx, pending, infos, launch, launch_tid, host, ctx)

    # coalesced groups: the point-to-point ops issued since the previous comm launch on that thread.
    # A p2p kernel that its enclosing ops leave without a peer (a schedule's ``PP:0SEND_F0`` label
    # around ``nccl:coalesced``) takes the facts of that window as well.
    coalesced = [
        pos_
        for pos_, info in enumerate(infos)
        if info.comm == C_COALESCED or (info.comm == C_P2P and info.peer < 0 and info.peer_grp < 0)
    ]
    if coalesced:
        _resolve_coalesced(
            [infos[k] for k in coalesced], comm_idx[coalesced], comm_idx, launch, launch_tid, host
        )
    rank_has_a2a = any(c.alltoall for c in host.comm)
    return infos, _classify_by_name(infos, comm_idx, gname, rank_has_a2a, ctx)


def _infos_from_args(cargs: list[Any], host: _Host, ctx: _Ctx) -> tuple[list[_CommInfo], list[int]]:
    """Each comm kernel's facts from its own args, else from the ``record_param_comms`` op with its
    External id; the positions still unresolved (no facts, or a coalesced group) beside them."""
    # record_param_comms ops that carry comm metadata, by External id
    rpc_ext = {
        x: c
        for nm, c, x in zip(host.name, host.comm, host.ext, strict=True)
        if nm == "record_param_comms" and c.comm != C_NONE and x >= 0
    }
    infos: list[_CommInfo] = []
    pending: list[int] = []  # positions in comm_idx still unresolved
    for pos_, a in enumerate(cargs):
        info = _args_comm(a, ctx) if (isinstance(a.coll, str) and a.coll) else _CommInfo()
        if info.comm == C_NONE:
            ext = _as_int(a.ext)
            if ext < 0:
                ext = _as_int(a.ext_lc)
            other = rpc_ext.get(ext) if ext >= 0 else None
            if other is not None and other.comm != C_NONE:
                info = _CommInfo(**other.__dict__)
        if info.comm == C_NONE or info.comm == C_COALESCED:
            pending.append(pos_)
        infos.append(info)
    return infos, pending


def _classify_by_name(
    infos: list[_CommInfo],
    comm_idx: npt.NDArray[np.intp],
    gname: list[str],
    rank_has_a2a: bool,
    ctx: _Ctx,
) -> int:
    """Kernels with no evidence at all: the kernel name and the rank's other comm ops with that name
    decide. Global peers are filled in for the classified ones. Returns how many had no evidence."""
    unclassified = 0
    by_name: dict[str, list[int]] = {}
    for pos_, info in enumerate(infos):
        if info.comm not in (C_NONE, C_COALESCED):
            base_name = gname[int(comm_idx[pos_])].split("(")[0]
            by_name.setdefault(base_name, []).append(info.comm)
    for pos_, info in enumerate(infos):
        if info.comm not in (C_NONE, C_COALESCED):
            if info.peer < 0 and info.peer_grp >= 0:
                info.peer = ctx.to_global(info.peer_grp, info.group, info.my_grp)
            continue
        unclassified += 1
        base_name = gname[int(comm_idx[pos_])].split("(")[0]
        if _RE_KERNEL_SENDRECV.search(base_name):
            info.comm = C_COLL if rank_has_a2a else C_P2P
        elif _RE_KERNEL_COLL.search(base_name):
            info.comm = C_COLL
        else:
            seen = by_name.get(base_name, [])
            info.comm = C_P2P if seen and seen.count(C_P2P) > len(seen) / 2 else C_COLL
    return unclassified


def _enclosing_comm(
    comm_idx: npt.NDArray[np.intp],
    pending: list[int],
    infos: list[_CommInfo],
    launch: I64A,
    launch_tid: I64A,
    host: _Host,
    ctx: _Ctx,
) -> None:
    """Fill ``infos[pending]`` from the innermost comm host ops enclosing each kernel's launch.

    Containment is vectorized per host thread: ops sorted by start with parent pointers; each
    launch finds the last op starting before it and climbs to the first ancestor that contains it,
    then facts are merged innermost-first along the ancestor chain.
    """
    ops = [i for i, inf in enumerate(host.info) if inf.cls in (N_COMM, N_PP_COMM)]
    if not ops:
        return
    o_start = np.array([host.start[i] for i in ops], dtype=np.int64)
    o_end = np.array([host.end[i] for i in ops], dtype=np.int64)
    o_tid = np.array([host.tid[i] for i in ops], dtype=np.int64)
    pend = np.array(pending, dtype=np.int64)
    k_launch = launch[comm_idx[pend]]
    k_tid = launch_tid[comm_idx[pend]]
    for t in np.unique(k_tid[k_launch >= 0]):
        sel_ops = np.flatnonzero(o_tid == t)
        if not len(sel_ops):
            continue
        order = sel_ops[np.lexsort((-o_end[sel_ops], o_start[sel_ops]))]
        s, e = o_start[order], o_end[order]
        parent = _parents(s, e)
        kq = np.flatnonzero((k_tid == t) & (k_launch >= 0))
        q = k_launch[kq]
        cur = np.searchsorted(s, q, side="right") - 1
        for _ in range(256):
            bad = (cur >= 0) & (e[np.maximum(cur, 0)] < q)
            if not bad.any():
                break
            cur[bad] = parent[cur[bad]]
        # merge facts innermost-first along the chain (chains are short: a few nested comm ops)
        for qi, c0 in zip(kq.tolist(), cur.tolist(), strict=True):
            info = infos[int(pend[qi])]
            c = c0
            depth = 0
            while c >= 0 and depth < 64:
                _merge(info, host.comm[ops[int(order[c])]])
                c = int(parent[c])
                depth += 1


def _merge(info: _CommInfo, other: _CommInfo) -> None:
    """Fill unknown fields of ``info`` from an enclosing op's facts."""
    if info.comm in (C_NONE, C_COALESCED) and other.comm != C_NONE:
        # a coalesced group of sends and receives inside a collective's op (an all-to-all that
        # NCCL runs as grouped send/recv) is that collective, never a pipeline link
        info.comm = other.comm
        info.alltoall = info.alltoall or other.alltoall
    if not info.direction and other.direction:
        info.direction = other.direction
    if info.peer < 0 and other.peer >= 0:
        info.peer = other.peer
    if info.peer_grp < 0 and other.peer_grp >= 0:
        info.peer_grp = other.peer_grp
        info.my_grp = other.my_grp
    if info.nbytes < 0 and other.nbytes >= 0:
        info.nbytes = other.nbytes
    if info.seq < 0 and other.seq >= 0:
        info.seq = other.seq
    if info.group < 0 and other.group >= 0:
        info.group = other.group


def _resolve_coalesced(
    infos: list[_CommInfo],
    rows: npt.NDArray[np.intp],
    comm_idx: npt.NDArray[np.intp],
    launch: I64A,
    launch_tid: I64A,
    host: _Host,
) -> None:
    """A coalesced launch carries the p2p ops its thread issued since its previous comm launch:
    P2P with their direction (BOTH when sends and receives) and peer (when they agree), else a
    collective. Windows are found with searchsorted on per-thread sorted arrays."""
    p2p = [i for i, inf in enumerate(host.info) if inf.cls == N_COMM and host.comm[i].comm == C_P2P]
    p_tid = np.array([host.tid[i] for i in p2p], dtype=np.int64)
    p_start = np.array([host.start[i] for i in p2p], dtype=np.int64)
    p_dir = np.array([host.comm[i].direction for i in p2p], dtype=np.int64)
    p_peer = np.array([host.comm[i].peer for i in p2p], dtype=np.int64)
    p_bytes = np.array([host.comm[i].nbytes for i in p2p], dtype=np.int64)
    p_group = np.array([host.comm[i].group for i in p2p], dtype=np.int64)
    order = np.lexsort((p_start, p_tid))
    p_tid, p_start, p_dir, p_peer = p_tid[order], p_start[order], p_dir[order], p_peer[order]
    p_bytes, p_group = p_bytes[order], p_group[order]
    c_l, c_t = launch[comm_idx], launch_tid[comm_idx]
    c_order = np.lexsort((c_l, c_t))
    c_l, c_t = c_l[c_order], c_t[c_order]
    for info, j in zip(infos, rows.tolist(), strict=True):
        t, q = int(launch_tid[j]), int(launch[j])
        labelled = info.comm == C_P2P  # known p2p, only its peer is missing: never downgraded
        if q < 0:
            info.comm = info.comm if labelled else C_NONE
            continue
        # previous comm launch on this thread
        lo_t, hi_t = np.searchsorted(c_t, t, "left"), np.searchsorted(c_t, t, "right")
        k = int(np.searchsorted(c_l[lo_t:hi_t], q, "left"))
        lo = int(c_l[lo_t + k - 1]) if k > 0 else -(1 << 62)
        a_t, b_t = np.searchsorted(p_tid, t, "left"), np.searchsorted(p_tid, t, "right")
        seg = slice(
            int(a_t + np.searchsorted(p_start[a_t:b_t], lo, "right")),
            int(a_t + np.searchsorted(p_start[a_t:b_t], q, "right")),
        )
        dirs = set(p_dir[seg].tolist()) - {int(Direction.NONE)}
        # a c10d::send / recv_ op and its record_param_comms child are one transfer: the op
        # without a peer adds nothing, the child names it
        peers = set(p_peer[seg].tolist()) - {-1}
        groups = set(p_group[seg].tolist()) - {-1}
        if seg.stop <= seg.start:
            info.comm = info.comm if labelled else C_COLL
            continue
        info.comm = C_P2P
        info.direction = int(Direction.BOTH) if len(dirs) > 1 else (dirs.pop() if dirs else info.direction)
        info.peer = peers.pop() if len(peers) == 1 else -1
        if info.group < 0:
            info.group = groups.pop() if len(groups) == 1 else -1
        if info.nbytes < 0:
            # the fused kernel moves each direction's payload at once: the largest is its size
            info.nbytes = int(p_bytes[seg].max())
