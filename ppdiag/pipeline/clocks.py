"""Send/recv matching across ranks and clock alignment (docs/clocks.md).

Within each link a->b the sends pair with b's receives from a in issue order, by time where
the counts disagree (a lost or duplicated event). A NCCL send and its
receive finish together (the transfer completes on both sides), so each matched pair measures the
clock offset between the two hosts. Offsets are solved by least squares over all rank pairs with
the lowest rank fixed at 0; the residual is the median disagreement left after alignment.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, RangeKind, RankTimeline, Run
from ppdiag.pipeline.pair_stats import group_medians, offsets_of


@dataclass
class P2POps:
    """One rank's point-to-point operations in issue order (own clock).

    ``peer`` / ``direction`` start as the parser gave them (-1 / 0 when unknown) and are copies:
    :func:`ppdiag.pipeline.peers.decide_peers` fills the unknown ones from timing, ``how`` says how
    each was decided (``peers.HOW_*``) and ``conf`` with what confidence (1 for metadata).
    ``index`` is the op's row in ``tl.intervals`` (``table == "intervals"``) or ``tl.ranges``.
    ``ends_meet``: a matched send and receive end together (device kernels), rather than a
    receive ending when the data arrived after the send started (host ops).
    """

    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    peer: npt.NDArray[np.int32]
    direction: npt.NDArray[np.int8]
    device: bool  # device kernels (ends are simultaneous) or host ops
    how: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, np.int8))
    conf: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(0, np.float32))
    index: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    table: str = "intervals"
    ends_meet: bool | None = None
    # the rank's ``intervals.peer`` / ``.direction`` with the decided peers laid over (copies; empty
    # until :func:`ppdiag.pipeline.peers.decide_peers` ran and decided some by timing)
    iv_peer: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    iv_dir: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, np.int8))

    def __post_init__(self) -> None:
        n = self.start.shape[0]
        if self.how.shape[0] != n:
            self.how = np.where(self.peer >= 0, 1, 0).astype(np.int8)
        if self.conf.shape[0] != n:
            self.conf = np.where(self.peer >= 0, 1.0, 0.0).astype(np.float32)
        if self.index.shape[0] != n:
            self.index = np.full(n, -1, np.int64)
        if self.ends_meet is None:
            self.ends_meet = self.device


@dataclass
class Pairs:
    """Matched transfers: sender/receiver rank and their intervals on their own clocks."""

    src: npt.NDArray[np.int32]
    dst: npt.NDArray[np.int32]
    send_start: npt.NDArray[np.int64]
    send_end: npt.NDArray[np.int64]
    recv_start: npt.NDArray[np.int64]
    recv_end: npt.NDArray[np.int64]
    device: bool
    unmatched: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # link: (sends, recvs)
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.src.shape[0])


def p2p_ops(tl: RankTimeline) -> P2POps:
    """Device p2p kernels, else host p2p ops (gloo spans, c10d ops), peers known or not."""
    iv = tl.intervals
    m = iv.kind == int(Kind.P2P)
    if m.any() and not tl.cpu_only:
        sel = np.flatnonzero(m)
        sel = sel[np.argsort(iv.start[sel], kind="stable")]
        return P2POps(
            iv.start[sel],
            iv.end[sel],
            iv.peer[sel].copy(),
            iv.direction[sel].copy(),
            True,
            index=sel.astype(np.int64),
            table="intervals",
        )
    rg = tl.ranges
    cm = (rg.kind == int(RangeKind.COMM_OP)) & (rg.direction > 0)
    if cm.any():
        names = np.array([tl.names[i] for i in rg.name[cm]], dtype=object)
        # One op per transfer: prefer the backend span (issue -> completion), then the c10d op.
        for prefix in ("gloo:", "nccl:", "c10d::"):
            pm = np.array([n.startswith(prefix) for n in names], dtype=bool)
            if pm.any():
                sel = np.flatnonzero(cm)[pm]
                o = np.argsort(rg.start[sel], kind="stable")
                sel = sel[o]
                return P2POps(
                    rg.start[sel],
                    rg.end[sel],
                    rg.peer[sel].copy(),
                    rg.direction[sel].copy(),
                    False,
                    index=sel.astype(np.int64),
                    table="ranges",
                )
    z = np.zeros(0, np.int64)
    return P2POps(z, z.copy(), np.zeros(0, np.int32), np.zeros(0, np.int8), False)


def _is_send(d: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    out: npt.NDArray[np.bool_] = (d == int(Direction.SEND)) | (d == int(Direction.BOTH))
    return out


def _is_recv(d: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    out: npt.NDArray[np.bool_] = (d == int(Direction.RECV)) | (d == int(Direction.BOTH))
    return out


def _pair_link(
    s_key: npt.NDArray[np.int64], r_key: npt.NDArray[np.int64], ends_meet: bool
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Indices ``(i, j)`` pairing sends ``i`` with receives ``j`` of one link, in order.

    The same counts pair k-th with k-th (issue order is the same on both sides; a send and its
    receive need not end together, e.g. p2p on the compute stream). Different counts mean a lost
    or duplicated event: where a send and its receive end together (device kernels) each send then
    takes the receive whose end is nearest its own once the link's constant shift (clock offset) is
    removed, within half the usual spacing of the receives; host ops take the first receive that
    ends after the send started. Pairs that would share or cross an op are
    dropped, so one missing event costs one pair, not every later one.
    """
    ns, nr = s_key.size, r_key.size
    if ns == nr:
        k = np.arange(ns, dtype=np.int64)
        return k, k
    if ns == 0 or nr == 0:
        z = np.zeros(0, np.int64)
        return z, z
    t = s_key + (_dense_shift(s_key, r_key) if ends_meet else 0)
    if ends_meet:
        j = np.searchsorted(r_key, t)
        jl = np.clip(j - 1, 0, nr - 1)
        jr = np.clip(j, 0, nr - 1)
        j = np.where(np.abs(r_key[jl] - t) <= np.abs(r_key[jr] - t), jl, jr)
        dist = np.abs(r_key[j] - t)
        gaps = np.diff(r_key)
        tol = max(int(np.median(gaps)) // 2, 1) if gaps.size else np.iinfo(np.int64).max
        keep = dist <= tol
    else:
        j = np.searchsorted(r_key, t, side="left")
        keep = j < nr
        j = np.clip(j, 0, nr - 1)
        dist = r_key[j] - t
    i = np.flatnonzero(keep)
    j = j[keep]
    dist = dist[keep]
    # one receive per send: the closest claim wins
    order = np.lexsort((dist, j))
    first = np.r_[True, j[order][1:] != j[order][:-1]]
    i, j = i[order][first], j[order][first]
    o = np.argsort(i, kind="stable")
    i, j = i[o], j[o]
    # keep the order: drop pairs whose receive index goes backwards
    mono = j == np.maximum.accumulate(j)
    return i[mono].astype(np.int64), j[mono].astype(np.int64)


def _dense_shift(s_key: npt.NDArray[np.int64], r_key: npt.NDArray[np.int64], slip: int = 4) -> int:
    """The clock shift ``r - s`` most pairs agree on when the k-th send may pair with a receive up
    to ``slip`` places away (events lost or duplicated): the densest 50 µs of those differences."""
    n = min(s_key.size, r_key.size)
    ks = np.arange(s_key.size)
    parts = []
    for t in range(-slip, slip + 1):  # a fixed handful of diagonals, each vectorized
        k = ks[(ks + t >= 0) & (ks + t < r_key.size)]
        parts.append(r_key[k + t] - s_key[k])
    d = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    if d.size == 0 or n == 0:
        return 0
    cnt = np.searchsorted(d, d + 50_000, side="right") - np.arange(d.size)
    i = int(np.argmax(cnt))
    return int(np.median(d[i : i + int(cnt[i])]))


def match_pairs(ops: dict[int, P2POps]) -> Pairs:
    """Pair the sends a->b with the receives on b from a, by order and time within each link.

    A lost or duplicated event leaves its op unmatched (counted per link in ``unmatched`` and a
    warning); it never shifts the later pairs.
    """
    parts: list[tuple[npt.NDArray[np.int64], ...]] = []
    device = all(o.device for o in ops.values() if len(o.start))
    unmatched: dict[tuple[int, int], tuple[int, int]] = {}
    warnings: list[str] = []
    for a, oa in ops.items():
        sends = _is_send(oa.direction) & (oa.peer >= 0)
        for b in np.unique(oa.peer[sends]):
            b = int(b)
            ob = ops.get(b)
            if ob is None:
                continue
            sa = np.flatnonzero(sends & (oa.peer == b))
            rb = np.flatnonzero(_is_recv(ob.direction) & (ob.peer == a))
            if sa.size == 0 or rb.size == 0:
                continue
            ends_meet = bool(oa.ends_meet and ob.ends_meet)
            s_key = oa.end[sa] if ends_meet else oa.start[sa]
            # issue order on each side; keys sorted for the time search
            so = np.argsort(s_key, kind="stable")
            ro = np.argsort(ob.end[rb], kind="stable")
            sa, rb = sa[so], rb[ro]
            i, j = _pair_link(s_key[so], ob.end[rb], ends_meet)
            lost = (sa.size - i.size, rb.size - j.size)
            if lost != (0, 0):
                unmatched[(a, b)] = lost
                warnings.append(
                    f"p2p link {a}->{b}: {sa.size} sends vs {rb.size} receives; "
                    f"{lost[0]} sends and {lost[1]} receives left unmatched (lost or duplicated events)"
                )
            n = i.size
            if n == 0:
                continue
            sa, rb = sa[i], rb[j]
            parts.append(
                (
                    np.full(n, a, np.int64),
                    np.full(n, b, np.int64),
                    oa.start[sa],
                    oa.end[sa],
                    ob.start[rb],
                    ob.end[rb],
                )
            )
    if not parts:
        z = np.zeros(0, np.int64)
        return Pairs(z.astype(np.int32), z.astype(np.int32), z, z, z, z, device, unmatched, warnings)
    cols = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    return Pairs(
        cols[0].astype(np.int32),
        cols[1].astype(np.int32),
        cols[2],
        cols[3],
        cols[4],
        cols[5],
        device,
        unmatched,
        warnings,
    )


@dataclass(frozen=True)
class HostClock:
    """The fitted clock of one host: ns to add to its ranks' times, the residual (half the width
    of the causal interval, or the spread of the equations), what fixed it, and the standard
    error of the offset against the reference host (:mod:`ppdiag.pipeline.clock_se`: what it is
    typically off by, at most the residual; 0 for the reference, None when nothing placed it)."""

    host: str
    ranks: tuple[int, ...]
    offset_ns: int
    residual_ns: int | None
    method: str
    se_ns: int | None = None


@dataclass
class ClockFit:
    """Per-rank offsets (ns to add) and the fit's residual."""

    offsets: dict[int, int]
    residual_us: float | None
    method: str
    # per rank: the median disagreement of its matched device transfers after alignment (µs)
    residual_by_rank_us: dict[int, float] = field(default_factory=dict)
    latency_us: float | None = None  # the normal device p2p transfer time (median of waited pairs)
    hosts: list[HostClock] = field(default_factory=list)  # one clock per host (host_clocks.py)


def collective_rows(run: Run) -> list[tuple[int, int, float, int]]:
    """Equations ``o_b - o_a = end_a - end_b`` from collectives: the k-th device collective of one
    process group ends at the same moment on all its members."""
    per_group: dict[tuple[str, tuple[int, ...]], dict[int, npt.NDArray[np.int64]]] = {}
    for tl in run.ranks:
        if tl.cpu_only:
            continue
        iv = tl.intervals
        m = (iv.kind == int(Kind.COLLECTIVE)) & (iv.group >= 0)
        if not m.any():
            continue
        for gi in np.unique(iv.group[m]):
            gi = int(gi)
            if gi >= len(tl.process_groups):
                continue
            g = tl.process_groups[gi]
            if len(g.ranks) < 2:
                continue
            sel = m & (iv.group == gi)
            ends = iv.end[sel][np.argsort(iv.start[sel], kind="stable")]
            per_group.setdefault((g.name or g.desc, tuple(g.ranks)), {})[tl.rank] = ends
    rows: list[tuple[int, int, float, int]] = []
    for members in per_group.values():
        rs = sorted(members)
        for a, b in itertools.pairwise(rs):
            ea, eb = members[a], members[b]
            n = min(ea.size, eb.size)
            if n == 0 or ea.size != eb.size:  # a rank missed some: the order cannot be trusted
                continue
            rows.append((a, b, float(np.median(ea[:n] - eb[:n])), n))
    return rows


def align_clocks(run: Run, pairs: Pairs, clocks: Mapping[int, int] | None = None) -> ClockFit:
    """Offsets that make matched device transfers and collectives end together.

    Least squares over every linked rank pair; the lowest rank of each connected set of ranks keeps
    its clock. Ranks linked by nothing keep theirs too (a warning says so upstream). ``clocks``
    maps each rank to the lowest rank reading the same clock (ranks of one host): those share one
    offset, fitted from every transfer between their clock and the others'.
    """
    ranks = sorted(tl.rank for tl in run.ranks)
    zero = {r: 0 for r in ranks}
    rep = {r: int(clocks.get(r, r)) if clocks else r for r in ranks}
    rows, p2p_rows = _equations(run, pairs, ranks, rep)
    if len(ranks) < 2 or not rows:
        hosts = {str(tl.meta.get("host_name", "")) for tl in run.ranks}
        method = (
            "same host clock" if len(hosts) == 1 and "" not in hosts else "none (no matched device transfers)"
        )
        return ClockFit(zero, None, method)
    offsets, n_comps = _solve_shared(ranks, rows, rep)
    by_rank: dict[int, float] = {}
    latency: float | None = None
    if len(pairs) and pairs.device:
        resid, by_rank, latency = _transfer_residuals(pairs, offsets, ranks)
    else:
        resid = np.array([abs(d - (offsets[b] - offsets[a])) for a, b, d, _ in rows], dtype=np.float64)
    method = "matched p2p transfers" if p2p_rows else "matched collectives"
    if p2p_rows and len(rows) > p2p_rows:
        method += " and collectives"
    if n_comps > 1:
        method += f" ({n_comps} unlinked groups of ranks, each on its own clock)"
    return ClockFit(offsets, float(np.median(resid)) / 1000.0, method, by_rank, latency)


def _solve_shared(
    ranks: list[int], rows: list[tuple[int, int, float, int]], rep: Mapping[int, int]
) -> tuple[dict[int, int], int]:
    """:func:`_solve` with one unknown per clock (``rep``: each rank's lowest rank on its clock):
    rows between ranks of one clock carry no offset and are left out."""
    shared = [(rep[a], rep[b], d, w) for a, b, d, w in rows if a in rep and b in rep and rep[a] != rep[b]]
    off, n_comps = _solve(sorted(set(rep.values())), shared)
    return {r: off[rep[r]] for r in ranks}, n_comps


def _equations(
    run: Run, pairs: Pairs, ranks: list[int], rep: Mapping[int, int]
) -> tuple[list[tuple[int, int, float, int]], int]:
    """The rows to solve (p2p rows first, then the collectives') and how many are p2p rows."""
    coll = collective_rows(run)
    rows = _p2p_rows(pairs, None) + coll
    p2p_rows = len(rows) - len(coll)
    if len(ranks) >= 2 and p2p_rows:
        # A send and its receive end together only when the receive was waiting for it (posted
        # before the send began); a buffered send or a late receive breaks that. Solve once with
        # every pair, then again with the pairs that the first answer shows were waiting.
        first = _solve_shared(ranks, rows, rep)
        refined = _p2p_rows(pairs, first)
        if refined:
            rows = refined + coll
            p2p_rows = len(refined)
    return rows, p2p_rows


def _transfer_residuals(
    pairs: Pairs, offsets: dict[int, int], ranks: list[int]
) -> tuple[npt.NDArray[np.int64], dict[int, float], float]:
    """On the solved clocks: the end-to-end residuals (ns) of the pairs whose receive waited (all
    pairs when none did), the median residual per rank (µs) and the transfer latency (µs)."""
    by_rank: dict[int, float] = {}
    o_src = offsets_of(offsets, pairs.src)
    o_dst = offsets_of(offsets, pairs.dst)
    waited = (pairs.recv_start + o_dst) <= (pairs.send_start + o_src)
    resid_all = np.abs((pairs.send_end + o_src) - (pairs.recv_end + o_dst))
    sel = waited if waited.any() else np.ones(len(pairs), dtype=bool)
    resid: npt.NDArray[np.int64] = resid_all[sel]
    # the transfer once both sides were there: the send's own duration on waited pairs
    latency = float(np.median((pairs.send_end - pairs.send_start)[sel])) / 1000.0
    # each selected pair counts for its source and (when another rank) its destination
    src, dst = pairs.src[sel].astype(np.int64), pairs.dst[sel].astype(np.int64)
    other = dst != src
    ks, med, _, _ = group_medians(np.r_[src, dst[other]], np.r_[resid_all[sel], resid_all[sel][other]])
    found = dict(zip(ks.tolist(), med.tolist(), strict=True))
    for r in ranks:
        if r in found:
            by_rank[r] = found[r] / 1000.0
    return resid, by_rank, latency


def _p2p_rows(pairs: Pairs, prior: tuple[dict[int, int], int] | None) -> list[tuple[int, int, float, int]]:
    """One equation per directed rank pair, ``o_dst - o_src = median(send_end - recv_end)``, over
    all pairs or, given a first solution, over the pairs whose receive was posted first."""
    rows: list[tuple[int, int, float, int]] = []
    if not (pairs.device and len(pairs)):
        return rows
    keep = np.ones(len(pairs), dtype=bool)
    if prior is not None:
        off = prior[0]
        keep = (pairs.recv_start + offsets_of(off, pairs.dst)) < (
            pairs.send_start + offsets_of(off, pairs.src)
        )
    diffs = (pairs.send_end - pairs.recv_end)[keep]
    key = (pairs.src.astype(np.int64) * 1_000_003 + pairs.dst)[keep]
    # one median per link, in the order of the link keys
    _, med, count, first = group_medians(key, diffs)
    src, dst = pairs.src[keep][first].tolist(), pairs.dst[keep][first].tolist()
    for a, b, m, n in zip(src, dst, med.tolist(), count.tolist(), strict=True):
        rows.append((int(a), int(b), float(m), int(n)))
    return rows


_DENSE_MAX = 256  # components up to this size are solved directly (n^2 floats: 512 KiB)


def _solve(ranks: list[int], rows: list[tuple[int, int, float, int]]) -> tuple[dict[int, int], int]:
    """Weighted least-squares offsets for ``rows`` (``o_b - o_a = d``, weight = pair count); one
    anchor per connected component (its lowest rank keeps its clock).

    The normal equations of this problem are the graph Laplacian of the rank graph, so memory stays
    O(ranks + pairs): small components are solved directly on their grounded Laplacian, large ones
    by conjugate gradients applied edge-wise (``np.bincount``), started from offsets propagated
    along a spanning tree so that only the noise-level correction is iterated.
    """
    idx = {r: i for i, r in enumerate(ranks)}
    rows = [r for r in rows if r[0] in idx and r[1] in idx]
    n = len(ranks)
    # connected components: each gets its own anchor
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, _, _ in rows:
        parent[find(idx[a])] = find(idx[b])
    comps: dict[int, list[int]] = {}
    for r in ranks:
        comps.setdefault(find(idx[r]), []).append(idx[r])
    sol = np.zeros(n, dtype=np.float64)
    if rows:
        ea = np.array([idx[a] for a, _, _, _ in rows], dtype=np.int64)
        eb = np.array([idx[b] for _, b, _, _ in rows], dtype=np.int64)
        d = np.array([r[2] for r in rows], dtype=np.float64)
        w = np.array([r[3] for r in rows], dtype=np.float64)  # squared row weight: the pair count
        comp_of = np.array([find(i) for i in range(n)], dtype=np.int64)
        e_comp = comp_of[ea]
        e_order = np.argsort(e_comp, kind="stable")
        bounds = np.searchsorted(e_comp[e_order], np.array(sorted(comps), dtype=np.int64))
        starts = dict(zip(sorted(comps), bounds.tolist(), strict=True))
        ends = dict(zip(sorted(comps), [*bounds[1:].tolist(), len(rows)], strict=True))
        for root, members in comps.items():
            if len(members) < 2:
                continue
            sel = e_order[starts[root] : ends[root]]
            sol[members] = _solve_component(
                np.array(members, dtype=np.int64), ea[sel], eb[sel], d[sel], w[sel]
            )
    return {r: round(sol[idx[r]]) for r in ranks}, len(comps)


def _solve_component(
    members: npt.NDArray[np.int64],
    ea: npt.NDArray[np.int64],
    eb: npt.NDArray[np.int64],
    d: npt.NDArray[np.float64],
    w: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Offsets of one connected component (``members`` sorted, the first is the anchor at 0).

    Minimises ``sum w (x_b - x_a - d)^2``: ``L x = B^T W d`` with ``L`` the weighted Laplacian,
    grounded at the anchor."""
    m = len(members)
    ia, ib = np.searchsorted(members, ea), np.searchsorted(members, eb)
    # Parallel equations of one rank pair (both directions, p2p and collectives) merge into one
    # of summed weight and weighted-mean difference: the same minimiser, and a pipeline's rank
    # graph becomes a tree or close to one, which the spanning-tree start solves outright.
    flip = ia > ib
    lo, hi = np.where(flip, ib, ia), np.where(flip, ia, ib)
    key, inv = np.unique(lo * m + hi, return_inverse=True)
    wd = np.bincount(inv, w * np.where(flip, -d, d), len(key))
    w = np.bincount(inv, w, len(key)).astype(np.float64)
    d = wd / w
    ia, ib = key // m, key % m
    rhs = np.bincount(ib, wd, m) - np.bincount(ia, wd, m)
    if m <= _DENSE_MAX:
        lap = np.zeros((m, m), dtype=np.float64)
        np.add.at(lap, (ia, ib), -w)
        np.add.at(lap, (ib, ia), -w)
        deg = np.bincount(ia, w, m) + np.bincount(ib, w, m)
        lap[np.arange(m), np.arange(m)] += deg
        x = np.zeros(m, dtype=np.float64)
        x[1:] = np.linalg.solve(lap[1:, 1:], rhs[1:])
        return x
    x = _tree_offsets(m, ia, ib, d)
    free = np.ones(m, dtype=bool)
    free[0] = False  # the anchor is grounded: its row and column drop out

    def lap_mul(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        t = w * (v[ib] - v[ia])
        return np.where(free, np.bincount(ib, t, m) - np.bincount(ia, t, m), 0.0)

    deg = np.bincount(ia, w, m) + np.bincount(ib, w, m)
    inv_deg = np.where(free, 1.0 / np.maximum(deg, 1e-300), 0.0)  # Jacobi preconditioner
    r = np.where(free, rhs, 0.0) - lap_mul(x)
    z = inv_deg * r
    p = z.copy()
    rz = float(r @ z)
    # Offsets are rounded to whole ns: stop once three steps in a row move no offset by 1e-4 ns
    # (or the residual vanishes); the iteration count is bounded by the exact-arithmetic limit.
    calm = 0
    for _ in range(2 * m):
        if calm >= 3 or not rz:
            break
        q = lap_mul(p)
        pq = float(p @ q)
        if pq <= 0.0:
            break
        alpha = rz / pq
        x += alpha * p
        calm = calm + 1 if abs(alpha) * float(np.abs(p).max()) < 1e-4 else 0
        r -= alpha * q
        z = inv_deg * r
        rz_new = float(r @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


def _tree_offsets(
    m: int, ia: npt.NDArray[np.int64], ib: npt.NDArray[np.int64], d: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Offsets propagated from node 0 along a breadth-first spanning tree (exact on a tree): the
    starting point of the iterative solve, so only the cycle disagreements remain to be iterated."""
    # adjacency in CSR form, both directions: going a->b adds d, b->a subtracts it
    src = np.concatenate((ia, ib))
    dst = np.concatenate((ib, ia))
    val = np.concatenate((d, -d))
    order = np.argsort(src, kind="stable")
    src, dst, val = src[order], dst[order], val[order]
    ptr = np.searchsorted(src, np.arange(m + 1))
    x = np.zeros(m, dtype=np.float64)
    seen = np.zeros(m, dtype=bool)
    seen[0] = True
    frontier = np.array([0], dtype=np.int64)
    while len(frontier):
        # all edges out of the frontier, vectorised per BFS level
        cnt = ptr[frontier + 1] - ptr[frontier]
        if not cnt.sum():
            break
        e = np.repeat(ptr[frontier] - np.cumsum(np.concatenate(([0], cnt[:-1]))), cnt) + np.arange(cnt.sum())
        nb = dst[e]
        new = ~seen[nb]
        nb, e = nb[new], e[new]
        nb, first = np.unique(nb, return_index=True)
        x[nb] = x[src[e[first]]] + val[e[first]]
        seen[nb] = True
        frontier = nb
    return x
