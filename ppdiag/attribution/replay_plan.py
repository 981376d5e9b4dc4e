"""The replay graph as the level schedule of :mod:`ppdiag.attribution.replay_levels` (docs/json.md,
*Time accounting*): its edges, and the step windows the node-at-a-time loop would have fixed.

The loop (``replay_run._place_nodes``) places the nodes in measured order and reads each
dependency's end as it stands then: a dependency placed later in that order is read as measured,
a constant. A step's window start is fixed when its first block is placed (the previous step's
end then), and a step-end sync's arrival when the first of its members' successors needs it: the
sync becomes a *virtual* node placed just before that block, whose edges are its members' last
blocks. Every other edge goes from a node placed before to one placed after, so the graph the
levels see has no cycle, and each node reads exactly what the loop read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.replay_graph import ReplayGraph
from ppdiag.attribution.replay_levels import NEG_I, EdgeList, LevelGraph

I64 = npt.NDArray[np.int64]


def vectorizable(rp: ReplayGraph) -> bool:
    """Whether the level schedule reproduces the loop: every analyzed step holds a block (a step
    without one takes its window from its predecessor's, a chain the edges do not model) and is
    analyzed once."""
    keys = [(rs.rank, rs.step) for rs in rp.steps]
    return bool(keys) and len(set(keys)) == len(keys) and all(rp.count.get(k, 0) > 0 for k in keys)


# nodes per level (summed over the variants placed together) below which the level schedule
# costs more than the node-at-a-time loop: each level is a fixed ~30 numpy calls (tens of µs),
# each node about 1 µs in the loop and a quarter of that in a level
MIN_WIDTH = 256


def chain_depth(rp: ReplayGraph) -> int:
    """The most blocks one rank runs in a row of chained steps: a lower bound of the graph's
    levels (a rank's blocks follow one another, and a chained step follows its predecessor)."""
    depth: dict[tuple[int, int], int] = {}
    for rs in sorted(rp.steps, key=lambda rs: rs.w0):
        key = (rs.rank, rs.step)
        prev = rp.prev_step.get(key)
        depth[key] = rp.count.get(key, 0) + (depth.get(prev, 0) if prev is not None else 0)
    return max(depth.values(), default=0)


def wide_enough(rp: ReplayGraph, variants: int) -> bool:
    """Whether placing ``variants`` together by levels beats the loop: a graph as deep as its
    chains are long (many chained steps of few ranks, e.g. 4 ranks x 128 steps x 512 blocks)
    has a handful of nodes per level, and its tens of thousands of levels cost more than the
    loop; sampled steps of many ranks (thousands of nodes per level) cost far less."""
    depth = chain_depth(rp)
    return depth > 0 and sum(rp.count.values()) * variants >= MIN_WIDTH * depth


@dataclass(frozen=True)
class PlacementPlan:
    """The level schedule of a replay graph (built once; every variant batch reads it)."""

    n: int  # real nodes (the virtual ones follow them)
    graph: LevelGraph
    xe: EdgeList
    # the I-edges' latencies: all the variants read of them (their ends and sources are the
    # graph's, by level; the edge list itself is not kept)
    i_k0: I64
    first_edge: dict[tuple[int, int], int]  # (rank, step) -> the X-edge of its first block
    sync_node: dict[int, int]  # a sync fixed during the loop -> its virtual node
    prod_const: I64  # per real node: the producer's measured end (not placed yet) or fixed issue
    prod_live: npt.NDArray[np.bool_]  # per real node: its producer is placed before it

    @classmethod
    def of(
        cls,
        rp: ReplayGraph,
        order: I64,
        meas_end: I64,
        prod: I64,
        t_issue: I64,
        has_abs: npt.NDArray[np.bool_],
    ) -> PlacementPlan:
        """``order``: node ids in measured order; ``prod``: each node's producer (-1: none);
        ``t_issue``: the fixed issue time of a wait on an operation issued before any block.
        ``meas_end`` and ``t_issue`` are less ``rp.origin``, as every time the plan reads."""
        n = int(order.size)
        pos2 = np.empty(n, np.int64)
        pos2[order] = 2 * np.arange(n)  # odd positions: virtual nodes, just before a block
        q_sync: dict[int, int] = {}
        for key, prev in rp.prev_step.items():
            s = rp.sync_of.get(prev)
            if s is not None:
                q_sync[s] = min(q_sync.get(s, 2 * n + 1), int(pos2[rp.first[key]]))
        sync_node = {s: n + j for j, s in enumerate(sorted(q_sync))}
        total = n + len(sync_node)
        sent = total
        vpos = np.r_[pos2, np.array([q_sync[s] - 1 for s in sorted(q_sync)], np.int64)]
        xe, first_edge = _x_edges(rp, vpos, meas_end, sync_node, sent)
        ie = _i_edges(rp, pos2, meas_end, sent, total)
        has_p = prod >= 0
        p = np.where(has_p, prod, 0)
        live = has_p & (pos2[p] < pos2)
        prod_src = np.r_[np.where(live, prod, sent), np.full(len(sync_node), sent, np.int64)]
        prod_const = np.where(has_p & ~live, meas_end[p], np.where(has_abs & ~has_p, t_issue, 0))
        virtual = np.r_[np.zeros(n, np.bool_), np.ones(len(sync_node), np.bool_)]
        graph = LevelGraph.build(total, xe, ie, prod_src, virtual)
        return cls(n, graph, xe, ie.k0, first_edge, sync_node, prod_const.astype(np.int64), live)


def _edges(rows: list[tuple[int, int, int, int, int, int]]) -> EdgeList:
    a = np.array(rows, np.int64).reshape(-1, 6)
    return EdgeList(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5])


def _x_edges(
    rp: ReplayGraph, vpos: I64, meas_end: I64, sync_node: dict[int, int], sent: int
) -> tuple[EdgeList, dict[tuple[int, int], int]]:
    """Each block's X-edges: the previous block of its step, or for a step's first block its
    window start (the previous step's end: its last block plus its tail, or the sync it joins),
    and each virtual sync's members' arrivals with the sync's transfer."""
    n = meas_end.size
    is_first = np.zeros(n, np.bool_)
    is_first[[rp.first[(rs.rank, rs.step)] for rs in rp.steps]] = True
    i = np.flatnonzero(~is_first)
    live = vpos[i - 1] < vpos[i]
    z = np.zeros(i.size, np.int64)
    inner = EdgeList(i, np.where(live, i - 1, sent), np.where(live, 0, meas_end[i - 1]), z, z, z)
    rows: list[tuple[int, int, int, int, int, int]] = []
    first_edge: dict[tuple[int, int], int] = {}

    def last_of(key: tuple[int, int], at: int) -> tuple[int, int]:
        # (source, constant) of a step's last block read at position ``at``
        last = rp.first[key] + rp.count[key] - 1
        return (last, 0) if vpos[last] < at else (sent, int(meas_end[last]))

    for rs in rp.steps:
        key = (rs.rank, rs.step)
        f = rp.first[key]
        first_edge[key] = i.size + len(rows)
        prev = rp.prev_step.get(key)
        if prev is None:
            rows.append((f, sent, rp.w0[key] - rp.origin, 0, 0, 0))
        elif (s := rp.sync_of.get(prev)) is None:
            busy_t, coll_t, host_t, other_t, copy_t = rp.tail[prev]
            src, c = last_of(prev, int(vpos[f]))
            rows.append((f, src, c + busy_t + other_t, host_t, coll_t, copy_t))
        else:
            b3, h3, o3, c3, p3 = rp.tail_coll[prev][3]
            rows.append((f, sync_node[s], b3 + o3, h3, p3, c3))
    for s, v in sync_node.items():
        members, xfer = rp.syncs[s]
        for m in members:
            b2, h2, o2, c2, p2 = rp.tail_coll[m][2]
            src, c = last_of(m, int(vpos[v]))
            rows.append((v, src, c + b2 + o2, h2, p2 + xfer, c2))
    rest = _edges(rows)
    return (
        EdgeList(*(np.concatenate([getattr(inner, k), getattr(rest, k)]) for k in _FIELDS)),
        first_edge,
    )


_FIELDS = ("dst", "src", "k0", "k_host", "k_comm", "k_copy")


def _i_edges(rp: ReplayGraph, pos2: I64, meas_end: I64, sent: int, total: int) -> EdgeList:
    """Each node's integer dependencies: its label edges and a fixed release (a node with none
    gets a constant far in the past, so that every node has one)."""
    nc = rp.cols
    # (one label edge per node: the edges by node id, as arrays)
    dst_e = nc.edges.ids()
    pt = nc.edges.val[dst_e]
    live = pos2[pt[:, 0]] < pos2[dst_e]
    src_e = np.where(live, pt[:, 0], sent)
    k_e = pt[:, 1] + np.where(live, 0, meas_end[pt[:, 0]])
    dst_r = np.fromiter(nc.release.keys(), np.int64, len(nc.release))
    k_r = np.fromiter(nc.release.values(), np.int64, len(nc.release)) - rp.origin
    has = np.zeros(total, np.bool_)
    has[dst_e] = True
    has[dst_r] = True
    dst_n = np.flatnonzero(~has)
    dst = np.concatenate([dst_e, dst_r, dst_n])
    src = np.concatenate([src_e, np.full(dst_r.size + dst_n.size, sent, np.int64)])
    k0 = np.concatenate([k_e, k_r, np.full(dst_n.size, NEG_I, np.int64)])
    z = np.zeros(dst.size, np.int64)
    return EdgeList(dst, src, k0, z, z, z)


__all__ = [
    "MIN_WIDTH",
    "PlacementPlan",
    "chain_depth",
    "vectorizable",
    "wide_enough",
]
