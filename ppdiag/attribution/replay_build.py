"""The replay graph's nodes for every analyzed rank-step at once (docs/json.md, *Time accounting*).

Each rank-step's window, with every time its blocks and sets hold, is one group of a
:class:`~ppdiag.model.interval_groups.Line`: the steps' sets laid end to end are one sorted set
each, so the wait before every block of the run and the split of the local time around it are one
binary search per set instead of one per rank-step (the same numbers as
the step-by-step computation the tests keep as its reference: a group's positions differ
from its times by a constant, and a search inside a group never reaches into another one). The
transfers that held the rank are looked up once per rank, on the rank's own p2p index.

Only when the groups do not fit on one int64 line together are the steps built one at a time (each
a line of its own), with the same code.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.rank_step import RankStep
from ppdiag.attribution.replay_index import _last_waits, _P2PIndex
from ppdiag.attribution.replay_nodes import Col, narrow
from ppdiag.attribution.replay_pieces import span_measures
from ppdiag.model import intervals as ivs
from ppdiag.model.interval_groups import Line

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class PendingWaits(NamedTuple):
    """The waits still to resolve once every rank's nodes exist, one row per wait in node order:
    the node, the operation that held it (peer, direction, posted, end), the release and the wait's
    start."""

    nid: I64
    peer: I64
    wdir: I64
    posted: I64
    op_end: I64
    rel: I64
    wait_start: I64

    @classmethod
    def concat(cls, parts: Sequence[PendingWaits]) -> PendingWaits:
        """The rows of ``parts`` one after the other."""
        return cls(*(np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(7)))


class StepTails(NamedTuple):
    """Per step, what follows its last block (see ``ReplayGraph._add_tails``): the local split
    (busy, coll, host, other, copy), whether a step-end collective lies in it, that collective's
    span and the local split (busy, host, other, copy, p2p) before and after it."""

    split: I64
    has_coll: B
    coll: I64
    before: I64
    after: I64


class StepNodes(NamedTuple):
    """The measured nodes of the steps, in steps order: the node columns (named as in
    :data:`~ppdiag.attribution.replay_nodes.MEASURED`), each node's measured start and the end of
    its rank's work before it, whether its wait's operation was queued on a compute stream, the
    waits to resolve, the labelled blocks (step key, stage, phase, micro-batch, node) and per step
    its first node, node count and the end of its last block's reach (the tail starts there)."""

    cols: dict[str, Col]
    start: I64
    lo: I64
    on_compute: B
    pending: PendingWaits
    labels: I64
    first: I64
    sizes: I64
    prev_end: I64
    tails: StepTails


def build_nodes(
    steps: Sequence[RankStep], cpu: dict[int, bool], index: dict[int, _P2PIndex], tol: int
) -> StepNodes:
    """The nodes of every step of ``steps``; ``cpu``: per rank, whether it is a CPU run."""
    try:
        return _build(steps, cpu, index, tol)
    except OverflowError:
        # the steps' spans are too wide for one int64 line together: one line per step
        parts = [_build([rs], cpu, index, tol) for rs in steps]
        return _concat(parts)


def _concat(parts: list[StepNodes]) -> StepNodes:
    """Steps built apart, one after the other (node ids shifted to their place)."""
    base = np.cumsum([0] + [len(p.start) for p in parts])[:-1].astype(np.int64)
    pend = [p.pending._replace(nid=p.pending.nid + b) for p, b in zip(parts, base, strict=True)]
    labels = [
        p.labels + np.array([[0], [0], [0], [0], [b]], np.int64) for p, b in zip(parts, base, strict=True)
    ]
    cat = np.concatenate
    return StepNodes(
        {c: cat([p.cols[c] for p in parts]) for c in parts[0].cols} if parts else {},
        cat([p.start for p in parts]) if parts else np.zeros(0, np.int64),
        cat([p.lo for p in parts]) if parts else np.zeros(0, np.int64),
        cat([p.on_compute for p in parts]) if parts else np.zeros(0, np.bool_),
        PendingWaits.concat(pend) if parts else PendingWaits(*(np.zeros(0, np.int64) for _ in range(7))),
        cat(labels, axis=1) if parts else np.zeros((5, 0), np.int64),
        cat([p.first + b for p, b in zip(parts, base, strict=True)]) if parts else np.zeros(0, np.int64),
        cat([p.sizes for p in parts]) if parts else np.zeros(0, np.int64),
        cat([p.prev_end for p in parts]) if parts else np.zeros(0, np.int64),
        StepTails(*(cat([p.tails[i] for p in parts]) for i in range(5))),
    )


class _OnLine(NamedTuple):
    """The steps as groups of one line, with a set of each step laid on it."""

    line: Line
    grp: I64  # per node: its step

    def put(self, t: I64) -> I64:
        """Node times as line positions."""
        return self.line.put(self.grp, t)

    def back(self, x: I64) -> I64:
        """Node positions back as times."""
        return self.line.time_of(x, self.grp)


def _set_on(line: Line, steps: Sequence[RankStep], get: Callable[[RankStep], ivs.ISet]) -> ivs.ISet:
    """The set ``get`` of every step, laid end to end on ``line``."""
    got = [get(rs) for rs in steps]
    n = np.array([s[0].size for s in got], np.int64)
    if not n.any():
        return ivs.empty()
    g = np.repeat(np.arange(len(steps), dtype=np.int64), n)
    return line.put(g, np.concatenate([s[0] for s in got])), line.put(g, np.concatenate([s[1] for s in got]))


_SETS: dict[str, Callable[[RankStep], ivs.ISet]] = {
    "p2p_host": lambda rs: rs.p2p_host,
    "host": lambda rs: rs.host_set,
    "coll": lambda rs: rs.sets.collective,
    "p2p": lambda rs: rs.sets.p2p,
    "copy": lambda rs: rs.sets.copy,
    "gaps": lambda rs: rs.sets.gaps,
    "wait": lambda rs: rs.wait_set,
    "compute": lambda rs: rs.sets.compute,
}


def _line_of(steps: Sequence[RankStep], grp: I64, s_t: I64, e_t: I64) -> Line:
    """One group per step, spanning its window and every time of its blocks and sets."""
    lo = np.array([rs.w0 for rs in steps], np.int64)
    hi = np.array([rs.w1 for rs in steps], np.int64)
    np.minimum.at(lo, grp, s_t)
    np.maximum.at(hi, grp, e_t)
    for get in _SETS.values():
        for i, rs in enumerate(steps):
            st, en = get(rs)
            if st.size:
                lo[i] = min(lo[i], int(st[0]))
                hi[i] = max(hi[i], int(en[-1]))
    return Line.of(lo, hi)


def _build(
    steps: Sequence[RankStep], cpu: dict[int, bool], index: dict[int, _P2PIndex], tol: int
) -> StepNodes:
    count = np.array([len(rs.blocks) for rs in steps], np.int64)
    first = np.zeros(count.size, np.int64)
    if count.size > 1:
        np.cumsum(count[:-1], out=first[1:])
    g = len(steps)
    grp = np.repeat(np.arange(g, dtype=np.int64), count)

    def cat(get: Callable[[RankStep], npt.NDArray[np.generic]]) -> I64:
        return np.concatenate([get(rs) for rs in steps]).astype(np.int64) if g else np.zeros(0, np.int64)

    s_t, e_t = cat(lambda rs: rs.blocks.start), cat(lambda rs: rs.blocks.end)
    on = _OnLine(_line_of(steps, grp, s_t, e_t), grp)
    line = on.line
    s_l, e_l = on.put(s_t), on.put(e_t)
    w0_l = line.put(np.arange(g), np.array([rs.w0 for rs in steps], np.int64))
    # the end of the rank's work before each block (the window start before the first): a running
    # max over each step's window start and block ends (positions grow from step to step)
    seq = np.empty(s_l.size + g, np.int64)
    at_w0 = first + np.arange(g)
    seq[at_w0] = w0_l
    seq[np.arange(s_l.size) + grp + 1] = e_l
    reach = np.maximum.accumulate(seq)
    lo_l = np.minimum(reach[np.arange(s_l.size) + grp], s_l)
    prev_end = line.time_of(reach[at_w0 + count], np.arange(g, dtype=np.int64))
    sets = {k: _set_on(line, steps, get) for k, get in _SETS.items()}
    rank_n = np.repeat(np.array([rs.rank for rs in steps], np.int64), count)
    cpu_n = np.repeat(np.array([cpu[rs.rank] for rs in steps], np.bool_), count)
    ws_l, rel_l, has, held, oc = _waits(on, sets["wait"], lo_l, s_l, rank_n, cpu_n, index, tol)
    pieces = _pieces(sets, lo_l, ws_l, rel_l, s_l, e_l)
    del sets["gaps"], sets["p2p_host"], sets["wait"]  # (the tails read the others)
    # (each column narrowed as it is made: the pieces' int64 arrays go as their copies come)
    cols = {
        "rank": narrow(rank_n),
        "step": narrow(np.repeat(np.array([rs.step for rs in steps], np.int64), count)),
        "idx": narrow(np.arange(s_l.size, dtype=np.int64) - first[grp]),
        "span": narrow(e_t - s_t),
        "busy": narrow(cat(lambda rs: rs.blocks.busy)),
        **{k: narrow(pieces.pop(k)) for k in list(pieces)},
        "phase": narrow(cat(lambda rs: rs.blocks.phase)),
        "stage": narrow(cat(lambda rs: rs.blocks.stage)),
    }
    j = np.flatnonzero(has)
    ws_t, rel_t = on.back(ws_l), on.back(rel_l)
    pending = PendingWaits(j, held[:, 0], held[:, 1], held[:, 2], held[:, 3], rel_t[j], ws_t[j])
    on_compute = np.zeros(s_l.size, np.bool_)
    on_compute[j] = oc
    mb = cat(lambda rs: rs.blocks.mb)
    lab = np.flatnonzero(mb >= 0)
    key = np.array([rs.number if rs.number >= 0 else rs.step for rs in steps], np.int64)
    # (int64: the key is; the narrowed columns are widened into it)
    labels = np.stack([key[grp[lab]], cols["stage"][lab], cols["phase"][lab], mb[lab], lab]).astype(
        np.int64, copy=False
    )
    hi_l = line.put(np.arange(g), np.array([rs.w1 for rs in steps], np.int64))
    tails = _tails(line, sets, reach[at_w0 + count], hi_l)
    return StepNodes(cols, s_t, on.back(lo_l), on_compute, pending, labels, first, count, prev_end, tails)


def _between(iset: ivs.ISet, lo: I64, hi: I64) -> I64:
    """The measure of a set on the line inside each ``[lo, hi)`` (0 for an empty or reversed span)."""
    if iset[0].size == 0 or lo.size == 0:
        return np.zeros(lo.size, np.int64)
    p = ivs.prefix_measure(iset, np.concatenate([lo, hi]))
    return np.where(hi > lo, p[lo.size :] - p[: lo.size], 0)


def _split_local(sets: dict[str, ivs.ISet], lo: I64, hi: I64) -> I64:
    """:func:`~ppdiag.attribution.rank_step._split_local` of each span ``[lo, hi)`` on the line:
    (compute, host-evidence idle, other, exposed copy, exposed p2p)."""
    busy, host = _between(sets["compute"], lo, hi), _between(sets["host"], lo, hi)
    copy, p2p = _between(sets["copy"], lo, hi), _between(sets["p2p"], lo, hi)
    other = np.maximum(hi - lo - busy - host - copy - p2p, 0)
    return np.where((hi > lo)[:, None], np.stack([busy, host, other, copy, p2p], axis=1), 0)


def _tails(line: Line, sets: dict[str, ivs.ISet], lo: I64, hi: I64) -> StepTails:
    """What follows each step's last block, ``[lo, hi)`` on the line (see :class:`StepTails`)."""
    busy = _between(sets["compute"], lo, hi)
    # exposed p2p after the last block (a send on the compute stream) is exposed comm too
    coll = _between(sets["coll"], lo, hi) + _between(sets["p2p"], lo, hi)
    host, copy = _between(sets["host"], lo, hi), _between(sets["copy"], lo, hi)
    other = np.maximum(hi - lo - busy - coll - host - copy, 0)
    split = np.stack([busy, coll, host, other, copy], axis=1)
    # the step-end collective: the collective time in the tail, from its first piece to its last
    cs, ce = sets["coll"]
    i0 = np.searchsorted(ce, lo, side="right")
    i1 = np.searchsorted(cs, hi, side="left")
    has = (i1 > i0) & (hi > lo)
    c0 = np.where(has, np.maximum(cs[np.minimum(i0, max(cs.size - 1, 0))] if cs.size else lo, lo), lo)
    c1 = np.where(has, np.minimum(ce[np.maximum(i1 - 1, 0)] if ce.size else hi, hi), hi)
    g = np.arange(lo.size, dtype=np.int64)
    span = np.stack([line.time_of(c0, g), line.time_of(c1, g)], axis=1)
    return StepTails(split, has, span, _split_local(sets, lo, c0), _split_local(sets, c1, hi))


def _waits(
    on: _OnLine,
    wait_set: ivs.ISet,
    lo_l: I64,
    s_l: I64,
    rank_n: I64,
    cpu_n: B,
    index: dict[int, _P2PIndex],
    tol: int,
) -> tuple[I64, I64, B, I64, B]:
    """The wait that released each block (line positions of its start and release, whether there is
    one) and, per wait, the operation that held the rank (peer, direction, posted, end) and whether
    it was queued on a compute stream."""
    has, ws_l, rel_l = _last_waits(wait_set, lo_l, s_l)
    # a "wait" no longer than the timing tolerance is rounding where a transfer touches the block
    tiny = has & (rel_l - ws_l <= tol)
    has &= ~tiny
    ws_l[tiny] = s_l[tiny]
    rel_l[tiny] = s_l[tiny]
    j = np.flatnonzero(has)
    held = np.zeros((j.size, 4), np.int64)
    ws_t, rel_t = on.back(ws_l)[j], on.back(rel_l)[j]
    by_rank = _by_rank(rank_n[j])
    # each rank's waits on its own p2p index (times, not positions: the index is the rank's)
    for r, sel in by_rank:
        held[sel] = index[r].blocking_arrays(ws_t[sel], rel_t[sel], tol)
    # devices: transfers of other operations before the one that held the rank are exposed comm,
    # not the wait: the wait is the exposed span of that operation
    adj = ~cpu_n[j] & (held[:, 0] >= 0)
    rel_n = np.maximum(np.minimum(rel_t, held[:, 3]), ws_t)
    ws_n = np.minimum(np.maximum(ws_t, held[:, 2]), rel_n)
    rel_t = np.where(adj, rel_n, rel_t)
    ws_t = np.where(adj, ws_n, ws_t)
    oc = np.zeros(j.size, np.bool_)
    for r, sel in by_rank:
        oc[sel] = index[r].on_compute_arrays(ws_t[sel], rel_t[sel])
    grp_j = on.grp[j]
    ws_l[j] = on.line.put(grp_j, ws_t)
    rel_l[j] = on.line.put(grp_j, rel_t)
    return ws_l, rel_l, has, held, oc


def _by_rank(rank: I64) -> list[tuple[int, I64]]:
    """Per rank, the positions of ``rank`` that hold it (one stable sort, no scan per rank)."""
    o = np.argsort(rank, kind="stable")
    r_sorted = rank[o]
    cut = np.flatnonzero(np.diff(r_sorted)) + 1
    bounds = np.r_[0, cut, r_sorted.size]
    return [(int(r_sorted[a]), o[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


def _pieces(sets: dict[str, ivs.ISet], lo: I64, ws: I64, rel: I64, s: I64, e: I64) -> dict[str, I64]:
    """The local time before each block outside its wait and its split, and the lost time inside
    the block (as :func:`~ppdiag.attribution.replay_pieces._outside_wait` for one step), on the line."""
    t = np.concatenate([lo, ws, rel, s, e])
    # each set's measures summed into the pieces as they come: a node array per piece is alive,
    # not three per set (eighteen block-sized arrays at once were the graph build's peak)
    ph0, ph1, _ = span_measures(sets["p2p_host"], t)
    p2p_host = ph0 + ph1
    h0, h1, h_in = span_measures(sets["host"], t)
    host = h0 + h1 + p2p_host
    c0, c1, _ = span_measures(sets["coll"], t)
    coll = c0 + c1
    c0, c1, _ = span_measures(sets["p2p"], t)  # (integer sums: the same in any order)
    coll += c0
    coll += c1
    coll -= p2p_host
    del ph0, ph1, h0, h1, c0, c1
    k0, k1, k_in = span_measures(sets["copy"], t)
    copy = k0 + k1
    del k0, k1
    g0, g1, g_in = span_measures(sets["gaps"], t)
    del t
    in_copy = np.minimum(k_in, g_in)
    in_host = np.minimum(h_in, g_in - in_copy)
    return {
        "in_host": in_host,
        "in_ux": g_in - in_host - in_copy,
        "in_copy": in_copy,
        "pre": ws - lo,
        "post": s - rel,
        "pre_host": host,
        "pre_coll": coll,
        "pre_ux": np.maximum(g0 + g1 - host - coll - copy, 0),
        "pre_copy": copy,
    }


__all__ = ["PendingWaits", "StepNodes", "build_nodes"]
