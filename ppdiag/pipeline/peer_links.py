"""Cross-rank timing of p2p transfers (steps 1 and 3 of
:mod:`ppdiag.pipeline.peers`): the coarse clock offsets, the link fits per ordered rank pair (a
histogram of send/receive key differences whose peak is the link's shift), and the acceptance of
reciprocal links that agree on one clock per rank.

Everything is sorting, ``searchsorted`` and histograms per rank pair: linear in the ops of a pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, RangeKind, Run
from ppdiag.pipeline.clocks import P2POps

# how a peer was decided (``P2POps.how``)
HOW_UNKNOWN = 0
HOW_METADATA = 1
HOW_TIMING = 2
HOW_LABELS = 3
HOW_NAMES = {
    HOW_UNKNOWN: "unknown",
    HOW_METADATA: "metadata",
    HOW_TIMING: "timing",
    HOW_LABELS: "pipeline labels",
}

_BIN_NS = 10_000  # histogram bin of the key-time differences
_PEAK_BINS = 5  # a link's peak is searched as the densest run of this many bins
_MIN_LINK_OPS = 2
_MAX_DIFFS_PER_OP = 64  # bounds the work per op when ops are dense in the search window
# a pair this close to a rank's weakest accepted partner in support is a tie that timing cannot
# break (replicas in lockstep); a schedule's echo through several stages stays a few % weaker
_TIE = 0.98
_COLL_SPREAD_NS = 500_000
# per rank: the sorted indices and keys of its unknown send- and receive-capable ops
_KeySets = tuple[dict[int, npt.NDArray[np.int64]], ...]


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


def can_send(direction: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    """Ops that may carry a send (a grouped or direction-unknown op may)."""
    out: npt.NDArray[np.bool_] = (
        (direction == int(Direction.SEND)) | (direction == int(Direction.BOTH)) | (direction == 0)
    )
    return out


def can_recv(direction: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    """Ops that may carry a receive."""
    out: npt.NDArray[np.bool_] = (
        (direction == int(Direction.RECV)) | (direction == int(Direction.BOTH)) | (direction == 0)
    )
    return out


@dataclass
class Coarse:
    """Coarse clock offsets (ns to add to each rank's clock) and how far to trust them."""

    offsets: dict[int, int]
    window_ns: int  # the search window for the link fits
    method: str
    uncertainty_ns: int  # the error these offsets may still carry
    # per (sender, flow): the receivers worth comparing (None: every rank; host_clocks.py)
    candidates: dict[tuple[int, int], set[int]] | None = None


def coarse_offsets(run: Run) -> tuple[dict[int, int], int, str]:
    """Offsets (ns to add to each rank's clock), the search window they leave, and their method."""
    c = coarse_clock(run)
    return c.offsets, c.window_ns, c.method


def coarse_clock(run: Run) -> Coarse:
    """The coarse offsets: one clock per host, else the collectives, else the step starts."""
    ranks = sorted(tl.rank for tl in run.ranks)
    zero = {r: 0 for r in ranks}
    hosts = {str(tl.meta.get("host_name") or "") for tl in run.ranks}
    if all(tl.cpu_only for tl in run.ranks) and len(hosts) == 1:
        # one host (or no host named: the CPU runs ppdiag sees are single-node): one clock
        return Coarse(zero, 2_000_000, "one host clock", 50_000)
    return (
        _by_collectives(run, ranks)
        or _by_step_starts(run, ranks)
        or Coarse(zero, 20_000_000, "none", 20_000_000)
    )


def _by_collectives(run: Run, ranks: list[int]) -> Coarse | None:
    """Offsets from the collectives' ends, when every rank ran the same number and the k-th ones
    end together; else None."""
    ends: dict[int, npt.NDArray[np.int64]] = {}
    for tl in run.ranks:
        iv = tl.intervals
        m = iv.kind == int(Kind.COLLECTIVE)
        if m.any() and not tl.cpu_only:
            ends[tl.rank] = np.sort(iv.end[m])
    sizes = {v.size for v in ends.values()}
    if not (len(ends) == len(ranks) and len(sizes) == 1 and ranks):
        return None
    # every rank ran the same number of collectives: the k-th ones end together
    ref = ends[ranks[0]]
    off = {r: int(np.median(ref - ends[r])) for r in ranks}
    spread = max(float(np.max(np.abs((ref - ends[r]) - off[r]))) for r in ranks)
    if spread <= _COLL_SPREAD_NS:
        window = int(min(max(4 * spread, 500_000), 5_000_000))
        return Coarse(off, window, "collectives", int(max(4 * spread, 2 * _BIN_NS)))
    # the k-th collectives do not end together: different groups (data-parallel replicas
    # reduce apart from the pipeline's own all-reduce), which only their group could sort out
    return None


def _by_step_starts(run: Run, ranks: list[int]) -> Coarse | None:
    """Offsets from the starts of the steps every rank ran; None when no step is common."""
    starts: dict[int, dict[int, int]] = {}
    for tl in run.ranks:
        rg = tl.ranges
        m = rg.kind == int(RangeKind.STEP)
        starts[tl.rank] = {int(n): int(s) for n, s in zip(rg.num[m], rg.start[m], strict=True)}
    common = set.intersection(*(set(v) for v in starts.values())) if starts else set()
    if not (common and ranks):
        return None
    nums = sorted(common)
    ref_s = np.array([starts[ranks[0]][n] for n in nums], dtype=np.int64)
    off: dict[int, int] = {}
    spread = 0.0
    for r in ranks:
        d = ref_s - np.array([starts[r][n] for n in nums], dtype=np.int64)
        off[r] = int(np.median(d))
        spread = max(spread, float(np.max(np.abs(d - off[r]))))
    window = int(min(max(4 * spread, 2_000_000), 20_000_000))
    return Coarse(off, window, "step starts", window)


def _keys(
    start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], ends_meet: bool, send: bool
) -> npt.NDArray[np.int64]:
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
    peaks = fit_peaks(s_key, r_key, window_ns, min_shift_ns, 1)
    return peaks[0] if peaks else None


def fit_peaks(
    s_key: npt.NDArray[np.int64],
    r_key: npt.NDArray[np.int64],
    window_ns: int,
    min_shift_ns: int,
    n_peaks: int = 3,
) -> list[tuple[int, int, int, float]]:
    """The ``n_peaks`` strongest separate peaks of ``r_key - s_key`` (see :func:`fit_link`).

    A schedule's echo can out-vote the real link inside one pair's window (a synthetic run's
    costs repeat exactly), so the runners-up are kept for the cross-pair checks to choose from.
    """
    if s_key.size == 0 or r_key.size == 0:
        return []
    d, i, _ = _window_diffs(s_key, r_key, min_shift_ns, window_ns)
    if d.size < _MIN_LINK_OPS:
        return []
    nb = max(int((window_ns - min_shift_ns) // _BIN_NS) + 1, 1)
    h = np.bincount(((d - min_shift_ns) // _BIN_NS).astype(np.int64), minlength=nb)[:nb]
    run_sum = np.convolve(h, np.ones(_PEAK_BINS, dtype=np.int64), mode="valid") if nb >= _PEAK_BINS else h
    run_sum = run_sum.astype(np.int64)
    out: list[tuple[int, int, int, float]] = []
    for _ in range(n_peaks):
        k = int(np.argmax(run_sum))
        if run_sum[k] < _MIN_LINK_OPS:
            break
        run_sum[max(k - _PEAK_BINS, 0) : k + _PEAK_BINS + 1] = 0  # the next peak lies apart
        lo = min_shift_ns + k * _BIN_NS
        hi = lo + _PEAK_BINS * _BIN_NS
        inside = (d >= lo) & (d < hi)
        if int(inside.sum()) < _MIN_LINK_OPS:
            continue
        center = int(np.median(d[inside]))
        dev = np.abs(d[inside] - center)
        tol = int(max(4 * float(np.median(dev)), 2 * _BIN_NS))
        near = np.abs(d - center) <= tol
        support = int(np.unique(i[near]).size)
        # what a flat floor of differences would put into a window of the same width
        floor = d.size * (2 * tol + 1) / max(window_ns - min_shift_ns, 1)
        out.append((center, tol, support, float(floor)))
    return out


def _nearest(keys: npt.NDArray[np.int64], t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per ``t``, the distance to the nearest of the sorted ``keys`` (int64 max when none)."""
    if keys.size == 0:
        return np.full(t.shape, np.iinfo(np.int64).max, np.int64)
    j = np.searchsorted(keys, t)
    a = np.abs(keys[np.clip(j - 1, 0, keys.size - 1)] - t)
    b = np.abs(keys[np.clip(j, 0, keys.size - 1)] - t)
    dist: npt.NDArray[np.int64] = np.minimum(a, b)
    return dist


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


def _fit_pass(
    o: dict[int, P2POps],
    unknown: dict[int, npt.NDArray[np.bool_]],
    ranks: list[int],
    off: dict[int, int],
    window: int,
    unc: int,
    allowed: set[tuple[int, int]] | None,
    all_meet: bool,
) -> tuple[dict[tuple[int, int], LinkFit], tuple[dict[int, npt.NDArray[np.int64]], ...]]:
    """One fit of the links on the clock ``off``: the accepted links and, per rank, the sorted
    indices and keys of its unknown send- and receive-capable ops (raises :class:`_Ambiguous`)."""
    # per rank: sorted keys of its unknown send-capable / receive-capable ops on the coarse clock
    send_idx: dict[int, npt.NDArray[np.int64]] = {}
    recv_idx: dict[int, npt.NDArray[np.int64]] = {}
    send_key: dict[int, npt.NDArray[np.int64]] = {}
    recv_key: dict[int, npt.NDArray[np.int64]] = {}
    for r in ranks:
        v = o[r]
        si = np.flatnonzero(unknown[r] & can_send(v.direction))
        ri = np.flatnonzero(unknown[r] & can_recv(v.direction))
        sk = _keys(v.start, v.end, bool(v.ends_meet), True)[si] + off.get(r, 0)
        rk = _keys(v.start, v.end, bool(v.ends_meet), False)[ri] + off.get(r, 0)
        so, ro = np.argsort(sk, kind="stable"), np.argsort(rk, kind="stable")
        send_idx[r], send_key[r] = si[so], sk[so]
        recv_idx[r], recv_key[r] = ri[ro], rk[ro]
    # link fits per ordered pair
    fits: dict[tuple[int, int], list[LinkFit]] = {}
    for a in ranks:
        if send_key[a].size == 0:
            continue
        ends_meet = o[a].ends_meet
        for b in ranks:
            if b == a or recv_key[b].size == 0 or (allowed is not None and (a, b) not in allowed):
                continue
            # ends meet: the offset is unknown by +-window; else a receive ends after its send began
            lo = -window if ends_meet else -window // 4
            peaks = fit_peaks(send_key[a], recv_key[b], window, lo)
            if peaks:
                fits[(a, b)] = [LinkFit(a, b, *pk) for pk in peaks]
    links = _accept(fits, unc, all_meet)
    return links, (send_idx, recv_idx, send_key, recv_key)


def _link_offsets(links: dict[tuple[int, int], LinkFit], ranks: list[int]) -> dict[int, int]:
    """Clock corrections the accepted links imply (``e_dst - e_src = shift``; the two directions
    of a link averaged), by a walk from the lowest rank of each linked set (0 for unlinked ranks)."""
    adj: dict[int, list[tuple[int, int]]] = {}
    for (a, b), f in links.items():
        g = links.get((b, a))
        shift = (f.shift_ns - g.shift_ns) // 2 if g is not None else f.shift_ns
        adj.setdefault(a, []).append((b, shift))
        adj.setdefault(b, []).append((a, -shift))
    e: dict[int, int] = {}
    for root in ranks:
        if root in e:
            continue
        e[root] = 0
        stack = [root]
        while stack:
            x = stack.pop()
            for y, sh in adj.get(x, []):
                if y not in e:
                    e[y] = e[x] + sh
                    stack.append(y)
    return e


def _accept(
    fits: dict[tuple[int, int], list[LinkFit]], unc: int, ends_meet: bool = True
) -> dict[tuple[int, int], LinkFit]:
    """Links whose peaks stand clear of the floor and agree on one clock per rank.

    A pipeline sends both ways on every link (activations one way, gradients back). Where a send
    and its receive end together, the two directions of a real link peak at opposite shifts (the
    same clock offset seen from either side), while a schedule's periodic echo (a rank's send
    ending as a rank two stages away receives) has a forward and a backward delay of its own: only
    reciprocal pairs of peaks are candidates. The peaks of real links also add up around any
    cycle. Candidates are taken strongest first: those whose shift the coarse clock's own
    uncertainty ``unc`` explains before any other, then by supporting ops, then by the smallest
    shift; a pair joining two ranks already linked is kept only when its shift agrees with the
    offsets the stronger pairs set. A pipeline rank has at most two partners.
    """
    pairs = _reciprocal_pairs(fits, unc, ends_meet)
    uf = _Potentials()
    out: dict[tuple[int, int], LinkFit] = {}
    degree: dict[int, int] = {}
    weakest: dict[int, tuple[bool, int]] = {}  # per rank: (explained by the coarse clock, support)
    for f, g in pairs:
        if (f.src, f.dst) in out:
            continue
        shift = (f.shift_ns - g.shift_ns) // 2 if ends_meet else f.shift_ns
        ra, ea = uf.find(f.src)
        rb, eb = uf.find(f.dst)
        strength = (abs(f.shift_ns) <= unc, f.support + g.support)
        if degree.get(f.src, 0) >= 2 or degree.get(f.dst, 0) >= 2:
            consistent = ra != rb or abs((eb - ea) - shift) <= max(f.tol_ns, 2 * _BIN_NS)
            if consistent:
                _refuse_tie(f, strength, degree, weakest)
            continue
        if ra != rb:
            # e_dst - e_src = shift
            uf.join(ra, ea, rb, eb, shift)
        elif ends_meet and abs((eb - ea) - shift) > max(f.tol_ns, 2 * _BIN_NS):
            continue
        out[(f.src, f.dst)] = f
        out[(g.src, g.dst)] = g
        for x in (f.src, f.dst):
            degree[x] = degree.get(x, 0) + 1
            if x not in weakest or strength < weakest[x]:
                weakest[x] = strength
    return out


def _reciprocal_pairs(
    fits: dict[tuple[int, int], list[LinkFit]], unc: int, ends_meet: bool
) -> list[tuple[LinkFit, LinkFit]]:
    """The candidate (forward, backward) peak pairs of :func:`_accept`, strongest first: peaks
    clear of the floor, and where ends meet, the two directions at opposite shifts."""
    good = {
        k: [f for f in fs if f.support >= _MIN_LINK_OPS and f.support >= 5 * f.floor + 1]
        for k, fs in fits.items()
    }
    pairs: list[tuple[LinkFit, LinkFit]] = []
    for (x, y), fs in good.items():
        gs = good.get((y, x), [])
        if x >= y:
            continue
        for f in fs:
            for g in gs:
                if ends_meet and abs(f.shift_ns + g.shift_ns) > max(f.tol_ns, g.tol_ns, 2 * _BIN_NS):
                    continue
                pairs.append((f, g))
    pairs.sort(key=lambda p: (abs(p[0].shift_ns) > unc, -(p[0].support + p[1].support), abs(p[0].shift_ns)))
    return pairs


def _refuse_tie(
    f: LinkFit, strength: tuple[bool, int], degree: dict[int, int], weakest: dict[int, tuple[bool, int]]
) -> None:
    """A consistent pair on a rank that has its two partners already: raise :class:`_Ambiguous`
    when it is as strong as the weakest partner taken there (the timing cannot tell them apart,
    e.g. data-parallel replicas that run in lockstep); else it is dropped."""
    full = [x for x in (f.src, f.dst) if degree.get(x, 0) >= 2]
    if all(weakest[x][0] == strength[0] and strength[1] >= _TIE * weakest[x][1] for x in full):
        raise _Ambiguous(f"ranks {f.src} and {f.dst} fit a link as well as {sorted(full)}'s partners")


class _Potentials:
    """Union-find over ranks that keeps each rank's clock offset relative to its set's root."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.pot: dict[int, int] = {}

    def find(self, x: int) -> tuple[int, int]:
        """The root of ``x``'s set and ``x``'s offset from it (path compressed)."""
        parent, pot = self.parent, self.pot
        if parent.setdefault(x, x) == x:
            pot.setdefault(x, 0)
            return x, 0
        root, p_off = self.find(parent[x])
        pot[x] = pot[x] + p_off if parent[x] != root else pot[x]
        parent[x] = root
        return root, pot[x]

    def join(self, ra: int, ea: int, rb: int, eb: int, shift: int) -> None:
        """Hang root ``rb`` under root ``ra`` so that ``e_b - e_a = shift`` (``ea``, ``eb``: the two
        ranks' offsets from their roots)."""
        self.parent[rb] = ra
        self.pot[rb] = ea + shift - eb


class _Ambiguous(Exception):
    """The timing fits more partners than a pipeline rank can have, equally well."""


def _assign_by_links(
    run: Run,
    o: dict[int, P2POps],
    ranks: list[int],
    links: dict[tuple[int, int], LinkFit],
    key_sets: _KeySets,
) -> tuple[int, list[npt.NDArray[np.float64]]]:
    """Give each unknown op the linked partner whose nearest counterpart is closest (in link
    tolerances); returns the ops placed and, per rank, the confidences of its timing decisions."""
    send_idx, recv_idx, send_key, recv_key = key_sets
    margins: list[npt.NDArray[np.float64]] = []
    decided = 0
    for r in ranks:
        v = o[r]
        for side in ("send", "recv"):
            idx = send_idx[r] if side == "send" else recv_idx[r]
            keys = send_key[r] if side == "send" else recv_key[r]
            cands = (
                [(b, f) for (a, b), f in links.items() if a == r]
                if side == "send"
                else [(a, f) for (a, b), f in links.items() if b == r]
            )
            if idx.size == 0 or not cands:
                continue
            decided += _assign_side(v, side == "send", idx, keys, cands, send_key, recv_key)
        _stream_vote(run, r, v)
        sel = v.how == HOW_TIMING
        margins.append(v.conf[sel].astype(np.float64))
    return decided, margins


def _assign_side(
    v: P2POps,
    send: bool,
    idx: npt.NDArray[np.int64],
    keys: npt.NDArray[np.int64],
    cands: list[tuple[int, LinkFit]],
    send_key: dict[int, npt.NDArray[np.int64]],
    recv_key: dict[int, npt.NDArray[np.int64]],
) -> int:
    """Place one rank's unknown sends (or receives) ``idx`` among the candidate partners
    ``cands``; returns how many were placed."""
    resid = np.empty((len(cands), idx.size), np.float64)
    for c, (p, lf) in enumerate(cands):
        if v.ends_meet:
            other = recv_key[p] if send else send_key[p]
            t = keys + lf.shift_ns if send else keys - lf.shift_ns
            dist = _nearest(other, t).astype(np.float64)
        elif not send:
            # the latest send of the candidate before this receive ended
            dist = np.abs(_latest_before(send_key[p], keys, lf.tol_ns).astype(np.float64) - lf.shift_ns)
        else:
            dist = np.abs(_earliest_after(recv_key[p], keys, lf.tol_ns).astype(np.float64) - lf.shift_ns)
        resid[c] = dist / max(lf.tol_ns, 1)
    best = np.argmin(resid, axis=0)
    b_res = resid[best, np.arange(idx.size)]
    second = np.partition(resid, 1, axis=0)[1] if len(cands) > 1 else np.full(idx.size, np.inf)
    # within the link's tolerance, or the only partner this rank has on that side
    ok = (b_res <= 1.0) | ((len(cands) == 1) & np.isfinite(b_res))
    peers = np.array([p for p, _ in cands], dtype=np.int32)
    v.peer[idx[ok]] = peers[best[ok]]
    v.how[idx[ok]] = HOW_TIMING
    # confidence: how much farther (in link tolerances) the second candidate lies
    conf = np.clip((second - b_res) / 2.0, 0.0, 1.0)
    conf = np.where(b_res <= 1.0, conf, 0.5 * conf)
    v.conf[idx[ok]] = conf[ok].astype(np.float32)
    return int(ok.sum())


def _stream_vote(run: Run, rank: int, v: P2POps) -> None:
    """Device ops on one stream talk to one peer (PyTorch keeps a NCCL communicator and stream per
    peer pair): where a stream's confidently placed ops agree (4 of 5 at least), its ambiguous ops
    take that peer. Streams that mix peers (one grouped communicator) change nothing."""
    tl = run.by_rank().get(rank)
    if tl is None or v.table != "intervals" or not v.index.size or (v.index < 0).any():
        return
    stream = tl.intervals.stream[v.index]
    timed = v.how == HOW_TIMING
    sure = timed & (v.conf >= 0.5)
    weak = timed & (v.conf < 0.5)
    if not weak.any():
        return
    for st in np.unique(stream[weak]):
        on = stream == st
        peers, counts = np.unique(v.peer[on & sure], return_counts=True)
        if counts.size == 0 or counts.sum() < 3:
            continue
        k = int(np.argmax(counts))
        if counts[k] >= 0.8 * counts.sum():
            fix = on & weak
            v.peer[fix] = peers[k]
            v.conf[fix] = 0.5
