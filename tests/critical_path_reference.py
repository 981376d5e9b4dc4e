"""The critical path walk as it was before its per-rank columns: the reference the walk in
``ppdiag.attribution.critical_path`` is compared with in ``test_critical_path.py`` (one search per
block for the previous block and the incoming transfer, the lost time filled per step).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.critical_path import (
    _PHASE_LETTER,
    RELEASE_TOL_NS,
    Transfers,
    _merge_blocks,
    _ms,
    _path_pieces,
    _stretch,
)
from ppdiag.diagnosis import GapTable, StepWindow
from ppdiag.pipeline.blocks import Blocks
from ppdiag.report_types import Cause, CriticalStep


class _Walk:
    """Per-rank sorted blocks and gaps, and the piece list of the walk in progress.

    A rank's sorted columns, its gap prefix sums and its Python lists are built the first time the
    walk reaches the rank: a step's path crosses one pipeline's ranks, so a run of many replicas
    never needs most of them (built up front for every rank, they were the analysis's peak
    memory at a thousand ranks: lists of every block, gap and transfer)."""

    def __init__(
        self,
        blocks: Mapping[int, Blocks],
        transfers: Transfers,
        gaps: Mapping[int, GapTable],
        stage_of: Mapping[int, int],
    ) -> None:
        self._blocks = {r: b for r, b in blocks.items() if len(b)}
        self._gaps = gaps
        self._bl: dict[int, tuple[list[int], list[int], list[int], list[int], list[int]] | None] = {}
        self._gs: dict[
            int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int8]] | None
        ] = {}
        self._gl: dict[int, tuple[list[int], list[int], list[int]] | None] = {}
        self._gap_cum: dict[int, npt.NDArray[np.int64]] = {}
        self._tr: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}
        self.tr = transfers
        # each receiving rank's slice of the transfers (sorted by dst), found once: a search per
        # lookup on the int32 column with a Python int converts the whole column every time
        ranks, first, counts = np.unique(transfers.dst, return_index=True, return_counts=True)
        self.tr_rows: dict[int, tuple[int, int]] = {
            r: (f, f + c) for r, f, c in zip(ranks.tolist(), first.tolist(), counts.tolist(), strict=True)
        }
        self.stage_of = stage_of
        self.pieces: list[tuple[int, int, dict[str, object]]] = []  # (start, end, fields)
        # the walk's block pieces, whose ``lost`` is filled in one pass per step (``fill_lost``)
        self.block_pieces: list[tuple[int, int, int, dict[str, object]]] = []  # (rank, s, e, fields)

    def any_blocks(self) -> bool:
        """Whether any rank has a block."""
        return bool(self._blocks)

    def bl(self, rank: int) -> tuple[list[int], list[int], list[int], list[int], list[int]] | None:
        """The rank's blocks sorted by end, as Python lists (start, end, phase, mb, stage): the walk
        reads them one element at a time, and a numpy scalar read costs several times a list's.
        None for a rank without blocks."""
        if rank not in self._bl:
            b = self._blocks.get(rank)
            if b is None:
                self._bl[rank] = None
            else:
                b = b.take(np.argsort(b.end, kind="stable"))
                self._bl[rank] = (
                    b.start.tolist(),
                    b.end.tolist(),
                    b.phase.tolist(),
                    b.mb.tolist(),
                    b.stage.tolist(),
                )
        return self._bl[rank]

    def gaps(
        self, rank: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int8]] | None:
        """The rank's gap pieces sorted by start (start, end, cause), None for a rank without a table."""
        if rank not in self._gs:
            g = self._gaps.get(rank)
            if g is None:
                self._gs[rank] = None
            else:
                o = np.argsort(g.start, kind="stable")
                self._gs[rank] = (g.start[o], g.end[o], g.cause[o])
        return self._gs[rank]

    def gl(self, rank: int) -> tuple[list[int], list[int], list[int]] | None:
        """:meth:`gaps` as Python lists."""
        if rank not in self._gl:
            g = self.gaps(rank)
            self._gl[rank] = None if g is None else (g[0].tolist(), g[1].tolist(), g[2].tolist())
        return self._gl[rank]

    def gap_cum(self, rank: int) -> npt.NDArray[np.int64]:
        """Per rank, the lost ns of its first k gap pieces by cause (row k): a block's lost time by
        cause is a difference of two rows, less the clipped parts of the pieces at its edges."""
        cum = self._gap_cum.get(rank)
        if cum is None:
            gs, ge, gc = self.gaps(rank) or (
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
                np.zeros(0, np.int8),
            )
            per = np.zeros((gs.size + 1, len(Cause)), np.int64)
            per[np.arange(1, gs.size + 1), gc.astype(np.int64)] = ge - gs
            cum = self._gap_cum[rank] = np.cumsum(per, axis=0)
        return cum

    def transfers_into(self, rank: int) -> tuple[list[int], list[int], list[int], list[int]]:
        """The transfers the rank received, by receive end: (sender, receive end, send start,
        receive start) as Python lists."""
        tr = self._tr.get(rank)
        if tr is None:
            lo, hi = self.tr_rows.get(rank, (0, 0))
            t = self.tr
            tr = self._tr[rank] = (
                t.src[lo:hi].tolist(),
                t.recv_end[lo:hi].tolist(),
                t.send_start[lo:hi].tolist(),
                t.recv_start[lo:hi].tolist(),
            )
        return tr

    def local(self, rank: int, lo: int, hi: int) -> None:
        """The stretch [lo, hi) on ``rank`` between two links of the chain: gaps by cause, the
        rest compute outside blocks (neighbouring pieces of one kind and cause merged)."""
        if hi <= lo:
            return
        got = self._gaps_in(rank, lo, hi)
        gs, ge, gc = ([x[i] for x in got] for i in range(3))
        self.pieces.extend(_stretch(rank, lo, hi, gs, ge, gc))

    def _gaps_in(self, rank: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """The rank's gap pieces clipped to [lo, hi), in time order (a rank's gaps are disjoint):
        (start, end, cause index)."""
        gl = self.gl(rank)
        if gl is None:
            return []
        gs, ge, gc = gl
        out: list[tuple[int, int, int]] = []
        for k in range(max(bisect.bisect_right(gs, lo) - 1, 0), bisect.bisect_left(gs, hi)):
            s, e = min(max(gs[k], lo), hi), min(max(ge[k], lo), hi)
            if e > s:
                out.append((s, e, gc[k]))
        return out

    def fill_lost(self) -> None:
        """Each block piece's lost ns inside it by cause, from the prefix sums: per rank, the gap
        pieces from the one holding the block's start to the last one starting before its end,
        less the parts of the two edge pieces outside the block."""
        by_rank: dict[int, list[tuple[int, int, dict[str, object]]]] = {}
        for r, lo, hi, f in self.block_pieces:
            by_rank.setdefault(r, []).append((lo, hi, f))
        self.block_pieces = []
        for r, items in by_rank.items():
            gaps = self.gaps(r)
            if gaps is None or not gaps[0].size:
                for _, _, f in items:
                    f["lost"] = {}
                    f["lost_ms"] = {}
                continue
            gs, ge, gc = gaps
            bounds = np.array([(lo, hi) for lo, hi, _ in items], dtype=np.int64).reshape(-1, 2)
            lo_a, hi_a = bounds[:, 0], bounds[:, 1]
            a = np.maximum(np.searchsorted(gs, lo_a, side="right") - 1, 0)
            b = np.searchsorted(gs, hi_a, side="left")
            some = b > a
            cum = self.gap_cum(r)
            lost = np.where(some[:, None], cum[b] - cum[a], 0)
            rows = np.flatnonzero(some & (gs[a] < lo_a))
            ka = a[rows]
            lost[rows, gc[ka]] -= np.minimum(lo_a[rows], ge[ka]) - gs[ka]
            rows = np.flatnonzero(some)
            kb = b[rows] - 1
            over = ge[kb] > hi_a[rows]
            rows, kb = rows[over], kb[over]
            lost[rows, gc[kb]] -= ge[kb] - np.maximum(hi_a[rows], gs[kb])
            # the dicts from the positive entries only (row-major: causes in index order), in ns
            # and in ms (the ms a division per entry, as _ms does)
            ns: list[dict[str, int]] = [{} for _ in items]
            ms: list[dict[str, float]] = [{} for _ in items]
            rows, cols = np.nonzero(lost > 0)
            vals = lost[rows, cols]
            for i, c, v, m in zip(
                rows.tolist(), cols.tolist(), vals.tolist(), (vals / 1e6).tolist(), strict=True
            ):
                key = Cause.of(c)
                ns[i][key] = v
                ms[i][key] = m
            for (_, _, f), d_ns, d_ms in zip(items, ns, ms, strict=True):
                f["lost"] = d_ns
                f["lost_ms"] = d_ms

    def last_block(self, rank: int, t: int, lo: int) -> int | None:
        """The last block of ``rank`` that ended by ``t`` and started at or after ``lo``."""
        bl = self.bl(rank)
        if bl is None:
            return None
        j = bisect.bisect_right(bl[1], t) - 1
        if j < 0 or bl[0][j] < lo:
            return None
        return j


Piece = tuple[int, int, dict[str, object]]


def _walk_step(w: _Walk, members: Sequence[StepWindow]) -> CriticalStep | None:
    """Walk one step back from its end on the rank that finished it last."""
    win = {m.rank: m for m in members}
    end_m = max(members, key=lambda m: (m.end, -m.rank))
    w.pieces = []
    start_rank, t = _walk_back(w, win, end_m.rank, end_m.end)
    w0 = win[start_rank].start if start_rank in win else t
    w.local(start_rank, min(w0, t), t)
    w.fill_lost()
    if not w.pieces:
        return None
    pieces = _merge_blocks(sorted(w.pieces, key=lambda p: (p[0], p[1])))
    p0 = pieces[0][0]
    out, by_stage = _path_pieces(w.stage_of, pieces, p0)
    total = pieces[-1][1] - p0
    return CriticalStep(
        step=end_m.number if end_m.number >= 0 else end_m.index,
        index=end_m.index,
        start_ns=p0,
        length_ms=_ms(total),
        end_rank=end_m.rank,
        start_rank=start_rank,
        pieces=out,
        by_stage=by_stage,
    )


def _walk_back(w: _Walk, win: dict[int, StepWindow], rank: int, t: int) -> tuple[int, int]:
    """From ``t`` on ``rank``, back block by block and across the transfers that released them,
    collecting ``w.pieces``; returns the rank and time where the chain begins."""
    seen: set[tuple[int, int]] = set()
    bisect_right = bisect.bisect_right
    pieces, block_pieces = w.pieces, w.block_pieces
    j = w.last_block(rank, t, win[rank].start if rank in win else t)
    while True:
        if j is None or (rank, j) in seen:
            break
        w0 = win[rank].start if rank in win else t
        seen.add((rank, j))
        b_start, b_end, b_ph, b_mb, b_st = w.bl(rank)  # type: ignore[misc]  # j is not None: it has blocks
        w.local(rank, b_end[j], t)
        # block j clipped at t as one piece (inlined: once per block of the path)
        s = b_start[j]
        e = min(b_end[j], t)
        if e > s:
            f: dict[str, object] = {
                "kind": "block",
                "rank": rank,
                "phase": _PHASE_LETTER.get(b_ph[j], "other"),
                "mb": b_mb[j] if b_mb[j] >= 0 else None,
                "virtual_stage": b_st[j] if b_st[j] >= 0 else None,
            }
            pieces.append((s, e, f))
            block_pieces.append((rank, s, e, f))
        # the last block that ended by s and started in the window (``last_block`` inlined)
        pj = bisect_right(b_end, s) - 1
        prev = None if pj < 0 or b_start[pj] < w0 else pj
        prev_end = b_end[prev] if prev is not None else w0
        tol = min(RELEASE_TOL_NS, (b_end[j] - s) // 10)
        # the transfer into the rank whose receive ended last in (prev_end, s + tol]
        tr_src, tr_re, tr_ss, tr_rs = w.transfers_into(rank)
        k = bisect_right(tr_re, s + tol) - 1
        if k < 0 or tr_re[k] <= prev_end:
            # released by the previous block on the rank (or the step start): the next block is
            # the one just found where the window is the rank's step (a rank outside the step
            # starts its window at t)
            t, j = s, (prev if rank in win else w.last_block(rank, s, s))
            continue
        src = tr_src[k]
        re = min(tr_re[k], s)
        ss = min(tr_ss[k], re)
        rs = min(tr_rs[k], re)
        w.local(rank, re, s)
        if rs > ss or src not in win or not win[src].start <= ss <= win[src].end:
            # the receive was posted after the send (the data was waiting: the receiver set the
            # pace), or the sender is not traced in this step or sent outside its window of it:
            # the transfer from the posting on, and the chain stays on the receiver
            a = max(rs if rs > ss else ss, prev_end)
            pieces.append((a, re, {"kind": "transfer", "rank": rank, "peer": src}))
            t = a
        else:
            pieces.append((ss, re, {"kind": "transfer", "rank": rank, "peer": src}))
            rank, t = src, ss
        j = w.last_block(rank, t, win[rank].start if rank in win else t)
    return rank, t


def critical_paths(
    windows: Sequence[StepWindow],
    blocks: Mapping[int, Blocks],
    transfers: Transfers,
    gaps: Mapping[int, GapTable],
    stage_of: Mapping[int, int],
) -> list[CriticalStep]:
    """The critical path of every analyzed step (steps in time order).

    ``windows``: each rank's analyzed steps on the aligned clock; ``blocks``: each rank's blocks,
    aligned; ``transfers``: the matched p2p pairs, aligned; ``gaps``: the cause of every piece of
    lost time; ``stage_of``: each rank's pipeline stage.
    """
    w = _Walk(blocks, transfers, gaps, stage_of)
    if not w.any_blocks():
        return []
    groups: dict[int, list[StepWindow]] = {}
    for sw in windows:
        groups.setdefault(sw.number if sw.number >= 0 else -1 - sw.index, []).append(sw)
    out = [cs for g in groups.values() if (cs := _walk_step(w, g)) is not None]
    return sorted(out, key=lambda c: c.start_ns)
