"""Send/recv matching across ranks and clock alignment (DESIGN.md §4.3).

The k-th send from rank a to rank b pairs with the k-th receive on b from a. A NCCL send and its
receive finish together (the transfer completes on both sides), so each matched pair measures the
clock offset between the two hosts. Offsets are solved by least squares over all rank pairs with
the lowest rank fixed at 0; the residual is the median disagreement left after alignment.
"""

from __future__ import annotations

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


def match_pairs(run: Run, ops: dict[int, P2POps]) -> Pairs:
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
            parts.append((np.full(n, a, np.int64), np.full(n, b, np.int64), oa.start[sa], oa.end[sa],
                          ob.start[rb], ob.end[rb]))
    if not parts:
        z = np.zeros(0, np.int64)
        return Pairs(z.astype(np.int32), z.astype(np.int32), z, z, z, z, device)
    cols = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    return Pairs(cols[0].astype(np.int32), cols[1].astype(np.int32), cols[2], cols[3], cols[4], cols[5], device)


@dataclass
class ClockFit:
    """Per-rank offsets (ns to add) and the fit's residual."""

    offsets: dict[int, int]
    residual_us: float | None
    method: str


def align_clocks(run: Run, pairs: Pairs) -> ClockFit:
    """Offsets that make matched device transfers end together (least squares, lowest rank at 0)."""
    ranks = sorted(tl.rank for tl in run.ranks)
    zero = {r: 0 for r in ranks}
    if len(ranks) < 2 or len(pairs) == 0 or not pairs.device:
        hosts = {str(tl.meta.get("host_name", "")) for tl in run.ranks}
        method = "same host clock" if len(hosts) == 1 and "" not in hosts else "none (no matched device transfers)"
        return ClockFit(zero, None, method)
    idx = {r: i for i, r in enumerate(ranks)}
    # One equation per directed rank pair: o_dst - o_src = median(send_end - recv_end).
    diffs = pairs.send_end - pairs.recv_end
    key = pairs.src.astype(np.int64) * 1_000_003 + pairs.dst
    rows: list[tuple[int, int, float, int]] = []
    for k in np.unique(key):
        m = key == k
        a = int(pairs.src[m][0])
        b = int(pairs.dst[m][0])
        rows.append((idx[a], idx[b], float(np.median(diffs[m])), int(m.sum())))
    n = len(ranks)
    a_mat = np.zeros((len(rows) + 1, n))
    rhs = np.zeros(len(rows) + 1)
    w = np.ones(len(rows) + 1)
    for i, (ia, ib, d, cnt) in enumerate(rows):
        a_mat[i, ib] = 1.0
        a_mat[i, ia] = -1.0
        rhs[i] = d
        w[i] = np.sqrt(cnt)
    a_mat[-1, 0] = 1.0  # anchor: the lowest rank keeps its clock
    w[-1] = 1e3
    sol, *_ = np.linalg.lstsq(a_mat * w[:, None], rhs * w, rcond=None)
    connected = set()
    for ia, ib, _, _ in rows:
        connected.update((ia, ib))
    offsets = {r: (int(round(sol[idx[r]])) if idx[r] in connected or idx[r] == 0 else 0) for r in ranks}
    o_src = np.array([offsets[int(r)] for r in pairs.src], dtype=np.int64)
    o_dst = np.array([offsets[int(r)] for r in pairs.dst], dtype=np.int64)
    resid = (pairs.send_end + o_src) - (pairs.recv_end + o_dst)
    return ClockFit(offsets, float(np.median(np.abs(resid))) / 1000.0, "matched p2p transfers")
