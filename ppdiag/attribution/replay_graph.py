"""The replay's block graph (docs/json.md): one node per analyzed block, with what each variant of
the replay needs to place it.

A node holds its measured span split into compute and the local delays inside it, the local time
before it split around the wait that released it (``pre`` before the wait began, ``post`` after
it ended, each split into host, exposed comm, copy and unexplained), and the wait itself: the
producer block on the peer that released it (or a fixed issue time, or a release kept where it was
measured for an untraced peer) with the producer's issue delay and the transfer once both sides
were ready. Pipeline data dependencies from the block labels are edges with the normal latency; a
step-end collective that every rank joins is one sync point; a rank's consecutive steps are
chained. :mod:`ppdiag.attribution.replay_run` evaluates the graph under a variant.

The graph is built once, in four passes: the nodes and tails of every step at once
(:mod:`ppdiag.attribution.replay_build`), the step-end syncs, the waits resolved to their producers
(which needs every rank's nodes), and the label edges (which need the normal latency of the
resolved waits). Per node and per wait the graph holds arrays, not Python objects.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.link_latency import link_latencies
from ppdiag.attribution.rank_step import RankStep, _m, held_in_call, held_send_calls
from ppdiag.attribution.replay_build import PendingWaits, StepTails, build_nodes
from ppdiag.attribution.replay_index import (
    _dense,
    _IssueIndex,
    _label_pairs,
    _P2PIndex,
)
from ppdiag.attribution.replay_mean_costs import mean_cost_factors
from ppdiag.attribution.replay_nodes import NodeColumns, _Node
from ppdiag.attribution.replay_pieces import _outside_wait
from ppdiag.attribution.replay_syncs import GroupSpans, sync_members
from ppdiag.attribution.replay_waits import common_waits, wait_arrays
from ppdiag.attribution.tolerance import timing_tolerance_ns
from ppdiag.model import Direction, Phase, RankTimeline
from ppdiag.model.intervals import ISet
from ppdiag.pipeline.clocks import P2POps
from ppdiag.pipeline.send_holds import HOLD_MIN_NS

# windows closer than this are consecutive steps of one rank
STEP_JOIN_NS = 1_000_000
# a send call that lasted this long between its block and its span held the send (the host ops'
# jitter on a loaded host, as for a held sender's clock: pipeline/send_holds.py)
HELD_CALL_NS = HOLD_MIN_NS


@dataclass
class _WaitContext:
    """What resolving a wait to its producer reads: every rank's block ends (sorted, with their
    node ids), the peers' issued operations and the steps by (rank, step)."""

    ends_by_rank: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]
    issues: _IssueIndex
    by_rank_step: dict[tuple[int, int], RankStep]
    timelines: dict[int, RankTimeline]
    tol: int
    # every wait's record (producer, consumer, transfer, waited), held, whole and consumer-held,
    # whether it is one (a gap that was no wait, a release kept for an untraced peer are not),
    # and the wait being resolved
    rec: npt.NDArray[np.int64]
    held: npt.NDArray[np.int64]
    whole: npt.NDArray[np.bool_]
    keep: npt.NDArray[np.bool_]
    consumer_held: npt.NDArray[np.bool_]
    held_sends: dict[int, ISet]  # per CPU rank, its send calls held over HELD_CALL_NS (aligned)
    at: int = -1


def _chain_steps(steps: list[RankStep]) -> dict[tuple[int, int], tuple[int, int]]:
    """A step that begins where the rank's previous analyzed step ended is chained to it:
    (rank, step) -> the (rank, step) before it."""
    prev_step: dict[tuple[int, int], tuple[int, int]] = {}
    by_rank: dict[int, list[RankStep]] = {}
    for rs in steps:
        by_rank.setdefault(rs.rank, []).append(rs)
    for lst in by_rank.values():
        lst.sort(key=lambda x: x.w0)
        for a_rs, b_rs in itertools.pairwise(lst):
            if abs(b_rs.w0 - a_rs.w1) <= STEP_JOIN_NS:
                prev_step[(b_rs.rank, b_rs.step)] = (a_rs.rank, a_rs.step)
    return prev_step


class ReplayGraph:
    """The frozen block graph of the analyzed steps (built once; the variants only read it)."""

    def __init__(
        self,
        steps: list[RankStep],
        timelines: dict[int, RankTimeline],
        ops: dict[int, P2POps],
        last_stage: int,
    ) -> None:
        self.steps = steps
        self._records: list[_Node] | None = None  # the nodes as records, built on demand
        self.first: dict[tuple[int, int], int] = {}
        self.count: dict[tuple[int, int], int] = {}
        # after the last block: busy, coll, host, other, copy
        self.tail: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
        # step-end collective of a (rank, step): start, end, (busy, host, other, copy, p2p) before
        # and after it
        self.tail_coll: dict[
            tuple[int, int],
            tuple[int, int, tuple[int, int, int, int, int], tuple[int, int, int, int, int]],
        ] = {}
        self.syncs: dict[int, tuple[list[tuple[int, int]], int]] = {}  # sync id -> members, transfer
        self.dropped_edges = 0
        self.untraced_waits = 0
        self.false_waits = 0  # gaps under a transfer that the peer issued only later (not waits)
        self._untimed: list[int] = []  # waits on sends held in their call (normal latency)
        # per wait: producer, consumer, transfer, waited
        self.waits: npt.NDArray[np.int64] = np.zeros((0, 4), np.int64)
        # per wait: how long a host-op producer held its send after its block
        self.held: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        # per wait on host ops (gloo): the consumer waited before the producer issued, so the wait
        # timed the whole transfer (a consumer that comes later times only what is left of it)
        self.whole: npt.NDArray[np.bool_] = np.zeros(0, np.bool_)
        # per wait on host ops: the consumer was held in its own call while the transfer was due
        # (see :func:`_consumer_held`): the wait does not time the link (PP004)
        self.consumer_held: npt.NDArray[np.bool_] = np.zeros(0, np.bool_)
        self._mean_costs: dict[tuple[int, int, int], float] | None = None  # computed once, on demand
        p2p_index = {r: _P2PIndex(timelines[r], ops.get(r)) for r in {rs.rank for rs in steps}}
        tol = timing_tolerance_ns(timelines)
        built = build_nodes(steps, {r: timelines[r].cpu_only for r in p2p_index}, p2p_index, tol)
        self.cols = NodeColumns(built.cols, built.on_compute)
        self.meas_start: npt.NDArray[np.int64] = built.start
        self.meas_lo: npt.NDArray[np.int64] = built.lo  # the end of the rank's work before each block
        firsts, counts = built.first.tolist(), built.sizes.tolist()
        self._add_tails(steps, built.tails)
        for rs, f, c in zip(steps, firsts, counts, strict=True):
            self.first[(rs.rank, rs.step)] = f
            self.count[(rs.rank, rs.step)] = c
        # the build's labels and waits are read once, then freed (not held to the end of the
        # graph's construction: at a thousand ranks they are a few hundred MB)
        labels, pending = built.labels, [built.pending]
        del built
        self._find_step_syncs(timelines)
        cons, prod = _label_pairs(labels, last_stage)
        del labels
        # each labelled block's producer (the block whose output it consumes), for host-op waits
        self._label_prod: dict[int, int] = dict(zip(cons.tolist(), prod.tolist(), strict=True))
        self._resolve_waits(pending, timelines, ops, tol)
        # each link's normal transfer time and the run's fault-free latency (the lower quartile
        # of the links' normal times: slow links, even most of them, do not set it)
        self.links = link_latencies(self.waits, self.whole)
        self.normal_latency = self.links.fault_free_ns
        self._untimed_at_normal_latency()
        self.untimed_waits = len(self._untimed)
        self._label_edges(cons, prod, tol)
        self.order: npt.NDArray[np.int64] = np.argsort(self.meas_start, kind="stable")
        self.w0 = {(rs.rank, rs.step): rs.w0 for rs in steps}
        # the variants place the nodes on times less this integer (the earliest start): their float
        # arithmetic on epoch ns (past 2**53) would round every sum to 256 ns (docs/json.md)
        self.origin = int(min([*self.w0.values(), *self.meas_start[self.order[:1]].tolist()], default=0))
        self.prev_step = _chain_steps(steps)

    def _add_tails(self, steps: list[RankStep], t: StepTails) -> None:
        """What follows each step's last block: its local split, and the step-end collective."""
        keys = [(rs.rank, rs.step) for rs in steps]
        split = [(a, b, c, d, e) for a, b, c, d, e in t.split.tolist()]
        self.tail = dict(zip(keys, split, strict=True))
        has = np.flatnonzero(t.has_coll)
        spans, before, after = t.coll[has].tolist(), t.before[has].tolist(), t.after[has].tolist()
        for i, (c0, c1), b, a in zip(has.tolist(), spans, before, after, strict=True):
            self.tail_coll[keys[i]] = (c0, c1, (b[0], b[1], b[2], b[3], b[4]), (a[0], a[1], a[2], a[3], a[4]))

    def mean_costs(self) -> dict[tuple[int, int, int], float]:
        """The same total work spread evenly over the stages: per (rank, stage, phase), the factor
        that brings that stage's forward (backward, W) work on the rank to the mean.

        When every (rank, stage) holds the same number of blocks of a phase, each stage (an
        interleaved chunk too) is brought to the mean stage work. When the labels do not add up
        (a block cut in two, chunks of one rank labelled alike) each rank's blocks are scaled to
        the mean work per rank instead, which keeps the total work whatever the labels say.
        Computed once per graph (the graph is frozen); callers get their own copy.
        """
        if self._mean_costs is None:
            self._mean_costs = self._compute_mean_costs()
        return dict(self._mean_costs)

    def _compute_mean_costs(self) -> dict[tuple[int, int, int], float]:
        phases = (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD))
        tot, cnt = self._work_by_label(phases)
        return mean_cost_factors(tot, cnt, phases)

    def _work_by_label(
        self, phases: tuple[int, ...]
    ) -> tuple[dict[tuple[int, int, int], int], dict[tuple[int, int, int], int]]:
        """The blocks' compute and count per (rank, stage, phase) of ``phases``, the keys in the
        order of their first node: one sort of a code per node, not a dict update per node."""
        c = self.cols.cols
        sel = np.flatnonzero(np.isin(c["phase"], phases))
        if not sel.size:
            return {}, {}
        rank, stage, phase = c["rank"][sel], c["stage"][sel], c["phase"][sel]
        _, first, inv = np.unique(_dense([rank, stage, phase]), return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        by_key = np.argsort(inv, kind="stable")
        cnt_a = np.bincount(inv)
        # (summed in int64: a narrowed column's sum over many blocks does not fit its dtype)
        tot_a = np.add.reduceat(c["busy"][sel][by_key], np.r_[0, np.cumsum(cnt_a)[:-1]], dtype=np.int64)
        keys = zip(rank[first].tolist(), stage[first].tolist(), phase[first].tolist(), strict=True)
        rows = sorted(zip(first.tolist(), keys, tot_a.tolist(), cnt_a.tolist(), strict=True))
        return {k: t for _, k, t, _ in rows}, {k: n for _, k, _, n in rows}

    def _find_step_syncs(self, timelines: dict[int, RankTimeline]) -> None:
        """Step-end collectives that every rank joins and that end together form one sync point:
        early ranks wait in them for the last one, which only pays the transfer. Where the ends
        fall into groups (the pipelines of data-parallel replicas whose clocks nothing in the
        trace links), each group of two or more that ends together is a sync point of its own,
        unless a member's collectives are named and none spans the job (a stage's reduce-scatter
        across replicas): those are no sync of the replay's (see :mod:`replay_syncs`)."""
        self.sync_of: dict[tuple[int, int], int] = {}
        by_step: dict[int, list[tuple[int, int]]] = {}
        for rs in self.steps:
            key = (rs.rank, rs.step)
            if key in self.tail_coll:
                by_step.setdefault(rs.number if rs.number >= 0 else rs.step, []).append(key)
        n_ranks = len({rs.rank for rs in self.steps})
        spans = GroupSpans(timelines, n_ranks)
        for members in by_step.values():
            if len(members) < 2 or len(members) < n_ranks:
                continue
            ends = np.array([self.tail_coll[k][1] for k in members], dtype=np.int64)
            durs = np.array([self.tail_coll[k][1] - self.tail_coll[k][0] for k in members], dtype=np.int64)
            groups = sync_members(ends, durs, functools.partial(self._narrower, spans, members))
            for sel in groups:
                sid = len(self.syncs)
                self.syncs[sid] = ([members[i] for i in sel], int(durs[sel].min()))
                for i in sel:
                    self.sync_of[members[i]] = sid

    def _narrower(self, spans: GroupSpans, members: list[tuple[int, int]]) -> npt.NDArray[np.bool_]:
        """Per member, whether its step-end collectives are named and none spans the job."""
        return np.array([spans.narrower(k[0], *self.tail_coll[k][:2]) for k in members], dtype=bool)

    @property
    def nodes(self) -> list[_Node]:
        """Every node as a record (built once, on demand: checks and tests read the graph a node at
        a time; the replay reads :attr:`cols`)."""
        if self._records is None:
            self._records = self.cols.records()
        return self._records

    def check(self) -> list[str]:
        """Every invariant of the graph it breaks, one line each (empty: the graph is sound): each
        (rank, step) owns one contiguous run of nodes in step order, every producer and label edge
        names another node, and no measured piece is negative."""
        out: list[str] = []
        n = len(self.nodes)
        pos = 0
        for rs in self.steps:
            key = (rs.rank, rs.step)
            if self.first.get(key) != pos:
                out.append(f"rank {rs.rank} step {rs.step}: nodes start at {self.first.get(key)}, not {pos}")
            pos += self.count.get(key, 0)
        if pos != n:
            out.append(f"the steps own {pos} nodes of {n}")
        if len(self.meas_start) != n or len(self.meas_lo) != n or sorted(self.order) != list(range(n)):
            out.append("the measured starts, ends before and replay order do not cover the nodes")
        for i, nd in enumerate(self.nodes):
            prods = [nd.obs[0]] if nd.obs is not None else []
            prods += [p for p, _ in nd.edges]
            if any(not 0 <= p < n or p == i for p in prods):
                out.append(f"node {i} (rank {nd.rank}): producer outside the graph or itself: {prods}")
            if min(nd.span, nd.busy, nd.pre, nd.post) < 0:
                out.append(f"node {i} (rank {nd.rank}): negative span, busy or local time")
        return out

    def _ends_by_rank(self) -> dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """Per rank, its block ends sorted with their node ids, for "which block did the peer
        finish last" (one sort by rank, then each rank's slice: no scan of all nodes per rank).
        Arrays, not lists: the waits search them as arrays, and lists of every node's end and id
        were a quarter of the graph's memory at a thousand ranks."""
        n_rank = self.cols.cols["rank"]
        n_end = np.asarray(self.meas_start, np.int64) + self.cols.cols["span"]
        by_r = np.argsort(n_rank, kind="stable")
        r_sorted = n_rank[by_r]
        out: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
        for r in {rs.rank for rs in self.steps}:
            ids_a = by_r[np.searchsorted(r_sorted, r, "left") : np.searchsorted(r_sorted, r, "right")]
            ends = n_end[ids_a]
            o = np.argsort(ends, kind="stable")
            out[r] = (ends[o], ids_a[o].astype(np.int64))
        return out

    def _rank_of(self, nid: int) -> int:
        """The rank of node ``nid`` (the per-wait lookups of the waits not resolved as arrays)."""
        return int(self.cols.cols["rank"][nid])

    def _step_of(self, nid: int) -> int:
        """The step of node ``nid``."""
        return int(self.cols.cols["step"][nid])

    def _resolve_waits(
        self,
        pending: list[PendingWaits],
        timelines: dict[int, RankTimeline],
        ops: dict[int, P2POps],
        tol: int,
    ) -> None:
        """Tie every wait to what released it (each wait's transfer is kept in :attr:`waits`).
        ``pending``: the waits, in a one-item list emptied here, so that their columns are freed
        once read, before the waits' records are cut to those that were waits."""
        ends, issues = self._ends_by_rank(), _IssueIndex(ops, timelines)
        w = wait_arrays(self, pending.pop(), issues, ends, timelines, tol)
        # per node: whether its step ran copies (nodes lie in steps order, each step's together)
        counts = [self.count[(rs.rank, rs.step)] for rs in self.steps]
        has_copy = np.repeat(np.array([rs.sets.copy[0].size > 0 for rs in self.steps], np.bool_), counts)
        fast, xfer = common_waits(self, w, timelines, has_copy, tol)
        self.cols.send_wait.update(w.nid[fast & (w.wdir == int(Direction.SEND))].tolist())
        me = self.cols.cols["rank"][w.nid]
        k = w.nid.size
        # (the common waits are device ones: a device transfer is timed by its kernels)
        ctx = _WaitContext(
            ends,
            issues,
            {(rs.rank, rs.step): rs for rs in self.steps},
            timelines,
            tol,
            np.stack([w.peer, me, xfer, w.rel - w.wait_start], axis=1).reshape(k, 4),
            np.zeros(k, np.int64),
            np.zeros(k, np.bool_),
            fast.copy(),
            np.zeros(k, np.bool_),
            {r: held_send_calls(tl, HELD_CALL_NS) for r, tl in timelines.items() if tl.cpu_only},
        )
        # the others one at a time; each keeps its place among the common ones
        slow = np.flatnonzero(~fast)
        cols = [a[slow].tolist() for a in (w.nid, w.peer, w.wdir, w.posted, w.op_end, w.rel, w.wait_start)]
        lasts = [x if f else None for x, f in zip(w.last[slow].tolist(), w.found[slow].tolist(), strict=True)]
        rows = zip(slow.tolist(), *cols, lasts, w.j[slow].tolist(), strict=True)
        del w, me, xfer, fast, has_copy, slow  # (what the loop reads is in its rows now)
        for i, nid, peer, wdir, posted, op_end, rel, wait_start, last, j in rows:
            ctx.at = i
            self._resolve_wait(ctx, nid, (peer, wdir, posted, op_end), rel, wait_start, (last, j))
        if ctx.keep.all():
            # every one was a wait (the common case): the records as they are, not copies of them
            self.waits, self.held, self.whole = ctx.rec, ctx.held, ctx.whole
            self.consumer_held = ctx.consumer_held
        else:
            self.waits, self.held, self.whole = ctx.rec[ctx.keep], ctx.held[ctx.keep], ctx.whole[ctx.keep]
            self.consumer_held = ctx.consumer_held[ctx.keep]

    def _resolve_wait(
        self,
        ctx: _WaitContext,
        nid: int,
        held: tuple[int, int, int, int],
        rel: int,
        wait_start: int,
        looked_up: tuple[int | None, int],
    ) -> None:
        """The operation that released the wait before node ``nid``: on devices the peer's kernel
        that ended with this rank's (a matched NCCL send/recv pair ends together), else the peer's
        last operation towards this rank before the release. Its producer block is the last one
        the peer finished before issuing it (with a slow link the peer may have finished later
        blocks before the data arrived)."""
        peer, wdir, posted, op_end = held
        got = ctx.ends_by_rank.get(peer)
        me, nc = self._rank_of(nid), self.cols
        # ``last``: the matched operation's issue, else the peer's last one before the release;
        # ``j``: the peer's last block that ended before ``at`` (see :func:`wait_arrays`)
        last, j = looked_up
        # (CPU runs: host calls, whose start says little about when the data left; there the
        # producer is the peer's last block before the release)
        device = not ctx.timelines[me].cpu_only
        # a block that ends within the timing tolerance after the issue counts as finished
        # before it (a send issued as its block ends must not flip to the block before under
        # ns jitter, which would read that whole block as the producer's host delay):
        # at = last if (last is not None and device) else rel, j = bisect_right(ends, at + tol) - 1
        if wdir == int(Direction.SEND):
            nc.send_wait.add(nid)
        if not device and self._labelled_wait(ctx, nid, peer, (wdir, op_end), rel, wait_start):
            return
        if j < 0 and last is not None and peer in ctx.ends_by_rank:
            # the peer issued it before finishing any analyzed block (a receive posted at the
            # start of the step): the transfer starts at that fixed issue time
            posted = min(posted, wait_start)
            xfer = rel - max(last, posted)
            if xfer < -ctx.tol:
                self._not_a_wait(nid, ctx.by_rank_step[(me, self._step_of(nid))])
                return
            nc.obs_abs[nid] = (last, xfer)
            nc.lead[nid] = wait_start - posted
            # (across hosts, "before" within what their clocks may be off by: too close to tell)
            whole = not device and posted <= last + ctx.timelines[me].clock_margin_ns(ctx.timelines[peer])
            self._record_wait(ctx, peer, me, xfer, rel - wait_start, whole=whole)
        elif j < 0:
            # the peer is not traced, or its block lies before the analyzed steps
            nc.release[nid] = rel
            self.untraced_waits += int(peer not in ctx.ends_by_rank)
        else:
            posted = min(posted, wait_start) if device else wait_start
            assert got is not None  # j >= 0: the peer has blocks
            ends, ids = got
            self._producer_wait(ctx, nid, peer, (int(ids[j]), int(ends[j]), last), posted, rel, wait_start)

    def _labelled_wait(
        self, ctx: _WaitContext, nid: int, peer: int, op: tuple[int, int], rel: int, wait_start: int
    ) -> bool:
        """A host-op receive whose send is known by order and whose block's label names its
        producer on that peer: the wait is tied to that producer and that send (True), not to the
        peer's last block before the release. A send held on its way is posted after the peer's
        later blocks, which the release would take for the producer."""
        wdir, op_end = op
        prod = self._label_prod.get(nid, -1)
        if wdir != int(Direction.RECV) or prod < 0 or self._rank_of(prod) != peer:
            return False
        sent = ctx.issues.send_of(self._rank_of(nid), peer, op_end, ctx.tol)
        if sent is None:
            return False
        p_end = int(self.meas_start[prod]) + int(self.cols.cols["span"][prod])
        # A send held in its call (a transport that does not take the post at once) opens its
        # backend span once the post returns (gloo opens ``gloo:send`` after posting): after its
        # data left, often after it arrived. Its call, between the block and the span, is the
        # producer's own clock, so which sends were held so is told alike on any clock; their
        # data had left when the receive ended. Taken as the issue, the span's open made such a
        # receive "no wait" on one host and a wait across hosts with an offset a few hundred µs
        # off, and moved the causes between ranks.
        prs = ctx.by_rank_step.get((peer, self._step_of(prod)))
        opened = (
            sent
            if prs is not None and sent > p_end and _m(prs.p2p_host, p_end, sent) > HELD_CALL_NS
            else None
        )
        if opened is not None:
            sent = min(sent, rel)
        if p_end > sent + ctx.tol:
            return False
        self._producer_wait(ctx, nid, peer, (prod, p_end, sent), wait_start, rel, wait_start, opened)
        return True

    def _producer_wait(
        self,
        ctx: _WaitContext,
        nid: int,
        peer: int,
        producer: tuple[int, int, int | None],
        posted: int,
        rel: int,
        wait_start: int,
        opened: int | None = None,
    ) -> None:
        """A wait released by the peer's block ``producer`` = (node, end, issue of the operation).

        The peer's last transfer operation towards this rank before the release: the time from
        the producer's block end to that issue is the producer's host delay. The transfer is what
        remains after both sides were ready: the producer had issued and this rank had posted its
        operation (a gloo or NCCL transfer cannot complete before the receive is posted; a receive
        posted under compute lets the transfer run before the wait begins). ``opened``: the span
        of a send held in its call (:meth:`_labelled_wait`), which times its link as before."""
        prod, p_end, last = producer
        me, nc = self._rank_of(nid), self.cols
        issue = max(p_end, last) if last is not None else p_end
        xfer = rel - max(issue, posted)
        if xfer < -ctx.tol:
            self._not_a_wait(nid, ctx.by_rank_step[(me, self._step_of(nid))])
            return
        # copies the producer ran between its block and the send delay the send as copies
        prs = ctx.by_rank_step.get((self._rank_of(prod), self._step_of(prod)))
        # (no copies, or an issue at the block's end: nothing to measure)
        copies = prs is not None and issue > p_end and prs.sets.copy[0].size > 0
        issue_copy = min(_m(prs.sets.copy, p_end, issue), issue - p_end) if copies and prs is not None else 0
        delay = issue - p_end - issue_copy
        held, whole = self._held_whole(ctx, (me, peer), prs, p_end, (issue, delay), posted)
        nc.obs[nid] = (prod, delay - held, xfer)
        nc.issue_copy[nid] = issue_copy
        if held:
            nc.issue_held[nid] = held
        nc.lead[nid] = wait_start - posted
        if opened is not None:
            # a send held in its call takes the normal latency in the replay (when its data left
            # is not recorded); its link is timed as any send's, from the span's open, where the
            # receive ended after it (the link's lateness is a gate of its own: PP004)
            self._untimed.append(nid)
            issue = max(p_end, opened)
            xfer = rel - max(issue, posted)
            if xfer < -ctx.tol:
                return
            held, whole = self._held_whole(
                ctx, (me, peer), prs, p_end, (issue, issue - p_end - issue_copy), posted
            )
        # a wait due while its consumer was held in its own send call times no link (PP004)
        ctx.consumer_held[ctx.at] = held_in_call(ctx.held_sends.get(me), p_end, rel, HELD_CALL_NS)
        self._record_wait(ctx, peer, me, xfer, rel - wait_start, held, whole)

    @staticmethod
    def _held_whole(
        ctx: _WaitContext,
        ranks: tuple[int, int],
        prs: RankStep | None,
        p_end: int,
        issued: tuple[int, int],
        posted: int,
    ) -> tuple[int, bool]:
        """How long a host-op producer held the send issued at ``issued`` = (issue, delay after
        its block) on its way, and whether the consumer (posted at ``posted``) waited through the
        whole transfer; ``ranks`` = (consumer, producer)."""
        me, peer = ranks
        issue, delay = issued
        # a host op (gloo) issued after its block while the producer went on (computing, waiting
        # for its own transfers): the data was held on its way, a late transfer; the stretch with
        # nothing running on the producer (its host stalled) and the call that was issuing the
        # transfer (its own host time, descheduled inside it or not) are a host delay
        held = 0
        if ctx.timelines[peer].cpu_only and prs is not None and delay > 0:
            own = _m(prs.host_set, p_end, issue) + _m(prs.p2p_host, p_end, issue)
            held = max(delay - own, 0)
        # (host ops: the wait began before the issue; a device transfer is timed by its kernels.
        # Across hosts the two times are compared across their fitted clocks: a wait that began
        # within what those may be off by after the issue is too close to call late, and counts)
        whole = ctx.timelines[me].cpu_only and posted <= issue + ctx.timelines[me].clock_margin_ns(
            ctx.timelines[peer]
        )
        return held, whole

    def _untimed_at_normal_latency(self) -> None:
        """The waits on sends held in their call (see :meth:`_labelled_wait`) take the normal
        latency as their transfer, out of the producer's issue delay (their sum is measured)."""
        if not self._untimed:
            return
        ids = np.asarray(self._untimed, np.int64)
        obs = self.cols.obs.val[ids].astype(np.int64)  # (a narrowed table's rows, against an int)
        xfer = np.minimum(self.normal_latency, np.maximum(obs[:, 1] + obs[:, 2], 0))
        self.cols.obs.set_many(ids, (obs[:, 0], obs[:, 1] + obs[:, 2] - xfer, xfer))

    def _record_wait(
        self,
        ctx: _WaitContext,
        peer: int,
        me: int,
        xfer: int,
        waited: int,
        held: int = 0,
        whole: bool = False,
    ) -> None:
        i = ctx.at
        ctx.rec[i] = (peer, me, xfer, waited)
        ctx.held[i] = held
        ctx.whole[i] = whole
        ctx.keep[i] = True

    def _label_edges(self, cons: npt.NDArray[np.int64], prod: npt.NDArray[np.int64], tol: int) -> None:
        """Pipeline data dependencies from labels, with the normal latency (capped so the measured
        timeline stays reproduced exactly). A consumer that starts a few ns before its producer
        ends (within the rounding and timer resolution of the input) keeps the dependency with
        that small negative latency: dropping it would make the split of the waits depend on
        sub-µs jitter (float32 seconds against float64 ones)."""
        start, c = np.asarray(self.meas_start, np.int64), self.cols.cols
        slack = start[cons] - c["post"][cons] - (start[prod] + c["span"][prod])
        # the measurement contradicts these dependencies: labels do not match up
        bad = slack < -tol
        self.dropped_edges += int(bad.sum())
        tau = np.minimum(slack[~bad], self.normal_latency)
        self.cols.edges.set_many(cons[~bad], (prod[~bad], tau))

    def _not_a_wait(self, nid: int, rs: RankStep) -> None:
        """A gap that looked like a wait but that the peer cannot have released: the peer issued
        the operation after this rank's block had begun (a transfer still in flight across the
        gap, while the rank was held by something else: a launch gap, a late host). Read as a
        wait, a later block of the peer would become this block's producer with a negative
        transfer, tying the two ranks wherever that block moves in a variant. The gap is measured
        as local time instead, exactly as for a block without a wait."""
        lo, s = int(self.meas_lo[nid]), int(self.meas_start[nid])
        # the same split as a block without a wait: an empty wait at the block's start
        at = np.array([s], np.int64)
        host, coll, copy, ux, _ = _outside_wait(rs, np.array([lo], np.int64), at, at, at, at)
        # (widening a narrowed column where the gap does not fit it)
        put = self.cols.put
        put("pre", nid, s - lo)
        put("post", nid, 0)
        for name, x in (("pre_host", host), ("pre_coll", coll), ("pre_copy", copy), ("pre_ux", ux)):
            put(name, nid, int(x[0]))
        self.cols.on_compute[nid] = False
        self.cols.false_wait.add(nid)
        self.false_waits += 1


__all__ = ["STEP_JOIN_NS", "ReplayGraph"]
