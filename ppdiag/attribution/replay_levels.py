"""The replay's placement over whole levels of its dependency graph (docs/json.md, *Time
accounting*): every node of a level placed at once, for every variant at once.

A node's end is ``int((base + post) + dur)`` where ``base`` is the latest of

* ``X + pre``: ``X`` the latest of its *X-edges* ``end[src] + tau`` (the previous block of its
  step, or its step's window start), then its local delay before the wait (a float); a node
  waiting on its own send adds the wait's ``add`` to it (code 1);
* its wait's arrival (codes 2 and 3): the producer's issue ``end[psrc] + pconst`` against the
  time this rank had posted (``X + pre - lead``), whichever is later, plus ``add``;
* its *I-edges* ``end[src] + tau`` (label edges, a fixed release).

That is the arithmetic of the node-at-a-time loop (``replay_run._place_nodes``) with the same
float operations in the same order: the integers stay exact (a latest of integers and floats is
taken exactly, as Python compares an ``int`` with a ``float``), the floats are rounded where the
loop rounds them. A *virtual* node (a step-end sync) has no duration: its end is its ``X``.

Edges point from a node placed earlier to one placed later (a dependency on a node placed later
reads that node's measured end: it is a constant, folded into ``tau`` with the sentinel node as
source, whose end is 0). The levels are Kahn's frontiers over those edges: a level's nodes
depend only on earlier levels, so each level is a few numpy operations over its nodes and every
variant (rows of the arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
# node ids and columns of a plan: int32 below 2**31 nodes (half the plan's index arrays, which
# every variant batch holds), int64 above
Idx = npt.NDArray[np.signedinteger[Any]]

# below every time of a run (epoch ns are ~2^61 at most in practice) and safe to add small
# numbers to without overflow
NEG_I = -(2**62)
NEG_F = float(NEG_I)


def _csr(keys: I64, n: int) -> tuple[I64, I64]:
    """The stable order of ``keys`` and where each key's run begins (``n + 1`` bounds)."""
    o = np.argsort(keys, kind="stable")
    return o, np.searchsorted(keys[o], np.arange(n + 1))


def levels(n: int, src: I64, dst: I64) -> I64:
    """The level of each of ``n`` nodes over the edges ``src -> dst`` (an acyclic graph): 0 for a
    node without predecessors, else one more than its latest predecessor's (Kahn's frontiers)."""
    level = np.zeros(n, np.int64)
    indeg = np.bincount(dst, minlength=n)
    o, bounds = _csr(src, n)
    succ_all = dst[o]
    frontier = np.flatnonzero(indeg == 0)
    lv = 0
    while frontier.size:
        level[frontier] = lv
        lo, cnt = bounds[frontier], bounds[frontier + 1] - bounds[frontier]
        tot = int(cnt.sum())
        if tot == 0:
            break
        starts = np.cumsum(cnt) - cnt
        idx = np.repeat(lo - starts, cnt) + np.arange(tot)
        u, c = np.unique(succ_all[idx], return_counts=True)
        indeg[u] -= c
        frontier = u[indeg[u] == 0]
        lv += 1
    if int(indeg.sum()) != 0:
        raise ValueError("the replay's dependency graph has a cycle")
    return level


@dataclass(frozen=True)
class EdgeList:
    """Edges into nodes: ``dst``, ``src`` (the sentinel ``n`` for a constant) and the edge's
    latency in four parts, the variant's flags choosing which count: ``k0`` always, ``k_host``,
    ``k_comm``, ``k_copy`` where that kind of delay is kept."""

    dst: I64
    src: I64
    k0: I64
    k_host: I64
    k_comm: I64
    k_copy: I64

    def tau(self, flags: npt.NDArray[np.bool_]) -> I64:
        """(variants, edges) latencies; ``flags``: (variants, 3) host, comm, copy kept."""
        f = flags.astype(np.int64)
        out: I64 = (
            self.k0[None, :]
            + f[:, 0:1] * self.k_host[None, :]
            + f[:, 1:2] * self.k_comm[None, :]
            + f[:, 2:3] * self.k_copy[None, :]
        )
        return out


@dataclass(frozen=True)
class LevelGraph:
    """The structure of the placement, in level order (built once per graph; the variants read
    it). Node ``i`` sits at column ``at[i]``; the sentinel at column ``n``."""

    n: int
    at: Idx  # node id -> column
    bounds: list[tuple[int, int]]  # each level's columns [a, b)
    x_src: Idx  # X-edges by destination column: source columns
    x_perm: Idx  # the X-edges in that order (index into the EdgeList)
    x_lv: list[tuple[int, int, I64 | None]]  # per level: edge slice and reduceat offsets (None: one each)
    i_src: Idx
    i_perm: Idx
    i_lv: list[tuple[int, int, I64 | None]]
    node_of: Idx  # column -> node id (the sentinel's column: ``n``)
    p_src: Idx  # per column: the producer's column (sentinel: none or constant)
    virt: list[bool]  # per level: whether it holds a virtual node
    is_virt: npt.NDArray[np.bool_]  # per column

    @classmethod
    def build(
        cls, n: int, xe: EdgeList, ie: EdgeList, prod: I64, virtual: npt.NDArray[np.bool_]
    ) -> LevelGraph:
        """``xe``, ``ie``: the X- and I-edges (every node has at least one X-edge); ``prod``: each
        node's producer (``n``: none); ``virtual``: the nodes whose end is their ``X``."""
        live = [(e.src[e.src < n], e.dst[e.src < n]) for e in (xe, ie)]
        pm = prod < n
        src = np.concatenate([live[0][0], live[1][0], prod[pm]])
        dst = np.concatenate([live[0][1], live[1][1], np.flatnonzero(pm)])
        lev = levels(n, src, dst)
        perm, lb = _csr(lev, int(lev.max()) + 1 if n else 0)
        at = np.empty(n + 1, np.int64)
        at[perm] = np.arange(n)
        at[n] = n
        bounds = list(zip(lb[:-1].tolist(), lb[1:].tolist(), strict=True))
        x_perm, x_src, x_lv = cls._by_level(xe, at, lb)
        i_perm, i_src, i_lv = cls._by_level(ie, at, lb)
        is_virt = np.zeros(n + 1, np.bool_)
        is_virt[at[np.flatnonzero(virtual)]] = True
        virt = [bool(is_virt[a:b].any()) for a, b in bounds]
        p_src = np.full(n + 1, n, np.int64)
        p_src[at[:n]] = at[prod]
        node_of = np.r_[perm, n]
        # the edges' sizes bound the edge indices as n + 1 bounds the node ids and columns
        idx = np.int32 if max(n + 1, x_perm.size, i_perm.size) < 2**31 else np.int64
        return cls(
            n,
            at.astype(idx),
            bounds,
            x_src.astype(idx),
            x_perm.astype(idx),
            x_lv,
            i_src.astype(idx),
            i_perm.astype(idx),
            i_lv,
            node_of.astype(idx),
            p_src.astype(idx),
            virt,
            is_virt,
        )

    def columns(self, rows: list[npt.NDArray[Any]], dtype: type) -> npt.NDArray[Any]:
        """(variants, columns) in level order from one array per variant by node id; nodes past
        an array's end (the virtual ones) and the sentinel are 0."""
        out: npt.NDArray[Any] = np.zeros((len(rows), self.n + 1), dtype)
        for k, r in enumerate(rows):
            padded: npt.NDArray[Any] = np.zeros(self.n + 1, dtype)
            padded[: r.size] = r
            out[k] = padded[self.node_of]
        return out

    @staticmethod
    def _by_level(e: EdgeList, at: I64, lb: I64) -> tuple[I64, I64, list[tuple[int, int, I64 | None]]]:
        """The edges ordered by destination column, and per level their slice and the offset of
        each destination's run within it (``None`` where each destination has exactly one)."""
        d = at[e.dst]
        o = np.argsort(d, kind="stable")
        d_sorted = d[o]
        starts = np.searchsorted(d_sorted, np.arange(int(lb[-1]) + 1 if lb.size else 1))
        out: list[tuple[int, int, I64 | None]] = []
        for a, b in zip(lb[:-1].tolist(), lb[1:].tolist(), strict=True):
            ea, eb = int(starts[a]), int(starts[b])
            off = starts[a:b] - ea
            out.append((ea, eb, None if eb - ea == b - a else off))
        return o, at[e.src[o]], out


@dataclass(frozen=True)
class NodeValues:
    """What the variants put on the nodes, (variants, columns) in level order
    (:meth:`LevelGraph.columns`): local delays
    before and after the wait and the duration (floats), the wait's code (0 none, 1 own send, 2
    producer, 3 fixed issue), its addition and lead, and the producer's issue beyond its end."""

    pre: F64
    post: F64
    dur: F64
    code: I64
    add: I64
    lead: I64
    pconst: I64


def place(g: LevelGraph, x_tau: I64, i_tau: I64, v: NodeValues) -> I64:
    """Every node's end, (variants, nodes) in node-id order: level by level, all variants at once."""
    nv = x_tau.shape[0]
    end = np.zeros((nv, g.n + 1), np.int64)
    pre, post, dur, code, add, pconst = v.pre, v.post, v.dur, v.code, v.add, v.pconst
    add_f = add.astype(np.float64)
    # code 1 adds its excess to ``X + pre``; codes 2 and 3 wait for an arrival
    add1 = np.where(code == 1, add_f, 0.0)
    waits = (code == 2) | (code == 3)
    lead_f = v.lead.astype(np.float64)
    xt = x_tau[:, g.x_perm]
    it = np.broadcast_to(i_tau[g.i_perm], (nv, g.i_perm.size)) if i_tau.ndim == 1 else i_tau[:, g.i_perm]
    for lv, (a, b) in enumerate(g.bounds):
        xa, xb, xoff = g.x_lv[lv]
        xv = end[:, g.x_src[xa:xb]] + xt[:, xa:xb]
        x = xv if xoff is None else np.maximum.reduceat(xv, xoff, axis=1)
        base0 = (x + pre[:, a:b]) + add1[:, a:b]
        posted = base0 - lead_f[:, a:b]
        issued = end[:, g.p_src[a:b]] + pconst[:, a:b]
        w = waits[:, a:b]
        # the issue is later than the posting: an exact integer arrival, else a float one
        gt = _int_gt(issued, posted)
        ad = add[:, a:b]
        arr_i = np.where(w & gt, issued + ad, NEG_I)
        arr_f = np.where(w & ~gt, posted + add_f[:, a:b], NEG_F)
        fbest = np.maximum(base0, arr_f)
        ia, ib, ioff = g.i_lv[lv]
        if ib > ia:
            iv = end[:, g.i_src[ia:ib]] + it[:, ia:ib]
            ib_best = iv if ioff is None else np.maximum.reduceat(iv, ioff, axis=1)
            ibest = np.maximum(ib_best, arr_i)
        else:
            ibest = arr_i
        fb = np.where(_int_gt(ibest, fbest), ibest.astype(np.float64), fbest)
        out = ((fb + post[:, a:b]) + dur[:, a:b]).astype(np.int64)
        end[:, a:b] = np.where(g.is_virt[a:b], x, out) if g.virt[lv] else out
    return end[:, g.at[: g.n]]


def _int_gt(i: I64, f: F64) -> npt.NDArray[np.bool_]:
    """``i > f`` compared exactly (as Python compares an int with a float), not after rounding
    ``i`` to a float: epoch nanoseconds are beyond a float's exact integers."""
    fi = i.astype(np.float64)
    # equal after rounding: ``f`` is then a whole number within int64, exact as an integer
    out: npt.NDArray[np.bool_] = (fi > f) | ((fi == f) & (i > f.astype(np.int64)))
    return out


__all__ = ["NEG_F", "NEG_I", "EdgeList", "LevelGraph", "NodeValues", "levels", "place"]
