"""The host ranges a Kineto parse keeps (steps, labels, comm ops, annotations) and their comm
facts; built once per rank and read by the GPU and CPU modes."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.model import (
    NameTable,
    RangeKind,
    Ranges,
)
from ppdiag.parsers.kineto_comm import _CommInfo, _Ctx, _host_comm
from ppdiag.parsers.kineto_names import C_P2P, N_BWD_OP, N_COMM, N_MODULE, N_PP_COMM, NameInfo, _NameMemo
from ppdiag.parsers.kineto_schema import (
    I64A,
    K_ANNOT,
    K_CPUOP,
    K_PYFUNC,
    _as_int,
    _decode_args,
    us_to_ns,
)
from ppdiag.parsers.kineto_table import Events


@dataclass
class _Host:
    """Kept host ranges (steps, labels, comm ops, other annotations) as parallel lists."""

    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)
    info: list[NameInfo] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    comm: list[_CommInfo] = field(default_factory=list)
    is_cpu_op: list[bool] = field(default_factory=list)
    ext: list[int] = field(default_factory=list)  # External id of comm ops, -1 otherwise
    # autograd backward ops (not kept as ranges: only to mark the GPU work they launch)
    bwd: tuple[I64A, I64A, I64A] | None = None  # start, end, tid


_COMM_CLS = (N_COMM, N_PP_COMM)
_NO_COMM = _CommInfo()  # the facts of every host range that is no comm op (shared, never written)


def _kept_infos(ev: Events, memo: _NameMemo) -> tuple[list[NameInfo], list[NameInfo]]:
    """Per name id: its NameInfo, and the one a kept range carries (OTHER when not a range)."""
    infos = list(map(memo.__getitem__, ev.names))
    kept = [i if i.range_kind >= 0 else NameInfo(i.cls, int(RangeKind.OTHER), phase=i.phase) for i in infos]
    return infos, kept


def _collect_host(
    ev: Events,
    host_idx: npt.NDArray[np.intp],
    codes: npt.NDArray[np.int8],
    memo: _NameMemo,
    base: int,
    ctx: _Ctx,
) -> _Host:
    """Keep the host ranges later layers need (and comm ops for kernel classification)."""
    host = _Host()
    if not len(host_idx):
        return host
    infos, kept_info = _kept_infos(ev, memo)
    cls_of = np.fromiter(map(attrgetter("cls"), infos), dtype=np.int64, count=len(infos))
    rk_of = np.fromiter(map(attrgetter("range_kind"), infos), dtype=np.int64, count=len(infos))
    nid = ev.name[host_idx]
    cls = cls_of[nid]
    sub_codes = codes[host_idx]
    is_bwd = cls == N_BWD_OP
    if is_bwd.any():
        b = host_idx[is_bwd]
        b_s = us_to_ns(ev.ts[b], base)
        b_e = b_s + np.maximum(us_to_ns(ev.dur[b], 0), 0)
        host.bwd = (b_s, b_e, ev.tid[b])
    # every user annotation is kept (they are few and name user phases); CPU ops and Python
    # functions only when their name means something to ppdiag
    keep = (rk_of[nid] >= 0) | (sub_codes == K_ANNOT)
    keep &= ~((sub_codes == K_PYFUNC) & (cls != N_MODULE))
    kept = np.flatnonzero(keep)
    if not len(kept):
        return host
    rows, k_nid, k_cls = host_idx[kept], nid[kept], cls[kept]
    ts = us_to_ns(ev.ts[rows], base)
    dur = np.maximum(us_to_ns(ev.dur[rows], 0), 0)
    host.start = ts.tolist()
    host.end = (ts + dur).tolist()
    host.tid = ev.tid[rows].tolist()
    host.info = list(map(kept_info.__getitem__, k_nid.tolist()))
    host.name = list(map(ev.names.__getitem__, k_nid.tolist()))
    host.is_cpu_op = (sub_codes[kept] == K_CPUOP).tolist()
    host.comm = [_NO_COMM] * len(rows)
    host.ext = [-1] * len(rows)
    comm = np.flatnonzero((k_cls == N_COMM) | (k_cls == N_PP_COMM))
    empty = msgspec.Raw()
    args = _decode_args([ev.args.get(r, empty) for r in rows[comm].tolist()])
    for j, a in zip(comm.tolist(), args, strict=True):
        host.comm[j] = _host_comm(host.info[j], a, ctx)
        x = -1 if a is None else _as_int(a.ext)
        host.ext[j] = x if x >= 0 or a is None else _as_int(a.ext_lc)
    _inherit_from_issuer(host)
    return host


def _inherit_from_issuer(host: _Host) -> None:
    """Backend spans (``gloo:send``) carry no peer: take it from the ``c10d::`` op that issued them
    (the latest-starting one on the same thread that contains the span's start)."""
    n = len(host.name)
    c10d = np.fromiter(map(methodcaller("startswith", "c10d::"), host.name), dtype=bool, count=n)
    p2p = np.fromiter(map(attrgetter("comm"), host.comm), dtype=np.int64, count=n) == C_P2P
    iss = np.flatnonzero(c10d & p2p)
    if not len(iss):
        return
    peer = np.fromiter(map(attrgetter("peer"), host.comm), dtype=np.int64, count=n)
    unknown = (peer < 0) | (np.fromiter(map(attrgetter("direction"), host.comm), np.int64, n) == 0)
    span = np.fromiter(map(attrgetter("cls"), host.info), dtype=np.int64, count=n) == N_COMM
    want = np.flatnonzero(p2p & span & ~c10d & unknown)
    if not len(want):
        return
    tid = np.asarray(host.tid, dtype=np.int64)
    start = np.asarray(host.start, dtype=np.int64)
    end = np.asarray(host.end, dtype=np.int64)
    # one sort of issuers and spans by (thread, start), issuers first on ties: the last issuer
    # at or before a span in that order is the latest-starting one of its thread
    rows = np.concatenate((iss, want))
    is_iss = np.arange(len(rows)) < len(iss)
    order = np.lexsort((~is_iss, start[rows], tid[rows]))
    pos = np.where(is_iss[order], np.arange(len(rows)), -1)
    last = np.maximum.accumulate(pos)
    w_at = np.flatnonzero(~is_iss[order])
    src = np.where(last[w_at] >= 0, rows[order][np.maximum(last[w_at], 0)], -1)
    w = rows[order][w_at]
    ok = (src >= 0) & (tid[np.maximum(src, 0)] == tid[w]) & (end[np.maximum(src, 0)] >= start[w])
    for i, s in zip(w[ok].tolist(), src[ok].tolist(), strict=True):
        c, fr = host.comm[i], host.comm[s]
        if c.peer < 0:
            c.peer = fr.peer
        if not c.direction:
            c.direction = fr.direction
        if c.nbytes < 0:
            c.nbytes = fr.nbytes


def _build_ranges(host: _Host, names: NameTable) -> Ranges:
    """The kept host ranges as the timeline's range table, in (start, end) order."""
    n = len(host.start)
    if not n:
        return Ranges.empty()
    info, comm = host.info, host.comm

    def col(objs: list[Any], attr: str) -> npt.NDArray[np.int64]:
        return np.fromiter(map(attrgetter(attr), objs), dtype=np.int64, count=n)

    c_dir = col(comm, "direction")
    cols: dict[str, Any] = {
        "start": host.start,
        "end": host.end,
        "tid": host.tid,
        "kind": col(info, "range_kind"),
        "name": list(map(names.id, host.name)),
        "num": col(info, "num"),
        "stage": col(info, "stage"),
        "mb": col(info, "mb"),
        "phase": col(info, "phase"),
        "peer": col(comm, "peer"),
        "direction": np.where(c_dir != 0, c_dir, col(info, "direction")),
        "bytes": col(comm, "nbytes"),
        "seq": col(comm, "seq"),
        "group": col(comm, "group"),
    }
    r = Ranges.from_columns(n, cols)
    return r.take(np.lexsort((r.end, r.start)))
