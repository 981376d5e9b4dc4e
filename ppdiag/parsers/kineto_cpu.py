"""CPU mode of the Kineto parser (no GPU events, e.g. gloo runs): the main thread is the device
timeline; its outermost CPU ops are the work and the tails of ``gloo:*`` spans the blocked
communication."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter, methodcaller
from typing import Any

import msgspec
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
    interned_ids,
)
from ppdiag.parsers.kineto_schema import I64A, _decode_args, us_to_ns
from ppdiag.parsers.kineto_table import Events


def _main_thread(host: _Host, h_cls: I64A, o_tid: I64A, o_start: I64A, o_end: I64A) -> int:
    """The main thread: the one with ProfilerStep# ranges, else the one with the most CPU-op time."""
    step_tids = np.asarray(host.tid, dtype=np.int64)[h_cls == N_STEP]
    if len(step_tids):
        vals, cnt = np.unique(step_tids, return_counts=True)
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


def _top_ops(ev: Events, rows: npt.NDArray[np.intp], infos: list[NameInfo], cls: I64A, ctx: _Ctx) -> _TopOps:
    """Kind, phase and comm columns of the top-level ops (event ``rows``, their name ``infos`` and
    classes): backward ops are BWD, and the issuing op of a c10d call is communication, not
    compute."""
    n_top = len(rows)
    out = _TopOps(
        kind=np.zeros(n_top, dtype=np.int8),
        phase=np.where(cls == N_BWD_OP, np.int8(Phase.BWD), np.int8(0)).astype(np.int8),
        peer=np.full(n_top, -1, dtype=np.int32),
        direction=np.zeros(n_top, dtype=np.int8),
        nbytes=np.full(n_top, -1, dtype=np.int64),
        comm_pos=np.flatnonzero(cls == N_COMM).tolist(),
        comm_info=[],
    )
    empty = msgspec.Raw()
    args = _decode_args([ev.args.get(r, empty) for r in rows[out.comm_pos].tolist()])
    for k, a in zip(out.comm_pos, args, strict=True):
        c = _host_comm(infos[k], a, ctx)
        out.kind[k] = Kind.P2P if c.comm == C_P2P else Kind.COLLECTIVE
        out.peer[k], out.direction[k], out.nbytes[k] = c.peer, c.direction, c.nbytes
        out.comm_info.append(c)
    return out


def _mark_optimizer(top: _TopOps, host: _Host, h_cls: I64A, main: int, t_s: I64A) -> None:
    """Compute ops starting inside an ``Optimizer.*`` range of the main thread are OPTIM."""
    sel = (h_cls == N_OPTIM) & (np.asarray(host.tid, dtype=np.int64) == main)
    if sel.any():
        s = np.asarray(host.start, dtype=np.int64)[sel]
        e = np.asarray(host.end, dtype=np.int64)[sel]
        order = np.lexsort((e, s))  # what sorting the (start, end) pairs gave
        os_, oe = s[order], np.maximum.accumulate(e[order])
        ki = np.searchsorted(os_, t_s, side="right") - 1
        inside = (ki >= 0) & (oe[np.maximum(ki, 0)] >= t_s)
        top.phase[inside & (top.kind == Kind.COMPUTE)] = Phase.OPTIM


_ANNOT_CLS = (N_STEP, N_LABEL, N_PP_COMM, N_PP_OTHER, N_OPTIM, N_DATA, N_MODULE)


def _cpu_mode(
    ev: Events,
    cpu_idx: npt.NDArray[np.intp],
    host: _Host,
    memo: _NameMemo,
    base: int,
    ctx: _Ctx,
    names: NameTable,
) -> tuple[Intervals, dict[str, Any]]:
    """The intervals of a CPU-only trace: the main thread's top-level CPU ops, and the blocked
    tails of its ``gloo:*`` spans."""
    o_tid = ev.tid[cpu_idx]
    o_start = us_to_ns(ev.ts[cpu_idx], base)
    o_end = o_start + np.maximum(us_to_ns(ev.dur[cpu_idx], 0), 0)
    h_cls = np.fromiter(map(attrgetter("cls"), host.info), dtype=np.int64, count=len(host.info))
    main = _main_thread(host, h_cls, o_tid, o_start, o_end)

    infos = list(map(memo.__getitem__, ev.names))
    cls_of = np.fromiter(map(attrgetter("cls"), infos), dtype=np.int64, count=len(infos))
    on_main = np.flatnonzero(o_tid == main)
    m_cls = cls_of[ev.name[cpu_idx[on_main]]]
    # Annotations recorded as CPU ops by old profilers are not work: they are not parents either.
    sel = np.flatnonzero(~np.isin(m_cls, _ANNOT_CLS))
    pos, t_s, t_e = _top_level(o_start[on_main][sel], o_end[on_main][sel])
    t_sel = sel[pos]
    rows = cpu_idx[on_main[t_sel]]
    n_top = len(rows)
    t_nid = ev.name[rows].tolist()
    name_id = interned_ids(names, ev.names, ev.name[rows])
    top = _top_ops(ev, rows, list(map(infos.__getitem__, t_nid)), m_cls[t_sel], ctx)
    _mark_optimizer(top, host, h_cls, main, t_s)

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
    blocked = _gloo_tails(t_s, t_e, host, h_cls, main, names, top.comm_pos, top.comm_info)
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
    h_cls: I64A,
    main: int,
    names: NameTable,
    comm_pos: list[int],
    comm_info: list[_CommInfo],
) -> Intervals | None:
    """Blocked communication on the main thread: the tail pieces of its ``gloo:*`` spans (see
    :func:`_tail_pieces`), with the facts of the span and of the c10d op that issued it."""
    gloo = np.fromiter(map(methodcaller("startswith", "gloo:"), host.name), dtype=bool, count=len(host.name))
    sel = (h_cls == N_COMM) & (np.asarray(host.tid, dtype=np.int64) == main) & gloo
    if not sel.any():
        return None
    spans = np.flatnonzero(sel).tolist()
    sp_s = np.asarray(host.start, dtype=np.int64)[sel]
    sp_e = np.asarray(host.end, dtype=np.int64)[sel]
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
