"""The replay graph's waits resolved for all of them at once (docs/json.md, *Time accounting*):
which operation released each wait, the peer's block that produced it, and for the common wait
(on devices, a producer block found, no copies between the block and its send, a peer that is no
CPU rank) its producer, issue delay, transfer and lead, as arrays. The other waits (host ops, a
peer without an analyzed block before the issue, a gap that was no wait, copies to measure) go
through :meth:`ReplayGraph._resolve_wait` one at a time, with the same lookups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.replay_build import PendingWaits
from ppdiag.attribution.replay_index import _IssueIndex, released_by
from ppdiag.model import RankTimeline

if TYPE_CHECKING:
    from ppdiag.attribution.replay_graph import ReplayGraph

I64 = npt.NDArray[np.int64]


class WaitArrays(NamedTuple):
    """Every pending wait as columns, in the order the steps found them."""

    nid: I64
    peer: I64
    wdir: I64
    posted: I64
    op_end: I64
    rel: I64
    wait_start: I64
    found: npt.NDArray[np.bool_]  # an operation of the peer released it
    last: I64  # that operation's issue time
    j: I64  # the peer's last block (by end) finished before the issue, -1: none
    prod: I64  # that block's node id (-1: none)
    p_end: I64  # and its end


def wait_arrays(
    g: ReplayGraph,
    pending: PendingWaits,
    issues: _IssueIndex,
    ends_by_rank: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
    timelines: dict[int, RankTimeline],
    tol: int,
) -> WaitArrays:
    """The waits of ``pending`` as columns with what releases them looked up at once: one binary
    search per link and kind (:func:`released_by`) and per peer (its blocks by end)."""
    nid, peer, wdir, posted, op_end, rel, wait_start = pending
    k = nid.size
    me = g.cols.cols["rank"][nid]
    found, last = released_by(issues, peer, me, wdir, op_end, rel)
    ranks, inv = np.unique(me, return_inverse=True)  # one look-up per rank, not per wait
    device = ~np.array([timelines[r].cpu_only for r in ranks.tolist()], np.bool_)[inv.reshape(-1)]
    # a block that ends within the timing tolerance after the issue counts as finished before it
    at = np.where(found & device, last, rel) + tol
    j = np.full(k, -1, np.int64)
    prod = np.full(k, -1, np.int64)
    p_end = np.zeros(k, np.int64)
    # each peer's waits, in order: one stable sort, not a scan of every wait per peer
    by_peer = np.argsort(peer, kind="stable")
    peers, first = np.unique(peer[by_peer], return_index=True)
    bounds = np.r_[first, by_peer.size]
    for p, a, b in zip(peers.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        got = ends_by_rank.get(p)
        if got is not None and got[0].size:
            sel = by_peer[a:b]
            ends, ids = got
            js = np.searchsorted(ends, at[sel], side="right") - 1
            j[sel] = js
            ok = js >= 0
            prod[sel[ok]] = ids[js[ok]]
            p_end[sel[ok]] = ends[js[ok]]
    return WaitArrays(nid, peer, wdir, posted, op_end, rel, wait_start, found, last, j, prod, p_end)


def common_waits(
    g: ReplayGraph,
    w: WaitArrays,
    timelines: dict[int, RankTimeline],
    has_copy: npt.NDArray[np.bool_],
    tol: int,
) -> tuple[npt.NDArray[np.bool_], I64]:
    """Resolve the common waits (see the module) into the graph at once; returns which were, and
    each one's transfer."""
    me = g.cols.cols["rank"][w.nid]
    cpu = {r: tl.cpu_only for r, tl in timelines.items()}
    device = ~np.array([cpu[r] for r in me.tolist()], np.bool_)
    peer_cpu = np.array([cpu.get(p, True) for p in w.peer.tolist()], np.bool_)
    posted = np.minimum(w.posted, w.wait_start)
    issue = np.where(w.found, np.maximum(w.p_end, w.last), w.p_end)
    xfer = w.rel - np.maximum(issue, posted)
    prod = np.maximum(w.prod, 0)
    fast = device & (w.prod >= 0) & ~peer_cpu & (xfer >= -tol) & ~((issue > w.p_end) & has_copy[prod])
    f = np.flatnonzero(fast)
    nc = g.cols
    ids = w.nid[f]
    nc.obs.set_many(ids, (w.prod[f], (issue - w.p_end)[f], xfer[f]))
    nc.issue_copy.set_many(ids, (np.zeros(f.size, np.int64),))
    nc.lead.set_many(ids, ((w.wait_start - posted)[f],))
    return fast, xfer


__all__ = ["WaitArrays", "common_waits", "wait_arrays"]
