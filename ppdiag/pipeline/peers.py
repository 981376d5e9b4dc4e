"""Point-to-point partners decided from cross-rank timing when the trace names no peer.

gloo runs recorded with ``torch.profiler`` defaults (no ``record_shapes``), NCCL kernels without
comm args and nsys kernels without NVTX payloads carry a transfer's direction at best, never its
peer. The partner is then found from timing (DESIGN.md §4.3):

1. Coarse clock offsets: ranks of one host share a clock (CPU/gloo runs); else the device
   collectives, which end together on every member; else the step starts.
2. Per ordered rank pair ``a -> b`` the differences between the *key times* of ``a``'s
   send-capable ops and ``b``'s receive-capable ops (an ops' key is its end where a matched send and
   receive end together: device kernels; else a send's start and a receive's end: a blocking
   receive ends when the data arrived) are histogrammed around the coarse offset. A real link shows
   a sharp peak (the link latency plus the residual clock offset) that stands far above the flat
   floor a non-partner gives; that peak is the link's fit.
3. Each op goes to the linked partner whose nearest counterpart is closest to that link's peak;
   the margin to the second candidate is its confidence. Ops no link explains stay unknown and
   are counted in a warning.

Everything is sorting, ``searchsorted`` and histograms per rank pair: linear in the ops of a pair.
The result is an overlay on :class:`~ppdiag.pipeline.clocks.P2POps` (copies owned by the
pipeline layer): the parser's arrays are never written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, RangeKind, Run
from ppdiag.pipeline.clocks import P2POps

# how a peer was decided (``P2POps.how``)
HOW_UNKNOWN = 0
HOW_METADATA = 1
HOW_TIMING = 2
HOW_NAMES = {HOW_UNKNOWN: "unknown", HOW_METADATA: "metadata", HOW_TIMING: "timing"}

_BIN_NS = 10_000  # histogram bin of the key-time differences
_PEAK_BINS = 5  # a link's peak is searched as the densest run of this many bins
_MIN_LINK_OPS = 2
_MAX_DIFFS_PER_OP = 64  # bounds the work per op when ops are dense inside the search window


@dataclass
class LinkFit:
    """The timing fit of one directed link ``src -> dst``.

    ``shift_ns`` is the peak of ``key(recv on dst) - key(send on src)`` on the coarse common clock,
    ``tol_ns`` the half-width of the peak, ``support`` the sends whose counterpart falls inside it.
    """

    src: int
    dst: int
    shift_ns: int
    tol_ns: int
    support: int
    floor: float  # the count a non-partner would give inside the same width (random coincidences)


@dataclass
class PeerDecision:
    """How the run's p2p partners were decided."""

    source: str  # "metadata" | "timing" | "metadata and timing" | "none"
    coarse_offsets: dict[int, int]
    coarse_method: str
    links: dict[tuple[int, int], LinkFit] = field(default_factory=dict)
    decided: int = 0  # ops whose peer came from timing
    undecided: int = 0  # ops no link explained
    confidence: float | None = None  # median margin of the timing decisions (0..1)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """The ``run.peers`` JSON object (docs/json.md)."""
        return {
            "source": self.source,
            "decided_by_timing": self.decided,
            "undecided": self.undecided,
            "confidence": None if self.confidence is None else round(self.confidence, 3),
            "coarse_clock": self.coarse_method,
            "links": [
                {
                    "src": f.src,
                    "dst": f.dst,
                    "ops": f.support,
                    "shift_us": round(f.shift_ns / 1000.0, 1),
                    "tol_us": round(f.tol_ns / 1000.0, 1),
                }
                for f in sorted(self.links.values(), key=lambda x: (x.src, x.dst))
            ],
        }


def can_send(direction: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    """Ops that may carry a send (a grouped or direction-unknown op may)."""
    return (direction == int(Direction.SEND)) | (direction == int(Direction.BOTH)) | (direction == 0)


def can_recv(direction: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    """Ops that may carry a receive."""
    return (direction == int(Direction.RECV)) | (direction == int(Direction.BOTH)) | (direction == 0)


def coarse_offsets(run: Run) -> tuple[dict[int, int], int, str]:
    """Offsets (ns to add to each rank's clock), the uncertainty they leave, and how they were found."""
    ranks = sorted(tl.rank for tl in run.ranks)
    zero = {r: 0 for r in ranks}
    hosts = {str(tl.meta.get("host_name") or "") for tl in run.ranks}
    if all(tl.cpu_only for tl in run.ranks) and len(hosts) == 1:
        # one host (or no host named: the CPU runs ppdiag sees are single-node): one clock
        return zero, 2_000_000, "one host clock"
    ends: dict[int, npt.NDArray[np.int64]] = {}
    for tl in run.ranks:
        iv = tl.intervals
        m = iv.kind == int(Kind.COLLECTIVE)
        if m.any() and not tl.cpu_only:
            ends[tl.rank] = np.sort(iv.end[m])
    sizes = {v.size for v in ends.values()}
    if len(ends) == len(ranks) and len(sizes) == 1 and ranks:
        # every rank ran the same number of collectives: the k-th ones end together
        ref = ends[ranks[0]]
        off = {r: int(np.median(ref - ends[r])) for r in ranks}
        spread = max(float(np.max(np.abs((ref - ends[r]) - off[r]))) for r in ranks)
        return off, int(min(max(4 * spread, 500_000), 5_000_000)), "collectives"
    starts: dict[int, dict[int, int]] = {}
    for tl in run.ranks:
        rg = tl.ranges
        m = rg.kind == int(RangeKind.STEP)
        starts[tl.rank] = {int(n): int(s) for n, s in zip(rg.num[m], rg.start[m], strict=True)}
    common = set.intersection(*(set(v) for v in starts.values())) if starts else set()
    if common and ranks:
        nums = sorted(common)
        ref_s = np.array([starts[ranks[0]][n] for n in nums], dtype=np.int64)
        off = {}
        spread = 0.0
        for r in ranks:
            d = ref_s - np.array([starts[r][n] for n in nums], dtype=np.int64)
            off[r] = int(np.median(d))
            spread = max(spread, float(np.max(np.abs(d - off[r]))))
        return off, int(min(max(4 * spread, 2_000_000), 20_000_000)), "step starts"
    return zero, 20_000_000, "none"


def _keys(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], ends_meet: bool, send: bool) -> npt.NDArray[np.int64]:
    return end if (ends_meet or not send) else start


def _window_diffs(
    s: npt.NDArray[np.int64], r: npt.NDArray[np.int64], lo_ns: int, hi_ns: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """All ``r[j] - s[i]`` within ``[lo_ns, hi_ns]`` (``r`` sorted), with their ``i`` and ``j``."""
    lo = np.searchsorted(r, s + lo_ns, side="left")
    hi = np.searchsorted(r, s + hi_ns, side="right")
    cnt = np.minimum(hi - lo, _MAX_DIFFS_PER_OP)
    total = int(cnt.sum())
    if total == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    i = np.repeat(np.arange(s.size), cnt)
    first = np.cumsum(cnt) - cnt
    j = np.repeat(lo, cnt) + (np.arange(total) - np.repeat(first, cnt))
    return (r[j] - s[i]).astype(np.int64), i.astype(np.int64), j.astype(np.int64)


def fit_link(
    s_key: npt.NDArray[np.int64], r_key: npt.NDArray[np.int64], window_ns: int, min_shift_ns: int
) -> tuple[int, int, int, float] | None:
    """Peak of ``r_key - s_key`` in ``[min_shift_ns, window_ns]`` (keys on the coarse common clock,
    ``r_key`` sorted): (shift, tolerance, support, floor), or None when there is no peak."""
    if s_key.size == 0 or r_key.size == 0:
        return None
    d, i, _ = _window_diffs(s_key, r_key, min_shift_ns, window_ns)
    if d.size < _MIN_LINK_OPS:
        return None
    nb = max(int((window_ns - min_shift_ns) // _BIN_NS) + 1, 1)
    h = np.bincount(((d - min_shift_ns) // _BIN_NS).astype(np.int64), minlength=nb)[:nb]
    run_sum = np.convolve(h, np.ones(_PEAK_BINS, dtype=np.int64), mode="valid") if nb >= _PEAK_BINS else h
    k = int(np.argmax(run_sum))
    lo = min_shift_ns + k * _BIN_NS
    hi = lo + _PEAK_BINS * _BIN_NS
    inside = (d >= lo) & (d < hi)
    if int(inside.sum()) < _MIN_LINK_OPS:
        return None
    center = int(np.median(d[inside]))
    dev = np.abs(d[inside] - center)
    tol = int(max(4 * float(np.median(dev)), 2 * _BIN_NS))
    near = np.abs(d - center) <= tol
    support = int(np.unique(i[near]).size)
    # what a flat floor of differences would put into a window of the same width
    floor = d.size * (2 * tol + 1) / max(window_ns - min_shift_ns, 1)
    return center, tol, support, float(floor)


def _nearest(keys: npt.NDArray[np.int64], t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per ``t``, the distance to the nearest of the sorted ``keys`` (int64 max when none)."""
    if keys.size == 0:
        return np.full(t.shape, np.iinfo(np.int64).max, np.int64)
    j = np.searchsorted(keys, t)
    a = np.abs(keys[np.clip(j - 1, 0, keys.size - 1)] - t)
    b = np.abs(keys[np.clip(j, 0, keys.size - 1)] - t)
    return np.minimum(a, b)


def _latest_before(keys: npt.NDArray[np.int64], t: npt.NDArray[np.int64], tol: int) -> npt.NDArray[np.int64]:
    """Per ``t``, ``t - k`` for the latest key ``k <= t + tol`` (int64 max when none)."""
    if keys.size == 0:
        return np.full(t.shape, np.iinfo(np.int64).max, np.int64)
    j = np.searchsorted(keys, t + tol, side="right") - 1
    out = t - keys[np.clip(j, 0, None)]
    return np.where(j >= 0, out, np.iinfo(np.int64).max)


def _earliest_after(keys: npt.NDArray[np.int64], t: npt.NDArray[np.int64], tol: int) -> npt.NDArray[np.int64]:
    """Per ``t``, ``k - t`` for the earliest key ``k >= t - tol`` (int64 max when none)."""
    if keys.size == 0:
        return np.full(t.shape, np.iinfo(np.int64).max, np.int64)
    j = np.searchsorted(keys, t - tol, side="left")
    out = keys[np.clip(j, 0, keys.size - 1)] - t
    return np.where(j < keys.size, out, np.iinfo(np.int64).max)


def decide_peers(run: Run, ops: dict[int, P2POps]) -> PeerDecision:
    """Fill the unknown peers of ``ops`` (``{rank: P2POps}``, modified in place) from timing."""
    o = ops
    unknown = {r: v.peer < 0 for r, v in o.items()}
    n_unknown = sum(int(u.sum()) for u in unknown.values())
    n_known = sum(int((~u).sum()) for u in unknown.values())
    off, window, method = coarse_offsets(run)
    dec = PeerDecision("metadata" if n_known else "none", off, method)
    if n_unknown == 0:
        return dec
    ranks = sorted(r for r in o if unknown[r].any())
    # per rank: sorted keys of its unknown send-capable / receive-capable ops on the coarse clock
    send_idx: dict[int, npt.NDArray[np.int64]] = {}
    recv_idx: dict[int, npt.NDArray[np.int64]] = {}
    send_key: dict[int, npt.NDArray[np.int64]] = {}
    recv_key: dict[int, npt.NDArray[np.int64]] = {}
    for r in ranks:
        v = o[r]
        si = np.flatnonzero(unknown[r] & can_send(v.direction))
        ri = np.flatnonzero(unknown[r] & can_recv(v.direction))
        sk = _keys(v.start, v.end, v.ends_meet, True)[si] + off.get(r, 0)
        rk = _keys(v.start, v.end, v.ends_meet, False)[ri] + off.get(r, 0)
        so, ro = np.argsort(sk, kind="stable"), np.argsort(rk, kind="stable")
        send_idx[r], send_key[r] = si[so], sk[so]
        recv_idx[r], recv_key[r] = ri[ro], rk[ro]
    # 2. link fits per ordered pair
    fits: dict[tuple[int, int], LinkFit] = {}
    for a in ranks:
        if send_key[a].size == 0:
            continue
        ends_meet = o[a].ends_meet
        for b in ranks:
            if b == a or recv_key[b].size == 0:
                continue
            # ends meet: the offset is unknown by +-window; else a receive ends after its send began
            lo = -window if ends_meet else -window // 4
            f = fit_link(send_key[a], recv_key[b], window, lo)
            if f is None:
                continue
            shift, tol, support, floor = f
            fits[(a, b)] = LinkFit(a, b, shift, tol, support, floor)
    links = _accept(fits, send_key, recv_key)
    dec.links = links
    if not links:
        dec.warnings.append(
            f"p2p peers unknown for {n_unknown} ops and no cross-rank timing pattern names them "
            f"(coarse clock: {method}); the pipeline cannot be rebuilt from timing"
        )
        return dec
    # 3. assign each unknown op to its best link
    margins: list[npt.NDArray[np.float64]] = []
    decided = 0
    for r in ranks:
        v = o[r]
        for side in ("send", "recv"):
            idx = send_idx[r] if side == "send" else recv_idx[r]
            keys = send_key[r] if side == "send" else recv_key[r]
            cands = [
                (b, f) for (a, b), f in links.items() if a == r
            ] if side == "send" else [(a, f) for (a, b), f in links.items() if b == r]
            if idx.size == 0 or not cands:
                continue
            resid = np.empty((len(cands), idx.size), np.float64)
            for c, (p, f) in enumerate(cands):
                if v.ends_meet:
                    other = recv_key[p] if side == "send" else send_key[p]
                    t = keys + f.shift_ns if side == "send" else keys - f.shift_ns
                    dist = _nearest(other, t).astype(np.float64)
                elif side == "recv":
                    # the latest send of the candidate before this receive ended
                    dist = np.abs(_latest_before(send_key[p], keys, f.tol_ns).astype(np.float64) - f.shift_ns)
                else:
                    dist = np.abs(_earliest_after(recv_key[p], keys, f.tol_ns).astype(np.float64) - f.shift_ns)
                resid[c] = dist / max(f.tol_ns, 1)
            best = np.argmin(resid, axis=0)
            b_res = resid[best, np.arange(idx.size)]
            if len(cands) > 1:
                second = np.partition(resid, 1, axis=0)[1]
            else:
                second = np.full(idx.size, np.inf)
            # within the link's tolerance, or the only partner this rank has on that side
            ok = (b_res <= 1.0) | ((len(cands) == 1) & np.isfinite(b_res))
            peers = np.array([p for p, _ in cands], dtype=np.int32)
            v.peer[idx[ok]] = peers[best[ok]]
            v.how[idx[ok]] = HOW_TIMING
            m = np.where(np.isinf(second), 1.0, 1.0 - b_res / np.maximum(second, 1e-9))
            conf = np.clip(np.where(b_res <= 1.0, m, 0.5 * m), 0.0, 1.0)
            v.conf[idx[ok]] = conf[ok].astype(np.float32)
            margins.append(conf[ok])
            decided += int(ok.sum())
    _directions(o, links, off)
    dec.decided = decided
    dec.undecided = sum(int((v.peer < 0).sum()) for v in o.values())
    dec.confidence = float(np.median(np.concatenate(margins))) if margins and decided else None
    dec.source = "metadata and timing" if n_known else "timing"
    if dec.undecided:
        dec.warnings.append(
            f"p2p peers: {dec.undecided} of {n_unknown} ops without a peer fit no link by timing "
            "and stay unmatched"
        )
    return dec


def _accept(
    fits: dict[tuple[int, int], LinkFit],
    send_key: dict[int, npt.NDArray[np.int64]],
    recv_key: dict[int, npt.NDArray[np.int64]],
) -> dict[tuple[int, int], LinkFit]:
    """Links whose peak stands clear of the floor and carries a real share of the rank's ops.

    A rank sends to at most two partners in a pipeline (the next stage's activations, the previous
    stage's gradients), so each sender keeps its strongest peaks; a peak below a third of the
    sender's best is a periodic echo of the schedule, not a partner.
    """
    good = {k: f for k, f in fits.items() if f.support >= _MIN_LINK_OPS and f.support >= 5 * f.floor + 1}
    out: dict[tuple[int, int], LinkFit] = {}
    for side in (0, 1):
        by: dict[int, list[LinkFit]] = {}
        for k, f in good.items():
            by.setdefault(k[side], []).append(f)
        keep: set[tuple[int, int]] = set()
        for lst in by.values():
            lst.sort(key=lambda f: -f.support)
            best = lst[0].support
            keep.update((f.src, f.dst) for f in lst if f.support >= best / 3)
        if side == 0:
            out = {k: good[k] for k in keep}
        else:
            out = {k: f for k, f in out.items() if k in keep}
    return out


def _directions(o: dict[int, P2POps], links: dict[tuple[int, int], LinkFit], off: dict[int, int]) -> None:
    """Direction-unknown ops with a decided peer: a send when only ``me -> peer`` is a link, a
    receive when only ``peer -> me`` is; where both are links, the op that started first waited
    for the other side's data (a receive posted early)."""
    for r, v in o.items():
        m = (v.direction == 0) & (v.peer >= 0)
        if not m.any():
            continue
        idx = np.flatnonzero(m)
        peers = v.peer[idx]
        out_l = np.array([(r, int(p)) in links for p in peers], dtype=bool)
        in_l = np.array([(int(p), r) in links for p in peers], dtype=bool)
        d = np.where(out_l & ~in_l, int(Direction.SEND), np.where(in_l & ~out_l, int(Direction.RECV), 0))
        both = out_l & in_l
        if both.any():
            # compare with the counterpart on the peer: nearest op by end time
            for p in np.unique(peers[both]):
                sel = idx[both & (peers == p)]
                po = o.get(int(p))
                if po is None or not len(po.end):
                    continue
                shift = off.get(int(p), 0) - off.get(r, 0)  # peer clock -> this rank's clock
                order = np.argsort(po.end, kind="stable")
                pe, ps = po.end[order] + shift, po.start[order] + shift
                j = np.searchsorted(pe, v.end[sel])
                j = np.where(
                    (j > 0) & ((j >= pe.size) | (np.abs(pe[np.clip(j - 1, 0, None)] - v.end[sel]) < np.abs(pe[np.clip(j, 0, pe.size - 1)] - v.end[sel]))),
                    j - 1,
                    j,
                )
                j = np.clip(j, 0, pe.size - 1)
                d_sel = np.where(v.start[sel] <= ps[j], int(Direction.RECV), int(Direction.SEND))
                d[np.searchsorted(idx, sel)] = d_sel
        v.direction[idx] = d.astype(np.int8)


def interval_overlay(
    tl: object, ops: P2POps
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int8]] | None:
    """Copies of ``tl.intervals.peer`` / ``.direction`` with the decided peers of the rank's device
    ops laid over (None when the ops are host ranges or nothing was decided by timing)."""
    from ppdiag.model import RankTimeline

    if not isinstance(tl, RankTimeline) or ops.table != "intervals" or not (ops.how == HOW_TIMING).any():
        return None
    peer = tl.intervals.peer.copy()
    direction = tl.intervals.direction.copy()
    ok = ops.index >= 0
    peer[ops.index[ok]] = ops.peer[ok]
    direction[ops.index[ok]] = ops.direction[ok]
    return peer, direction
