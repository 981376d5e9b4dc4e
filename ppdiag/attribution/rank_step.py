"""One rank's step on the aligned clock: the window's interval sets, its account, its blocks and
the lost time with host evidence (what the replay and the causes read of a rank in a step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.accounting import Account, WindowSets, account, window_sets
from ppdiag.model import Direction, Kind, RangeKind, RankTimeline
from ppdiag.model import intervals as ivs
from ppdiag.pipeline.blocks import Blocks


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
    # spinning beside a host stall delays nothing the host did not delay already (CPU runs: the
    # calls that only issued a transfer, which wait_set leaves out)
    p2p_host: ivs.ISet = field(default_factory=ivs.empty)


_T = TypeVar("_T")
# per timeline, what a step reads of its whole timeline (own clock), built once instead of per
# step; an entry keeps the intervals object it was built from, so a reused id() never matches
_PER_TIMELINE: dict[tuple[str, int], tuple[object, Any]] = {}
_PER_TIMELINE_MAX = 512


def _per_timeline(what: str, tl: RankTimeline, build: Callable[[RankTimeline], _T]) -> _T:
    """``build(tl)``, computed once per timeline (its intervals object) and kind of ``what``."""
    iv = tl.intervals
    hit = _PER_TIMELINE.get((what, id(iv)))
    if hit is not None and hit[0] is iv:
        value: _T = hit[1]
        return value
    value = build(tl)
    if len(_PER_TIMELINE) >= _PER_TIMELINE_MAX:
        _PER_TIMELINE.clear()
    _PER_TIMELINE[(what, id(iv))] = (iv, value)
    return value


def _launched(tl: RankTimeline) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Start and launch time of the rank's launched kernels and copies, sorted by start."""
    return _per_timeline("launched", tl, _launched_of)


def _launched_of(tl: RankTimeline) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    iv = tl.intervals
    busy = np.isin(iv.kind, (int(Kind.COMPUTE), int(Kind.MEMCPY), int(Kind.MEMSET))) & (iv.launch >= 0)
    st = iv.start[busy]
    la = iv.launch[busy]
    order = np.argsort(st, kind="stable")
    return st[order], la[order]


def _posting_calls(tl: RankTimeline) -> ivs.ISet:
    """CPU runs: the calls that only issued a transfer (``c10d::send`` / ``c10d::recv_`` around
    an asynchronous ``gloo:*`` span that outlives them), as a set on the rank's own clock.

    Such a call returns before any data moved: the rank is issuing work, not waiting for a peer,
    and its time (stretched when the process is descheduled inside it) is the rank's own host
    time. The wait is the ``gloo:*`` span's blocked tail that follows. A call that holds its span
    to the end blocked inside it, and stays a wait."""
    return _per_timeline("posting", tl, _posting_of)


def _posting_of(tl: RankTimeline) -> ivs.ISet:
    iv = tl.intervals
    out = ivs.empty()
    rg = tl.ranges
    m = np.flatnonzero(iv.kind == int(Kind.P2P))
    cm = np.flatnonzero(rg.kind == int(RangeKind.COMM_OP))
    if m.size and cm.size:
        gloo_id = {
            i for i in np.unique(np.r_[iv.name[m], rg.name[cm]]).tolist() if tl.names[i].startswith("gloo:")
        }
        ops = m[~np.isin(iv.name[m], list(gloo_id))]  # the top-level calls, not the blocked tails
        sp = cm[np.isin(rg.name[cm], list(gloo_id))]
        if ops.size and sp.size:
            o = np.argsort(rg.start[sp], kind="stable")
            sp_s, sp_e = rg.start[sp][o], rg.end[sp][o]
            # the first span the call issued (it starts inside the call) and whether it outlives it
            j = np.searchsorted(sp_s, iv.start[ops], side="left")
            jj = np.minimum(j, sp_s.size - 1)
            inside = (j < sp_s.size) & (sp_s[jj] <= iv.end[ops])
            posting = ops[inside & (sp_e[jj] > iv.end[ops])]
            out = ivs.union(iv.start[posting], iv.end[posting])
    return out


def held_send_calls(tl: RankTimeline, over_ns: int) -> ivs.ISet:
    """CPU runs: the send calls (``c10d::send``, not the ``gloo:*`` tails) of a rank that holds
    its sends in the call (half of them or more last over ``over_ns``: a post the transport takes
    only late), those over ``over_ns``, on the aligned clock; empty for any other rank (a call
    descheduled now and then on a loaded host is no held rank). The rank posts no receive
    meanwhile."""
    s, e = _per_timeline(f"held_sends_{over_ns}", tl, lambda t: _held_sends_of(t, over_ns))
    return s + tl.clock_offset_ns, e + tl.clock_offset_ns


def held_in_call(sends: ivs.ISet | None, p_end: int, rel: int, over_ns: int) -> bool:
    """Whether a consumer spent over ``over_ns`` inside its held send calls ``sends`` between the
    producer's block end ``p_end`` and the release ``rel``. A gloo send completes once its
    receive is posted and the producer issues its next send after it: the producer's hold and
    the consumer's late receive are then that call's, not the link's."""
    return sends is not None and _m(sends, p_end, rel) > over_ns


def _held_sends_of(tl: RankTimeline, over_ns: int) -> ivs.ISet:
    iv = tl.intervals
    m = np.flatnonzero((iv.kind == int(Kind.P2P)) & (iv.direction == int(Direction.SEND)))
    m = m[~np.isin(iv.name[m], [i for i, n in enumerate(tl.names) if n.startswith("gloo:")])]
    long = iv.end[m] - iv.start[m] > over_ns
    if m.size == 0 or 2 * int(long.sum()) < m.size:
        return ivs.empty()
    return ivs.union(iv.start[m[long]], iv.end[m[long]])


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
    waits = sets.p2p
    if tl.cpu_only and sets.p2p[0].size:
        # CPU runs: the calls that only issued a transfer are the rank's own host time, not a wait
        ps, pe = _posting_calls(tl)
        posting = ivs.intersect(ivs.clip((ps + off, pe + off), w0, w1), sets.p2p)
        if posting[0].size:
            waits = ivs.subtract(sets.p2p, posting)
            p2p_host = posting
    return RankStep(tl.rank, step, number, w0, w1, sets, acct, blocks, host, waits, p2p_host)


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


__all__ = ["RankStep", "rank_step"]
