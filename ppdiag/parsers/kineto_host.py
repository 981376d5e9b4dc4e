"""The host ranges a Kineto parse keeps (steps, labels, comm ops, annotations) and their comm
facts; built once per rank and read by the GPU and CPU modes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    _col,
    _decode_args,
    _f64,
    _tids,
    us_to_ns,
)


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


def _collect_host(
    evs: list[Any],
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
    idx_list = host_idx.tolist()
    sub = [evs[i] for i in idx_list]
    infos = [memo[e.name] for e in sub]
    sub_codes = codes[host_idx]
    is_bwd = np.fromiter((i.cls == N_BWD_OP for i in infos), dtype=bool, count=len(infos))
    if is_bwd.any():
        bsel = np.flatnonzero(is_bwd).tolist()
        b_ev = [sub[i] for i in bsel]
        b_s = us_to_ns(_f64(_col(b_ev, "ts")), base)
        b_e = b_s + np.maximum(us_to_ns(_f64(_col(b_ev, "dur")), 0), 0)
        host.bwd = (b_s, b_e, _tids(_col(b_ev, "tid")))
    keep_cls = np.fromiter((i.range_kind >= 0 for i in infos), dtype=bool, count=len(infos))
    # every user annotation is kept (they are few and name user phases); CPU ops and Python
    # functions only when their name means something to ppdiag
    keep = keep_cls | (sub_codes == K_ANNOT)
    keep &= ~((sub_codes == K_PYFUNC) & ~np.fromiter((i.cls == N_MODULE for i in infos), bool, len(infos)))
    kept = np.flatnonzero(keep).tolist()
    if not kept:
        return host
    ks = [sub[i] for i in kept]
    ts = us_to_ns(_f64(_col(ks, "ts")), base)
    dur = np.maximum(us_to_ns(_f64(_col(ks, "dur")), 0), 0)
    host.start = ts.tolist()
    host.end = (ts + dur).tolist()
    host.tid = _tids(_col(ks, "tid")).tolist()
    comm_args = iter(
        _decode_args([e.args for j, e in zip(kept, ks, strict=True) if infos[j].cls in _COMM_CLS])
    )
    for j, e in zip(kept, ks, strict=True):
        info = infos[j]
        if info.range_kind < 0:
            info = NameInfo(info.cls, int(RangeKind.OTHER), phase=info.phase)
        host.info.append(info)
        host.name.append(e.name if isinstance(e.name, str) else str(e.name))
        host.is_cpu_op.append(bool(sub_codes[j] == K_CPUOP))
        if info.cls in _COMM_CLS:
            a = next(comm_args)
            host.comm.append(_host_comm(info, a, ctx))
            x = -1 if a is None else _as_int(a.ext)
            host.ext.append(x if x >= 0 or a is None else _as_int(a.ext_lc))
        else:
            host.comm.append(_CommInfo())
            host.ext.append(-1)
    _inherit_from_issuer(host)
    return host


_COMM_CLS = (N_COMM, N_PP_COMM)


def _inherit_from_issuer(host: _Host) -> None:
    """Backend spans (``gloo:send``) carry no peer: take it from the ``c10d::`` op that issued them
    (the latest-starting one on the same thread that contains the span's start)."""
    iss = [i for i, nm in enumerate(host.name) if nm.startswith("c10d::") and host.comm[i].comm == C_P2P]
    want = [
        i
        for i, nm in enumerate(host.name)
        if host.comm[i].comm == C_P2P
        and host.info[i].cls == N_COMM
        and not nm.startswith("c10d::")
        and (host.comm[i].peer < 0 or not host.comm[i].direction)
    ]
    if not iss or not want:
        return
    i_tid = np.array([host.tid[i] for i in iss], dtype=np.int64)
    i_s = np.array([host.start[i] for i in iss], dtype=np.int64)
    i_e = np.array([host.end[i] for i in iss], dtype=np.int64)
    order = np.lexsort((i_s, i_tid))
    i_tid, i_s, i_e = i_tid[order], i_s[order], i_e[order]
    iss_sorted = [iss[int(k)] for k in order]
    w_tid = np.array([host.tid[i] for i in want], dtype=np.int64)
    w_s = np.array([host.start[i] for i in want], dtype=np.int64)
    # search on (tid, start) pairs: the last issuer of that thread starting at or before the span
    key_i = np.stack((i_tid, i_s), axis=1)
    pos = np.searchsorted(i_tid, w_tid, side="left")
    end = np.searchsorted(i_tid, w_tid, side="right")
    for k, i in enumerate(want):
        lo, hi = int(pos[k]), int(end[k])
        if lo >= hi:
            continue
        j = lo + int(np.searchsorted(key_i[lo:hi, 1], w_s[k], side="right")) - 1
        if j < lo or i_e[j] < w_s[k]:
            continue
        c, src = host.comm[i], host.comm[iss_sorted[j]]
        if c.peer < 0:
            c.peer = src.peer
        if not c.direction:
            c.direction = src.direction
        if c.nbytes < 0:
            c.nbytes = src.nbytes


def _build_ranges(host: _Host, names: NameTable) -> Ranges:
    n = len(host.start)
    if not n:
        return Ranges.empty()
    cols: dict[str, Any] = {
        "start": host.start,
        "end": host.end,
        "tid": host.tid,
        "kind": [i.range_kind for i in host.info],
        "name": [names.id(s) for s in host.name],
        "num": [i.num for i in host.info],
        "stage": [i.stage for i in host.info],
        "mb": [i.mb for i in host.info],
        "phase": [i.phase for i in host.info],
        "peer": [c.peer for c in host.comm],
        "direction": [c.direction or i.direction for c, i in zip(host.comm, host.info, strict=True)],
        "bytes": [c.nbytes for c in host.comm],
        "seq": [c.seq for c in host.comm],
        "group": [c.group for c in host.comm],
    }
    r = Ranges.from_columns(n, cols)
    return r.take(np.lexsort((r.end, r.start)))
