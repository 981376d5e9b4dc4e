"""Indexes the replay searches when it builds its block graph: the last wait before each block,
which transfer held a rank during a wait, which operation of the peer released it, and which
labelled block each labelled block consumes.

Each is one sort up front and a binary search per question, never a scan of a rank's events.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, Phase, RankTimeline
from ppdiag.model import intervals as ivs
from ppdiag.pipeline.clocks import P2POps, match_pairs

I64 = npt.NDArray[np.int64]

# transfer pieces closer than this form one wait (the host issuing the next operation in between)
WAIT_JOIN_NS = 50_000
# matched device send/recv kernels end within this of each other
MATCH_END_NS = 20_000


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
        j0 = int(self.reach.searchsorted(lo, side="right"))
        j1 = int(self.start.searchsorted(hi, side="left"))
        if j1 <= j0:
            return False
        cover = np.minimum(self.end[j0:j1], hi) - np.maximum(self.start[j0:j1], lo)
        return bool(self.on_compute[j0 + int(np.argmax(cover))])

    def _covers(
        self, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """For many spans at once: the pieces that can overlap each span (the slices
        :meth:`blocking` looks at, laid end to end), as (span of each piece, its position, how
        much of the span it covers) and where each span's run of pieces begins."""
        j0 = np.searchsorted(self.reach, lo, side="right")
        j1 = np.searchsorted(self.start, hi, side="left")
        n_k = np.maximum(j1 - j0, 0)
        first = np.concatenate([[0], np.cumsum(n_k)])
        seg = np.repeat(np.arange(lo.size), n_k)
        pos = j0[seg] + (np.arange(seg.size) - first[seg])
        cover = np.minimum(self.end[pos], hi[seg]) - np.maximum(self.start[pos], lo[seg])
        return seg, pos, cover, first

    def blocking_many(
        self, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], tol: int = 0
    ) -> list[tuple[int, int, int, int]]:
        """:meth:`blocking` of every span ``[lo[i], hi[i]]``, in one vectorized pass."""
        return [(a, b, c, d) for a, b, c, d in self.blocking_arrays(lo, hi, tol).tolist()]

    def blocking_arrays(
        self, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64], tol: int = 0
    ) -> npt.NDArray[np.int64]:
        """:meth:`blocking_many` as an ``(n, 4)`` array: (peer, direction, start, end) per span,
        ``(-1, 0, lo, hi)`` where no transfer held the rank."""
        out = np.stack([np.full(lo.size, -1, np.int64), np.zeros(lo.size, np.int64), lo, hi], axis=1)
        seg, pos, cover, first = self._covers(lo, hi)
        if seg.size == 0:
            return out
        has = np.flatnonzero(first[1:] > first[:-1])
        top = np.full(lo.size, np.iinfo(np.int64).min, np.int64)
        top[has] = np.maximum.reduceat(cover, first[has])
        # the first (earliest posted) piece of each span within ``tol`` of its longest cover
        cand = np.flatnonzero(cover >= top[seg] - tol)
        spans, at = np.unique(seg[cand], return_index=True)
        k = pos[cand[at]]
        good = top[spans] > 0
        spans, k = spans[good], k[good]
        out[spans, 0] = self.peer[k]
        out[spans, 1] = self.direction[k]
        out[spans, 2] = self.start[k]
        out[spans, 3] = self.end[k]
        return out

    def on_compute_many(self, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]) -> list[bool]:
        """:meth:`on_compute_at` of every span ``[lo[i], hi[i]]``, in one vectorized pass."""
        out: list[bool] = self.on_compute_arrays(lo, hi).tolist()
        return out

    def on_compute_arrays(
        self, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """:meth:`on_compute_many` as a boolean array."""
        out = np.zeros(lo.size, np.bool_)
        seg, pos, cover, first = self._covers(lo, hi)
        if seg.size:
            has = np.flatnonzero(first[1:] > first[:-1])
            top = np.zeros(lo.size, np.int64)
            top[has] = np.maximum.reduceat(cover, first[has])
            # argmax: the first piece of each span with its largest cover
            cand = np.flatnonzero(cover == top[seg])
            spans, at = np.unique(seg[cand], return_index=True)
            out[spans] = self.on_compute[pos[cand[at]]]
        return out

    def blocking(self, lo: int, hi: int, tol: int = 0) -> tuple[int, int, int, int]:
        """(peer, direction, start, end) of the p2p interval that covers most of the wait ``[lo, hi]``.

        A wait can end on a transfer that was complete long before (a receive is only waited for
        after an earlier send returned), so the longest piece names the peer that held the rank.
        Its start is when the rank posted the operation (often under compute, before the wait).
        Pieces that cover the wait alike (within ``tol``: a send and a receive posted and done
        together) are a tie, not decided by ns jitter: the one posted first names the peer.
        """
        j0 = int(self.reach.searchsorted(lo, side="right"))
        j1 = int(self.start.searchsorted(hi, side="left"))
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
    times on the aligned clock (int64 arrays: :func:`released_by` searches them for many waits
    at once), so "the last one before the release" is one binary search."""

    SEND, RECV, ANY = 0, 1, 2

    def __init__(self, ops: dict[int, P2POps], timelines: dict[int, RankTimeline]) -> None:
        self.by: dict[tuple[int, int, int], I64] = {}
        # device kernels of a matched send and receive end together: by end, with their starts
        self.by_end: dict[tuple[int, int, int], tuple[I64, I64]] = {}
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
                        self.by[(r, int(peer), kind)] = np.sort(st[sel]).astype(np.int64)
                        if po.device:
                            o = np.argsort(en[sel], kind="stable")
                            self.by_end[(r, int(peer), kind)] = (
                                en[sel][o].astype(np.int64),
                                st[sel][o].astype(np.int64),
                            )
        # host ops (gloo): each receive's send by order on its link (the k-th send meets the k-th
        # receive), keyed by the receive's end on the aligned clock: a send held on its way is
        # posted after later sends' blocks, so neither the time of the release nor of the post
        # tells which send it was
        self.sent_for: dict[tuple[int, int], tuple[I64, I64]] = {}
        host = {r: po for r, po in ops.items() if r in timelines and len(po.start) and not po.device}
        if len(host) >= 2:
            pairs = match_pairs(host)
            off = {r: timelines[r].clock_offset_ns for r in host}
            for a, b in {(int(x), int(y)) for x, y in zip(pairs.src, pairs.dst, strict=True)}:
                m = (pairs.src == a) & (pairs.dst == b)
                r_end = pairs.recv_end[m] + off[b]
                o = np.argsort(r_end, kind="stable")
                sent = (pairs.send_start[m] + off[a])[o]
                self.sent_for[(b, a)] = (r_end[o].astype(np.int64), sent.astype(np.int64))

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
        j = int(ends.searchsorted(end, side="left"))
        best: int | None = None
        for c in (j - 1, j):
            ok = 0 <= c < len(ends) and abs(int(ends[c]) - end) <= tol and int(starts[c]) <= end
            if ok and (best is None or abs(int(ends[c]) - end) < abs(int(ends[best]) - end)):
                best = c
        return int(starts[best]) if best is not None else None

    def send_of(self, rank: int, peer: int, recv_end: int, tol: int) -> int | None:
        """Issue time (aligned) of the host-op send of ``peer`` that ``rank``'s receive ending at
        ``recv_end`` (within ``tol``) was paired with by order; None when it was not paired."""
        got = self.sent_for.get((rank, peer))
        if got is None:
            return None
        ends, sends = got
        j = int(ends.searchsorted(recv_end - tol, side="left"))
        return int(sends[j]) if j < len(ends) and int(ends[j]) <= recv_end + tol else None

    def last_before(self, rank: int, towards: int, wait_dir: int, t: int) -> int | None:
        """Issue time of ``rank``'s last operation towards ``towards`` at or before ``t`` that can
        release a wait of direction ``wait_dir`` (None when there is none)."""
        arr = self.by.get((rank, towards, self._kind(wait_dir)))
        if arr is None:
            return None
        j = int(arr.searchsorted(t, side="right")) - 1
        return int(arr[j]) if j >= 0 else None


def _matched_many(
    ends: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], t: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """:meth:`_IssueIndex.matched` of each end in ``t`` against one group's operations (sorted by
    end): whether one ended within ``MATCH_END_NS``, and its issue time."""
    j = np.searchsorted(ends, t, side="left")

    def ok(c: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        cc = np.clip(c, 0, ends.size - 1)
        d = np.abs(ends[cc] - t)
        return (c >= 0) & (c < ends.size) & (d <= MATCH_END_NS) & (starts[cc] <= t), d

    ok0, d0 = ok(j - 1)
    ok1, d1 = ok(j)
    # the earlier candidate unless the later one is strictly closer
    pick = np.where(ok1 & (~ok0 | (d1 < d0)), j, j - 1)
    return ok0 | ok1, starts[np.clip(pick, 0, ends.size - 1)]


def released_by(
    issues: _IssueIndex,
    peer: npt.NDArray[np.int64],
    me: npt.NDArray[np.int64] | npt.NDArray[np.int32],
    wdir: npt.NDArray[np.int64],
    op_end: npt.NDArray[np.int64],
    rel: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """For many waits at once: the issue of the operation that released each (the peer's device
    operation that ended with the waiter's, :meth:`_IssueIndex.matched` within ``MATCH_END_NS``,
    else the peer's last one before the release, :meth:`_IssueIndex.last_before`), as (found,
    issue time). One binary search per (peer, waiter, kind) group, the same picks as the
    per-wait methods."""
    n = peer.size
    kind = np.where(
        wdir == int(Direction.RECV),
        issues.SEND,
        np.where(wdir == int(Direction.SEND), issues.RECV, issues.ANY),
    )
    found = np.zeros(n, np.bool_)
    out = np.zeros(n, np.int64)
    code = (peer * (int(me.max()) + 1 if n else 1) + me) * 3 + kind
    o = np.argsort(code, kind="stable")
    bounds = np.flatnonzero(np.r_[True, code[o][1:] != code[o][:-1], True]) if n else np.zeros(1, np.int64)
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        sel = o[a:b]
        key = (int(peer[sel[0]]), int(me[sel[0]]), int(kind[sel[0]]))
        got = issues.by_end.get(key)
        if got is not None and len(got[0]):
            hit, val = _matched_many(got[0], got[1], op_end[sel])
            found[sel[hit]] = True
            out[sel[hit]] = val[hit]
        arr = issues.by.get(key)
        rest = sel[~found[sel]]
        if arr is not None and len(arr) and rest.size:
            arr_a = arr
            j = np.searchsorted(arr_a, rel[rest], side="right") - 1
            hit = j >= 0
            found[rest[hit]] = True
            out[rest[hit]] = arr_a[j[hit]]
    return found, out


# the phases as plain ints
_FWD, _BWD, _WGRAD = int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD)


def _dense(cols: Sequence[npt.NDArray[np.int64] | npt.NDArray[np.int32]]) -> npt.NDArray[np.int64]:
    """One code per row of the columns ``cols`` (equal rows, equal codes): each column's offset
    from its minimum in a mixed radix, renumbered densely only where the product of the ranges
    would overflow."""
    code = np.zeros(cols[0].size, np.int64)
    radix = 1
    for c in cols:
        if not c.size:
            break
        lo = int(c.min())
        span = int(c.max()) - lo + 1
        if radix * span >= 2**62:
            _, inv = np.unique(code, return_inverse=True)
            code, radix = inv.reshape(-1).astype(np.int64), int(inv.max()) + 1
        if radix * span >= 2**62:
            _, inv = np.unique(c, return_inverse=True)
            c, lo, span = inv.reshape(-1).astype(np.int64), 0, int(inv.max()) + 1
        code = code * span + (c - lo)
        radix *= span
    return code


def _label_pairs(
    lab: npt.NDArray[np.int64], last_stage: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(consumer, producer) node ids of the pipeline dependencies from the block labels ``lab``
    (rows: step number, stage, phase, micro-batch, node id; a label given twice names its later
    block). A forward block consumes the forward of the stage before, a backward the backward of
    the stage after (the last stage: its own forward), a W block its own backward."""
    stepn, stage, phase, mb, nid = lab
    n = nid.size
    is_f, is_b = phase == _FWD, phase == _BWD
    last = stage == last_stage
    p_stage = np.where(is_f, stage - 1, np.where(is_b & ~last, stage + 1, stage))
    p_phase = np.where(is_f | (is_b & last), _FWD, _BWD)
    has = is_f | is_b | (phase == _WGRAD)
    code = _dense([np.r_[stepn, stepn], np.r_[stage, p_stage], np.r_[phase, p_phase], np.r_[mb, mb]])
    o = np.argsort(code[:n], kind="stable")
    key_s = code[:n][o]
    final = np.r_[key_s[1:] != key_s[:-1], True] if n else np.zeros(0, np.bool_)  # last of each label
    keys, cons = key_s[final], nid[o][final]
    want, wants = code[n:][o][final], has[o][final]
    pos = np.minimum(np.searchsorted(keys, want), max(keys.size - 1, 0))
    found = wants & (keys[pos] == want) if keys.size else wants
    prod = cons[pos][found] if keys.size else cons[found]
    cons = cons[found]
    mine = prod != cons
    return cons[mine], prod[mine]


__all__ = ["MATCH_END_NS", "WAIT_JOIN_NS", "released_by"]
