"""One clock per host: the offsets of host ops (gloo) across hosts, from causality alone
(docs/clocks.md).

Ranks on one host read one clock; each host gets one offset. Host ops carry no simultaneous
event (a gloo receive ends when the data arrived, after its send began), so a matched transfer
``a -> b`` bounds the offset from one side: ``recv_end_b + o_b >= send_start_a + o_a``. Transfers
in both directions bound it from both sides, and the offset is the middle of the intersected
interval, its half-width the residual.

Before the peers are known (profiler defaults record none), the pairing comes from structure that
no clock changes: per step, the k-th forward send of a rank meets the k-th forward receive of its
partner, the k-th gradient coming back meets the k-th backward receive, and the counts agree. For
a candidate pair the forward gaps ``recv_end - send_start`` and the backward ones each carry the
unknown offset with opposite signs, so their sum (the width of the causal interval) is the same
on any clock: two transfer latencies for real partners, a stage's compute more for anyone further
away. Each sender takes the partner of the narrowest interval; the interval then places the two
hosts' clocks. Everything is one array per stream group: ``senders x receivers x k``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, RangeKind, Run
from ppdiag.pipeline.clock_bounds import _consistent, flow_residuals, placed_residual, span_jitter
from ppdiag.pipeline.clock_se import capped, host_errors, mean_se, quantile_se
from ppdiag.pipeline.clocks import ClockFit, HostClock, P2POps, Pairs, _solve
from ppdiag.pipeline.link_places import Latency, host_latency, placed_both_ways, waited_both_ways
from ppdiag.pipeline.links import host_of
from ppdiag.pipeline.pair_stats import offsets_of
from ppdiag.pipeline.peer_flow import _BWD, _FWD, _flow_class, _step_of
from ppdiag.pipeline.placement_error import known_clock_error
from ppdiag.pipeline.send_holds import MIN_WAITED, sender_holds

_LOW_Q = 0.25  # the quantile that stands for a stream's smallest gap (stray pairs outvoted)
_MAX_K = 256  # transfers per stream compared in the coarse search (its first steps)
_TOL_NS = 1_000_000  # host ops' jitter on a loaded host: a causal bound may be broken by this much


def clock_domains(run: Run) -> dict[int, str]:
    """Each rank's clock domain: its host (Kineto ``host_name``, the Nsight Systems host, a
    ``tensorboard_trace_handler`` file name). When no rank names a host all share one domain
    (``""``); a rank without a host among named ones is its own domain."""
    named = {tl.rank: host_of(tl) for tl in run.ranks}
    if not any(named.values()):
        return {r: "" for r in named}
    return {r: h if h else f"rank {r}" for r, h in named.items()}


def _grouped(ranks: list[int], dom: dict[int, str]) -> tuple[list[str], dict[str, int]]:
    """Domains in order of their lowest rank (the first keeps its clock) and their indices."""
    order: list[str] = []
    for r in sorted(ranks):
        if dom[r] not in order:
            order.append(dom[r])
    return order, {h: i for i, h in enumerate(order)}


# ---------------------------------------------------------------- coarse: partners by structure


def _streams(
    run: Run, o: dict[int, P2POps]
) -> dict[tuple[int, int, bool], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
    """Per (rank, flow, sends?): the keys (a send's start, a receive's end, own clock) ordered by
    step and time, and their step numbers."""
    tls = run.by_rank()
    out: dict[tuple[int, int, bool], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
    for r, v in o.items():
        if r not in tls or not len(v.start):
            continue
        for send in (True, False):
            d = int(Direction.SEND) if send else int(Direction.RECV)
            idx = np.flatnonzero(v.direction == d)
            if idx.size == 0:
                continue
            cls = _flow_class(tls[r], v, idx, send)
            key = (v.start[idx] if send else v.end[idx]).astype(np.int64)
            step = _step_of(tls[r], key)
            for c in (_FWD, _BWD):
                m = (cls == c) & (step >= 0)
                if m.any():
                    k, s = key[m], step[m]
                    order = np.lexsort((k, s))
                    out[(r, c, send)] = (k[order], s[order])
    return out


def _gap_quantiles(
    senders: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
    receivers: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
) -> npt.NDArray[np.float64]:
    """``Q[t, i, j]``: the lower quartile (t = 0) and the median (t = 1) over k of ``recv_j[k] -
    send_i[k]`` where both streams have the same steps and counts per step (NaN where they do
    not: order cannot pair them)."""
    q = np.full((2, len(senders), len(receivers)), np.nan)

    def sig(s: npt.NDArray[np.int64]) -> bytes:
        return s.tobytes()

    groups: dict[bytes, tuple[list[int], list[int]]] = {}
    for i, (_, st) in enumerate(senders):
        groups.setdefault(sig(st), ([], []))[0].append(i)
    for j, (_, st) in enumerate(receivers):
        if sig(st) in groups:
            groups[sig(st)][1].append(j)
    for si, ri in groups.values():
        if not si or not ri:
            continue
        s_mat = np.stack([senders[i][0][:_MAX_K] for i in si])
        r_mat = np.stack([receivers[j][0][:_MAX_K] for j in ri])
        gaps = r_mat[None, :, :] - s_mat[:, None, :]  # senders x receivers x k
        qs = np.quantile(gaps, (_LOW_Q, 0.5), axis=2, method="lower")
        for t in range(2):
            q[t][np.ix_(si, ri)] = qs[t]
    return q


@dataclass(frozen=True)
class _Bound:
    """``o_hi - o_lo`` of two domains lies in ``[lo, hi]`` (ns), from ``n`` transfers."""

    a: int
    b: int
    lo: float
    hi: float
    n: int


@dataclass(frozen=True)
class CoarseHosts:
    """The hosts' clocks before the peers are known, and each sender's candidate receivers per
    flow (``(rank, flow) -> ranks``, the narrowest causal intervals first) for the data flow to
    choose from, so that it compares a few pairs per rank instead of every pair."""

    offsets: dict[int, int]
    uncertainty_ns: int
    method: str
    candidates: dict[tuple[int, int], set[int]] | None


def coarse_host_offsets(run: Run, o: dict[int, P2POps]) -> CoarseHosts | None:
    """Offsets of host-op ranks on several hosts before any peer is known: each rank's partner is
    the one whose causal interval is narrowest (module docstring), and the partners across hosts
    place the hosts. None when nothing links the hosts."""
    dom = clock_domains(run)
    ranks = sorted(o)
    hosts, hidx = _grouped(ranks, dom)
    if len(hosts) < 2:
        return None
    st = _streams(run, o)
    fs = [k for k in st if k[1] == _FWD and k[2]]
    fr = [k for k in st if k[1] == _FWD and not k[2]]
    bs = [k for k in st if k[1] == _BWD and k[2]]
    br = [k for k in st if k[1] == _BWD and not k[2]]
    if not (fs and fr and bs and br):
        return None
    qf = _gap_quantiles([st[k] for k in fs], [st[k] for k in fr])
    qb = _gap_quantiles([st[k] for k in bs], [st[k] for k in br])
    bpos = {k[0]: i for i, k in enumerate(bs)}
    brpos = {k[0]: j for j, k in enumerate(br)}
    feas: list[tuple[float, int, int, float, float]] = []  # (width, sender, receiver, lo, hi)
    for i, (a, _, _) in enumerate(fs):
        if a not in brpos:
            continue
        for j, (b, _, _) in enumerate(fr):
            if b == a or b not in bpos or np.isnan(qf[0, i, j]):
                continue
            back = qb[:, bpos[b], brpos[a]]
            if np.isnan(back[0]):
                continue
            # the score: the medians' width (the profiler's spans break causality now and then,
            # so the extremes are no judge); the place: the lower quartiles', o_b - o_a in [lo, hi]
            m_lo, m_hi = -float(qf[1, i, j]), float(back[1])
            if m_hi - m_lo < -_TOL_NS or (dom[a] == dom[b] and not m_lo - _TOL_NS <= 0 <= m_hi + _TOL_NS):
                continue  # not causal both ways (on one host: at offset 0)
            lo, hi = sorted((-float(qf[0, i, j]), float(back[0])))
            feas.append((m_hi - m_lo, a, b, lo, hi))
    chosen, cand = _assign_partners(feas)
    bounds = [_Bound(hidx[dom[a]], hidx[dom[b]], lo, hi, 1) for _, a, b, lo, hi in chosen if dom[a] != dom[b]]
    if not bounds:
        return None
    host_off, resid, _, _ = _solve_hosts(len(hosts), bounds)
    linked = {x for bd in bounds for x in (bd.a, bd.b)}
    off = {r: host_off[hidx[dom[r]]] for r in ranks}
    unc = max((x for h in linked if (x := resid[h]) is not None), default=0) + _TOL_NS // 2
    method = f"host clocks from the transfers' order and causality ({len(hosts)} hosts)"
    return CoarseHosts(off, unc, method, cand)


def _assign_partners(
    feas: list[tuple[float, int, int, float, float]],
) -> tuple[list[tuple[float, int, int, float, float]], dict[tuple[int, int], set[int]] | None]:
    """One forward receiver per sender and one sender per receiver, narrowest causal interval
    first (greedy; a pipeline link is one-to-one). A sender whose two narrowest intervals are
    within the host ops' jitter of each other (data-parallel replicas in near lockstep look
    alike) is ambiguous: it places no clock, and the data flow then compares every rank (and
    abstains on a conflict) instead of the chosen partners. Returns the chosen pairs and the
    candidates per (rank, flow), None when some sender was ambiguous."""
    by_sender: dict[int, list[float]] = {}
    for f in sorted(feas):
        by_sender.setdefault(f[1], []).append(f[0])
    ambiguous = {a for a, w in by_sender.items() if len(w) > 1 and w[1] - w[0] < _TOL_NS}
    chosen: list[tuple[float, int, int, float, float]] = []
    senders: set[int] = set()
    receivers: set[int] = set()
    for f in sorted(feas):
        if f[1] in senders or f[2] in receivers or f[1] in ambiguous:
            continue
        chosen.append(f)
        senders.add(f[1])
        receivers.add(f[2])
    if ambiguous:
        return chosen, None
    cand: dict[tuple[int, int], set[int]] = {}
    for _, a, b, _, _ in chosen:
        cand[(a, _FWD)] = {b}
        cand.setdefault((b, _BWD), set()).add(a)
    return chosen, cand


def _merge(bounds: list[_Bound]) -> list[_Bound]:
    """The bounds of each pair of domains intersected into one (oriented low -> high index)."""
    per: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
    for bd in bounds:
        if bd.a < bd.b:
            per.setdefault((bd.a, bd.b), []).append((bd.lo, bd.hi, bd.n))
        else:
            per.setdefault((bd.b, bd.a), []).append((-bd.hi, -bd.lo, bd.n))
    out: list[_Bound] = []
    for (a, b), xs in per.items():
        lo = max(x[0] for x in xs)
        hi = min(x[1] for x in xs)
        out.append(_Bound(a, b, lo, hi, sum(x[2] for x in xs)))
    return out


def _solve_hosts(
    n_hosts: int, bounds: list[_Bound]
) -> tuple[list[int], list[int | None], list[tuple[int, int]], bool]:
    """Host offsets from the merged bounds: the middle of each pair's interval, solved over the host
    graph (least squares; exact on a tree). Returns the offsets, each host's residual (half the
    width of its narrowest interval; None for a host nothing links), the pairs whose bounds
    conflict, and whether any did."""
    merged = _merge(bounds)
    rows = [(m.a, m.b, (m.lo + m.hi) / 2.0, m.n) for m in merged]
    off, _ = _solve(list(range(n_hosts)), rows)
    resid: list[int | None] = [None] * n_hosts
    conflicts: list[tuple[int, int]] = []
    for m in merged:
        half = round(abs(m.hi - m.lo) / 2.0)
        if m.hi < m.lo:
            conflicts.append((m.a, m.b))
        for h in (m.a, m.b):
            cur = resid[h]
            resid[h] = half if cur is None else min(cur, half)
    resid[0] = 0  # the reference host keeps its clock
    return [off[h] for h in range(n_hosts)], resid, conflicts, bool(conflicts)


# ---------------------------------------------------------------- the fit on matched transfers


def fit_host_clocks(run: Run, pairs: Pairs) -> tuple[dict[int, int], list[HostClock], list[str]] | None:
    """One offset per host from matched host transfers (both directions bound it; module
    docstring), else from the step starts. None when the run has one clock domain."""
    dom = clock_domains(run)
    ranks = sorted(tl.rank for tl in run.ranks)
    hosts, hidx = _grouped(ranks, dom)
    if len(hosts) < 2:
        return None
    holds = sender_holds(pairs, dom)
    host_idx = [hidx[dom[r]] for r in ranks]
    lows, highs, waits = _transfer_bounds(pairs, host_idx, ranks, holds)
    raw = _transfer_bounds(pairs, host_idx, ranks, np.zeros(len(pairs)))[2]  # causal: no hold
    jitter = span_jitter(pairs, dom)
    known, lat = known_clock_error(pairs, dom, holds, _place_link), host_latency(pairs, dom, holds)
    _collective_bounds(run, dom, hidx, lows, highs)
    bounds: list[_Bound] = []
    pair_se: dict[tuple[int, int], float] = {}  # what each pair's offset is typically off by
    warnings: list[str] = []
    for a, b in sorted(set(lows) | set(highs)):
        lo_v = np.concatenate(lows.get((a, b), [np.zeros(0)]))
        hi_v = np.concatenate(highs.get((a, b), [np.zeros(0)]))
        lo, hi, _ = _consistent(lo_v, hi_v)
        if lo is None or hi is None:
            continue  # one side only: no interval
        n = int(lo_v.size + hi_v.size)
        placed, placed_se = _refined(_Bound(a, b, lo, hi, n), waits.get((a, b)), lat)
        d, r = (placed.lo + placed.hi) / 2.0, placed_residual(placed.lo, placed.hi, raw.get((a, b)), jitter)
        bounds.append(_Bound(a, b, d - r, d + r, n))
        # what the placement is off by, as measured where the clock is known (a link's whole
        # error, its count's noise in it; a pair whose own count leaves more is that uncertain),
        # none measured: the interval of the fewest broken bounds, all that is known
        half = (placed.hi - placed.lo) / 2.0 + jitter
        pair_se[(a, b)] = min(max(placed_se, known) if known is not None else half, half)
        # broken beyond the host ops' own jitter, by more than a twentieth of the bounds
        bad = int((lo_v > hi + _TOL_NS).sum() + (hi_v < lo - _TOL_NS).sum())
        if bad > max(1, n // 20):
            warnings.append(
                f"clock bounds conflict between hosts {hosts[a] or '?'} and {hosts[b] or '?'}: "
                f"{bad} of {n} matched transfers and collectives contradict every single offset by over "
                "1 ms (lost or reordered events, or a clock that drifted during the capture); the offset "
                "most agree on is used"
            )
    two_sided = bounds
    method = "causal bounds of matched host transfers and collectives"
    if not two_sided:
        return _by_steps(run, ranks, dom, hosts, hidx)
    host_off, resid, _, _ = _solve_hosts(len(hosts), two_sided)
    # against the reference: every pair on the way counts (clock_bounds.flow_residuals)
    edges = [(m.a, m.b, float(m.n), abs(m.hi - m.lo) / 2.0) for m in two_sided]
    resid = [None if x is None else round(x) for x in flow_residuals(len(hosts), edges)]
    resid[0] = 0  # the reference host keeps its clock
    linked = {x for m in two_sided for x in (m.a, m.b)} | {0}
    if len(linked) < len(hosts):
        steps = _by_steps(run, ranks, dom, hosts, hidx)
        if steps is not None:
            s_off = steps[0]
            for h, name in enumerate(hosts):
                if h not in linked:
                    r0 = min(r for r in ranks if dom[r] == name)
                    host_off[h] = s_off[r0]
    out = {r: host_off[hidx[dom[r]]] for r in ranks}
    se = host_errors(len(hosts), pair_se)
    clocks = [
        HostClock(
            name,
            tuple(r for r in ranks if dom[r] == name),
            host_off[h],
            resid[h] if h in linked else None,
            "reference" if h == 0 else (method if h in linked else "step starts"),
            capped(se[h], resid[h] if h in linked else None),
        )
        for h, name in enumerate(hosts)
    ]
    return out, clocks, warnings


_Arrays = dict[tuple[int, int], list[npt.NDArray[np.float64]]]
# per host pair: each way's bounds, send and receive starts (own clocks), ends and links
_Waits = dict[tuple[int, int], tuple[npt.NDArray[np.float64], ...]]


def _transfer_bounds(
    pairs: Pairs, host_idx: list[int], ranks: list[int], holds: npt.NDArray[np.float64]
) -> tuple[_Arrays, _Arrays, _Waits]:
    """Per pair of hosts (low index first, ``D = o_high - o_low``): the lower bounds ``send_start -
    recv_end`` of the transfers low -> high, the upper bounds ``recv_end - send_start`` of those
    high -> low, and for each the receive's and send's starts (to tell which receives waited) and
    its link (the two ranks, either direction; :func:`placed_both_ways`).
    The waits' bounds (what places the offset within the interval) count from when the data left:
    the send's start plus its sender's hold (``holds``, per transfer; :func:`sender_holds`); the
    causal bounds keep the start, which no hold makes wrong."""
    lows: _Arrays = {}
    highs: _Arrays = {}
    waits: _Waits = {}
    if not len(pairs) or pairs.device:
        return lows, highs, waits
    of = dict(zip(ranks, host_idx, strict=True))
    ha = np.array([of[int(r)] for r in pairs.src], dtype=np.int64)
    hb = np.array([of[int(r)] for r in pairs.dst], dtype=np.int64)
    gap = (pairs.send_start - pairs.recv_end).astype(np.float64)
    left = gap + holds  # the data's departure, not the send's issue
    # starts from one integer origin: epoch ns lie past 2^53, where a float is 256 ns coarse, and
    # a skew rounded there moved a receive across the "waited" test (a recorded ZBV run, rank 3
    # moved 1 ms behind: 194 µs off the same split without skew); differences of the run's own
    # times are exact floats, and a skew shifts them by exactly itself
    t0 = int(min(pairs.send_start.min(), pairs.recv_start.min()))
    ss, rs = (pairs.send_start - t0).astype(np.float64), (pairs.recv_start - t0).astype(np.float64)
    ends = (pairs.send_end - pairs.recv_end).astype(np.float64)
    # each transfer's link (the two ranks, either direction): its own latencies, placed on its own
    link = np.minimum(pairs.src, pairs.dst) * float(1 << 20) + np.maximum(pairs.src, pairs.dst)
    for a, b in {(min(int(x), int(y)), max(int(x), int(y))) for x, y in zip(ha, hb, strict=True) if x != y}:
        up, dn = (ha == a) & (hb == b), (ha == b) & (hb == a)
        lows.setdefault((a, b), []).append(gap[up])
        highs.setdefault((a, b), []).append(-gap[dn])
        waits[(a, b)] = (left[up], ss[up], rs[up], -left[dn], ss[dn], rs[dn], ends[up], -ends[dn])
        waits[(a, b)] += (link[up], link[dn])
    return lows, highs, waits


def _refined(
    bd: _Bound, w: tuple[npt.NDArray[np.float64], ...] | None, lat: Latency | None = None
) -> tuple[_Bound, float]:
    """The offset from the receives that waited for their data: those end a transfer latency after
    the send began, so the upper quartile of their lower bounds and the lower quartile of their
    upper bounds sit a latency either side of the offset (``lat``, the host's usual one, places
    each; their middle without it: :func:`placed_both_ways`); per link where several are timed,
    judged waiting on the interval's middle and once more on the placed clock. The interval keeps
    the first one's ends: its residual grows by the move.
    Also the offset's standard error: the middle of two directions' places, each as uncertain as
    its transfers' spread over the root of their count (:func:`mean_se`), or the one direction's
    that placed it; the interval's half-width when no waited receive placed it."""
    whole = (bd.hi - bd.lo) / 2.0
    if w is None:
        return bd, whole
    lo_v, _, _, hi_v, _, _, e_up, e_dn, _, _ = w
    mid = (bd.lo + bd.hi) / 2.0
    w_up, w_dn = waited_both_ways(w, mid)
    placed = placed_both_ways(w, mid, lat)
    if placed is not None:
        # which receives waited, judged again on the clock they placed (the interval's middle
        # may be as far off as the queued transfers that set its ends)
        d, se = placed_both_ways(w, placed[0], lat) or placed
    elif (not hi_v.size and w_up.any()) or (not lo_v.size and w_dn.any()):
        # transfers one way only (the other side of the interval is the collectives', as wide as
        # their spans): a receive that waited for its data ends as its send does, within a
        # latency (the ends of a matched transfer meet), which places the offset from this side
        e = e_up[w_up] if w_up.any() else e_dn[w_dn]
        d = min(max(float(np.median(e)), bd.lo), bd.hi)
        se = quantile_se(e, 0.5) if e.size >= MIN_WAITED else whole
    else:
        return bd, whole
    r = abs(d - mid) + whole
    return _Bound(bd.a, bd.b, d - r, d + r, bd.n), se


def _place_link(
    sub: Pairs, holds: npt.NDArray[np.float64], lat: Latency | None
) -> tuple[float, float] | None:
    """Where the fit places the offset of one link's transfers ``sub`` (ranks a < b, as if on two
    hosts: ``D = o_b - o_a``), and its count's standard error: the causal interval, then the
    receives that waited (:func:`_refined`). What ``placement_error`` runs on links within a host."""
    ranks = sorted({int(r) for r in sub.src} | {int(r) for r in sub.dst})
    if len(ranks) != 2:
        return None
    lows, highs, waits = _transfer_bounds(sub, [0, 1], ranks, holds)
    lo_v, hi_v = (
        np.concatenate(lows.get((0, 1), [np.zeros(0)])),
        np.concatenate(highs.get((0, 1), [np.zeros(0)])),
    )
    lo, hi, _ = _consistent(lo_v, hi_v)
    if lo is None or hi is None:
        return None
    placed, se = _refined(_Bound(0, 1, lo, hi, len(sub)), waits.get((0, 1)), lat)
    return (placed.lo + placed.hi) / 2.0, se


def _collective_bounds(
    run: Run,
    dom: dict[int, str],
    hidx: dict[str, int],
    lows: _Arrays,
    highs: _Arrays,
) -> None:
    """Bounds from host collectives (gloo ``all_reduce`` and the like): the k-th instance of one
    op on two ranks cannot end on either before it started on both, so ``end_b + o_b >= start_a +
    o_a`` and the reverse: both sides at once. Ops are paired by order where counts agree."""
    per: dict[str, dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]] = {}
    for tl in run.ranks:
        if not tl.cpu_only:
            continue
        rg = tl.ranges
        m = np.flatnonzero((rg.kind == int(RangeKind.COMM_OP)) & (rg.direction == 0))
        if m.size == 0:
            continue
        names = np.array([tl.names[i] for i in rg.name[m]], dtype=object)
        for nm in np.unique(names):
            if not str(nm).startswith("gloo:"):
                continue  # one op per collective: the backend span
            sel = m[names == nm]
            sel = sel[np.argsort(rg.start[sel], kind="stable")]
            per.setdefault(str(nm), {})[tl.rank] = (rg.start[sel], rg.end[sel])
    for members in per.values():
        rs = sorted(members)
        for x in rs:
            for y in rs:
                hx, hy = hidx[dom[x]], hidx[dom[y]]
                if hx >= hy or members[x][0].size != members[y][0].size:
                    continue
                (sx, ex), (sy, ey) = members[x], members[y]
                # D = o_y - o_x: ey + o_y >= sx + o_x and ex + o_x >= sy + o_y
                lows.setdefault((hx, hy), []).append((sx - ey).astype(np.float64))
                highs.setdefault((hx, hy), []).append((ex - sy).astype(np.float64))


def _by_steps(
    run: Run, ranks: list[int], dom: dict[int, str], hosts: list[str], hidx: dict[str, int]
) -> tuple[dict[int, int], list[HostClock], list[str]] | None:
    """The last resort: each host's offset from the starts of the steps every rank ran (median
    over the host's ranks and the steps), the spread as residual."""
    from ppdiag.pipeline.peer_links import _by_step_starts

    c = _by_step_starts(run, ranks)
    if c is None:
        return None
    host_off = [round(float(np.median([c.offsets[r] for r in ranks if dom[r] == h]))) for h in hosts]
    base = host_off[0]
    host_off = [x - base for x in host_off]
    out = {r: host_off[hidx[dom[r]]] for r in ranks}
    clocks = [
        HostClock(
            h,
            tuple(r for r in ranks if dom[r] == h),
            host_off[i],
            c.uncertainty_ns if i else 0,
            "reference" if i == 0 else "step starts",
            c.uncertainty_ns if i else 0,  # no transfer placed it: it is known to its residual only
        )
        for i, h in enumerate(hosts)
    ]
    return out, clocks, ["host clocks aligned by the step starts only (no matched transfer links the hosts)"]


def with_host_clocks(run: Run, pairs: Pairs, fit: ClockFit) -> tuple[ClockFit, list[str]]:
    """``fit`` with one clock per host: where no device transfer or collective aligned the ranks
    (host ops, gloo), the hosts' offsets from :func:`fit_host_clocks`; otherwise the device fit's
    offsets summarised per host (median, spread as residual). Warnings of conflicting bounds."""
    dom = clock_domains(run)
    ranks = sorted(tl.rank for tl in run.ranks)
    hosts, _ = _grouped(ranks, dom)
    aligned_by_device = fit.residual_us is not None
    if len(hosts) >= 2 and not aligned_by_device:
        got = fit_host_clocks(run, pairs)
        if got is not None:
            off, clocks, warnings = got
            resid = [c.residual_ns for c in clocks if c.residual_ns is not None and c.method != "reference"]
            methods = sorted({c.method for c in clocks if c.method != "reference"})
            return (
                ClockFit(
                    off,
                    max(resid) / 1000.0 if resid else None,
                    f"one clock per host ({len(hosts)} hosts): " + ", ".join(methods),
                    hosts=clocks,
                ),
                warnings,
            )
    clocks = []
    cross = _device_disagreements(pairs, fit, dom) if aligned_by_device and len(hosts) >= 2 else {}
    for h in hosts:
        mine = [r for r in ranks if dom[r] == h]
        vals = np.array([fit.offsets.get(r, 0) for r in mine], dtype=np.float64)
        spread = float(vals.max() - vals.min()) / 2.0 if vals.size else 0.0
        method, res_ns = fit.method, spread
        if len(mine) > 1 and h and aligned_by_device and spread == 0.0:
            # one offset for the host's ranks (device_clocks.py): the residual is its transfers'
            method += " (one offset for the host)"
            res_ns = max((fit.residual_by_rank_us.get(r, 0.0) * 1000.0 for r in mine), default=0.0)
        elif len(mine) > 1 and h and aligned_by_device:
            method += " (one offset per rank)"
        clocks.append(
            HostClock(
                h,
                tuple(mine),
                round(float(np.median(vals))) if vals.size else 0,
                round(res_ns) if aligned_by_device else None,
                method,
                # the reference keeps its clock; the others are as uncertain as the transfers
                # that tie them to other hosts (at most the residual)
                0 if h == hosts[0] else capped(mean_se(cross.get(h, np.zeros(0))), res_ns),
            )
        )
    fit.hosts = clocks
    return fit, []


def _device_disagreements(
    pairs: Pairs, fit: ClockFit, dom: dict[int, str]
) -> dict[str, npt.NDArray[np.float64]]:
    """Per host, how far the ends of its matched device transfers to and from other hosts
    disagree on the fitted clocks (a send and its receive end together): what places its offset."""
    if not (len(pairs) and pairs.device):
        return {}
    e = (
        pairs.send_end
        + offsets_of(fit.offsets, pairs.src)
        - pairs.recv_end
        - offsets_of(fit.offsets, pairs.dst)
    )
    hs = np.array([dom[int(r)] for r in pairs.src], dtype=object)
    hd = np.array([dom[int(r)] for r in pairs.dst], dtype=object)
    across = hs != hd
    return {
        h: e[across & ((hs == h) | (hd == h))].astype(np.float64) for h in set(hs[across]) | set(hd[across])
    }
