"""The replay's evaluation (docs/json.md, *Time accounting*): the block graph of
:mod:`ppdiag.attribution.replay_graph` run under one variant, some kinds of delay removed.

Every quantity that depends only on the variant is computed for all nodes at once
(:mod:`ppdiag.attribution.replay_columns`). The nodes are then placed over the levels of the
dependency graph (:mod:`ppdiag.attribution.replay_plan`, :mod:`ppdiag.attribution.replay_levels`):
each level's nodes and every variant asked together at once, with the arithmetic of the loop
over the nodes in measured order (:func:`_place_nodes`, run by :func:`_place_kinds` with fast
paths for the common kinds of node), which places a graph too deep for the levels (a few ranks,
many chained steps: a handful of nodes per level) and one the levels do not model (a step
without blocks). ``tests/test_replay_identity.py`` checks both against one
node at a time, ``tests/test_replay_levels.py`` the levels against a loop on random graphs.

Both place the nodes on times less the graph's integer origin (:attr:`ReplayGraph.origin`): the
floats of a variant's local delays added to epoch nanoseconds would round to 256 ns.
``tests/test_replay_origin.py`` holds a run at an epoch origin to the same run at 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.rank_step import RankStep
from ppdiag.attribution.replay_columns import (
    K_EDGE,
    K_PLAIN,
    K_WAIT,
    K_WAIT_ONLY,
    NEG_INF,
    ListMemo,
    _Columns,
    _Flags,
    _kind_rows,
    _KindRows,
    _LoopRows,
    _Row,
    _variant_arrays,
)
from ppdiag.attribution.replay_graph import ReplayGraph
from ppdiag.attribution.replay_levels import NodeValues, place
from ppdiag.attribution.replay_plan import PlacementPlan, vectorizable, wide_enough
from ppdiag.model import RankTimeline
from ppdiag.parsers.heap import trim_heap
from ppdiag.pipeline.clocks import P2POps

# variants x nodes placed together at most (the placement holds ~12 arrays of them: ~40 MB)
PLACE_BUDGET = 400_000

# what a variant gives: (window, idle) of every (rank, step)
_Idle = dict[tuple[int, int], tuple[int, int]]


class Variant(NamedTuple):
    """A variant of the replay: which kinds of delay it keeps (see :meth:`Replay.run`)."""

    host: bool = True
    comm_excess: bool = True
    comm: bool = True
    copy: bool = True
    ux: bool = True
    balanced: dict[tuple[int, int, int], float] | None = None


# a variant's memo key: its effective flags and mean costs
_MemoKey = tuple[_Flags, tuple[tuple[tuple[int, int, int], float], ...] | None]


class _Windows:
    """The step windows of one variant, computed on demand: a step starts where the rank's
    previous chained step ends (the first analyzed step keeps its measured start), and ends after
    its tail, or at its step-end sync (the last member's arrival plus the sync's transfer)."""

    def __init__(self, rp: ReplayGraph, end: list[int], fl: _Flags) -> None:
        self.rp = rp
        self.end = end  # every node's end in the variant (a node not replayed yet: as measured)
        self.fl = fl
        self.w_start: dict[tuple[int, int], int] = {}
        self.w_end: dict[tuple[int, int], int] = {}
        self.sync_end: dict[int, int] = {}

    def last_end(self, key: tuple[int, int]) -> int:
        f, c = self.rp.first[key], self.rp.count[key]
        return self.end[f + c - 1] if c else self.start(key)

    def start(self, key: tuple[int, int]) -> int:
        if key not in self.w_start:
            prev = self.rp.prev_step.get(key)
            self.w_start[key] = self.stop(prev) if prev is not None else self.rp.w0[key] - self.rp.origin
        return self.w_start[key]

    def local(self, piece: tuple[int, int, int, int, int]) -> int:
        busy_p, host_p, other_p, copy_p, p2p_p = piece
        fl = self.fl
        return (
            busy_p
            + other_p
            + (host_p if fl.host else 0)
            + (copy_p if fl.copy else 0)
            + (p2p_p if fl.comm else 0)
        )

    def stop(self, key: tuple[int, int]) -> int:
        if key in self.w_end:
            return self.w_end[key]
        rp, fl = self.rp, self.fl
        sync = rp.sync_of.get(key)
        if sync is not None:
            if sync not in self.sync_end:
                members, xfer = rp.syncs[sync]
                arrive = NEG_INF
                for m in members:
                    arrive = max(arrive, self.last_end(m) + self.local(rp.tail_coll[m][2]))
                self.sync_end[sync] = arrive + (xfer if fl.comm else 0)
            val = self.sync_end[sync] + self.local(rp.tail_coll[key][3])
        else:
            busy_t, coll_t, host_t, other_t, copy_t = rp.tail[key]
            val = (
                self.last_end(key)
                + busy_t
                + other_t
                + (coll_t if fl.comm else 0)
                + (host_t if fl.host else 0)
                + (copy_t if fl.copy else 0)
            )
        self.w_end[key] = int(val)
        return self.w_end[key]


class _PlacedWindows(_Windows):
    """:class:`_Windows` of a variant placed by levels: the nodes' ends stay one array row (the
    windows read only the last block of some steps; a list of every node's end was the largest
    object of each variant batch at a thousand ranks)."""

    def __init__(self, rp: ReplayGraph, ends: npt.NDArray[np.int64], fl: _Flags) -> None:
        super().__init__(rp, [], fl)
        self.ends = ends

    def last_end(self, key: tuple[int, int]) -> int:
        f, c = self.rp.first[key], self.rp.count[key]
        return int(self.ends[f + c - 1]) if c else self.start(key)


def _place_nodes(win: _Windows, rows: Iterator[_Row]) -> None:
    """Place every node in measured order: after the previous block (or its step's start) and its
    local delay before the wait, its wait's release, its label edges, then its local delay after
    the wait and its duration."""
    # ``if x > y: y = x`` is ``max(y, x)`` (the first argument on a tie) without a call: this loop
    # runs once per node and variant, millions of times on a long run; the common cases come
    # first (no wait, a producer block's wait, one label edge): most nodes of a 1F1B run have
    # no wait (c == 0), and one test passes them
    end = win.end
    for i, fk, pre, post, du, c, add, lead, prod, extra, t_iss, ep, et, deps in rows:
        base = (win.start(fk) if fk is not None else end[i - 1]) + pre
        if c:
            if c == 2:
                # the transfer starts once the producer issued it and this rank had posted its
                # side (``lead`` before it began to wait); the block waits for its arrival
                posted = base - lead
                issued = end[prod] + extra
                arrive = (issued if issued > posted else posted) + add
                if arrive > base:
                    base = arrive
            elif c == 1:
                # waiting for its own send: no data dependency, the wait overlaps once comm
                # does; only a slow link's excess over the normal transfer stays (blocking sends)
                base += add
            else:  # c == 3
                posted = base - lead
                arrive = (t_iss if t_iss > posted else posted) + add
                if arrive > base:
                    base = arrive
        if ep >= 0:
            t = end[ep] + et
            if t > base:
                base = t
        elif deps is not None:
            rel, eds = deps
            if rel is not None and rel > base:
                base = rel
            for p, tau in eds:
                t = end[p] + tau
                if t > base:
                    base = t
        end[i] = int((base + post) + du)


def _place_kinds(win: _Windows, rows: _KindRows) -> None:
    """:func:`_place_nodes` with the common nodes on fast paths: each node's kind says which of
    its fields it reads, so the loop zips ten columns instead of fourteen and tests one kind
    instead of the first block, the code and the edges, and a wait on its label edge's producer
    reads that block's end once; every other node (a step's first block, a release, a wait on
    its own send or a fixed issue) is placed by :func:`_place_nodes` itself. Each fast path is
    the general row's arithmetic for that kind, the same operations in the same order (the same
    ints and floats, e.g. a tie keeps ``posted``)."""
    # the kinds by how often they come in a 1F1B run: half the nodes have one label edge and no
    # wait, a third a producer wait with its label edge
    end = win.end
    other = rows.others.__next__
    # (the kinds as locals: no global look-up per node and test)
    k_edge, k_wait, k_plain, k_wait_only = K_EDGE, K_WAIT, K_PLAIN, K_WAIT_ONLY
    for i, kind, pre, post, du, ep, et, add, lead, extra in rows.main:
        if kind == k_edge:
            base = end[i - 1] + pre
            t = end[ep] + et
            if t > base:
                base = t
        elif kind == k_wait:
            base = end[i - 1] + pre
            e = end[ep]  # the producer's end, also its label edge's source
            posted = base - lead
            issued = e + extra
            arrive = (issued if issued > posted else posted) + add
            if arrive > base:
                base = arrive
            t = e + et
            if t > base:
                base = t
        elif kind == k_plain:
            base = end[i - 1] + pre
        elif kind == k_wait_only:
            base = end[i - 1] + pre
            posted = base - lead
            issued = end[ep] + extra  # (``ep``: the producer)
            arrive = (issued if issued > posted else posted) + add
            if arrive > base:
                base = arrive
        else:
            _place_nodes(win, iter((other(),)))
            continue
        end[i] = int((base + post) + du)


def _kinds_present(rp: ReplayGraph, cols: _Columns) -> _Flags:
    """Which kinds of delay the run has at all: ``False`` where every number a variant would remove
    for it is zero (no host delay, no transfer above the normal latency, no exposed comm, no
    copy, no unexplained idle), so that removing it leaves every variant as it is."""
    tails = list(rp.tail.values())
    pieces = [p for tc in rp.tail_coll.values() for p in (tc[2], tc[3])]

    def any_of(*arrays: npt.NDArray[np.integer[Any]] | npt.NDArray[np.bool_]) -> bool:
        return any(bool(a.any()) for a in arrays)

    def tail_has(k: int) -> bool:
        return any(t[k] != 0 for t in tails)

    def piece_has(k: int) -> bool:
        return any(p[k] != 0 for p in pieces)

    # tail: busy, coll, host, other, copy; pieces: busy, host, other, copy, p2p
    return _Flags(
        host=any_of(cols.pre_host, cols.in_host, cols.issue) or tail_has(2) or piece_has(1),
        comm_excess=bool((cols.xfer > rp.normal_latency).any() or cols.issue_held.any()),
        comm=any_of(cols.pre_coll, cols.send_wait, cols.on_compute)
        or tail_has(1)
        or piece_has(4)
        or any(x != 0 for _, x in rp.syncs.values()),
        copy=any_of(cols.pre_copy, cols.in_copy, cols.issue_copy) or tail_has(4) or piece_has(3),
        ux=any_of(cols.pre_ux, cols.in_ux),
    )


def _step_idle(
    rp: ReplayGraph, cols: _Columns, win: _Windows, factor: npt.NDArray[np.float64] | None
) -> _Idle:
    """``(window, idle)`` of every (rank, step) once its nodes are placed. Under ``balanced`` the
    blocks' compute is at the mean cost (what is left of each span once its host, copy and other
    idle is taken out), summed per step by prefix sums."""
    cum_delta: list[int] = []
    if factor is not None:
        bal = (cols.busy * factor).astype(np.int64)
        cum_delta = np.concatenate([[0], np.cumsum(bal - cols.busy)]).tolist()
    idle: _Idle = {}
    for rs in rp.steps:
        key = (rs.rank, rs.step)
        f, c = rp.first[key], rp.count[key]
        w0 = win.start(key)
        w1 = win.stop(key)
        busy = rs.acct.compute
        if factor is not None and c:
            busy = busy + int(cum_delta[f + c] - cum_delta[f])
        idle[key] = (int(w1 - w0), int(w1 - w0 - busy))
    return idle


class _StepRows(NamedTuple):
    """Per analyzed step (in :attr:`Replay.steps` order), what the level placement reads."""

    keys: list[tuple[int, int]]
    fe: npt.NDArray[np.int64]  # its first edge in the plan
    fe_src: npt.NDArray[np.int64]  # and that edge's source node
    first: npt.NDArray[np.int64]  # its first node
    n_nodes: npt.NDArray[np.int64]  # and how many
    busy: npt.NDArray[np.int64]  # its block compute
    nxt: npt.NDArray[np.int64]  # the step chained after it, -1: none
    last_keys: list[tuple[int, int]]  # the steps without a chained successor


class _TailRows(NamedTuple):
    """Per step without a chained successor (the order of :attr:`_StepRows.last_keys`)."""

    li: npt.NDArray[np.int64]  # its index among the steps
    has_nodes: npt.NDArray[np.bool_]
    last_node: npt.NDArray[np.int64]  # its last block's node (0 without blocks)
    tail: npt.NDArray[np.int64]  # busy, coll, host, other, copy after the last block
    is_sync: npt.NDArray[np.bool_]  # it ends in a step-end sync
    sync_v: npt.NDArray[np.int64]  # the sync's virtual node in the plan, -1: none
    after: npt.NDArray[np.int64]  # busy, host, other, copy, p2p after the sync


class Replay(ReplayGraph):
    """The block graph of the analyzed steps and its evaluation under counterfactual changes."""

    def __init__(
        self,
        steps: list[RankStep],
        timelines: dict[int, RankTimeline],
        ops: dict[int, P2POps],
        last_stage: int,
    ) -> None:
        super().__init__(steps, timelines, ops, last_stage)
        # the build's temporaries (the steps' sets laid on one line, the pieces) are freed: their
        # pages back to the system before the variants' placement allocates its own
        trim_heap()
        self._cols: _Columns | None = None
        self._matters: _Flags | None = None
        # results by the variant's effective flags and mean costs: variants that differ only in
        # kinds of delay the run does not have are the same computation
        self._memo: dict[_MemoKey, _Idle] = {}
        self._placement: PlacementPlan | None = None
        self._step_rows_memo: _StepRows | None = None
        self._tail_rows_memo: _TailRows | None = None

    def _columns(self) -> _Columns:
        """The nodes as columns (built once, reused by every variant)."""
        if self._cols is None:
            self._cols = _Columns.of(self)
        return self._cols

    def _effective(self, fl: _Flags) -> _Flags:
        """``fl`` with every kind of delay the run does not have kept (removing it changes no
        number of the replay: the variant is the same computation)."""
        if self._matters is None:
            self._matters = _kinds_present(self, self._columns())
        m = self._matters
        return _Flags(
            host=fl.host or not m.host,
            comm_excess=fl.comm_excess or not m.comm_excess,
            comm=fl.comm or not m.comm,
            copy=fl.copy or not m.copy,
            ux=fl.ux or not m.ux,
        )

    def run(
        self,
        *,
        host: bool = True,
        comm_excess: bool = True,
        comm: bool = True,
        copy: bool = True,
        ux: bool = True,
        balanced: dict[tuple[int, int, int], float] | None = None,
    ) -> _Idle:
        """``(window, idle)`` of every (rank, step) under a variant; ``False`` removes that delay.

        ``host``: host delays (launched after the gap began, a producer's late issue);
        ``comm_excess``: transfer time above the normal latency on the waits (slow links);
        ``comm``: exposed communication that is not a pipeline transfer (p2p and collectives between
        blocks, the step-end sync's transfer); ``copy``: exposed copies; ``ux``: local idle with no
        evidence; ``balanced``: each rank's blocks scaled to the mean work per rank
        (``mean_costs``). The pipeline transfers keep at least the normal latency in every
        variant: that latency is part of the schedule.

        Consecutive steps of a rank are chained: a step starts where the rank's previous step ends
        in the same variant (a faster previous step lets the next one begin earlier); the first
        analyzed step keeps its measured start.
        """
        return self.run_many([Variant(host, comm_excess, comm, copy, ux, balanced)])[0]

    def run_many(self, variants: Sequence[Variant]) -> list[_Idle]:
        """:meth:`run` of each variant; those not computed yet are placed together, level by level
        over the block graph (one pass of numpy operations for all of them)."""
        cols = self._columns()
        keys = []
        todo: dict[_MemoKey, tuple[_Flags, dict[tuple[int, int, int], float] | None]] = {}
        for v in variants:
            fl = self._effective(
                _Flags(host=v.host, comm_excess=v.comm_excess, comm=v.comm, copy=v.copy, ux=v.ux)
            )
            key = (fl, tuple(sorted(v.balanced.items())) if v.balanced is not None else None)
            keys.append(key)
            if key not in self._memo:
                todo[key] = (fl, v.balanced)
        if todo and vectorizable(self) and wide_enough(self, len(todo)):
            # a few variants at a time: the placement holds about a dozen (variants, nodes) arrays
            items = list(todo.items())
            per = max(1, PLACE_BUDGET // max(len(self.cols), 1))
            for a in range(0, len(items), per):
                self._run_levels(cols, dict(items[a : a + per]))
        lr: _LoopRows | None = None
        lists: ListMemo = {}
        meas_end: list[int] | None = None
        for key, (fl, balanced) in todo.items():
            if key not in self._memo:
                va = _variant_arrays(cols, self.normal_latency, fl, balanced)
                # each variant starts from a copy of one list of the measured ends (a list copy
                # shares the int objects: a few times cheaper than a list from the array)
                meas_end = meas_end or cols.meas_end.tolist()
                win = _Windows(self, meas_end.copy(), fl)
                lr = lr or _LoopRows.of(self, cols)
                _place_kinds(win, _kind_rows(va, cols, lr, lists))
                self._memo[key] = _step_idle(self, cols, win, va.factor)
        return [dict(self._memo[k]) for k in keys]

    def _plan(self, cols: _Columns) -> PlacementPlan:
        if self._placement is None:
            meas_end = cols.meas_end
            # the plan is built once and held by every variant batch: the pages freed before it
            # (the mean costs' lists) and by its build go back to the system around it
            trim_heap()
            self._placement = PlacementPlan.of(
                self, cols.order, meas_end, cols.prod, cols.t_issue, cols.has_abs
            )
            trim_heap()
        return self._placement

    def _step_rows(self, plan: PlacementPlan) -> _StepRows:
        """The steps in :attr:`steps` order (the order of ``first_edge``), with what their idle
        reads; built once (the variants are placed a few at a time, and these do not change)."""
        if self._step_rows_memo is None:
            keys = list(plan.first_edge)
            fe = np.fromiter(plan.first_edge.values(), np.int64, len(keys))
            first = np.fromiter((self.first[kk] for kk in keys), np.int64, len(keys))
            count = np.fromiter((self.count[kk] for kk in keys), np.int64, len(keys))
            busy = np.fromiter((rs.acct.compute for rs in self.steps), np.int64, len(keys))
            at = {kk: i for i, kk in enumerate(keys)}
            # a step followed by another ends where that one starts; the last ones are computed
            nxt = np.full(len(keys), -1, np.int64)
            for b, a in self.prev_step.items():
                nxt[at[a]] = at[b]
            last_keys = [keys[i] for i in np.flatnonzero(nxt < 0).tolist()]
            self._step_rows_memo = _StepRows(keys, fe, plan.xe.src[fe], first, count, busy, nxt, last_keys)
        return self._step_rows_memo

    def _last_stops(
        self,
        plan: PlacementPlan,
        ends: npt.NDArray[np.int64],
        w0: npt.NDArray[np.int64],
        fl: _Flags,
        last_keys: list[tuple[int, int]],
    ) -> npt.NDArray[np.int64]:
        """:meth:`_Windows.stop` of every step without a chained successor, as arrays: its last
        block's end (its start without blocks) plus its tail, or its sync's end plus what follows
        the sync; a sync the plan did not place is resolved by :meth:`_Windows.stop` itself."""
        t = self._tail_rows(plan)
        c, h, cp = int(fl.comm), int(fl.host), int(fl.copy)
        last_end = np.where(t.has_nodes, ends[t.last_node], w0[t.li])
        tail = t.tail
        out = last_end + tail[:, 0] + tail[:, 3] + tail[:, 1] * c + tail[:, 2] * h + tail[:, 4] * cp
        a = t.after  # busy, host, other, copy, p2p after the sync
        local = a[:, 0] + a[:, 2] + a[:, 1] * h + a[:, 3] * cp + a[:, 4] * c
        placed = t.sync_v >= 0
        out[placed] = ends[t.sync_v[placed]] + local[placed]
        rest = np.flatnonzero(t.is_sync & ~placed)
        if rest.size:
            win = _PlacedWindows(self, ends[: plan.n], fl)
            keys = self._step_rows(plan).keys
            win.w_start = dict(zip(keys, w0.tolist(), strict=True))
            win.w_end = {prev: win.w_start[b] for b, prev in self.prev_step.items()}
            win.sync_end = {s: int(ends[v]) for s, v in plan.sync_node.items()}
            out[rest] = [win.stop(last_keys[i]) for i in rest.tolist()]
        return out

    def _tail_rows(self, plan: PlacementPlan) -> _TailRows:
        """What :meth:`_last_stops` reads of each step without a successor (built once)."""
        if self._tail_rows_memo is None:
            rows = self._step_rows(plan)
            li = np.flatnonzero(rows.nxt < 0)
            n_nodes = rows.n_nodes[li]
            last = rows.first[li] + n_nodes - 1
            sync = [self.sync_of.get(k) for k in rows.last_keys]
            zero = (0, 0, 0, 0, 0)
            pairs = zip(rows.last_keys, sync, strict=True)
            after = [self.tail_coll[k][3] if sid is not None else zero for k, sid in pairs]
            self._tail_rows_memo = _TailRows(
                li,
                n_nodes > 0,
                np.maximum(last, 0),
                np.array([self.tail[k] for k in rows.last_keys], np.int64).reshape(-1, 5),
                np.array([sid is not None for sid in sync], np.bool_),
                np.array([plan.sync_node.get(sid, -1) if sid is not None else -1 for sid in sync], np.int64),
                np.array(after, np.int64).reshape(-1, 5),
            )
        return self._tail_rows_memo

    def _run_levels(
        self,
        cols: _Columns,
        todo: dict[_MemoKey, tuple[_Flags, dict[tuple[int, int, int], float] | None]],
    ) -> None:
        """Place the variants of ``todo`` over the plan's levels, then their step windows as the
        node-at-a-time loop fixes them (each step's start when its first block is placed, each
        sync's arrival when it is first needed)."""
        plan = self._plan(cols)
        lat = self.normal_latency
        # each variant's node arrays as a dict whose arrays are dropped as they are stacked: the
        # batch holds one copy of a column at a time, not the variants' and the stacked ones
        vas = [_variant_arrays(cols, lat, fl, bal)._asdict() for fl, bal in todo.values()]
        factors = [va["factor"] for va in vas]  # what is read of them after the placement
        g = plan.graph

        def stack(name: str, dtype: type) -> npt.NDArray[Any]:
            return g.columns([va.pop(name) for va in vas], dtype)

        flags = np.array([[fl.host, fl.comm, fl.copy] for fl, _ in todo.values()], np.bool_)
        pconst = g.columns(
            [plan.prod_const + np.where(cols.has_obs, va.pop("extra"), 0) for va in vas], np.int64
        )
        x_tau = plan.xe.tau(flags)
        values = NodeValues(
            stack("pre", np.float64),
            stack("post", np.float64),
            stack("dur", np.float64),
            stack("code", np.int64),
            stack("add", np.int64),
            stack("lead", np.int64),
            pconst,
        )
        ends = place(g, x_tau, plan.i_k0, values)
        keys, fe, fe_src, first, count, busy, nxt, last_keys = self._step_rows(plan)
        for k, (key, (fl, _)) in enumerate(todo.items()):
            ext = np.r_[ends[k], 0]  # the sentinel's end: constants are the edges' own latency
            w0 = ext[fe_src] + x_tau[k, fe]
            w1 = w0[np.maximum(nxt, 0)]
            w1[nxt < 0] = self._last_stops(plan, ends[k], w0, fl, last_keys)
            factor = factors[k]
            busy_k = busy
            if factor is not None:
                # the blocks' compute at the mean cost, summed per step by prefix sums
                bal = (cols.busy * factor).astype(np.int64)
                cum = np.concatenate([[0], np.cumsum(bal - cols.busy)])
                busy_k = busy + (cum[first + count] - cum[first])
            span = w1 - w0
            self._memo[key] = dict(
                zip(keys, zip(span.tolist(), (span - busy_k).tolist(), strict=True), strict=True)
            )


__all__ = ["NEG_INF", "Replay", "Variant"]
