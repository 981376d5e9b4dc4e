"""Split every rank's lost time into causes (DESIGN.md §5).

The measured run is rebuilt as a *replay*: each rank executes its blocks in the observed order,
and a block starts at ``max(previous end + local delay before the wait, release by the peer) +
transfer + local delay after the wait``. The release is the end of the producer block the rank
waited for (the last block the peer finished before the wait ended) plus the producer's delay in
issuing the transfer; the transfer is what remains of the wait once both sides were ready.
Pipeline data dependencies from the block labels are added with the normal latency. A step-end
collective that every rank joins is one sync point (early ranks wait in it, the last one pays only
the transfer), and a rank's consecutive steps are chained. With every quantity as measured, the
replay reproduces the measured timeline exactly (checked; a difference is reported).

Causes are counterfactuals (DESIGN.md §5), built up from the ideal run one kind of delay at a
time; each cause is the growth of the rank's idle time when its kind is added, so they telescope
to the measured lost time (``CHAIN``, :func:`replay_causes`):

1. ``bubble``: the idle of the schedule with every stage's work brought to the mean stage work,
   pipeline transfers at the run's normal latency (the lower median of the links' median transfer
   times) and nothing else, capped by the idle with the actual costs.
2. ``imbalance``: what the actual stage costs add.
3. ``comm_wait``: what the actual transfer times add (slow links, late transfers).
4. ``host``: what host delays add: local idle where the next work was launched after the gap
   began (GPU), or any event-less stretch between ops (CPU-only runs), a producer's delay in
   issuing a transfer after its block ended.
5. ``exposed_comm``: what communication that could have overlapped adds: exposed collectives and
   transfers between blocks, the step-end sync's transfer, a rank waiting for its own send, a
   receive queued behind compute on the compute stream.
6. ``exposed_copy``: what exposed copies add (between and inside blocks, and before a send).
7. ``unexplained``: the rest (idle with work queued and no evidence, and any disagreement between
   the replay and the measurement).

A wait's transfer starts once the producer issued it and the waiting rank had posted its side (a
receive posted under compute lets the transfer run before the wait begins); on GPU runs the
producer's operation is the one that ended with the waiter's (NCCL send and receive end
together), and its producer block the last one it finished before issuing it.

A delay on one rank that makes its neighbours wait is removed everywhere at once, so the
neighbours' waiting is charged to the root cause (a host stall on rank 1 shows as ``host`` on
ranks 0, 2 and 3), as DESIGN.md requires. The same replay with one delay removed gives each
finding's gain.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.accounting import Account, WindowSets, account, window_sets
from ppdiag.attribution.collective_waits import CollectiveWaits, apply_moves, run_waits
from ppdiag.attribution.tolerance import timing_tolerance_ns
from ppdiag.diagnosis import CAUSE_KEYS, Cause, GapTable
from ppdiag.model import Direction, Kind, Phase, RankTimeline
from ppdiag.model import intervals as ivs
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.clocks import P2POps

NEG_INF = -(2**62)
# transfer pieces closer than this form one wait (the host issuing the next operation in between)
WAIT_JOIN_NS = 50_000
# matched device send/recv kernels end within this of each other
MATCH_END_NS = 20_000
# windows closer than this are consecutive steps of one rank
STEP_JOIN_NS = 1_000_000


@dataclass
class RankStep:
    """Inputs of one rank in one step on the aligned clock."""

    rank: int
    step: int  # index among the rank's analyzed steps
    number: int
    w0: int
    w1: int
    sets: WindowSets
    acct: Account
    blocks: Blocks  # this step's blocks, aligned, time order
    host_set: ivs.ISet  # lost time with host evidence
    wait_set: ivs.ISet  # exposed p2p time (waiting for a peer or transferring)
    # exposed p2p pieces that ran while the host had not launched the next work yet: a send
    # spinning beside a host stall delays nothing the host did not delay already
    p2p_host: ivs.ISet = field(default_factory=ivs.empty)


@dataclass
class _Node:
    """One block in the replay."""

    rank: int
    step: int
    idx: int
    span: int  # measured end - start
    busy: int
    in_host: int  # host-evidence lost inside the block span
    in_ux: int  # other lost inside the block span
    in_copy: int  # exposed copies inside the block span
    phase: int
    stage: int
    pre: int
    post: int
    pre_host: int
    pre_coll: int
    pre_ux: int
    pre_copy: int
    # the observed wait: (producer node, producer's issue delay, transfer after both sides were ready)
    obs: tuple[int, int, int] | None = None
    # how long before the wait began this rank had posted the operation it waits in (under compute)
    lead: int = 0
    # the rank waits for its own send to complete: no data dependency, overlappable (exposed comm)
    send_wait: bool = False
    # exposed copies on the producer between its block's end and the send's issue
    issue_copy: int = 0
    # the operation it waits in was queued on the compute stream (could not be posted early)
    on_compute: bool = False
    # a wait on an operation the peer issued at a fixed time (before any analyzed block of its
    # own): (issue time, transfer after both sides were ready)
    obs_abs: tuple[int, int] | None = None
    # a wait on a rank that is not traced: its release stays where it was measured
    release: int | None = None
    # a gap under a transfer that the peer issued only after this block began: local time
    false_wait: bool = False
    edges: list[tuple[int, int]] = field(default_factory=list)  # label dependencies: (producer, latency)


@dataclass
class Attribution:
    """Cause totals per (rank, step) in ns, the gap tables, and replay facts for findings."""

    causes: dict[tuple[int, int], dict[str, int]]
    gaps: dict[int, GapTable]
    normal_latency_ns: int
    step_replay_ns: dict[str, float]  # mean step time of each replay variant (for gains)
    notes: list[str] = field(default_factory=list)
    edges: list[tuple[int, int, int, int]] = field(
        default_factory=list
    )  # producer, consumer, transfer, waited
    collective_waits: CollectiveWaits | None = None  # waits in collectives for a late member


# per timeline: its launched kernels sorted by start (own clock), built once instead of per step;
# the entry keeps the intervals object it was built from, so a reused id() never matches
_LAUNCHED: dict[int, tuple[object, npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
_LAUNCHED_MAX = 256


def _launched(tl: RankTimeline) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Start and launch time of the rank's launched kernels and copies, sorted by start."""
    iv = tl.intervals
    hit = _LAUNCHED.get(id(iv))
    if hit is not None and hit[0] is iv:
        return hit[1], hit[2]
    busy = np.isin(iv.kind, (int(Kind.COMPUTE), int(Kind.MEMCPY), int(Kind.MEMSET))) & (iv.launch >= 0)
    st = iv.start[busy]
    la = iv.launch[busy]
    order = np.argsort(st, kind="stable")
    if len(_LAUNCHED) >= _LAUNCHED_MAX:
        _LAUNCHED.clear()
    _LAUNCHED[id(iv)] = (iv, st[order], la[order])
    return st[order], la[order]


def _host_evidence(tl: RankTimeline, offset: int, gaps: ivs.ISet) -> ivs.ISet:
    """The part of each gap before the next compute was even launched (or all of it on CPU runs)."""
    gs, ge = gaps
    if gs.size == 0:
        return ivs.empty()
    if tl.cpu_only:
        return gs.copy(), ge.copy()
    st0, la0 = _launched(tl)
    if not st0.size:
        return ivs.empty()
    # search on the rank's own clock: no per-step copy of the whole rank
    nxt = np.searchsorted(st0, ge - offset, side="left")
    ok = nxt < st0.size
    launch_next = np.where(ok, la0[np.minimum(nxt, st0.size - 1)] + offset, gs)
    he = np.minimum(np.maximum(launch_next, gs), ge)
    return ivs.union(gs, he)


def rank_step(tl: RankTimeline, step: int, number: int, w0: int, w1: int, blocks: Blocks) -> RankStep:
    """Gather one rank's step on the aligned clock."""
    off = tl.clock_offset_ns
    sets = window_sets(tl.intervals, off, w0, w1)
    acct = account(sets, w0, w1)
    # host evidence only on idle time: comm and copies have their own causes
    comm = ivs.union(
        np.r_[sets.p2p[0], sets.collective[0], sets.copy[0]],
        np.r_[sets.p2p[1], sets.collective[1], sets.copy[1]],
    )
    idle = ivs.subtract(sets.gaps, comm)
    host = _host_evidence(tl, off, idle)
    with_p2p = ivs.union(np.r_[idle[0], sets.p2p[0]], np.r_[idle[1], sets.p2p[1]])
    # (device runs only: on CPU runs every event-less stretch is host, and a p2p op is an event)
    p2p_host = (
        ivs.intersect(_host_evidence(tl, off, with_p2p), sets.p2p)
        if sets.p2p[0].size and not tl.cpu_only
        else ivs.empty()
    )
    return RankStep(tl.rank, step, number, w0, w1, sets, acct, blocks, host, sets.p2p, p2p_host)


def _m(iset: ivs.ISet, lo: int, hi: int) -> int:
    """Measure of a sorted disjoint set inside ``[lo, hi)`` (binary search, no scan)."""
    return ivs.measure_in(iset, lo, hi)


def _split_local(rs: RankStep, lo: int, hi: int) -> tuple[int, int, int, int, int]:
    """``[lo, hi)`` of a rank as (compute, host-evidence idle, other, exposed copy, exposed p2p) ns."""
    if hi <= lo:
        return (0, 0, 0, 0, 0)
    busy = _m(rs.sets.compute, lo, hi)
    host = _m(rs.host_set, lo, hi)
    copy = _m(rs.sets.copy, lo, hi)
    p2p = _m(rs.sets.p2p, lo, hi)
    return (busy, host, max(hi - lo - busy - host - copy - p2p, 0), copy, p2p)


def _measure_between(
    iset: ivs.ISet, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """:func:`ivs.measure_in` of a sorted disjoint set for each ``[lo[i], hi[i])`` at once."""
    if iset[0].size == 0 or lo.size == 0:
        return np.zeros(lo.shape, np.int64)
    got = ivs.prefix_measure(iset, hi) - ivs.prefix_measure(iset, lo)
    return np.where(hi > lo, got, 0)


def _last_waits(
    wait_set: ivs.ISet, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """For each span ``[lo[i], hi[i])``: whether transfer time lies in it, and the last run of it
    (pieces at most ``WAIT_JOIN_NS`` apart are one wait) clipped to the span, as (start, end);
    ``(hi, hi)`` where there is none."""
    s, e = wait_set
    n = lo.size
    if s.size == 0 or n == 0:
        return np.zeros(n, np.bool_), hi.copy(), hi.copy()
    i0 = np.searchsorted(e, lo, side="right")  # first piece that reaches past lo
    i1 = np.searchsorted(s, hi, side="left")  # pieces before this begin before hi
    has = (i1 > i0) & (hi > lo)
    last = np.maximum(i1 - 1, 0)
    # the first piece of each run of pieces joined by short gaps
    join = np.r_[False, (s[1:] - e[:-1]) <= WAIT_JOIN_NS]
    run_first = np.maximum.accumulate(np.where(join, 0, np.arange(s.size)))
    k = np.maximum(run_first[last], i0)
    start = np.where(has, np.maximum(s[np.minimum(k, s.size - 1)], lo), hi)
    end = np.where(has, np.minimum(e[last], hi), hi)
    return has, start.astype(np.int64), end.astype(np.int64)


class _P2PIndex:
    """One rank's p2p intervals on the aligned clock, sorted by start, for "which transfer held
    the rank during ``[lo, hi]``" in O(log n + overlaps) per wait instead of a scan of the rank."""

    def __init__(self, tl: RankTimeline, po: P2POps | None = None) -> None:
        iv = tl.intervals
        m = np.flatnonzero(iv.kind == int(Kind.P2P))
        off = tl.clock_offset_ns
        o = np.argsort(iv.start[m], kind="stable")
        idx = m[o]
        self.start = iv.start[idx] + off
        self.end = iv.end[idx] + off
        # where the trace names no peer, the pipeline's overlay (peers decided by timing) does
        overlay = po is not None and po.iv_peer.shape[0] == len(iv)
        self.peer = po.iv_peer[idx] if po is not None and overlay else iv.peer[idx]
        self.direction = po.iv_dir[idx] if po is not None and overlay else iv.direction[idx]
        # p2p kernels queued on a stream that runs compute (p2p on the compute stream); on CPU
        # runs every op is on the main thread, which says nothing about the device streams
        comp_streams = np.unique(iv.stream[iv.kind == int(Kind.COMPUTE)])
        self.on_compute = np.isin(iv.stream[idx], comp_streams) & (not tl.cpu_only)
        # running max of the ends: the intervals that can still reach ``lo`` begin at the first
        # position whose running max passes it
        self.reach = np.maximum.accumulate(self.end) if self.end.size else self.end

    def on_compute_at(self, lo: int, hi: int) -> bool:
        """Whether the operation that held the rank in ``[lo, hi]`` ran on a compute stream."""
        j0 = int(np.searchsorted(self.reach, lo, side="right"))
        j1 = int(np.searchsorted(self.start, hi, side="left"))
        if j1 <= j0:
            return False
        cover = np.minimum(self.end[j0:j1], hi) - np.maximum(self.start[j0:j1], lo)
        return bool(self.on_compute[j0 + int(np.argmax(cover))])

    def blocking(self, lo: int, hi: int, tol: int = 0) -> tuple[int, int, int, int]:
        """(peer, direction, start, end) of the p2p interval that covers most of the wait ``[lo, hi]``.

        A wait can end on a transfer that was complete long before (a receive is only waited for
        after an earlier send returned), so the longest piece names the peer that held the rank.
        Its start is when the rank posted the operation (often under compute, before the wait).
        Pieces that cover the wait alike (within ``tol``: a send and a receive posted and done
        together) are a tie, not decided by ns jitter: the one posted first names the peer.
        """
        j0 = int(np.searchsorted(self.reach, lo, side="right"))
        j1 = int(np.searchsorted(self.start, hi, side="left"))
        if j1 <= j0:
            return -1, 0, lo, hi
        st, en = self.start[j0:j1], self.end[j0:j1]
        cover = np.minimum(en, hi) - np.maximum(st, lo)
        top = int(cover.max())
        if top <= 0:
            return -1, 0, lo, hi
        # the first (earliest posted) of the pieces that tie, as an exact tie always was
        k = int(np.flatnonzero(cover >= top - tol)[0])
        return int(self.peer[j0 + k]), int(self.direction[j0 + k]), int(st[k]), int(en[k])


class _IssueIndex:
    """The p2p operations each rank issued towards each peer, by what can release a waiter:
    a receive is released by the peer's send, a blocked send by the peer's receive. Sorted issue
    times on the aligned clock, so "the last one before the release" is one binary search."""

    SEND, RECV, ANY = 0, 1, 2

    def __init__(self, ops: dict[int, P2POps], timelines: dict[int, RankTimeline]) -> None:
        self.by: dict[tuple[int, int, int], npt.NDArray[np.int64]] = {}
        # device kernels of a matched send and receive end together: by end, with their starts
        self.by_end: dict[tuple[int, int, int], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
        for r, po in ops.items():
            if r not in timelines or not len(po.start):
                continue
            st = po.start + timelines[r].clock_offset_ns
            en = po.end + timelines[r].clock_offset_ns
            send_like = (po.direction == int(Direction.SEND)) | (po.direction == int(Direction.BOTH))
            recv_like = (po.direction == int(Direction.RECV)) | (po.direction == int(Direction.BOTH))
            for peer in np.unique(po.peer).tolist():
                pm = po.peer == peer
                for kind, sel in ((self.SEND, pm & send_like), (self.RECV, pm & recv_like), (self.ANY, pm)):
                    if sel.any():
                        self.by[(r, int(peer), kind)] = np.sort(st[sel])
                        if po.device:
                            o = np.argsort(en[sel], kind="stable")
                            self.by_end[(r, int(peer), kind)] = (en[sel][o], st[sel][o])

    def _kind(self, wait_dir: int) -> int:
        if wait_dir == int(Direction.RECV):
            return self.SEND
        if wait_dir == int(Direction.SEND):
            return self.RECV
        return self.ANY

    def matched(self, rank: int, towards: int, wait_dir: int, end: int, tol: int) -> int | None:
        """Issue time of ``rank``'s device operation towards ``towards`` that ended with the
        waiter's operation (within ``tol``): its matched partner (None when there is none)."""
        got = self.by_end.get((rank, towards, self._kind(wait_dir)))
        if got is None:
            return None
        ends, starts = got
        j = int(np.searchsorted(ends, end))
        best: int | None = None
        for c in (j - 1, j):
            ok = 0 <= c < ends.size and abs(int(ends[c]) - end) <= tol and int(starts[c]) <= end
            if ok and (best is None or abs(int(ends[c]) - end) < abs(int(ends[best]) - end)):
                best = c
        return int(starts[best]) if best is not None else None

    def last_before(self, rank: int, towards: int, wait_dir: int, t: int) -> int | None:
        """Issue time of ``rank``'s last operation towards ``towards`` at or before ``t`` that can
        release a wait of direction ``wait_dir`` (None when there is none)."""
        arr = self.by.get((rank, towards, self._kind(wait_dir)))
        if arr is None:
            return None
        j = int(np.searchsorted(arr, t, side="right")) - 1
        return int(arr[j]) if j >= 0 else None


@dataclass
class _Columns:
    """The replay's nodes as columns: what every variant reads, without per-node attribute access."""

    pre: npt.NDArray[np.int64]
    post: npt.NDArray[np.int64]
    pre_host: npt.NDArray[np.int64]
    pre_coll: npt.NDArray[np.int64]
    pre_copy: npt.NDArray[np.int64]
    pre_ux: npt.NDArray[np.int64]
    span: npt.NDArray[np.int64]
    busy: npt.NDArray[np.int64]
    in_host: npt.NDArray[np.int64]
    in_ux: npt.NDArray[np.int64]
    in_copy: npt.NDArray[np.int64]
    send_wait: npt.NDArray[np.bool_]
    has_obs: npt.NDArray[np.bool_]
    has_abs: npt.NDArray[np.bool_]
    xfer: npt.NDArray[np.int64]  # the observed transfer of the wait (0 without one)
    issue: npt.NDArray[np.int64]  # the producer's issue delay
    issue_copy: npt.NDArray[np.int64]
    lead: npt.NDArray[np.int64]
    on_compute: npt.NDArray[np.bool_]
    cost_key: list[tuple[int, int, int]]  # (rank, stage, phase): the mean-cost factor's key
    meas_end: list[int]
    # in the replay's order (measured start): node ids, the (rank, step) of a step's first block
    # (None for the others), producers, fixed issue times, and (release, label edges) or None
    order: npt.NDArray[np.int64]
    order_l: list[int]
    first_key_o: list[tuple[int, int] | None]
    prod_o: list[int]
    t_issue_o: list[int]
    deps_o: list[tuple[int | None, list[tuple[int, int]]] | None]

    @classmethod
    def of(cls, rp: Replay) -> _Columns:
        nodes = rp.nodes
        n = len(nodes)

        def col(get: Callable[[_Node], int]) -> npt.NDArray[np.int64]:
            return np.fromiter((get(nd) for nd in nodes), np.int64, n)

        def flag(get: Callable[[_Node], bool]) -> npt.NDArray[np.bool_]:
            return np.fromiter((get(nd) for nd in nodes), np.bool_, n)

        span = col(lambda nd: nd.span)
        return cls(
            pre=col(lambda nd: nd.pre),
            post=col(lambda nd: nd.post),
            pre_host=col(lambda nd: nd.pre_host),
            pre_coll=col(lambda nd: nd.pre_coll),
            pre_copy=col(lambda nd: nd.pre_copy),
            pre_ux=col(lambda nd: nd.pre_ux),
            span=span,
            busy=col(lambda nd: nd.busy),
            in_host=col(lambda nd: nd.in_host),
            in_ux=col(lambda nd: nd.in_ux),
            in_copy=col(lambda nd: nd.in_copy),
            send_wait=flag(lambda nd: nd.send_wait),
            has_obs=flag(lambda nd: nd.obs is not None),
            has_abs=flag(lambda nd: nd.obs_abs is not None),
            xfer=col(
                lambda nd: nd.obs[2] if nd.obs is not None else nd.obs_abs[1] if nd.obs_abs is not None else 0
            ),
            issue=col(lambda nd: nd.obs[1] if nd.obs is not None else 0),
            issue_copy=col(lambda nd: nd.issue_copy),
            lead=col(lambda nd: nd.lead),
            on_compute=flag(lambda nd: nd.on_compute),
            cost_key=[(nd.rank, nd.stage, nd.phase) for nd in nodes],
            meas_end=(np.asarray(rp.meas_start, np.int64) + span).tolist() if n else [],
            order=np.asarray(rp.order, np.int64),
            order_l=list(rp.order),
            first_key_o=[
                (nodes[i].rank, nodes[i].step) if rp.first[(nodes[i].rank, nodes[i].step)] == i else None
                for i in rp.order
            ],
            prod_o=[ob[0] if (ob := nodes[i].obs) is not None else -1 for i in rp.order],
            t_issue_o=[ab[0] if (ab := nodes[i].obs_abs) is not None else 0 for i in rp.order],
            deps_o=[
                (nodes[i].release, nodes[i].edges) if nodes[i].release is not None or nodes[i].edges else None
                for i in rp.order
            ],
        )


class Replay:
    """The block graph of the analyzed steps and its evaluation under counterfactual changes."""

    def mean_costs(self) -> dict[tuple[int, int, int], float]:
        """The same total work spread evenly over the stages: per (rank, stage, phase), the factor
        that brings that stage's forward (backward, W) work on the rank to the mean.

        When every (rank, stage) holds the same number of blocks of a phase, each stage (an
        interleaved chunk too) is brought to the mean stage work. When the labels do not add up
        (a block cut in two, chunks of one rank labelled alike) each rank's blocks are scaled to
        the mean work per rank instead, which keeps the total work whatever the labels say.
        """
        phases = (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD))
        tot: dict[tuple[int, int, int], int] = {}
        cnt: dict[tuple[int, int, int], int] = {}
        for nd in self.nodes:
            if nd.phase in phases:
                k = (nd.rank, nd.stage, nd.phase)
                tot[k] = tot.get(k, 0) + nd.busy
                cnt[k] = cnt.get(k, 0) + 1
        out: dict[tuple[int, int, int], float] = {}
        for ph in phases:
            keys = [k for k in tot if k[2] == ph]
            if not keys:
                continue
            if len({cnt[k] for k in keys}) == 1:
                vals = {k: tot[k] for k in keys if tot[k] > 0}
                mean = float(np.mean(list(vals.values()))) if vals else 0.0
                out.update({k: mean / v for k, v in vals.items()})
                continue
            per_rank: dict[int, int] = {}
            for k in keys:
                per_rank[k[0]] = per_rank.get(k[0], 0) + tot[k]
            pos = {r: v for r, v in per_rank.items() if v > 0}
            mean = float(np.mean(list(pos.values()))) if pos else 0.0
            out.update({k: mean / pos[k[0]] for k in keys if k[0] in pos})
        return out

    def _find_step_syncs(self) -> None:
        """Step-end collectives that every rank joins and that end together form one sync point:
        early ranks wait in them for the last one, which only pays the transfer."""
        self.sync_of: dict[tuple[int, int], int] = {}
        by_step: dict[int, list[tuple[int, int]]] = {}
        for rs in self.steps:
            key = (rs.rank, rs.step)
            if key in self.tail_coll:
                by_step.setdefault(rs.number if rs.number >= 0 else rs.step, []).append(key)
        n_ranks = len({rs.rank for rs in self.steps})
        for sk, members in by_step.items():
            if len(members) < 2 or len(members) < n_ranks:
                continue
            ends = np.array([self.tail_coll[k][1] for k in members], dtype=np.int64)
            durs = np.array([self.tail_coll[k][1] - self.tail_coll[k][0] for k in members], dtype=np.int64)
            xfer = int(durs.min())
            # a real sync: the collectives end within a fraction of the shortest one (plus 50 µs)
            if int(ends.max() - ends.min()) > max(xfer // 2, 50_000):
                continue
            self.syncs[sk] = (members, xfer)
            for k in members:
                self.sync_of[k] = sk

    def edge_stats(self) -> list[tuple[int, int, int, int]]:
        """Observed waits as (producer rank, consumer rank, transfer ns, time waited ns)."""
        return list(self.waits)

    def __init__(
        self,
        steps: list[RankStep],
        timelines: dict[int, RankTimeline],
        ops: dict[int, P2POps],
        last_stage: int,
    ) -> None:
        self.steps = steps
        self._cols: _Columns | None = None
        self.nodes: list[_Node] = []
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
        self.syncs: dict[int, tuple[list[tuple[int, int]], int]] = {}  # step key -> members, transfer
        self.order: list[int] = []
        self.meas_start: list[int] = []
        self.meas_lo: list[int] = []  # the end of the rank's work before each block
        taus: dict[tuple[int, int], list[int]] = {}  # per link (producer, consumer)
        self.dropped_edges = 0
        self.untraced_waits = 0
        self.false_waits = 0  # gaps under a transfer that the peer issued only later (not waits)
        self.waits: list[tuple[int, int, int, int]] = []  # producer, consumer, transfer, waited
        by_key: dict[tuple[int, int, int, int], int] = {}
        ends_by_rank: dict[int, tuple[npt.NDArray[np.int64], list[int]]] = {}
        # (node, (peer, dir, posted, op end), release, wait start)
        pending: list[tuple[int, tuple[int, int, int, int], int, int]] = []
        p2p_index = {r: _P2PIndex(timelines[r], ops.get(r)) for r in {rs.rank for rs in steps}}
        tol = timing_tolerance_ns(timelines)
        for rs in steps:
            b = rs.blocks
            self.first[(rs.rank, rs.step)] = len(self.nodes)
            self.count[(rs.rank, rs.step)] = len(b)
            cpu = timelines[rs.rank].cpu_only
            s_a = b.start.astype(np.int64)
            e_a = b.end.astype(np.int64)
            # the end of the rank's work before each block (the window start before the first)
            reach = np.maximum.accumulate(np.r_[np.int64(rs.w0), e_a])
            prev_a = reach[:-1]
            lo_a = np.minimum(prev_a, s_a)
            # The wait that released each block is the last run of transfer time before it (pieces
            # a few µs apart are one wait); earlier transfers were exposed comm.
            has_w, ws_a, rel_a = _last_waits(rs.wait_set, lo_a, s_a)
            # a "wait" no longer than the timing tolerance is rounding where a transfer touches
            # the block, not a wait: it must not make the peer's block this one's producer
            tiny = has_w & (rel_a - ws_a <= tol)
            has_w &= ~tiny
            ws_a[tiny] = s_a[tiny]
            rel_a[tiny] = s_a[tiny]
            held_l: list[tuple[int, int, int, int]] = []
            on_comp_l: list[bool] = []
            idx = p2p_index[rs.rank]
            for j in np.flatnonzero(has_w).tolist():
                wait_start, rel = int(ws_a[j]), int(rel_a[j])
                held = idx.blocking(wait_start, rel, tol)
                # transfers of other operations before the one that held the rank (a send on
                # the compute stream before the receive) are exposed comm, not the wait
                if held[0] >= 0 and not cpu:
                    # the wait is the exposed span of that operation; other transfers before or
                    # after it (a send on the compute stream, a receive whose data was there)
                    # are exposed comm around the wait
                    rel = max(min(rel, held[3]), wait_start)
                    wait_start = min(max(wait_start, held[2]), rel)
                    ws_a[j], rel_a[j] = wait_start, rel
                held_l.append(held)
                on_comp_l.append(idx.on_compute_at(wait_start, rel))
            pre_a = ws_a - lo_a
            post_a = s_a - rel_a
            sets = rs.sets

            m = _measure_between
            # local pieces outside the wait span
            p2p_host = m(rs.p2p_host, lo_a, ws_a) + m(rs.p2p_host, rel_a, s_a)
            host_a = m(rs.host_set, lo_a, ws_a) + m(rs.host_set, rel_a, s_a) + p2p_host
            coll_a = (
                m(sets.collective, lo_a, ws_a)
                + m(sets.collective, rel_a, s_a)
                + m(sets.p2p, lo_a, ws_a)
                + m(sets.p2p, rel_a, s_a)
                - p2p_host
            )
            copy_a = m(sets.copy, lo_a, ws_a) + m(sets.copy, rel_a, s_a)
            lost_a = m(sets.gaps, lo_a, ws_a) + m(sets.gaps, rel_a, s_a)
            ux_a = np.maximum(lost_a - host_a - coll_a - copy_a, 0)
            in_lost = m(sets.gaps, s_a, e_a)
            in_copy = np.minimum(m(sets.copy, s_a, e_a), in_lost)
            in_host = np.minimum(m(rs.host_set, s_a, e_a), in_lost - in_copy)
            rows = zip(
                s_a.tolist(),
                e_a.tolist(),
                b.busy.tolist(),
                in_host.tolist(),
                (in_lost - in_host - in_copy).tolist(),
                in_copy.tolist(),
                b.phase.tolist(),
                b.stage.tolist(),
                b.mb.tolist(),
                pre_a.tolist(),
                post_a.tolist(),
                host_a.tolist(),
                coll_a.tolist(),
                ux_a.tolist(),
                copy_a.tolist(),
                has_w.tolist(),
                rel_a.tolist(),
                ws_a.tolist(),
                lo_a.tolist(),
                strict=True,
            )
            step_key = rs.number if rs.number >= 0 else rs.step
            k_w = 0
            for i, row in enumerate(rows):
                s, e, busy, ih, iu, ic, ph, st, mb, pre, post, h, co, u, cp, w, rel, wst, lo = row
                node = _Node(rs.rank, rs.step, i, e - s, busy, ih, iu, ic, ph, st, pre, post, h, co, u, cp)
                nid = len(self.nodes)
                self.nodes.append(node)
                self.meas_start.append(s)
                self.meas_lo.append(lo)
                if w:
                    pending.append((nid, held_l[k_w], rel, wst))
                    node.on_compute = on_comp_l[k_w]
                    k_w += 1
                if mb >= 0:
                    by_key[(step_key, st, ph, mb)] = nid
            prev_end = int(reach[-1])
            t_lo, t_hi = prev_end, rs.w1
            busy_t = _m(rs.sets.compute, t_lo, t_hi)
            # exposed p2p after the last block (a send on the compute stream) is exposed comm too
            coll_t = _m(rs.sets.collective, t_lo, t_hi) + _m(rs.sets.p2p, t_lo, t_hi)
            host_t = _m(rs.host_set, t_lo, t_hi)
            copy_t = _m(rs.sets.copy, t_lo, t_hi)
            other_t = max(t_hi - t_lo - busy_t - coll_t - host_t - copy_t, 0)
            self.tail[(rs.rank, rs.step)] = (busy_t, coll_t, host_t, other_t, copy_t)
            cs, ce = ivs.window(rs.sets.collective, t_lo, t_hi)
            if cs.size:
                c0, c1 = int(cs[0]), int(ce[-1])
                self.tail_coll[(rs.rank, rs.step)] = (
                    c0,
                    c1,
                    _split_local(rs, t_lo, c0),
                    _split_local(rs, c1, t_hi),
                )
        self._find_step_syncs()
        # per-rank block ends for "which block did the peer finish last"
        # (one sort by rank, then each rank's slice: no scan of all nodes per rank)
        n_rank = np.fromiter((nd.rank for nd in self.nodes), np.int64, len(self.nodes))
        n_end = np.asarray(self.meas_start, np.int64) + np.fromiter(
            (nd.span for nd in self.nodes), np.int64, len(self.nodes)
        )
        by_r = np.argsort(n_rank, kind="stable")
        r_sorted = n_rank[by_r]
        for r in {rs.rank for rs in steps}:
            ids_a = by_r[np.searchsorted(r_sorted, r, "left") : np.searchsorted(r_sorted, r, "right")]
            ends = n_end[ids_a]
            o = np.argsort(ends, kind="stable")
            ends_by_rank[r] = (ends[o], ids_a[o].tolist())
        issues = _IssueIndex(ops, timelines)
        by_rank_step = {(rs.rank, rs.step): rs for rs in steps}
        for nid, (peer, wdir, posted, op_end), rel, wait_start in pending:
            ends, ids = ends_by_rank.get(peer, (np.zeros(0, np.int64), []))
            me = self.nodes[nid].rank
            # The operation that released the wait: on devices the peer's kernel that ended with
            # this rank's (a matched NCCL send/recv pair ends together), else the peer's last
            # operation towards this rank before the release. Its producer block is the last one
            # the peer finished before issuing it (with a slow link the peer may have finished
            # later blocks before the data arrived).
            last = issues.matched(peer, me, wdir, op_end, MATCH_END_NS)
            if last is None:
                last = issues.last_before(peer, me, wdir, rel)
            # (CPU runs: host calls, whose start says little about when the data left; there the
            # producer is the peer's last block before the release)
            device = not timelines[me].cpu_only
            # a block that ends within the timing tolerance after the issue counts as finished
            # before it (a send issued as its block ends must not flip to the block before under
            # ns jitter, which would read that whole block as the producer's host delay)
            at = last if (last is not None and device) else rel
            j = int(np.searchsorted(ends, at + tol, side="right")) - 1
            self.nodes[nid].send_wait = wdir == int(Direction.SEND)
            if j < 0 and last is not None and peer in ends_by_rank:
                # the peer issued it before finishing any analyzed block (a receive posted at the
                # start of the step): the transfer starts at that fixed issue time
                posted = min(posted, wait_start)
                xfer = rel - max(last, posted)
                if xfer < -tol:
                    self._not_a_wait(nid, by_rank_step[(me, self.nodes[nid].step)])
                    continue
                self.nodes[nid].obs_abs = (last, xfer)
                self.nodes[nid].lead = wait_start - posted
                self.waits.append((peer, me, xfer, rel - wait_start))
                taus.setdefault((peer, me), []).append(xfer)
                continue
            if j < 0:
                # the peer is not traced, or its block lies before the analyzed steps
                self.nodes[nid].release = rel
                self.untraced_waits += int(peer not in ends_by_rank)
                continue
            p_end = int(ends[j])
            # The peer's last transfer operation towards this rank before the release: the time from
            # the producer's block end to that issue is the producer's host delay. The transfer is
            # what remains after both sides were ready: the producer had issued and this rank had
            # posted its operation (a gloo or NCCL transfer cannot complete before the receive is
            # posted; a receive posted under compute lets the transfer run before the wait begins).
            issue = max(p_end, last) if last is not None else p_end
            posted = min(posted, wait_start) if device else wait_start
            xfer = rel - max(issue, posted)
            if xfer < -tol:
                self._not_a_wait(nid, by_rank_step[(me, self.nodes[nid].step)])
                continue
            # copies the producer ran between its block and the send delay the send as copies
            prs = by_rank_step.get((self.nodes[ids[j]].rank, self.nodes[ids[j]].step))
            issue_copy = min(_m(prs.sets.copy, p_end, issue), issue - p_end) if prs is not None else 0
            self.nodes[nid].obs = (ids[j], issue - p_end - issue_copy, xfer)
            self.nodes[nid].issue_copy = issue_copy
            self.nodes[nid].lead = wait_start - posted
            self.waits.append((peer, me, xfer, rel - wait_start))
            taus.setdefault((peer, me), []).append(xfer)
        # The normal latency: the lower median over the links of each link's median transfer,
        # so that slow links (even half of them, as with P=2) do not set what "normal" is.
        per_link = [float(np.median(v)) for v in taus.values()]
        self.normal_latency = int(np.percentile(per_link, 50, method="lower")) if per_link else 0
        # pipeline data dependencies from labels, with the normal latency (capped so the measured
        # timeline stays reproduced exactly). A consumer that starts a few ns before its producer
        # ends (within the rounding and timer resolution of the input) keeps the dependency with
        # that small negative latency: dropping it would make the split of the waits depend on
        # sub-µs jitter (float32 seconds against float64 ones).
        for key, nid in by_key.items():
            stepn, stage, phase, mb = key
            if phase == int(Phase.FWD):
                prod = by_key.get((stepn, stage - 1, int(Phase.FWD), mb))
            elif phase == int(Phase.BWD):
                prod = (
                    by_key.get((stepn, stage, int(Phase.FWD), mb))
                    if stage == last_stage
                    else by_key.get((stepn, stage + 1, int(Phase.BWD), mb))
                )
            elif phase == int(Phase.WGRAD):
                prod = by_key.get((stepn, stage, int(Phase.BWD), mb))
            else:
                prod = None
            if prod is None or prod == nid:
                continue
            node = self.nodes[nid]
            p_end = self.meas_start[prod] + self.nodes[prod].span
            slack = self.meas_start[nid] - node.post - p_end
            if slack < -tol:  # the measurement contradicts this dependency: labels do not match up
                self.dropped_edges += 1
                continue
            node.edges.append((prod, min(self.normal_latency, slack)))
        self.order = sorted(range(len(self.nodes)), key=lambda i: self.meas_start[i])
        self.w0 = {(rs.rank, rs.step): rs.w0 for rs in steps}
        # a step that begins where the rank's previous analyzed step ended is chained to it
        self.prev_step: dict[tuple[int, int], tuple[int, int]] = {}
        by_rank: dict[int, list[RankStep]] = {}
        for rs in steps:
            by_rank.setdefault(rs.rank, []).append(rs)
        for lst in by_rank.values():
            lst.sort(key=lambda x: x.w0)
            for a_rs, b_rs in itertools.pairwise(lst):
                if abs(b_rs.w0 - a_rs.w1) <= STEP_JOIN_NS:
                    self.prev_step[(b_rs.rank, b_rs.step)] = (a_rs.rank, a_rs.step)

    def _not_a_wait(self, nid: int, rs: RankStep) -> None:
        """A gap that looked like a wait but that the peer cannot have released: the peer issued
        the operation after this rank's block had begun (a transfer still in flight across the
        gap, while the rank was held by something else: a launch gap, a late host). Read as a
        wait, a later block of the peer would become this block's producer with a negative
        transfer, tying the two ranks wherever that block moves in a variant. The gap is measured
        as local time instead, exactly as for a block without a wait."""
        node = self.nodes[nid]
        lo, s = self.meas_lo[nid], self.meas_start[nid]
        p2p_host = _m(rs.p2p_host, lo, s)
        host = _m(rs.host_set, lo, s) + p2p_host
        coll = _m(rs.sets.collective, lo, s) + _m(rs.sets.p2p, lo, s) - p2p_host
        copy = _m(rs.sets.copy, lo, s)
        lost = _m(rs.sets.gaps, lo, s)
        node.pre, node.post = s - lo, 0
        node.pre_host, node.pre_coll, node.pre_copy = host, coll, copy
        node.pre_ux = max(lost - host - coll - copy, 0)
        node.on_compute = False
        node.false_wait = True
        self.false_waits += 1

    def _columns(self) -> _Columns:
        """The nodes as columns (built once, reused by every variant)."""
        if self._cols is None:
            self._cols = _Columns.of(self)
        return self._cols

    def run(
        self,
        *,
        host: bool = True,
        comm_excess: bool = True,
        comm: bool = True,
        copy: bool = True,
        ux: bool = True,
        balanced: dict[tuple[int, int, int], float] | None = None,
    ) -> dict[tuple[int, int], tuple[int, int]]:
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
        cols = self._columns()
        lat = self.normal_latency
        w_start: dict[tuple[int, int], int] = {}
        w_end: dict[tuple[int, int], int] = {}
        sync_end: dict[int, int] = {}
        # Every per-node quantity that depends only on the variant, computed for all nodes at once;
        # the loop below keeps only the dependencies (the same arithmetic as one node at a time).
        loc = cols.pre + cols.post
        keep = loc.copy()
        if not host:
            keep -= cols.pre_host
        if not comm:
            keep -= cols.pre_coll
        if not copy:
            keep -= cols.pre_copy
        if not ux:
            keep -= cols.pre_ux
        scale = np.where(loc > 0, keep / np.where(loc > 0, loc, 1), 0.0)
        # everything the loop reads, in the loop's order (one zip instead of indexing per node)
        order = cols.order
        pre_l: list[float] = (cols.pre * scale)[order].tolist()
        post_l: list[float] = (cols.post * scale)[order].tolist()
        dur: npt.NDArray[np.int64] | npt.NDArray[np.float64]
        if balanced is not None:
            factor = np.fromiter(
                (balanced.get(k, 1.0) for k in cols.cost_key), np.float64, len(cols.cost_key)
            )
            dur = cols.busy * factor + cols.in_host + cols.in_ux + cols.in_copy
        else:
            dur = cols.span.copy()
        if not host:
            dur = dur - cols.in_host
        if not copy:
            dur = dur - cols.in_copy
        if not ux:
            dur = dur - cols.in_ux
        dur_l = dur[order].tolist()
        # the wait of each node: 1 its own send (comm removed), 2 a producer block, 3 a fixed issue
        code = np.where(
            cols.send_wait & (not comm), 1, np.where(cols.has_obs, 2, np.where(cols.has_abs, 3, 0))
        )[order].tolist()
        xfer_a = cols.xfer if comm_excess else np.minimum(cols.xfer, lat)
        excess = np.maximum(cols.xfer - lat, 0) if comm_excess else np.zeros_like(cols.xfer)
        # code 1 adds the excess, 2 and 3 wait for the transfer
        add_l = np.where(cols.send_wait & (not comm), excess, xfer_a)[order].tolist()
        extra_l = (cols.issue if host else 0) + (cols.issue_copy if copy else 0) + 0 * cols.issue
        lead_a = cols.lead if comm else np.where(cols.on_compute, -NEG_INF, cols.lead)
        # code 2 waits for its producer's end (+ issue delay), code 3 for a fixed issue time
        lead_l = lead_a[order].tolist()
        extra_o = extra_l[order].tolist()
        rows = zip(
            cols.order_l,
            cols.first_key_o,
            pre_l,
            post_l,
            dur_l,
            code,
            add_l,
            lead_l,
            cols.prod_o,
            extra_o,
            cols.t_issue_o,
            cols.deps_o,
            strict=True,
        )
        end: list[int] = list(cols.meas_end)  # a node not replayed yet ends where it was measured

        def last_end(key: tuple[int, int]) -> int:
            f, c = self.first[key], self.count[key]
            return end[f + c - 1] if c else window_start(key)

        def window_start(key: tuple[int, int]) -> int:
            if key not in w_start:
                prev = self.prev_step.get(key)
                w_start[key] = window_end(prev) if prev is not None else self.w0[key]
            return w_start[key]

        def local(piece: tuple[int, int, int, int, int]) -> int:
            busy_p, host_p, other_p, copy_p, p2p_p = piece
            return (
                busy_p + other_p + (host_p if host else 0) + (copy_p if copy else 0) + (p2p_p if comm else 0)
            )

        def window_end(key: tuple[int, int]) -> int:
            if key in w_end:
                return w_end[key]
            sync = self.sync_of.get(key)
            if sync is not None:
                if sync not in sync_end:
                    members, xfer = self.syncs[sync]
                    arrive = NEG_INF
                    for m in members:
                        arrive = max(arrive, last_end(m) + local(self.tail_coll[m][2]))
                    sync_end[sync] = arrive + (xfer if comm else 0)
                val = sync_end[sync] + local(self.tail_coll[key][3])
            else:
                busy_t, coll_t, host_t, other_t, copy_t = self.tail[key]
                val = (
                    last_end(key)
                    + busy_t
                    + other_t
                    + (coll_t if comm else 0)
                    + (host_t if host else 0)
                    + (copy_t if copy else 0)
                )
            w_end[key] = int(val)
            return w_end[key]

        for i, fk, pre, post, du, c, add, lead, prod, extra, t_iss, deps in rows:
            base = (window_start(fk) if fk is not None else end[i - 1]) + pre
            if c == 1:
                # waiting for its own send: no data dependency, the wait overlaps once comm does;
                # only a slow link's excess over the normal transfer stays (blocking sends)
                base += add
            elif c == 2:
                # the transfer starts once the producer issued it and this rank had posted its
                # side (``lead`` before it began to wait); the block waits for its arrival
                ready = max(base - lead, end[prod] + extra)
                base = max(base, ready + add)
            elif c == 3:
                base = max(base, max(base - lead, t_iss) + add)
            if deps is not None:
                rel, eds = deps
                if rel is not None:
                    base = max(base, rel)
                for p, tau in eds:
                    base = max(base, end[p] + tau)
            end[i] = int((base + post) + du)
        # the blocks' compute at the mean cost (what is left of each span once its host, copy and
        # other idle is taken out), summed per step by prefix sums
        if balanced is not None:
            bal = (cols.busy * factor).astype(np.int64)
            cum_delta = np.concatenate([[0], np.cumsum(bal - cols.busy)]).tolist()
        idle: dict[tuple[int, int], tuple[int, int]] = {}
        for rs in self.steps:
            key = (rs.rank, rs.step)
            f, c = self.first[key], self.count[key]
            w0 = window_start(key)
            w1 = window_end(key)
            busy = rs.acct.compute
            if balanced is not None and c:
                busy = busy + int(cum_delta[f + c] - cum_delta[f])
            idle[key] = (int(w1 - w0), int(w1 - w0 - busy))
        return idle


# Variants of the replay, each removing one more kind of delay than the next (DESIGN.md §5): the
# causes are the differences of consecutive ones, so they telescope to the measured lost time.
CHAIN: tuple[tuple[str, frozenset[str]], ...] = (
    ("measured", frozenset()),
    ("no_ux", frozenset({"ux"})),
    ("no_copy", frozenset({"ux", "copy"})),
    ("no_comm", frozenset({"ux", "copy", "comm"})),
    ("no_host", frozenset({"ux", "copy", "comm", "host"})),
    ("schedule_only", frozenset({"ux", "copy", "comm", "host", "comm_excess"})),
)


def _variant(
    rp: Replay, removed: frozenset[str], balanced: dict[tuple[int, int, int], float] | None = None
) -> dict[tuple[int, int], tuple[int, int]]:
    """One replay variant with the named kinds of delay removed."""
    return rp.run(
        host="host" not in removed,
        comm_excess="comm_excess" not in removed,
        comm="comm" not in removed,
        copy="copy" not in removed,
        ux="ux" not in removed,
        balanced=balanced,
    )


def replay_causes(
    rp: Replay,
) -> tuple[dict[tuple[int, int], dict[str, int]], dict[str, dict[tuple[int, int], tuple[int, int]]]]:
    """The counterfactual causes of every (rank, step) from the replay, and every variant's result.

    Built up from the ideal run: ``bubble`` is the idle of the schedule with every stage at the
    mean cost, normal-latency transfers and nothing else (capped by the idle with the actual
    costs), ``imbalance`` what the actual stage costs add, ``comm_wait`` what the actual transfer
    times add (slow links, late transfers), ``host`` the host delays, ``exposed_comm`` the exposed
    collectives and transfers between blocks, ``exposed_copy`` the exposed copies; the rest of
    the measured idle is ``unexplained``.
    """
    full = {name: _variant(rp, removed) for name, removed in CHAIN}
    full["balanced"] = _variant(rp, CHAIN[-1][1], rp.mean_costs())
    v = {name: {k: x[1] for k, x in var.items()} for name, var in full.items()}
    out: dict[tuple[int, int], dict[str, int]] = {}
    for k in v["measured"]:
        sched = v["schedule_only"][k]
        bubble = max(min(v["balanced"][k], sched), 0)
        out[k] = {
            "bubble": bubble,
            "imbalance": max(sched - bubble, 0),
            "comm_wait": max(v["no_host"][k] - sched, 0),
            "host": max(v["no_comm"][k] - v["no_host"][k], 0),
            "exposed_comm": max(v["no_copy"][k] - v["no_comm"][k], 0),
            "exposed_copy": max(v["no_ux"][k] - v["no_copy"][k], 0),
            "unexplained": max(v["measured"][k] - v["no_ux"][k], 0),
        }
    return out, full


def attribute(
    steps: list[RankStep],
    timelines: dict[int, RankTimeline],
    ops: dict[int, P2POps],
    last_stage: int,
    pipelined: bool,
) -> Attribution:
    """Cause totals for every (rank, step) and the per-gap cause tables."""
    causes: dict[tuple[int, int], dict[str, int]] = {}
    notes: list[str] = []
    replay_steps: dict[str, float] = {}
    edges: list[tuple[int, int, int, int]] = []
    lat = 0
    if pipelined and any(len(rs.blocks) for rs in steps):
        rp = Replay(steps, timelines, ops, last_stage)
        lat = rp.normal_latency
        cf, full = replay_causes(rp)
        mean_cost = rp.mean_costs()
        # single-cause counterfactuals for the findings' gains: only that delay removed
        full["gain_host"] = rp.run(host=False)
        full["gain_comm_wait"] = rp.run(comm_excess=False)
        full["gain_comm"] = rp.run(comm_excess=False, comm=False)
        full["gain_copy"] = rp.run(copy=False)
        full["gain_balanced"] = rp.run(balanced=mean_cost)
        v = {name: {k: x[1] for k, x in var.items()} for name, var in full.items()}
        for rs in steps:
            k = (rs.rank, rs.step)
            c = dict(cf[k])
            # the replay's own disagreement with the measurement is left to _close
            c["unexplained"] = 0
            causes[k] = _close(c, rs.acct.lost)
        # collectives the replay does not model as its step-end sync: waits for a late member
        waits = run_waits(steps, timelines, {k: rp.tail_coll[k][:2] for k in rp.sync_of})
        for k, mv in waits.moves.items():
            causes[k] = apply_moves(causes[k], mv)
        for name, var in full.items():
            replay_steps[name] = float(np.mean([w for w, _ in var.values()])) if var else 0.0
        edges = rp.edge_stats()
        if rp.dropped_edges:
            notes.append(
                f"{rp.dropped_edges} micro-batch dependencies from the block labels contradict the "
                "measured order and were left out of the replay (labels may be mis-numbered)"
            )
        if rp.untraced_waits:
            notes.append(
                f"{rp.untraced_waits} waits are on ranks that are not in the traces: "
                "they are counted as pipeline waits; analyze every rank of the pipeline to trace them"
            )
        mism = [abs(v["measured"][(rs.rank, rs.step)] - rs.acct.lost) for rs in steps]
        if mism and max(mism) > 0.02 * max(rs.acct.window for rs in steps):
            notes.append(
                "the replay of the measured timeline differs from the measurement by up to "
                f"{max(mism) / 1e6:.2f} ms; the difference is reported as unexplained"
            )
    else:
        waits = run_waits(steps, timelines, p2p=True)
        for rs in steps:
            host = ivs.measure(ivs.subtract(rs.host_set, rs.sets.p2p))
            c = {
                "bubble": 0,
                "imbalance": 0,
                "comm_wait": 0,
                "exposed_comm": rs.acct.exposed_p2p + rs.acct.exposed_collective,
                "host": host,
                "exposed_copy": rs.acct.exposed_copy,
                "unexplained": 0,
            }
            k = (rs.rank, rs.step)
            causes[k] = apply_moves(_close(c, rs.acct.lost), waits.moves.get(k, {}))
    notes.extend(waits.notes)
    gaps = _paint(steps, causes)
    return Attribution(causes, gaps, lat, replay_steps, notes, edges, waits)


def _close(c: dict[str, int], lost: int) -> dict[str, int]:
    """Make the causes add up to the lost time exactly: a shortfall is unexplained, an excess is
    taken back from the causes in reverse precedence (the replay overestimated them)."""
    total = sum(c.values())
    if total <= lost:
        c["unexplained"] += lost - total
        return c
    excess = total - lost
    for k in ("unexplained", "exposed_copy", "exposed_comm", "host", "comm_wait", "imbalance", "bubble"):
        take = min(excess, c[k])
        c[k] -= take
        excess -= take
        if excess == 0:
            break
    return c


# Where each cause is drawn first: pools are 0 host evidence, 1 waits, 2 exposed collectives,
# 3 other idle, 4 exposed copies. Bubble prefers waits at the edges of the step (warm-up and
# cool-down).
_POOLS = {
    "host": (0, 1, 3),
    "comm_wait": (1,),
    "exposed_comm": (2, 1),
    "exposed_copy": (4,),
    "unexplained": (3,),
    "bubble": (1, 3),
    "imbalance": (1, 3),
}
_ORDER = ("host", "exposed_copy", "exposed_comm", "comm_wait", "unexplained", "bubble", "imbalance")
_FALLBACK = (1, 3, 0, 2, 4)


def _pools(lost: ivs.ISet, by_rank: list[ivs.ISet]) -> list[ivs.ISet]:
    """The lost time split into its pools in one sweep: host evidence, then waits, collectives and
    copies (each taking what the earlier ones left), the rest as "other". Returned in the order
    host, wait, collective, other, copy; each a sorted disjoint set with touching pieces merged."""
    if lost[0].size == 0:
        return [ivs.empty() for _ in range(5)]
    pts = np.unique(np.concatenate([lost[0], lost[1], *[x for st in by_rank for x in st]]))
    seg_s, seg_e = pts[:-1], pts[1:]

    def covers(iset: ivs.ISet) -> npt.NDArray[np.bool_]:
        s, e = iset
        if s.size == 0:
            return np.zeros(seg_s.size, np.bool_)
        j = np.searchsorted(s, seg_s, side="right") - 1
        return (j >= 0) & (seg_s < e[np.maximum(j, 0)])

    label = np.full(seg_s.size, -1, np.int64)
    in_lost = covers(lost)
    label[in_lost] = 3  # other
    # first matching pool wins: host (0), wait (1), collective (2), copy (4)
    for pool, iset in reversed(list(zip((0, 1, 2, 4), by_rank, strict=True))):
        label[in_lost & covers(iset)] = pool
    out: list[ivs.ISet] = []
    for pool in range(5):
        k = np.flatnonzero(label == pool)
        if k.size == 0:
            out.append(ivs.empty())
            continue
        # adjacent elementary segments of one pool touch: merge them
        new = np.r_[True, k[1:] != k[:-1] + 1]
        first = np.flatnonzero(new)
        last = np.r_[first[1:] - 1, k.size - 1]
        out.append((seg_s[k[first]].astype(np.int64), seg_e[k[last]].astype(np.int64)))
    return out


def _paint(steps: list[RankStep], causes: dict[tuple[int, int], dict[str, int]]) -> dict[int, GapTable]:
    """Give every lost-time segment one cause so that the totals per (rank, step) are exact.

    First the amount each cause takes from each pool of segments (by the precedence of _ORDER and
    the pools each cause prefers), then each pool is cut at those amounts in one vectorized pass.
    """
    out: dict[int, list[npt.NDArray[np.int64]]] = {}
    for rs in steps:
        pools = _pools(rs.sets.gaps, [rs.host_set, rs.wait_set, rs.sets.collective, rs.sets.copy])
        left = [ivs.measure(p) for p in pools]
        takes: list[list[tuple[int, int]]] = [[] for _ in pools]  # per pool: (cause, ns)
        c = causes[(rs.rank, rs.step)]
        for key in _ORDER:
            need = c.get(key, 0)
            for p in list(_POOLS[key]) + [q for q in _FALLBACK if q not in _POOLS[key]]:
                if need <= 0:
                    break
                take = min(need, left[p])
                if take > 0:
                    takes[p].append((int(Cause[key.upper()]), take))
                    left[p] -= take
                    need -= take
        for p, (ps, pe) in enumerate(pools):
            if not takes[p] or ps.size == 0:
                continue
            if p == 1:
                # the schedule's own waits sit at the edges of the step (warm-up, cool-down): bubble
                # takes the waits nearest the edges first, imbalance the steady-state ones
                order = np.argsort(np.minimum(ps - rs.w0, rs.w1 - pe), kind="stable")
                ps, pe = ps[order], pe[order]
                rank_of = {int(Cause.BUBBLE): 0, int(Cause.IMBALANCE): 1}
                takes[p].sort(key=lambda t: rank_of.get(t[0], 2))
            out.setdefault(rs.rank, []).append(_cut(ps, pe, takes[p], rs.step))
    tables: dict[int, GapTable] = {}
    for r, parts in out.items():
        arr = np.concatenate(parts) if parts else np.zeros((0, 4), np.int64)
        arr = arr[np.argsort(arr[:, 0], kind="stable")]
        tables[r] = GapTable(
            arr[:, 0].copy(),
            arr[:, 1].copy(),
            arr[:, 2].astype(np.int8),
            np.full(arr.shape[0], -1, np.int32),
            arr[:, 3].astype(np.int32),
        )
    for rs in steps:
        tables.setdefault(rs.rank, GapTable.empty())
    return tables


def _cut(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], takes: list[tuple[int, int]], step: int
) -> npt.NDArray[np.int64]:
    """Rows (start, end, cause, step): the segments, in their order, handed out to the causes in
    ``takes`` (cause, ns) one after the other."""
    lengths = ends - starts
    cum = np.cumsum(lengths)
    total = int(cum[-1])
    bounds = np.cumsum([t for _, t in takes])
    pos = np.unique(np.concatenate([[0], cum, np.minimum(bounds, total)]))
    pos = pos[pos <= total]
    lo, hi = pos[:-1], pos[1:]
    k = np.searchsorted(cum, lo, side="right")
    before = np.concatenate([[0], cum[:-1]])
    t0 = starts[k] + (lo - before[k])
    cause = np.array([c for c, _ in takes], dtype=np.int64)[
        np.minimum(np.searchsorted(bounds, lo, side="right"), len(takes) - 1)
    ]
    keep = (hi > lo) & (lo < bounds[-1])
    return np.stack([t0, t0 + (hi - lo), cause, np.full(lo.size, step, np.int64)], axis=1)[keep]


__all__ = ["CAUSE_KEYS", "Attribution", "RankStep", "Replay", "attribute", "rank_step"]
