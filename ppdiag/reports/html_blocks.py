"""The drawable blocks of one rank in one step of the HTML timeline, built with numpy: device
intervals merged per category (one bar per micro-batch block at the finest level, only by
category at coarser ones), the gaps by cause, and the short gaps inside a block kept on it.

A block set is ``{category: {column: array}}`` with the columns ``start``, ``end``, ``count``,
``key``, ``mb_lo``, ``mb_hi``, ``chunk``, ``peer``, ``direction``, ``name`` (and ``hidden`` on
compute blocks at level 0); gap categories are ``"cause:<key>"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import GapTable
from ppdiag.model.timeline import Kind, Phase
from ppdiag.report_types import Cause

if TYPE_CHECKING:
    from ppdiag.model.timeline import RankTimeline

I64 = npt.NDArray[np.int64]
#: Merged blocks of one rank by category, each a dict of columns.
Blocks = dict[str, dict[str, I64]]

_PHASE_CAT = {
    int(Phase.FWD): "fwd",
    int(Phase.BWD): "bwd",
    int(Phase.WGRAD): "wgrad",
    int(Phase.OPTIM): "optim",
}
CAT_ORDER = ("fwd", "bwd", "wgrad", "optim", "other", "p2p", "collective", "copy")
COMPUTE_CATS = ("fwd", "bwd", "wgrad", "optim", "other")


def _merge(start: I64, end: I64, key: I64, tol: int, extra: dict[str, I64], name: I64) -> dict[str, I64]:
    """Merge items of equal ``key`` whose gap is at most ``tol`` (vectorized).

    Returns per merged block: start, end, count, key, the min/max of ``extra['mb']``, the other
    ``extra`` columns from the block's first item and the ``name`` of its longest item.
    """
    n = int(start.shape[0])
    if n == 0:
        z = np.zeros(0, np.int64)
        out = {
            "start": z,
            "end": z,
            "count": z,
            "key": z,
            "name": z,
            "mb_lo": z,
            "mb_hi": z,
        }
        out.update({k: z for k in extra})
        return out
    order = np.lexsort((start, key))
    s, e, k = start[order], end[order], key[order]
    seg_new = np.empty(n, dtype=bool)
    seg_new[0] = True
    seg_new[1:] = k[1:] != k[:-1]
    seg = np.cumsum(seg_new) - 1
    # running max of end within each key segment: offset segments apart so the max never crosses
    lo = int(s.min())
    big = int(e.max()) - lo + tol + 2
    cm = np.maximum.accumulate((e - lo) + seg * big) - seg * big + lo
    brk = seg_new.copy()
    brk[1:] |= s[1:] > cm[:-1] + tol
    firsts = np.flatnonzero(brk)
    out = {
        "start": s[firsts],
        "end": np.maximum.reduceat(e, firsts),
        "count": np.diff(np.append(firsts, n)),
        "key": k[firsts],
    }
    mb = extra.get("mb")
    if mb is not None:
        mbs = mb[order]
        out["mb_lo"] = np.minimum.reduceat(mbs, firsts)
        out["mb_hi"] = np.maximum.reduceat(mbs, firsts)
    for c, arr in extra.items():
        if c != "mb":
            out[c] = arr[order][firsts]
    # the longest member names the block
    gid = np.cumsum(brk) - 1
    o2 = np.lexsort((e - s, gid))
    lasts = np.append(firsts[1:], n) - 1
    out["name"] = name[order][o2[lasts]]
    return out


@dataclass
class Level:
    """How coarse the merge is: level 0 keeps micro-batches apart, higher levels only categories."""

    level: int
    tol: int


def _categories(kind: I64, phase: I64) -> I64:
    """Index in :data:`CAT_ORDER` of every item (compute by phase, comm kinds); -1: not drawn (sync)."""
    comp = kind == int(Kind.COMPUTE)
    cat = np.full(kind.shape[0], -1, np.int64)
    for ci, c in enumerate(CAT_ORDER):
        if c in COMPUTE_CATS:
            if c == "other":
                m = comp & ~np.isin(phase, list(_PHASE_CAT))
            else:
                ph = next(p for p, cc in _PHASE_CAT.items() if cc == c)
                m = comp & (phase == ph)
        elif c == "p2p":
            m = kind == int(Kind.P2P)
        elif c == "collective":
            m = kind == int(Kind.COLLECTIVE)
        else:
            m = np.isin(kind, [int(Kind.MEMCPY), int(Kind.MEMSET)])
        cat[m] = ci
    return cat


def _microbatch_blocks(cols: dict[str, I64], s: I64, e: I64, span_ns: int, tol: int) -> dict[str, I64]:
    """Level 0 compute: one bar per micro-batch block. The parts of one (micro-batch, chunk) in a
    step merge whatever lies between them (short gaps: hidden below); unlabelled work by ``tol``."""
    mb, chunk = cols["mb"], cols["chunk"]
    key = (mb + 1) * 65536 + (chunk + 1)
    lab = mb >= 0
    extra = {k: cols[k] for k in ("mb", "chunk", "peer", "direction")}
    parts = [
        _merge(s[sel], e[sel], key[sel], t, {k: v[sel] for k, v in extra.items()}, cols["name"][sel])
        for sel, t in ((lab, span_ns), (~lab, tol))
        if sel.any()
    ]
    return {k: np.concatenate([p_[k] for p_ in parts]) for k in parts[0]}


def _work_blocks(rt: RankTimeline, a: int, b: int, lv: Level) -> Blocks:
    """The rank's device intervals inside ``[a, b)``, merged per category."""
    out: Blocks = {}
    iv = rt.intervals
    off = rt.clock_offset_ns
    st = iv.start + off
    en = iv.end + off
    idx = np.flatnonzero((en > a) & (st < b) & (en > st))
    if idx.shape[0] == 0:
        return out
    s = np.maximum(st[idx], a)
    e = np.minimum(en[idx], b)
    cols = {
        "mb": iv.mb[idx].astype(np.int64),
        "chunk": iv.chunk[idx].astype(np.int64),
        "peer": iv.peer[idx].astype(np.int64),
        "direction": iv.direction[idx].astype(np.int64),
        "name": iv.name[idx].astype(np.int64),
    }
    cat = _categories(iv.kind[idx].astype(np.int64), iv.phase[idx].astype(np.int64))
    for ci, c in enumerate(CAT_ORDER):
        m = cat == ci
        if not m.any():
            continue
        sub = {k: v[m] for k, v in cols.items()}
        if c in COMPUTE_CATS and lv.level == 0:
            out[c] = _microbatch_blocks(sub, s[m], e[m], b - a, lv.tol)
            continue
        if c in COMPUTE_CATS or lv.level != 0:
            key = np.zeros(int(m.sum()), np.int64)
        else:
            key = (sub["peer"] + 1) * 8 + sub["direction"]
        extra = {k: sub[k] for k in ("mb", "chunk", "peer", "direction")}
        out[c] = _merge(s[m], e[m], key, lv.tol, extra, sub["name"])
    return out


def _gap_blocks(out: Blocks, gaps: GapTable, a: int, b: int, lv: Level) -> None:
    """The gaps inside ``[a, b)`` merged per cause (and per blamed rank at level 0), into ``out``."""
    sel = (gaps.end > a) & (gaps.start < b) & (gaps.end > gaps.start)
    if not sel.any():
        return
    s = np.maximum(gaps.start[sel], a).astype(np.int64)
    e = np.minimum(gaps.end[sel], b).astype(np.int64)
    cause = gaps.cause[sel].astype(np.int64)
    blame = gaps.blame[sel].astype(np.int64)
    if lv.level == 0:
        shown = _hide_short_gaps(out, s, e, max(lv.tol, (b - a) // 100))
        s, e, cause, blame = s[shown], e[shown], cause[shown], blame[shown]
    for ci, c in enumerate(Cause):
        m = cause == ci
        if not m.any():
            continue
        key = blame[m] + 1 if lv.level == 0 else np.zeros(int(m.sum()), np.int64)
        neg = np.full(int(m.sum()), -1, np.int64)
        out["cause:" + c] = _merge(
            s[m], e[m], key, lv.tol, {"mb": neg, "chunk": neg, "peer": blame[m], "direction": neg}, neg
        )


def rank_step_blocks(
    rt: RankTimeline | None, gaps: GapTable | None, window: tuple[int, int], lv: Level
) -> Blocks:
    """Merged blocks of one rank in one step, by category (work kinds and cause keys), inside the
    rank's ``window`` of that step."""
    a, b = window
    out = _work_blocks(rt, a, b, lv) if rt is not None and len(rt.intervals) else {}
    if gaps is not None and len(gaps):
        _gap_blocks(out, gaps, a, b, lv)
    return out


def _hide_short_gaps(out: dict[str, dict[str, I64]], s: I64, e: I64, limit: int) -> npt.NDArray[np.bool_]:
    """Gaps shorter than ``limit`` that lie inside a micro-batch block are not drawn: their time
    goes into the block's ``hidden`` (shown on hover; the accounting keeps it). The gaps to draw."""
    cats = [c for c in COMPUTE_CATS if c in out]
    for c in cats:
        out[c]["hidden"] = np.zeros(out[c]["start"].shape[0], np.int64)
    keep = np.ones(s.shape[0], dtype=bool)
    if not cats or s.shape[0] == 0:
        return keep
    bs = np.concatenate([out[c]["start"] for c in cats])
    be = np.concatenate([out[c]["end"] for c in cats])
    lab = np.concatenate([out[c]["mb_lo"] >= 0 for c in cats])
    owner = np.concatenate([np.full(out[c]["start"].shape[0], i, np.int64) for i, c in enumerate(cats)])
    local = np.concatenate([np.arange(out[c]["start"].shape[0], dtype=np.int64) for c in cats])
    o = np.argsort(bs, kind="stable")
    bs, be, lab, owner, local = bs[o], be[o], lab[o], owner[o], local[o]
    j = np.searchsorted(bs, s, side="right") - 1
    jj = np.clip(j, 0, None)
    inside: npt.NDArray[np.bool_] = (j >= 0) & lab[jj] & (e <= be[jj]) & ((e - s) < limit)
    keep = ~inside
    for i, c in enumerate(cats):
        m = inside & (owner[jj] == i)
        np.add.at(out[c]["hidden"], local[jj[m]], (e - s)[m])
    return keep


def count(blocks: dict[int, Blocks]) -> int:
    """Blocks over every rank and category."""
    return sum(int(v["start"].shape[0]) for per in blocks.values() for v in per.values())


def keep_longest(
    blocks: dict[int, dict[str, dict[str, I64]]], budget: int
) -> dict[int, dict[str, dict[str, I64]]]:
    """Keep the ``budget`` longest blocks over all rows and categories (ties: earliest rows first)."""
    durs = np.concatenate([v["end"] - v["start"] for per in blocks.values() for v in per.values()])
    if durs.shape[0] <= budget:
        return blocks
    cut = np.partition(durs, durs.shape[0] - budget)[durs.shape[0] - budget]
    ties_left = budget - int((durs > cut).sum())
    out: dict[int, dict[str, dict[str, I64]]] = {}
    for r, per in blocks.items():
        out[r] = {}
        for c, v in per.items():
            d = v["end"] - v["start"]
            m = d > cut
            tie = np.flatnonzero(d == cut)[: max(0, ties_left)]
            m[tie] = True
            ties_left -= int(tie.shape[0])
            out[r][c] = {k: a[m] for k, a in v.items()}
    return out
