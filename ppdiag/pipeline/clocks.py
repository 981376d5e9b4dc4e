"""Send/recv matching across ranks and clock alignment (DESIGN.md §4.3).

The k-th send from rank a to rank b pairs with the k-th receive on b from a. A NCCL send and its
receive finish together (the transfer completes on both sides), so each matched pair measures the
clock offset between the two hosts. Offsets are solved by least squares over all rank pairs with
the lowest rank fixed at 0; the residual is the median disagreement left after alignment.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, RangeKind, RankTimeline, Run


@dataclass
class P2POps:
    """One rank's point-to-point operations in issue order (own clock)."""

    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    peer: npt.NDArray[np.int32]
    direction: npt.NDArray[np.int8]
    device: bool  # device kernels (ends are simultaneous) or host ops


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

    def __len__(self) -> int:
        return int(self.src.shape[0])


def p2p_ops(tl: RankTimeline) -> P2POps:
    """Device p2p kernels with known peers, else host p2p ops (gloo spans, c10d ops)."""
    iv = tl.intervals
    m = (iv.kind == int(Kind.P2P)) & (iv.peer >= 0) & (iv.direction > 0)
    if m.any() and not tl.cpu_only:
        o = np.argsort(iv.start[m], kind="stable")
        return P2POps(iv.start[m][o], iv.end[m][o], iv.peer[m][o], iv.direction[m][o], True)
    rg = tl.ranges
    cm = (rg.kind == int(RangeKind.COMM_OP)) & (rg.peer >= 0) & (rg.direction > 0)
    if cm.any():
        names = np.array([tl.names[i] for i in rg.name[cm]], dtype=object)
        # One op per transfer: prefer the backend span (issue -> completion), then the c10d op.
        for prefix in ("gloo:", "nccl:", "c10d::"):
            pm = np.array([n.startswith(prefix) for n in names], dtype=bool)
            if pm.any():
                sel = np.flatnonzero(cm)[pm]
                o = np.argsort(rg.start[sel], kind="stable")
                sel = sel[o]
                return P2POps(rg.start[sel], rg.end[sel], rg.peer[sel], rg.direction[sel], False)
    z = np.zeros(0, np.int64)
    return P2POps(z, z.copy(), np.zeros(0, np.int32), np.zeros(0, np.int8), False)


def match_pairs(ops: dict[int, P2POps]) -> Pairs:
    """Pair the k-th send a->b with the k-th recv on b from a."""
    parts: list[tuple[npt.NDArray[np.int64], ...]] = []
    device = all(o.device for o in ops.values() if len(o.start))
    for a, oa in ops.items():
        sends = (oa.direction == int(Direction.SEND)) | (oa.direction == int(Direction.BOTH))
        for b in np.unique(oa.peer[sends]):
            b = int(b)
            ob = ops.get(b)
            if ob is None:
                continue
            sa = np.flatnonzero(sends & (oa.peer == b))
            recvs = (ob.direction == int(Direction.RECV)) | (ob.direction == int(Direction.BOTH))
            rb = np.flatnonzero(recvs & (ob.peer == a))
            n = min(sa.size, rb.size)
            if n == 0:
                continue
            sa, rb = sa[:n], rb[:n]
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
        return Pairs(z.astype(np.int32), z.astype(np.int32), z, z, z, z, device)
    cols = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    return Pairs(
        cols[0].astype(np.int32), cols[1].astype(np.int32), cols[2], cols[3], cols[4], cols[5], device
    )


@dataclass
class ClockFit:
    """Per-rank offsets (ns to add) and the fit's residual."""

    offsets: dict[int, int]
    residual_us: float | None
    method: str


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


def align_clocks(run: Run, pairs: Pairs) -> ClockFit:
    """Offsets that make matched device transfers and collectives end together.

    Least squares over every linked rank pair; the lowest rank of each connected set of ranks keeps
    its clock. Ranks linked by nothing keep theirs too (a warning says so upstream).
    """
    ranks = sorted(tl.rank for tl in run.ranks)
    zero = {r: 0 for r in ranks}
    coll = collective_rows(run)
    rows = _p2p_rows(pairs, None) + coll
    p2p_rows = len(rows) - len(coll)
    if len(ranks) >= 2 and p2p_rows:
        # A send and its receive end together only when the receive was waiting for it (posted
        # before the send began); a buffered send or a late receive breaks that. Solve once with
        # every pair, then again with the pairs that the first answer shows were waiting.
        first = _solve(ranks, rows)
        refined = _p2p_rows(pairs, first)
        if refined:
            rows = refined + coll
            p2p_rows = len(refined)
    if len(ranks) < 2 or not rows:
        hosts = {str(tl.meta.get("host_name", "")) for tl in run.ranks}
        method = (
            "same host clock" if len(hosts) == 1 and "" not in hosts else "none (no matched device transfers)"
        )
        return ClockFit(zero, None, method)
    offsets, n_comps = _solve(ranks, rows)
    if len(pairs) and pairs.device:
        o_src = np.array([offsets[int(r)] for r in pairs.src], dtype=np.int64)
        o_dst = np.array([offsets[int(r)] for r in pairs.dst], dtype=np.int64)
        waited = (pairs.recv_start + o_dst) <= (pairs.send_start + o_src)
        resid = np.abs((pairs.send_end + o_src) - (pairs.recv_end + o_dst))
        resid = resid[waited] if waited.any() else resid
    else:
        resid = np.array([abs(d - (offsets[b] - offsets[a])) for a, b, d, _ in rows], dtype=np.float64)
    method = "matched p2p transfers" if p2p_rows else "matched collectives"
    if p2p_rows and len(rows) > p2p_rows:
        method += " and collectives"
    if n_comps > 1:
        method += f" ({n_comps} unlinked groups of ranks, each on its own clock)"
    return ClockFit(offsets, float(np.median(resid)) / 1000.0, method)


def _p2p_rows(pairs: Pairs, prior: tuple[dict[int, int], int] | None) -> list[tuple[int, int, float, int]]:
    """One equation per directed rank pair, ``o_dst - o_src = median(send_end - recv_end)``, over
    all pairs or, given a first solution, over the pairs whose receive was posted first."""
    rows: list[tuple[int, int, float, int]] = []
    if not (pairs.device and len(pairs)):
        return rows
    keep = np.ones(len(pairs), dtype=bool)
    if prior is not None:
        off = prior[0]
        o_src = np.array([off[int(r)] for r in pairs.src], dtype=np.int64)
        o_dst = np.array([off[int(r)] for r in pairs.dst], dtype=np.int64)
        keep = (pairs.recv_start + o_dst) < (pairs.send_start + o_src)
    diffs = pairs.send_end - pairs.recv_end
    key = pairs.src.astype(np.int64) * 1_000_003 + pairs.dst
    for k in np.unique(key):
        m = (key == k) & keep
        if m.any():
            rows.append(
                (int(pairs.src[m][0]), int(pairs.dst[m][0]), float(np.median(diffs[m])), int(m.sum()))
            )
    return rows


def _solve(ranks: list[int], rows: list[tuple[int, int, float, int]]) -> tuple[dict[int, int], int]:
    """Least-squares offsets for ``rows`` (``o_b - o_a = d``); one anchor per connected component."""
    idx = {r: i for i, r in enumerate(ranks)}
    rows = [r for r in rows if r[0] in idx and r[1] in idx]
    # connected components: each gets its own anchor
    parent = list(range(len(ranks)))

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
    n = len(ranks)
    a_mat = np.zeros((len(rows) + len(comps), n))
    rhs = np.zeros(len(rows) + len(comps))
    w = np.ones(len(rows) + len(comps))
    for i, (a, b, d, cnt) in enumerate(rows):
        a_mat[i, idx[b]] = 1.0
        a_mat[i, idx[a]] = -1.0
        rhs[i] = d
        w[i] = np.sqrt(cnt)
    for j, members in enumerate(comps.values()):
        a_mat[len(rows) + j, min(members)] = 1.0  # anchor: the lowest rank keeps its clock
        w[len(rows) + j] = 1e3
    sol, *_ = np.linalg.lstsq(a_mat * w[:, None], rhs * w, rcond=None)
    return {r: round(sol[idx[r]]) for r in ranks}, len(comps)
