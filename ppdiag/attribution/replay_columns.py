"""The replay's nodes as the columns every variant reads (docs/json.md, *Time accounting*), and
what one variant puts on them: the local delays it keeps, the durations, the waits.

:func:`_variant_arrays` is shared by the level-by-level placement
(:mod:`ppdiag.attribution.replay_levels`) and by the node-at-a-time loop
(``replay_run._place_kinds``, which reads :class:`_LoopRows` and :func:`_kind_rows` too).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.replay_graph import ReplayGraph
from ppdiag.attribution.replay_index import _dense
from ppdiag.attribution.replay_nodes import Col, narrow

NEG_INF = -(2**62)

# one node of a variant in the replay's order: node id, (rank, step) of a step's first block or
# None, pre, post, duration, wait code, the wait's addition, lead, producer, producer's extra
# delay, fixed issue time, the producer and latency of its one label edge (-1 and 0: none, or
# not its only dependency), and (release, label edges) of the other nodes with dependencies
_Row = tuple[
    int,
    tuple[int, int] | None,
    float,
    float,
    float,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    tuple[int | None, list[tuple[int, int]]] | None,
]


@dataclass(frozen=True)
class _Flags:
    """Which kinds of delay a variant keeps (``False`` removes it); see :meth:`Replay.run`."""

    host: bool
    comm_excess: bool
    comm: bool
    copy: bool
    ux: bool


@dataclass
class _Columns:
    """The replay's nodes as columns: what every variant reads, without per-node attribute access."""

    pre: Col
    post: Col
    pre_host: Col
    pre_coll: Col
    pre_copy: Col
    pre_ux: Col
    span: Col
    busy: Col
    in_host: Col
    in_ux: Col
    in_copy: Col
    send_wait: npt.NDArray[np.bool_]
    has_obs: npt.NDArray[np.bool_]
    has_abs: npt.NDArray[np.bool_]
    xfer: npt.NDArray[np.int64]  # the observed transfer of the wait (0 without one)
    issue: Col  # the producer's issue delay
    issue_copy: npt.NDArray[np.int64]
    issue_held: Col  # the producer's issue delay with its send held (comm)
    lead: npt.NDArray[np.int64]
    on_compute: npt.NDArray[np.bool_]
    # the mean-cost factor's keys, (rank, stage, phase), and each node's key among them
    cost_keys: list[tuple[int, int, int]]
    cost_of: npt.NDArray[np.int32]
    # the measured ends and the fixed issue times less the graph's origin (ReplayGraph.origin)
    meas_end: npt.NDArray[np.int64]
    order: npt.NDArray[np.int64]  # node ids in the replay's order (measured start)
    prod: npt.NDArray[np.int64]  # by node id: the producer (-1: none) and the fixed issue time
    t_issue: npt.NDArray[np.int64]

    @classmethod
    def of(cls, rp: ReplayGraph) -> _Columns:
        nc = rp.cols
        c = nc.cols
        n = len(nc)

        def by_id(table: Mapping[int, tuple[int, ...] | int], k: int | None = None) -> npt.NDArray[np.int64]:
            # a column that is 0 except at the node ids of ``table`` (item ``k`` of each value)
            out = np.zeros(n, np.int64)
            vals = table.values() if k is None else (v[k] for v in table.values())  # type: ignore[index]
            out[nc.ids(dict(table))] = np.fromiter(vals, np.int64, len(table))
            return out

        def mask(ids: Collection[int]) -> npt.NDArray[np.bool_]:
            out = np.zeros(n, np.bool_)
            out[np.fromiter(ids, np.int64, len(ids))] = True
            return out

        has_obs, has_abs = nc.obs.has.copy(), mask(nc.obs_abs.keys())
        xfer = np.where(has_obs, nc.obs.column(2), np.where(has_abs, by_id(nc.obs_abs, 1), 0))
        keys, inv = _distinct_rows(c["rank"], c["stage"], c["phase"])
        return cls(
            pre=c["pre"],
            post=c["post"],
            pre_host=c["pre_host"],
            pre_coll=c["pre_coll"],
            pre_copy=c["pre_copy"],
            pre_ux=c["pre_ux"],
            span=c["span"],
            busy=c["busy"],
            in_host=c["in_host"],
            in_ux=c["in_ux"],
            in_copy=c["in_copy"],
            send_wait=mask(nc.send_wait),
            has_obs=has_obs,
            has_abs=has_abs,
            xfer=xfer,
            # (the delays narrowed as the graph's own columns are: see ``narrow``)
            issue=narrow(nc.obs.column(1)),
            # (views of the frozen graph's own columns: width-1 tables are contiguous already, and
            # these two are int64: a variant puts a far-past constant among the leads)
            issue_copy=np.asarray(nc.issue_copy.column(), np.int64),
            issue_held=narrow(by_id(nc.issue_held)),
            lead=np.asarray(nc.lead.column(), np.int64),
            on_compute=nc.on_compute,
            cost_keys=[(int(k[0]), int(k[1]), int(k[2])) for k in keys.tolist()],
            cost_of=inv.reshape(-1).astype(np.int32),
            # (the absolute times less the graph's origin: the variants' floats stay exact)
            meas_end=(np.asarray(rp.meas_start, np.int64) - rp.origin) + c["span"]
            if n
            else np.zeros(0, np.int64),
            order=np.asarray(rp.order, np.int64),
            prod=np.where(has_obs, nc.obs.column(0), np.int64(-1)),  # (int64: the plan adds to it)
            t_issue=np.where(has_abs, by_id(nc.obs_abs, 0) - rp.origin, 0),
        )


def _distinct_rows(*cols: Col) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The distinct rows of the columns ``cols`` (rows: one value of each) and each row's index
    among them: one sort of a code of each row."""
    if not cols[0].size:
        return np.zeros((0, len(cols)), np.int64), np.zeros(0, np.int64)
    _, first, inv = np.unique(_dense(list(cols)), return_index=True, return_inverse=True)
    return np.stack([c[first] for c in cols], axis=1), inv.reshape(-1)


@dataclass(frozen=True)
class _LoopRows:
    """What the node loop (``replay_run._place_kinds``) reads besides the variant's values, in the
    replay's order: node ids, the (rank, step) of a step's first block (None for the others), the
    producer and latency of a node's one label edge (-1 and 0: none), (release, label edges) of
    the other nodes with dependencies (or None), and which nodes take the general row (a step's
    first block, a node with a release)."""

    order_l: list[int]
    first_key_o: list[tuple[int, int] | None]
    edge_p: npt.NDArray[np.int64]
    edge_p_o: list[int]
    edge_t_o: list[int]
    deps_o: list[tuple[int | None, list[tuple[int, int]]] | None]
    general: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, rp: ReplayGraph, cols: _Columns) -> _LoopRows:
        nc = rp.cols
        c = nc.cols
        n = len(nc)
        order_l: list[int] = cols.order.tolist()
        is_first = np.zeros(n + 1, np.bool_)
        is_first[[f for key, f in rp.first.items() if rp.count[key]]] = True
        keys_l = list(zip(c["rank"].tolist(), c["step"].tolist(), strict=True))
        first_l = is_first[:n].tolist()
        # the nodes whose only dependency is one label edge take the loop's short path
        in_rel = np.zeros(n, np.bool_)
        in_rel[np.fromiter(nc.release.keys(), np.int64, len(nc.release))] = True
        has_e, ev = nc.edges.has, nc.edges.val
        single = has_e & ~in_rel
        # the others with dependencies (a release, and at most one label edge) are the few waits
        # on untraced ranks: (release, label edges) at their place in the loop's order
        deps_o: list[tuple[int | None, list[tuple[int, int]]] | None] = [None] * n
        at = np.empty(n, np.int64)
        at[cols.order] = np.arange(n)
        no_edges: list[tuple[int, int]] = []
        rel_ids = np.flatnonzero(in_rel)
        for i, k, e, p, t in zip(
            rel_ids.tolist(),
            at[rel_ids].tolist(),
            has_e[rel_ids].tolist(),
            ev[rel_ids, 0].tolist(),
            ev[rel_ids, 1].tolist(),
            strict=True,
        ):
            deps_o[k] = (nc.release[i] - rp.origin, [(p, t)] if e else no_edges)
        edge_p = np.where(single, ev[:, 0], -1)[cols.order]
        return cls(
            order_l=order_l,
            first_key_o=[keys_l[i] if first_l[i] else None for i in order_l],
            edge_p=edge_p,
            edge_p_o=edge_p.tolist(),
            edge_t_o=np.where(single, ev[:, 1], 0)[cols.order].tolist(),
            deps_o=deps_o,
            general=(is_first[:n] | in_rel)[cols.order],
        )


class _VariantArrays(NamedTuple):
    """Everything a variant puts on the nodes, in node-id order (see :func:`_variant_rows`)."""

    pre: npt.NDArray[np.float64]
    post: npt.NDArray[np.float64]
    dur: Col | npt.NDArray[np.float64]
    code: npt.NDArray[np.int64]
    add: npt.NDArray[np.int64]
    lead: npt.NDArray[np.int64]
    extra: npt.NDArray[np.signedinteger[Any]]
    factor: npt.NDArray[np.float64] | None


def _variant_arrays(
    cols: _Columns, lat: int, fl: _Flags, balanced: dict[tuple[int, int, int], float] | None
) -> _VariantArrays:
    """What a variant puts on every node: its local delays before and after the wait (scaled by
    the kinds of delay kept), its duration, its wait's code and addition, the lead of its posting,
    the producer's extra issue delay, and the mean-cost factor of each node (``balanced`` only)."""
    loc = cols.pre + cols.post
    keep = loc.copy()
    if not fl.host:
        keep -= cols.pre_host
    if not fl.comm:
        keep -= cols.pre_coll
    if not fl.copy:
        keep -= cols.pre_copy
    if not fl.ux:
        keep -= cols.pre_ux
    scale = np.where(loc > 0, keep / np.where(loc > 0, loc, 1), 0.0)
    dur: Col | npt.NDArray[np.float64]
    factor: npt.NDArray[np.float64] | None = None
    if balanced is not None:
        # one look-up per distinct (rank, stage, phase), not per node
        per_key = [balanced.get(k, 1.0) for k in cols.cost_keys]
        factor = np.asarray(per_key, np.float64)[cols.cost_of] if per_key else np.zeros(0, np.float64)
        dur = cols.busy * factor + cols.in_host + cols.in_ux + cols.in_copy
    else:
        dur = cols.span.copy()
    if not fl.host:
        dur = dur - cols.in_host
    if not fl.copy:
        dur = dur - cols.in_copy
    if not fl.ux:
        dur = dur - cols.in_ux
    # the wait of each node: 1 its own send (comm removed), 2 a producer block, 3 a fixed issue
    own_send = cols.send_wait & (not fl.comm)
    code = np.where(own_send, 1, np.where(cols.has_obs, 2, np.where(cols.has_abs, 3, 0)))
    xfer_a = cols.xfer if fl.comm_excess else np.minimum(cols.xfer, lat)
    excess = np.maximum(cols.xfer - lat, 0) if fl.comm_excess else np.zeros_like(cols.xfer)
    extra = (
        (cols.issue if fl.host else 0)
        + (cols.issue_copy if fl.copy else 0)
        + (cols.issue_held if fl.comm_excess else 0)
        + 0 * cols.issue
    )
    return _VariantArrays(
        pre=np.multiply(cols.pre, scale, dtype=np.float64),
        post=np.multiply(cols.post, scale, dtype=np.float64),
        dur=dur,
        code=code,
        # code 1 adds the excess, 2 and 3 wait for the transfer
        add=np.where(own_send, excess, xfer_a),
        # code 2 waits for its producer's end (+ issue delay), code 3 for a fixed issue time
        lead=cols.lead if fl.comm else np.where(cols.on_compute, -NEG_INF, cols.lead),
        extra=extra,
        factor=factor,
    )


# per value column of the loop rows: the variant's array and its list in the loop's order, kept
# for the next variant
ListMemo = dict[str, tuple[npt.NDArray[np.int64] | npt.NDArray[np.float64], list[Any]]]


def _ordered(
    name: str, arr: npt.NDArray[Any], order: npt.NDArray[np.int64] | None, memo: ListMemo
) -> list[Any]:
    """``arr[order].tolist()`` (``order`` None: ``arr`` is in the loop's order already), or the
    list the previous variant made of an equal array (same dtype, same values): most variants
    change a few of the columns (e.g. removing host delay leaves the waits' codes, additions and
    leads as they were), and each list costs a copy and a Python object per node."""
    hit = memo.get(name)
    if hit is not None and hit[0].dtype == arr.dtype and np.array_equal(hit[0], arr):
        return hit[1]
    out: list[Any] = (arr if order is None else arr[order]).tolist()
    memo[name] = (arr, out)
    return out


# the node kinds of the loop's fast paths (``replay_run._place_kinds``), by how a node is placed:
# after its previous block and one label edge, or a producer block's wait whose producer is its
# label edge's, or after its previous block only, or a producer wait without a label edge; every
# other node (a step's first block, a wait on its own send or on a fixed issue, a release, a wait
# whose label edge is another block's) is placed by the general row (``replay_run._place_nodes``)
K_EDGE, K_WAIT, K_PLAIN, K_WAIT_ONLY, K_OTHER = 0, 1, 2, 3, 4


class _KindRows(NamedTuple):
    """What the kind loop reads of one variant, in the loop's order: per node (id, kind, pre,
    post, duration, the block it reads (the label edge's producer, or the wait's producer
    for K_WAIT_ONLY) and the label edge's latency, the wait's addition, lead and the producer's
    extra delay); per K_OTHER node its whole :data:`_Row`."""

    main: Iterator[tuple[int, int, float, float, float, int, int, int, int, int]]
    others: Iterator[_Row]


def _node_kinds(
    code: npt.NDArray[np.int64], prod: npt.NDArray[np.int64], lr: _LoopRows
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each node's kind and the block it reads (loop order) from its wait code and producer (loop
    order) and its dependencies."""
    edge = lr.edge_p >= 0
    wait = np.where(edge, np.where(lr.edge_p == prod, K_WAIT, K_OTHER), K_WAIT_ONLY)
    kind = np.where(code == 0, np.where(edge, K_EDGE, K_PLAIN), np.where(code == 2, wait, K_OTHER))
    kind[lr.general] = K_OTHER
    return kind, np.where(kind == K_WAIT_ONLY, prod, lr.edge_p)


def _kind_rows(va: _VariantArrays, cols: _Columns, lr: _LoopRows, memo: ListMemo | None = None) -> _KindRows:
    """Everything the kind loop reads under the variant, in the loop's order (zips instead of
    indexing per node); ``memo`` carries the lists from one variant to the next."""
    order = cols.order
    m: ListMemo = {} if memo is None else memo
    code = va.code[order]
    prod = cols.prod[order]
    kind, reads = _node_kinds(code, prod, lr)
    main = zip(
        lr.order_l,
        _ordered("kind", kind, None, m),
        _ordered("pre", va.pre, order, m),
        _ordered("post", va.post, order, m),
        _ordered("dur", va.dur, order, m),
        _ordered("reads", reads, None, m),
        lr.edge_t_o,
        _ordered("add", va.add, order, m),
        _ordered("lead", va.lead, order, m),
        _ordered("extra", va.extra, order, m),
        strict=True,
    )
    g = np.flatnonzero(kind == K_OTHER)
    og = order[g]
    g_l = g.tolist()
    others = zip(
        og.tolist(),
        [lr.first_key_o[j] for j in g_l],
        va.pre[og].tolist(),
        va.post[og].tolist(),
        va.dur[og].tolist(),
        code[g].tolist(),
        va.add[og].tolist(),
        va.lead[og].tolist(),
        prod[g].tolist(),
        va.extra[og].tolist(),
        cols.t_issue[og].tolist(),
        lr.edge_p[g].tolist(),
        [lr.edge_t_o[j] for j in g_l],
        [lr.deps_o[j] for j in g_l],
        strict=True,
    )
    return _KindRows(main, others)


__all__ = ["K_EDGE", "K_OTHER", "K_PLAIN", "K_WAIT", "K_WAIT_ONLY", "NEG_INF"]
