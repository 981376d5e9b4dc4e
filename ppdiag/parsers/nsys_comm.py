"""Communication semantics of GPU kernels from the NCCL API calls that launched them.

A NCCL kernel belongs to the NCCL API range that contains its launch call on the same thread
(what NVIDIA's ``nvtx_gpu_proj_trace`` does). Grouped calls (``ncclGroupStart``; ``ncclSend``,
``ncclRecv``…; ``ncclGroupEnd``) launch one fused kernel inside the outermost ``ncclGroupEnd``, so
that kernel carries every operation of the group: p2p with direction ``BOTH`` when it both sends
and receives, collective when the group holds a collective or talks to more than two peers (an
all-to-all built from send/recv).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Direction, Kind
from ppdiag.parsers.nsys_nvtx import (
    API_COLL,
    API_GROUP_END,
    API_GROUP_START,
    API_P2P,
    NcclCalls,
    Spans,
)

I64 = npt.NDArray[np.int64]


@dataclass
class Projection:
    """Per comm kernel: what its launching NCCL call(s) say; ``matched`` False where none did."""

    matched: npt.NDArray[np.bool_]
    kind: npt.NDArray[np.int8]
    direction: npt.NDArray[np.int8]
    peer_local: I64  # communicator-local peer rank, -1 unknown or several peers
    bytes: I64
    comm: I64  # communicator hash (as int64), 0 unknown or several


def project_nccl(calls: NcclCalls, sel: npt.NDArray[np.bool_], launch: I64, ltid: I64) -> Projection:
    """Match kernels (their launch time and thread) to the NCCL calls ``calls[sel]`` of one process."""
    n = len(launch)
    out = Projection(
        matched=np.zeros(n, dtype=bool),
        kind=np.full(n, Kind.P2P, np.int8),
        direction=np.full(n, Direction.NONE, np.int8),
        peer_local=np.full(n, -1, np.int64),
        bytes=np.full(n, -1, np.int64),
        comm=np.zeros(n, np.int64),
    )
    idx = np.flatnonzero(sel)
    if not len(idx) or not n:
        return out
    tids = calls.tid[idx]
    for t in np.unique(tids).tolist():
        k_sel = np.flatnonzero((ltid == t) & (launch >= 0))
        if not len(k_sel):
            continue
        c = idx[tids == t]
        c = c[np.argsort(calls.start[c], kind="stable")]
        _project_thread(calls, c, launch, k_sel, out)
    return out


@dataclass
class _Grouping:
    """The ops of one thread's NCCL calls (``c``, in time order) and the group each belongs to."""

    in_group: npt.NDArray[np.bool_]  # an op called between ncclGroupStart and ncclGroupEnd
    outer_end: npt.NDArray[np.bool_]  # an outermost ncclGroupEnd (where the fused launch happens)
    gid: I64  # outermost group number of each call
    key: I64  # aggregation key per call: its group, or itself (negative) outside a group
    is_op: npt.NDArray[np.bool_]


def _grouping(api: npt.NDArray[np.int8]) -> _Grouping:
    is_gs = api == API_GROUP_START
    is_ge = api == API_GROUP_END
    delta = is_gs.astype(np.int64) - is_ge.astype(np.int64)
    depth_after = np.cumsum(delta)
    if (depth_after < 0).any():
        # The capture began inside a group: replay with the depth floored at zero.
        d = 0
        depth_after = np.empty(len(api), dtype=np.int64)
        for i, x in enumerate(delta.tolist()):
            d = max(d + x, 0)
            depth_after[i] = d
    depth_before = depth_after - delta
    gid = np.cumsum(is_gs & (depth_before == 0))
    is_op = (api == API_P2P) | (api == API_COLL)
    in_group = is_op & (depth_before > 0)
    key = np.where(in_group, gid, -(np.arange(len(api)) + 1))
    return _Grouping(in_group, is_ge & (depth_after == 0), gid, key, is_op)


@dataclass
class _Aggregate:
    """What each group of ops (or lone op) says as one kernel, indexed like ``ukeys``."""

    ukeys: I64
    kind: npt.NDArray[np.int8]
    direction: npt.NDArray[np.int8]
    peer: I64  # the one local peer, -1 when several or unknown
    bytes: I64
    comm: I64  # the one communicator, 0 when several


def _pairs(k: I64, p: I64) -> I64:
    """The distinct (k, p) pairs of non-negative ``k`` and ``p``, as the two rows of an array in
    (k, p) order: ``np.unique(np.stack([k, p]), axis=1)``, which sorts the pairs as raw bytes and
    cost ~0.05 s on a rank's 131 k NCCL calls. Here one int64 code per pair, deduplicated by a
    stable sort (the calls come nearly in key order, which timsort merges in linear time)."""
    if not k.size:
        return np.empty((2, 0), dtype=np.int64)
    span = int(p.max()) + 1
    if int(k.max()) >= (1 << 62) // span:  # the codes would not fit int64
        return np.unique(np.stack([k, p]), axis=1)
    code = np.sort(k.astype(np.int64) * span + p, kind="stable")
    code = code[np.r_[True, code[1:] != code[:-1]]]
    return np.stack([code // span, code % span])


def _aggregate(calls: NcclCalls, oc: I64, keys: I64) -> _Aggregate:
    """Per group: a collective when it holds one or talks to more than two peers, else p2p with
    the directions of its ops; bytes summed; the peer and communicator when there is only one."""
    ukeys, kinv = np.unique(keys, return_inverse=True)
    m = len(ukeys)
    op_dir = calls.direction[oc]
    n_send = np.bincount(kinv, weights=(op_dir == Direction.SEND), minlength=m)
    n_recv = np.bincount(kinv, weights=(op_dir == Direction.RECV), minlength=m)
    n_coll = np.bincount(kinv, weights=(calls.api[oc] == API_COLL), minlength=m)
    b = calls.bytes[oc]
    bsum = np.bincount(kinv, weights=np.where(b >= 0, b, 0).astype(np.float64), minlength=m)
    bknown = np.bincount(kinv, weights=(b >= 0), minlength=m)
    peer = calls.peer_local[oc]
    p_known = peer >= 0
    pairs = _pairs(kinv[p_known], peer[p_known])
    n_peers = np.bincount(pairs[0], minlength=m) if pairs.shape[1] else np.zeros(m, dtype=np.int64)
    p_unknown = np.bincount(kinv, weights=~p_known, minlength=m)
    peer_one = np.full(m, -1, dtype=np.int64)
    if pairs.shape[1]:
        single = (n_peers == 1) & (p_unknown == 0)
        first = np.full(m, -1, dtype=np.int64)
        first[pairs[0][::-1]] = pairs[1][::-1]
        peer_one = np.where(single, first, -1)
    comm = calls.comm[oc]
    cmin = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
    cmax = np.full(m, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(cmin, kinv, comm)
    np.maximum.at(cmax, kinv, comm)
    g_kind = np.where((n_coll > 0) | (n_peers > 2), Kind.COLLECTIVE, Kind.P2P).astype(np.int8)
    g_dir = np.select(
        [(n_send > 0) & (n_recv > 0), n_send > 0, n_recv > 0],
        [Direction.BOTH, Direction.SEND, Direction.RECV],
        Direction.NONE,
    ).astype(np.int8)
    g_dir[g_kind == Kind.COLLECTIVE] = Direction.NONE
    g_bytes = np.where(bknown > 0, bsum, -1).astype(np.int64)
    return _Aggregate(ukeys, g_kind, g_dir, peer_one, g_bytes, np.where(cmin == cmax, cmin, 0))


def _project_thread(calls: NcclCalls, c: I64, launch: I64, k_sel: I64, out: Projection) -> None:
    g = _grouping(calls.api[c])
    ops = np.flatnonzero(g.is_op)
    if not len(ops):
        return
    agg = _aggregate(calls, c[ops], g.key[ops])
    ukeys, m = agg.ukeys, len(agg.ukeys)
    # Containers: ops outside groups (the launch happens inside the op's own range) and outermost
    # group ends (the fused launch happens there).
    cont = np.flatnonzero((g.is_op & ~g.in_group) | g.outer_end)
    if not len(cont):
        return
    cont_key = np.where(g.outer_end[cont], g.gid[cont], g.key[cont])
    pos = np.searchsorted(ukeys, cont_key)
    pos_ok = (pos < m) & (ukeys[np.minimum(pos, m - 1)] == cont_key)
    cstart = calls.start[c[cont]]
    cend = calls.end[c[cont]]
    x = launch[k_sel]
    j = np.searchsorted(cstart, x, side="right") - 1
    hit = j >= 0
    jj = np.where(hit, j, 0)
    hit &= cend[jj] >= x
    hit &= pos_ok[jj]
    rows = k_sel[hit]
    gi = pos[jj[hit]]
    out.matched[rows] = True
    out.kind[rows] = agg.kind[gi]
    out.direction[rows] = agg.direction[gi]
    out.peer_local[rows] = np.where(agg.kind[gi] == Kind.P2P, agg.peer[gi], -1)
    out.bytes[rows] = agg.bytes[gi]
    out.comm[rows] = agg.comm[gi]


def inside_spans(spans: Spans, pid: int, launch: I64, ltid: I64) -> npt.NDArray[np.bool_]:
    """Whether each launch lies inside one of ``spans`` of process ``pid`` on the same thread."""
    out = np.zeros(len(launch), dtype=bool)
    sel = spans.pid == pid
    if not sel.any() or not len(launch):
        return out
    for t in np.unique(spans.tid[sel]).tolist():
        s = sel & (spans.tid == t)
        st, en = _merge(spans.start[s], spans.end[s])
        k = np.flatnonzero((ltid == t) & (launch >= 0))
        if not len(k):
            continue
        j = np.searchsorted(st, launch[k], side="right") - 1
        ok = j >= 0
        ok &= en[np.maximum(j, 0)] >= launch[k]
        out[k[ok]] = True
    return out


def _merge(start: I64, end: I64) -> tuple[I64, I64]:
    """Union of intervals as sorted, disjoint (start, end) arrays."""
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    grp = np.cumsum(new) - 1
    ends = np.full(int(grp[-1]) + 1 if len(grp) else 0, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ends, grp, e)
    return s[new], ends


@dataclass
class NamedP2P:
    """Per GPU row: what PyTorch's ``nccl:send a->b`` / ``nccl:recv a<-b`` ranges say of it."""

    direction: npt.NDArray[np.int8]  # NONE where no such range belongs to the kernel
    group_rank: I64  # this process's rank in the op's group (-1 unknown or ambiguous)
    group_peer: I64  # the peer's rank in that group (-1 unknown, or several peers)


def project_torch_p2p(
    start: I64,
    tid: I64,
    direction: npt.NDArray[np.int8],
    group_rank: I64,
    group_peer: I64,
    kind: npt.NDArray[np.int8],
    launch: I64,
    ltid: I64,
) -> NamedP2P:
    """Attach PyTorch p2p ranges (``start``/``tid``/... of one process) to the NCCL kernels they issued.

    ProcessGroupNCCL opens the range before it calls NCCL on the same thread, so a range belongs to
    the first NCCL kernel that thread launches at or after the range's start: the kernel launched
    inside it, or, for coalesced sends and receives (``batch_isend_irecv``), the one fused kernel
    launched when the group closes after all of them. A range whose first following NCCL launch
    is a collective is ignored. Several ranges on one p2p kernel give ``BOTH`` when they send and
    receive, and a peer only when they all name the same one.
    """
    n = len(kind)
    out = NamedP2P(np.full(n, Direction.NONE, np.int8), np.full(n, -1, np.int64), np.full(n, -1, np.int64))
    if not len(start) or not n:
        return out
    comm = np.flatnonzero(((kind == Kind.P2P) | (kind == Kind.COLLECTIVE)) & (launch >= 0))
    owner_rows: list[I64] = []
    owner_kern: list[I64] = []
    for t in np.unique(tid).tolist():
        r = np.flatnonzero(tid == t)
        k = comm[ltid[comm] == t]
        if not len(k):
            continue
        k = k[np.argsort(launch[k], kind="stable")]
        j = np.searchsorted(launch[k], start[r], side="left")
        ok = j < len(k)
        owner_rows.append(r[ok])
        owner_kern.append(k[j[ok]])
    if not owner_rows:
        return out
    rows = np.concatenate(owner_rows)
    kern = np.concatenate(owner_kern)
    p2p = kind[kern] == Kind.P2P
    rows, kern = rows[p2p], kern[p2p]
    if not len(rows):
        return out
    d = direction[rows]
    sends = np.zeros(n, dtype=bool)
    recvs = np.zeros(n, dtype=bool)
    sends[kern[d == Direction.SEND]] = True
    recvs[kern[d == Direction.RECV]] = True
    out.direction[:] = np.select(
        [sends & recvs, sends, recvs], [Direction.BOTH, Direction.SEND, Direction.RECV], Direction.NONE
    ).astype(np.int8)
    # One (own rank, peer) pair per kernel, else unknown: several peers on one fused kernel are not
    # a single p2p transfer.
    pairs = np.unique(np.stack([kern, group_rank[rows], group_peer[rows]]), axis=1)
    per_kernel = np.bincount(pairs[0], minlength=n)
    single = pairs[:, per_kernel[pairs[0]] == 1]
    good = (single[1] >= 0) & (single[2] >= 0)
    out.group_rank[single[0][good]] = single[1][good]
    out.group_peer[single[0][good]] = single[2][good]
    return out
