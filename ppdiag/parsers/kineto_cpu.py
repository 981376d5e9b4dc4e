"""CPU mode of the Kineto parser (no GPU events, e.g. gloo runs): the main thread is the device
timeline; its outermost CPU ops are the work and the tails of ``gloo:*`` spans the blocked
communication."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model import (
    Intervals,
    Kind,
    NameTable,
    Phase,
)
from ppdiag.parsers.kineto_comm import _CommInfo, _Ctx, _host_comm
from ppdiag.parsers.kineto_host import _Host
from ppdiag.parsers.kineto_names import (
    C_P2P,
    N_BWD_OP,
    N_COMM,
    N_DATA,
    N_LABEL,
    N_MODULE,
    N_OPTIM,
    N_PP_COMM,
    N_PP_OTHER,
    N_STEP,
    NameInfo,
    _NameMemo,
)
from ppdiag.parsers.kineto_schema import I64A, _col, _decode_args, _f64, _tids, us_to_ns


def _main_thread(host: _Host, o_tid: I64A, o_start: I64A, o_end: I64A) -> int:
    """The main thread: the one with ProfilerStep# ranges, else the one with the most CPU-op time."""
    step_tids = [host.tid[i] for i, inf in enumerate(host.info) if inf.cls == N_STEP]
    if step_tids:
        vals, cnt = np.unique(np.array(step_tids, dtype=np.int64), return_counts=True)
        return int(vals[cnt.argmax()])
    vals, inv = np.unique(o_tid, return_inverse=True)
    return int(vals[np.bincount(inv, weights=(o_end - o_start).astype(np.float64)).argmax()])


def _top_level(s: I64A, e: I64A) -> tuple[npt.NDArray[np.intp], I64A, I64A]:
    """(positions, starts, ends) of the outermost ranges, in start order (longer first on ties)."""
    order = np.lexsort((-e, s))
    s, e = s[order], e[order]
    prev_max = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(e)[:-1])) if len(e) else e
    top = s >= prev_max
    return order[top], s[top], e[top]


@dataclass
class _TopOps:
    """Columns of the top-level ops of the main thread, and the comm facts of their comm ops."""

    kind: npt.NDArray[np.int8]
    phase: npt.NDArray[np.int8]
    peer: npt.NDArray[np.int32]
    direction: npt.NDArray[np.int8]
    nbytes: I64A
    comm_pos: list[int]
    comm_info: list[_CommInfo]


def _top_ops(t_ops: list[Any], t_info: list[NameInfo], ctx: _Ctx) -> _TopOps:
    """Kind, phase and comm columns of the top-level ops: backward ops are BWD, and the issuing op
    of a c10d call is communication, not compute."""
    n_top = len(t_ops)
    out = _TopOps(
        kind=np.zeros(n_top, dtype=np.int8),
        phase=np.zeros(n_top, dtype=np.int8),
        peer=np.full(n_top, -1, dtype=np.int32),
        direction=np.zeros(n_top, dtype=np.int8),
        nbytes=np.full(n_top, -1, dtype=np.int64),
        comm_pos=[],
        comm_info=[],
    )
    op_args = iter(_decode_args([o.args for o, inf in zip(t_ops, t_info, strict=True) if inf.cls == N_COMM]))
    for k, inf in enumerate(t_info):
        if inf.cls == N_BWD_OP:
            out.phase[k] = Phase.BWD
        elif inf.cls == N_COMM:
            c = _host_comm(inf, next(op_args), ctx)
            out.kind[k] = Kind.P2P if c.comm == C_P2P else Kind.COLLECTIVE
            out.peer[k], out.direction[k], out.nbytes[k] = c.peer, c.direction, c.nbytes
            out.comm_pos.append(k)
            out.comm_info.append(c)
    return out


def _mark_optimizer(top: _TopOps, host: _Host, main: int, t_s: I64A) -> None:
    """Compute ops starting inside an ``Optimizer.*`` range of the main thread are OPTIM."""
    opt = [
        (host.start[i], host.end[i])
        for i, inf in enumerate(host.info)
        if inf.cls == N_OPTIM and host.tid[i] == main
    ]
    if opt:
        os_ = np.array(sorted(opt), dtype=np.int64)
        oe = np.maximum.accumulate(os_[:, 1])
        ki = np.searchsorted(os_[:, 0], t_s, side="right") - 1
        inside = (ki >= 0) & (oe[np.maximum(ki, 0)] >= t_s)
        top.phase[inside & (top.kind == Kind.COMPUTE)] = Phase.OPTIM


def _cpu_mode(
    evs: list[Any],
    cpu_idx: npt.NDArray[np.intp],
    host: _Host,
    memo: _NameMemo,
    base: int,
    ctx: _Ctx,
    names: NameTable,
) -> tuple[Intervals, dict[str, Any]]:
    """The intervals of a CPU-only trace: the main thread's top-level CPU ops, and the blocked
    tails of its ``gloo:*`` spans."""
    ops = [evs[i] for i in cpu_idx.tolist()]
    o_tid = _tids(_col(ops, "tid"))
    o_start = us_to_ns(_f64(_col(ops, "ts")), base)
    o_end = o_start + np.maximum(us_to_ns(_f64(_col(ops, "dur")), 0), 0)
    main = _main_thread(host, o_tid, o_start, o_end)

    on_main = np.flatnonzero(o_tid == main)
    m_ops = [ops[i] for i in on_main.tolist()]
    del ops
    infos = [memo[e.name] for e in m_ops]
    # Annotations recorded as CPU ops by old profilers are not work: they are not parents either.
    is_annot = np.fromiter(
        (i.cls in (N_STEP, N_LABEL, N_PP_COMM, N_PP_OTHER, N_OPTIM, N_DATA, N_MODULE) for i in infos),
        dtype=bool,
        count=len(infos),
    )
    sel = np.flatnonzero(~is_annot)
    pos, t_s, t_e = _top_level(o_start[on_main][sel], o_end[on_main][sel])
    t_sel = sel[pos]
    t_ops = [m_ops[i] for i in t_sel.tolist()]
    t_info = [infos[i] for i in t_sel.tolist()]
    n_top = len(t_ops)
    name_id = np.fromiter(
        (names.id(o.name if isinstance(o.name, str) else str(o.name)) for o in t_ops),
        dtype=np.int32,
        count=n_top,
    )
    top = _top_ops(t_ops, t_info, ctx)
    _mark_optimizer(top, host, main, t_s)
    del m_ops, t_ops

    cols: dict[str, Any] = {
        "start": t_s,
        "end": t_e,
        "stream": np.full(n_top, main, dtype=np.int64),
        "kind": top.kind,
        "name": name_id,
        "phase": top.phase,
        "peer": top.peer,
        "direction": top.direction,
        "bytes": top.nbytes,
        "launch": t_s,
    }
    parts = [Intervals.from_columns(n_top, cols)]
    blocked = _gloo_tails(t_s, t_e, host, main, names, top.comm_pos, top.comm_info)
    if blocked is not None:
        parts.append(blocked)
    extra = {
        "main_tid": main,
        "cpu_ops": len(cpu_idx),
        "top_level_ops": n_top,
        "blocked_pieces": len(blocked) if blocked is not None else 0,
    }
    return Intervals.concat(parts), extra


def _tail_pieces(t_s: I64A, t_e: I64A, sp_s: I64A, sp_e: I64A) -> tuple[I64A, I64A, I64A] | None:
    """(start, end, span index) of the blocked pieces: each span's tail after the last top-level
    op that started before its end, split where tails overlap so that each piece belongs to the
    covering span that ends first; None when there is none."""
    cummax = np.maximum.accumulate(t_e) if len(t_e) else t_e
    k = np.searchsorted(t_s, sp_e, side="left") - 1
    last_end = np.where(k >= 0, cummax[np.maximum(k, 0)] if len(cummax) else 0, np.iinfo(np.int64).min)
    tail_s = np.maximum(last_end, sp_s)
    has = tail_s < sp_e
    if not has.any():
        return None
    idx = np.flatnonzero(has)
    ts_, te_ = tail_s[idx], sp_e[idx]
    # elementary segments; paint them in order of span end, first painter wins
    bounds = np.unique(np.concatenate((ts_, te_)))
    owner = np.full(max(len(bounds) - 1, 0), -1, dtype=np.int64)
    a = np.searchsorted(bounds, ts_)
    b = np.searchsorted(bounds, te_)
    for j in np.argsort(te_, kind="stable").tolist():
        seg = owner[a[j] : b[j]]
        seg[seg < 0] = j
    seg_idx = np.flatnonzero(owner >= 0)
    if not len(seg_idx):
        return None
    own = owner[seg_idx]
    # merge adjacent segments of the same owner into one piece
    brk = np.flatnonzero((np.diff(seg_idx) != 1) | (np.diff(own) != 0)) + 1
    first = np.concatenate(([0], brk))
    last = np.concatenate((brk - 1, [len(seg_idx) - 1]))
    return bounds[seg_idx[first]], bounds[seg_idx[last] + 1], idx[own[first]]


def _gloo_tails(
    t_s: I64A,
    t_e: I64A,
    host: _Host,
    main: int,
    names: NameTable,
    comm_pos: list[int],
    comm_info: list[_CommInfo],
) -> Intervals | None:
    """Blocked communication on the main thread: the tail pieces of its ``gloo:*`` spans (see
    :func:`_tail_pieces`), with the facts of the span and of the c10d op that issued it."""
    spans = [
        i
        for i, inf in enumerate(host.info)
        if inf.cls == N_COMM and host.tid[i] == main and host.name[i].startswith("gloo:")
    ]
    if not spans:
        return None
    sp_s = np.array([host.start[i] for i in spans], dtype=np.int64)
    sp_e = np.array([host.end[i] for i in spans], dtype=np.int64)
    got = _tail_pieces(t_s, t_e, sp_s, sp_e)
    if got is None:
        return None
    p_start, p_end, p_span = got  # p_span: index into `spans`
    n = len(p_start)

    # the issuing c10d op: the top-level comm op containing the span start
    c_s = t_s[comm_pos] if comm_pos else np.zeros(0, dtype=np.int64)
    c_e = t_e[comm_pos] if comm_pos else np.zeros(0, dtype=np.int64)
    kind = np.zeros(n, dtype=np.int8)
    peer = np.full(n, -1, dtype=np.int32)
    direction = np.zeros(n, dtype=np.int8)
    nbytes = np.full(n, -1, dtype=np.int64)
    name_id = np.zeros(n, dtype=np.int32)
    for r in range(n):
        hi = spans[int(p_span[r])]
        hc = host.comm[hi]
        kind[r] = Kind.P2P if hc.comm == C_P2P else Kind.COLLECTIVE
        name_id[r] = names.id(host.name[hi])
        direction[r] = hc.direction
        nbytes[r] = hc.nbytes
        pr = hc.peer
        if len(c_s):
            ci = int(np.searchsorted(c_s, host.start[hi], side="right")) - 1
            if ci >= 0 and c_e[ci] >= host.start[hi]:
                issuer = comm_info[ci]
                if pr < 0:
                    pr = issuer.peer
                if not direction[r]:
                    direction[r] = issuer.direction
                if nbytes[r] < 0:
                    nbytes[r] = issuer.nbytes
        peer[r] = pr
    cols: dict[str, Any] = {
        "start": p_start,
        "end": p_end,
        "stream": np.full(n, main, dtype=np.int64),
        "kind": kind,
        "name": name_id,
        "peer": peer,
        "direction": direction,
        "bytes": nbytes,
    }
    return Intervals.from_columns(n, cols)
