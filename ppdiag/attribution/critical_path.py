"""The critical path of every step: the chain of blocks, transfers and gaps that sets its length.

Walked backwards on the measured, aligned timeline from the end of the step on the rank that
finished it last. At a block the walk asks what released it: the previous block on its rank or
its matched incoming transfer, whichever ended last. A transfer whose receive was waiting when
the send was issued leads to its sender at that time, and from there to the sender's last block
before it; a receive posted after the send (the data was there) keeps the chain on the receiver.
Everything between two links of the chain on one rank (the wait after a receive, the host's delay
before a send, the tail of the step) is split by the gap table into causes; what is not a gap
there is compute outside the blocks (optimizer, other kernels). The walk stops at the start of
the step on the rank it reached.

The pieces tile the path without overlap, so their durations add up to the path length.
"Which stage do I shorten" is then read off the ``by_stage`` table: each stage's compute on the
path, the transfers into it and the lost time on its ranks by cause.

Collectives are not followed across ranks: a wait in a collective stays on the waiting rank with
the cause the attribution gave it (a late member's root cause).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import GapTable, StepWindow
from ppdiag.model import Phase
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.clocks import Pairs
from ppdiag.report_types import PATH_CATEGORIES, Cause, CriticalStep, PathPiece, StageShare

# a receive that ends this little after the block start (at most a tenth of the block) still
# released it (the receive and the block's first kernel on two streams); clipped to the block start
RELEASE_TOL_NS = 5_000

_PHASE_LETTER = {int(Phase.FWD): "F", int(Phase.BWD): "B", int(Phase.WGRAD): "W"}
#: Categories of the ``by_stage`` table, in column order.


@dataclass(frozen=True)
class Transfers:
    """Matched p2p transfers on the aligned clock, sorted by receiver then receive end."""

    src: npt.NDArray[np.int32]
    dst: npt.NDArray[np.int32]
    send_start: npt.NDArray[np.int64]
    recv_start: npt.NDArray[np.int64]
    recv_end: npt.NDArray[np.int64]

    @classmethod
    def from_pairs(cls, pairs: Pairs, offsets: Mapping[int, int]) -> Transfers:
        """The matched pairs of the pipeline with each side moved onto the aligned clock."""
        src = pairs.src.astype(np.int32)
        dst = pairs.dst.astype(np.int32)
        off_s, off_d = _offsets_of(src, offsets), _offsets_of(dst, offsets)
        return cls.build(src, dst, pairs.send_start + off_s, pairs.recv_start + off_d, pairs.recv_end + off_d)

    @classmethod
    def build(
        cls,
        src: npt.ArrayLike,
        dst: npt.ArrayLike,
        send_start: npt.ArrayLike,
        recv_start: npt.ArrayLike,
        recv_end: npt.ArrayLike,
    ) -> Transfers:
        """From columns in any order (sorted here)."""
        s = np.asarray(src, dtype=np.int32)
        d = np.asarray(dst, dtype=np.int32)
        ss = np.asarray(send_start, dtype=np.int64)
        rs = np.asarray(recv_start, dtype=np.int64)
        re = np.asarray(recv_end, dtype=np.int64)
        o = np.lexsort((re, d))
        return cls(s[o], d[o], ss[o], rs[o], re[o])


def _offsets_of(ranks: npt.NDArray[np.int32], offsets: Mapping[int, int]) -> npt.NDArray[np.int64]:
    """Each row's rank's clock offset (0 for a rank without one): one look-up per distinct rank."""
    uniq, inv = np.unique(ranks, return_inverse=True)
    return np.array([offsets.get(r, 0) for r in uniq.tolist()], dtype=np.int64)[inv.reshape(-1)]


Piece = tuple[int, int, dict[str, object]]


def _ranges(
    a: npt.NDArray[np.intp], b: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Every index of the ranges [a[i], b[i]) (empty where b[i] <= a[i]) with its range's row i,
    in row order: one pass for many short look-ups."""
    n = np.maximum(b - a, 0)
    row = np.repeat(np.arange(a.size), n)
    k = np.arange(int(n.sum())) + np.repeat(a - (np.cumsum(n) - n), n)
    return row, k


def _stretch(rank: int, lo: int, hi: int, gs: list[int], ge: list[int], gc: list[int]) -> list[Piece]:
    """The stretch [lo, hi) on ``rank``, given its gap pieces clipped to it in time order: gaps by
    cause, the rest compute outside blocks (neighbouring pieces of one kind and cause merged)."""
    marks: list[tuple[int, int, str | None]] = []
    t = lo
    for si, ei, ci in zip(gs, ge, gc, strict=True):
        if si > t:
            marks.append((t, si, None))
        marks.append((max(si, t), ei, Cause.of(ci)))
        t = max(t, ei)
    if t < hi:
        marks.append((t, hi, None))
    merged: list[tuple[int, int, str | None]] = []
    for m in marks:
        if merged and merged[-1][2] == m[2] and merged[-1][1] == m[0]:
            merged[-1] = (merged[-1][0], m[1], m[2])
        elif m[1] > m[0]:
            merged.append(m)
    out: list[Piece] = []
    for x, z, cause in merged:
        f: dict[str, object] = {"kind": "gap", "cause": cause} if cause else {"kind": "other"}
        out.append((x, z, {**f, "rank": rank}))
    return out


class _RankBlocks(NamedTuple):
    """One rank's blocks sorted by end, as the walk reads them (see :meth:`_Walk.bl`)."""

    start: list[int]
    end: list[int]
    prev: list[int]  # the last block that ended by this one's start (-1: none)
    released: list[int]  # the rank's last transfer in received by the start plus the tolerance (-1: none)
    blocks: Blocks  # the blocks in this order: their labels are read for the walked ones only


class _Walk:
    """Per-rank sorted blocks and gaps, and the piece list of the walk in progress.

    A rank's sorted columns and its Python lists are built the first time the walk reaches the
    rank: a step's path crosses one pipeline's ranks, so a run of many replicas
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
        self._bl: dict[int, _RankBlocks | None] = {}
        self._gs: dict[
            int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int8]] | None
        ] = {}
        self._tr: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}
        self.tr = transfers
        # each receiving rank's slice of the transfers (sorted by dst), found once: a search per
        # lookup on the int32 column with a Python int converts the whole column every time
        ranks, first, counts = np.unique(transfers.dst, return_index=True, return_counts=True)
        self.tr_rows: dict[int, tuple[int, int]] = {
            r: (f, f + c) for r, f, c in zip(ranks.tolist(), first.tolist(), counts.tolist(), strict=True)
        }
        self.stage_of = stage_of
        # the walk in progress: pieces (start, end, fields), or a stretch's index (``local``)
        self.pieces: list[Piece | int] = []
        # the walks' block pieces, whose ``lost`` is filled in one pass per rank (``fill_lost``)
        self.block_fields: list[dict[str, object]] = []
        self.block_cols: list[int] = []  # rank, block index (``bl``), start, end of each, flat
        # the walks' stretches between two links of a chain (``local``), and each one's cut once
        # resolved (``resolve``)
        self.st_rank: list[int] = []
        self.st_lo: list[int] = []
        self.st_hi: list[int] = []
        self.parts: list[list[Piece]] = []

    def any_blocks(self) -> bool:
        """Whether any rank has a block."""
        return bool(self._blocks)

    def bl(self, rank: int) -> _RankBlocks | None:
        """The rank's blocks sorted by end (None for a rank without blocks), with what the walk
        asks of each: read one element at a time, as Python lists (a numpy scalar read costs
        several times a list's)."""
        if rank not in self._bl:
            b = self._blocks.get(rank)
            self._bl[rank] = None if b is None else self._rank_blocks(rank, b)
        return self._bl[rank]

    def _rank_blocks(self, rank: int, b: Blocks) -> _RankBlocks:
        """:meth:`bl`'s columns, each in one numpy pass over the rank's blocks: the block before
        each one and the transfer that may have released it do not depend on where the walk came
        from, so they are searched for every block at once instead of once per block walked."""
        b = b.take(np.argsort(b.end, kind="stable"))
        start, end = b.start.astype(np.int64), b.end.astype(np.int64)
        lo, hi = self.tr_rows.get(rank, (0, 0))
        tol = np.minimum(RELEASE_TOL_NS, (end - start) // 10)
        return _RankBlocks(
            start.tolist(),
            end.tolist(),
            (np.searchsorted(end, start, side="right") - 1).tolist(),
            (np.searchsorted(self.tr.recv_end[lo:hi], start + tol, side="right") - 1).tolist(),
            b,
        )

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
        """The stretch [lo, hi) on ``rank`` between two links of the chain, as a placeholder in
        the piece list (its index in the stretches): :meth:`resolve` cuts every stretch of the
        walks at once into gaps by cause and compute outside blocks."""
        if hi <= lo:
            return
        self.pieces.append(len(self.st_rank))
        self.st_rank.append(rank)
        self.st_lo.append(lo)
        self.st_hi.append(hi)

    def resolve(self) -> None:
        """Cut the stretches added since the last call (:meth:`local`) and fill the block pieces'
        lost time (:meth:`fill_lost`): one numpy pass per rank for all the steps walked."""
        first = len(self.parts)
        ranks = np.array(self.st_rank[first:], dtype=np.int64)
        lo = np.array(self.st_lo[first:], dtype=np.int64)
        hi = np.array(self.st_hi[first:], dtype=np.int64)
        parts: list[list[Piece]] = [[] for _ in range(ranks.size)]
        for r in np.unique(ranks).tolist():
            idx = np.flatnonzero(ranks == r)
            for i, cut in zip(idx.tolist(), self._cut(r, lo[idx], hi[idx]), strict=True):
                parts[i] = cut
        self.parts += parts
        self.fill_lost()

    def _cut(self, rank: int, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]) -> list[list[Piece]]:
        """Each stretch [lo, hi) of ``rank``: its gaps by cause, the rest compute outside blocks
        (neighbouring pieces of one kind and cause merged). The rank's gap pieces that meet each
        stretch are found and clipped for all of them at once (a rank's gaps are disjoint)."""
        g = self.gaps(rank)
        if g is None:
            counts, gs_l, ge_l, gc_l = [0] * lo.size, [], [], []
        else:
            gs, ge, gc = g
            a = np.maximum(np.searchsorted(gs, lo, side="right") - 1, 0)
            row, k = _ranges(a, np.searchsorted(gs, hi, side="left"))
            x_lo, x_hi = lo[row], hi[row]
            cs = np.minimum(np.maximum(gs[k], x_lo), x_hi)
            ce = np.minimum(np.maximum(ge[k], x_lo), x_hi)
            keep = ce > cs
            counts = np.bincount(row[keep], minlength=lo.size).tolist()
            gs_l, ge_l, gc_l = cs[keep].tolist(), ce[keep].tolist(), gc[k[keep]].tolist()
        out: list[list[Piece]] = []
        pos = 0
        for x, z, n in zip(lo.tolist(), hi.tolist(), counts, strict=True):
            if not n:
                out.append([(x, z, {"kind": "other", "rank": rank})])
                continue
            out.append(_stretch(rank, x, z, gs_l[pos : pos + n], ge_l[pos : pos + n], gc_l[pos : pos + n]))
            pos += n
        return out

    def flat(self, pieces: list[Piece | int]) -> list[Piece]:
        """A walk's pieces with each stretch placeholder replaced by its cut (after :meth:`resolve`)."""
        out: list[Piece] = []
        parts = self.parts
        for p in pieces:
            if type(p) is int:
                out += parts[p]
            else:
                out.append(p)  # type: ignore[arg-type]
        return out

    def fill_lost(self) -> None:
        """Each block piece's lost ns inside it by cause: per rank, the gap pieces from the one
        holding the block's start to the last one starting before its end, less the parts of the
        two edge pieces outside the block."""
        fields, self.block_fields = self.block_fields, []
        cols = np.array(self.block_cols, dtype=np.int64).reshape(-1, 4)  # rank, index, start, end
        self.block_cols = []
        labels = self._labels(cols)
        lost = np.zeros((len(fields), len(Cause)), np.int64)
        for r in np.unique(cols[:, 0]).tolist():
            gaps = self.gaps(r)
            if gaps is None or not gaps[0].size:
                continue
            gs, ge, gc = gaps
            at = np.flatnonzero(cols[:, 0] == r)
            lo, hi = cols[at, 2], cols[at, 3]
            a = np.maximum(np.searchsorted(gs, lo, side="right") - 1, 0)
            b = np.searchsorted(gs, hi, side="left")
            row, k = _ranges(a, b)
            g_s, g_e, lo_k, hi_k = gs[k], ge[k], lo[row], hi[row]
            amount = g_e - g_s
            edge = (k == a[row]) & (g_s < lo_k)
            amount[edge] -= np.minimum(lo_k, g_e)[edge] - g_s[edge]
            edge = (k == b[row] - 1) & (g_e > hi_k)
            amount[edge] -= g_e[edge] - np.maximum(hi_k, g_s)[edge]
            np.add.at(lost, (at[row], gc[k].astype(np.intp)), amount)
        # the dicts from the positive entries only (row-major: causes in index order), in ns and
        # in ms (the ms a division per entry, as _ms does)
        ns: list[dict[str, int]] = [{} for _ in fields]
        ms: list[dict[str, float]] = [{} for _ in fields]
        rows, causes = np.nonzero(lost > 0)
        vals = lost[rows, causes]
        for i, c, v, m in zip(
            rows.tolist(), causes.tolist(), vals.tolist(), (vals / 1e6).tolist(), strict=True
        ):
            key = Cause.of(c)
            ns[i][key] = v
            ms[i][key] = m
        for f, ph, mb, vs, d_ns, d_ms in zip(fields, *labels, ns, ms, strict=True):
            f["phase"] = ph
            f["mb"] = mb
            f["virtual_stage"] = vs
            f["lost"] = d_ns
            f["lost_ms"] = d_ms

    def _labels(self, cols: npt.NDArray[np.int64]) -> tuple[list[str], list[int | None], list[int | None]]:
        """The walked blocks' phase letters ("other" for none), micro-batches and virtual stages
        (None for unknown), read from each rank's columns for those blocks only."""
        phase = np.empty(len(cols), object)
        mb = np.empty(len(cols), object)
        stage = np.empty(len(cols), object)
        for r in np.unique(cols[:, 0]).tolist():
            at = np.flatnonzero(cols[:, 0] == r)
            b: Blocks = self._bl[r].blocks  # type: ignore[union-attr]  # a walked rank has blocks
            ix = cols[at, 1]
            uniq, inv = np.unique(b.phase[ix], return_inverse=True)
            phase[at] = np.array([_PHASE_LETTER.get(x, "other") for x in uniq.tolist()], object)[
                inv.reshape(-1)
            ]
            for out, col in ((mb, b.mb[ix]), (stage, b.stage[ix])):
                v = col.astype(object)
                v[col < 0] = None
                out[at] = v
        return phase.tolist(), mb.tolist(), stage.tolist()

    def last_block(self, rank: int, t: int, lo: int) -> int | None:
        """The last block of ``rank`` that ended by ``t`` and started at or after ``lo``."""
        bl = self.bl(rank)
        if bl is None:
            return None
        j = bisect.bisect_right(bl.end, t) - 1
        if j < 0 or bl.start[j] < lo:
            return None
        return j


def _merge_blocks(pieces: list[Piece]) -> list[Piece]:
    """Blocks of one (phase, micro-batch, virtual stage) that follow each other on one rank with
    only local pieces between them (a block cut in per-layer parts) as one block piece: the gaps
    between the parts go into its ``lost``, compute outside blocks into its compute."""

    def key(f: dict[str, object]) -> tuple[object, ...]:
        return (f["rank"], f.get("phase"), f.get("mb"), f.get("virtual_stage"))

    out: list[Piece] = []
    last_block: int | None = None  # index in ``out`` of the last block piece
    for a, z, f in pieces:
        if f["kind"] == "block" and last_block is not None and key(out[last_block][2]) == key(f):
            pa, _, pf = out[last_block]
            lost: dict[str, int] = dict(pf["lost"])  # type: ignore[call-overload]
            between = [(ga, gz, str(g["cause"])) for ga, gz, g in out[last_block + 1 :] if g["kind"] == "gap"]
            between += [(0, v, c) for c, v in f["lost"].items()]  # type: ignore[attr-defined]
            for ga, gz, c in between:
                lost[c] = lost.get(c, 0) + gz - ga
            del out[last_block + 1 :]
            out[last_block] = (pa, z, {**pf, "lost": lost, "lost_ms": None})
            continue
        if f["kind"] == "transfer" or (last_block is not None and f["rank"] != out[last_block][2]["rank"]):
            last_block = None
        out.append((a, z, f))
        if f["kind"] == "block":
            last_block = len(out) - 1
    return out


class _Walked(NamedTuple):
    """One step's walk: the window that ended it, the rank where the chain begins, and the
    pieces with the stretches still to cut (:meth:`_Walk.resolve`)."""

    end: StepWindow
    start_rank: int
    pieces: list[Piece | int]


def _walk_one(w: _Walk, members: Sequence[StepWindow]) -> _Walked:
    """Walk one step back from its end on the rank that finished it last."""
    win = {m.rank: m for m in members}
    end_m = max(members, key=lambda m: (m.end, -m.rank))
    w.pieces = []
    start_rank, t = _walk_back(w, win, end_m.rank, end_m.end)
    w0 = win[start_rank].start if start_rank in win else t
    w.local(start_rank, min(w0, t), t)
    return _Walked(end_m, start_rank, w.pieces)


def _finish(w: _Walk, walked: _Walked) -> CriticalStep | None:
    """A walked step's path (after :meth:`_Walk.resolve`): pieces in time order, the parts of one
    block as one piece, times in ms, and the table by stage."""
    pieces = w.flat(walked.pieces)
    if not pieces:
        return None
    pieces = _merge_blocks(sorted(pieces, key=itemgetter(0, 1)))
    p0 = pieces[0][0]
    out, by_stage = _path_pieces(w.stage_of, pieces, p0)
    end_m = walked.end
    return CriticalStep(
        step=end_m.number if end_m.number >= 0 else end_m.index,
        index=end_m.index,
        start_ns=p0,
        length_ms=_ms(pieces[-1][1] - p0),
        end_rank=end_m.rank,
        start_rank=walked.start_rank,
        pieces=out,
        by_stage=by_stage,
    )


def _walk_step(w: _Walk, members: Sequence[StepWindow]) -> CriticalStep | None:
    """One step's critical path on its own (:func:`critical_paths` walks every step first)."""
    walked = _walk_one(w, members)
    w.resolve()
    return _finish(w, walked)


def _walk_back(w: _Walk, win: dict[int, StepWindow], rank: int, t: int) -> tuple[int, int]:
    """From ``t`` on ``rank``, back block by block and across the transfers that released them,
    collecting ``w.pieces``; returns the rank and time where the chain begins."""
    seen: set[tuple[int, int]] = set()
    pieces, block_fields, block_cols = w.pieces, w.block_fields, w.block_cols
    bisect_right = bisect.bisect_right
    j = w.last_block(rank, t, win[rank].start if rank in win else t)
    while j is not None and (rank, j) not in seen:
        seen.add((rank, j))
        m = win.get(rank)
        w0 = m.start if m is not None else t
        c: _RankBlocks = w.bl(rank)  # type: ignore[assignment]  # j is not None: it has blocks
        s = c.start[j]
        e = c.end[j]
        if e < t:
            w.local(rank, e, t)
        else:
            e = t  # block j clipped at t
        if e > s:
            # its phase, micro-batch and stage are set with its lost time (``fill_lost``)
            f: dict[str, object] = {"kind": "block", "rank": rank}
            pieces.append((s, e, f))
            block_fields.append(f)
            block_cols += (rank, j, s, e)
        # the last block that ended by s and started in the window
        pj = c.prev[j]
        prev = None if pj < 0 or c.start[pj] < w0 else pj
        prev_end = w0 if prev is None else c.end[pj]
        # the transfer into the rank whose receive ended last in (prev_end, s + tol]
        k = c.released[j]
        if k >= 0:
            tr_src, tr_re, tr_ss, tr_rs = w.transfers_into(rank)
        if k < 0 or tr_re[k] <= prev_end:
            # released by the previous block on the rank (or the step start): the next block is
            # the one just found where the window is the rank's step (a rank outside the step
            # starts its window at t)
            t, j = s, (prev if m is not None else w.last_block(rank, s, s))
            continue
        src = tr_src[k]
        re = min(tr_re[k], s)
        ss = min(tr_ss[k], re)
        rs = min(tr_rs[k], re)
        if re < s:
            w.local(rank, re, s)
        sm = win.get(src)
        if rs > ss or sm is None or not sm.start <= ss <= sm.end:
            # the receive was posted after the send (the data was waiting: the receiver set the
            # pace), or the sender is not traced in this step or sent outside its window of it:
            # the transfer from the posting on, and the chain stays on the receiver
            a = max(rs if rs > ss else ss, prev_end)
            pieces.append((a, re, {"kind": "transfer", "rank": rank, "peer": src}))
            t = a
        else:
            pieces.append((ss, re, {"kind": "transfer", "rank": rank, "peer": src}))
            rank, t = src, ss
        # the rank's last block that ended by t and started in its window (``last_block`` inlined)
        c2 = w.bl(rank)
        if c2 is None:
            break
        m = win.get(rank)
        j = bisect_right(c2.end, t) - 1
        if j < 0 or c2.start[j] < (t if m is None else m.start):
            break
    return rank, t


def _ms(ns: int) -> float:
    """Integer ns as ms. ``round(ns / 1e6, 6)`` is this very float for any integer below 2**53
    (the quotient is the float nearest ns * 1e-6, already a 6-decimal number), so no rounding."""
    return ns / 1e6


def _path_pieces(
    stage_of: Mapping[int, int], pieces: list[Piece], p0: int
) -> tuple[list[PathPiece], list[StageShare]]:
    """The path's pieces (times relative to ``p0``, in ms) and its time per stage and category."""
    # every start and length in one division (int64 to float64 and IEEE division, as Python's)
    ends = np.array([(a, z) for a, z, _ in pieces], dtype=np.int64).reshape(-1, 2)
    t_ms: list[float] = ((ends[:, 0] - p0) / 1e6).tolist()
    dur_ms: list[float] = ((ends[:, 1] - ends[:, 0]) / 1e6).tolist()
    out: list[PathPiece] = []
    agg: dict[int | None, dict[str, int]] = {}
    for (a, z, f), t, d in zip(pieces, t_ms, dur_ms, strict=True):
        r: int = f["rank"]  # type: ignore[assignment]
        st = stage_of.get(r)
        kind: str = f["kind"]  # type: ignore[assignment]
        row = agg.get(st)
        if row is None:
            row = agg[st] = dict.fromkeys(PATH_CATEGORIES, 0)
        if kind == "block":
            lost: dict[str, int] = f["lost"]  # type: ignore[assignment]
            out.append(
                PathPiece(
                    kind,
                    r,
                    st,
                    t,
                    d,
                    f["phase"],  # type: ignore[arg-type]
                    f["mb"],  # type: ignore[arg-type]
                    f["virtual_stage"],  # type: ignore[arg-type]
                    None,
                    None,
                    f.get("lost_ms") or {c: _ms(x) for c, x in lost.items()},  # type: ignore[arg-type]
                )
            )
            row["compute"] += z - a - sum(lost.values())
            for c, x in lost.items():
                row[c] += x
            continue
        cause: str | None = f.get("cause")  # type: ignore[assignment]
        out.append(PathPiece(kind, r, st, t, d, peer=f.get("peer"), cause=cause))  # type: ignore[arg-type]
        row[cause if kind == "gap" else kind] += z - a  # type: ignore[index]
    by_stage = [
        StageShare(st, {k: _ms(v) for k, v in agg[st].items()})
        for st in sorted(agg, key=lambda x: (x is None, x if x is not None else 0))
    ]
    return out, by_stage


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
    # every step walked first, so that the stretches and the blocks' lost time are cut in one
    # numpy pass per rank for all of them
    walked = [_walk_one(w, g) for g in groups.values()]
    w.resolve()
    out = [cs for x in walked if (cs := _finish(w, x)) is not None]
    return sorted(out, key=lambda c: c.start_ns)
