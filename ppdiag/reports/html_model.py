"""The timeline data model of the HTML report: one row per rank, merged blocks per category (one
bar per micro-batch block, short gaps inside it kept on the block), the gaps by cause and the
critical path of the drawn steps, all built with numpy from the diagnosis' columnar timelines.

The timeline stays under ``max_blocks`` drawn blocks by merging adjacent blocks (and, as a last
resort, by dropping the shortest ones), saying so in ``notes``.
"""

from __future__ import annotations

import contextlib
import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.model.timeline import Kind, Phase
from ppdiag.reports.context import context_of
from ppdiag.reports.style import (
    cause_label,
    num,
)

if TYPE_CHECKING:
    from ppdiag.model.timeline import RankTimeline
    from ppdiag.reports.context import Analyzed

I64 = npt.NDArray[np.int64]


MAX_BLOCKS = 20_000  # drawn blocks (work + gaps) over all drawn steps
MAX_ROWS = 64  # timeline rows (ranks)
MAX_STEPS = 12  # steps drawn for the step buttons
TEXT_LIMIT = 4_000  # above this many blocks, labels only in the hover

_PHASE_CAT = {
    int(Phase.FWD): "fwd",
    int(Phase.BWD): "bwd",
    int(Phase.WGRAD): "wgrad",
    int(Phase.OPTIM): "optim",
}
CAT_ORDER = ("fwd", "bwd", "wgrad", "optim", "other", "p2p", "collective", "copy")
COMPUTE_CATS = ("fwd", "bwd", "wgrad", "optim", "other")

# ----------------------------------------------------------------------------------------------
# small helpers


def esc(x: Any) -> str:
    """HTML-escape any value (quotes included)."""
    return html.escape("" if x is None else str(x), quote=True)


def short_name(name: str, n: int = 140) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _fmt_val(v: Any) -> str:
    """A compact text form of an evidence value."""
    if isinstance(v, bool) or v is None:
        return str(v).lower() if v is not None else "—"
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e6:
            return f"{v:.4g}"
        return f"{v:.3e}"
    if isinstance(v, (list, tuple)):
        items = [_fmt_val(x) for x in v[:20]]
        more = f", … ({len(v) - 20} more)" if len(v) > 20 else ""
        return "[" + ", ".join(items) + more + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt_val(x)}" for k, x in list(v.items())[:20])
    return str(v)


# ----------------------------------------------------------------------------------------------
# the timeline model: merged blocks, built with numpy


@dataclass
class BlockSet:
    """Drawn blocks of one category (a work kind or a cause) over all rows and drawn steps."""

    category: str
    is_cause: bool
    row: list[npt.NDArray[np.int64]] = field(default_factory=list)
    start: list[I64] = field(default_factory=list)
    end: list[I64] = field(default_factory=list)
    count: list[I64] = field(default_factory=list)
    mb_lo: list[I64] = field(default_factory=list)
    mb_hi: list[I64] = field(default_factory=list)
    chunk: list[I64] = field(default_factory=list)
    peer: list[I64] = field(default_factory=list)  # peer rank (comm) or blamed rank (gaps)
    direction: list[I64] = field(default_factory=list)
    name: list[I64] = field(default_factory=list)  # name id of the longest member, -1 for gaps
    rank: list[I64] = field(default_factory=list)
    hidden: list[I64] = field(default_factory=list)  # short gaps inside the block, ns (not drawn)

    def cat(self, attr: str) -> npt.NDArray[np.int64]:
        parts = getattr(self, attr)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return int(sum(len(x) for x in self.start))


@dataclass
class StepSpan:
    """One analyzed step on the common clock (union over ranks)."""

    index: int
    number: int
    start: int
    end: int
    drawn: bool = False
    median: bool = False

    @property
    def label(self) -> str:
        return f"step {self.number}" if self.number >= 0 else f"step #{self.index}"


@dataclass
class Row:
    """One timeline row."""

    rank: int
    stages: list[int]
    y: int
    label: str


@dataclass
class TimelineData:
    """Everything the timeline figure draws; the blocks are on the common clock in ns."""

    rows: list[Row]
    spans: list[StepSpan]
    t0: int
    sets: dict[str, BlockSet]
    notes: list[str]
    shown: StepSpan | None
    virtual: bool = False
    raw_blocks: int = 0  # blocks before size reduction (all drawn steps)
    names: dict[int, list[str]] = field(default_factory=dict)
    # critical path of the drawn steps: (row y, start ns, end ns, kind, sender row y or -1, label)
    path: list[tuple[int, int, int, str, int, str]] = field(default_factory=list)
    pp: int = 1  # pipeline ranks: virtual stage s is chunk s // pp of its rank

    def chunk_index(self, virtual_stage: int) -> int:
        """The chunk of a virtual stage on its rank (interleaved: s // pp; V-shaped alike)."""
        return virtual_stage // self.pp if self.pp > 1 else virtual_stage

    @property
    def n_blocks(self) -> int:
        return sum(len(s) for s in self.sets.values())


def stages_by_rank(diag: Analyzed) -> dict[int, list[int]]:
    """Pipeline stage(s) of each rank (several with virtual stages); empty for a run without PP.

    Merges ``run.stage_map``, the context's ``stage_of_rank`` and ``ranks[].stage``; a report
    that says ``pp`` 1 has no stages, whatever a topology default put in the context.
    """
    out: dict[int, list[int]] = {}
    rep = diag.result
    if rep.run.pp == 1:
        return out
    for s, r in rep.run.stage_map.items():
        with contextlib.suppress(TypeError, ValueError):
            out.setdefault(int(r), []).append(int(s))
    for r, st in context_of(diag).stage_of_rank.items():
        lst = [int(x) for x in st] if isinstance(st, (list, tuple)) else [int(st)]
        have = out.setdefault(int(r), [])
        for x in lst:
            if x not in have:
                have.append(x)
    for row in rep.ranks:
        if row.stage is not None and row.stage not in out.get(row.rank, []):
            out.setdefault(row.rank, []).append(row.stage)
    return {r: sorted(v) for r, v in out.items()}


def _pick_rows(diag: Analyzed, max_rows: int, notes: list[str]) -> list[Row]:
    stages = stages_by_rank(diag)
    have = [rt.rank for rt in diag.run.ranks]
    lost = {row.rank: sum(num(v) or 0.0 for v in row.lost_ms.values()) for row in diag.result.ranks}
    chosen = list(have)
    pipe_of = {row.rank: row.pipeline for row in diag.result.ranks if row.pipeline is not None}
    if len(have) > max_rows and len(set(pipe_of.values())) > 1:
        # one pipeline in full (the one holding the rank with the most lost time); the replicas'
        # stage costs are in the heat map under the timeline
        worst = max((r for r in have if r in pipe_of), key=lambda r: (lost.get(r, 0.0), -r))
        mine = [r for r in have if pipe_of.get(r) == pipe_of[worst]]
        if 0 < len(mine) <= max_rows:
            notes.append(
                f"{len(have)} ranks in {len(set(pipe_of.values()))} pipelines: the timeline shows "
                f"pipeline {pipe_of[worst]} in full (it holds rank {worst}, the most lost time); the heat "
                "map below compares every replica's stages, and every rank is in the tables and the "
                "Perfetto overlay."
            )
            chosen = mine
    if len(chosen) > max_rows:
        by_stage: dict[int, list[int]] = {}
        for r in have:
            by_stage.setdefault(stages.get(r, [-1])[0] if stages.get(r) else -1, []).append(r)
        per = max(1, max_rows // max(1, len(by_stage)))
        chosen = []
        for _s, rs in sorted(by_stage.items()):
            chosen += sorted(rs, key=lambda r: -lost.get(r, 0.0))[:per]
        chosen = chosen[:max_rows]
        notes.append(
            f"{len(have)} ranks: the timeline shows {len(chosen)} of them, the ranks with the most "
            f"lost time in each stage; every rank is in the tables and the Perfetto overlay."
        )

    def order(r: int) -> tuple[int, int, int]:
        s = stages.get(r)
        return (0, s[0], r) if s else (1, 0, r)

    rows = []
    for y, r in enumerate(sorted(chosen, key=order)):
        s = stages.get(r, [])
        if not s:
            label = f"rank {r}"
        elif len(s) == 1:
            label = f"stage {s[0]} · rank {r}"
        else:
            label = f"stages {','.join(map(str, s))} · rank {r}"
        rows.append(Row(rank=r, stages=s, y=y, label=label))
    return rows


def _step_spans(diag: Analyzed) -> list[StepSpan]:
    by: dict[int, StepSpan] = {}
    for w in diag.steps:
        sp = by.get(w.index)
        if sp is None:
            by[w.index] = StepSpan(w.index, w.number, int(w.start), int(w.end))
        else:
            sp.start, sp.end = min(sp.start, int(w.start)), max(sp.end, int(w.end))
    spans = [by[k] for k in sorted(by) if by[k].end > by[k].start]
    if spans:
        durs = [s.end - s.start for s in spans]
        order = sorted(range(len(spans)), key=lambda i: (durs[i], i))
        spans[order[(len(order) - 1) // 2]].median = True
    return spans


def _whole_span(diag: Analyzed, ranks: list[int]) -> StepSpan | None:
    lo, hi = None, None
    by = diag.run.by_rank()
    for r in ranks:
        rt = by.get(r)
        if rt is None or len(rt.intervals) == 0:
            continue
        a = int(rt.intervals.start.min()) + rt.clock_offset_ns
        b = int(rt.intervals.end.max()) + rt.clock_offset_ns
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    for r in ranks:
        g = diag.gaps.get(r)
        if g is not None and len(g):
            lo = int(g.start.min()) if lo is None else min(lo, int(g.start.min()))
            hi = int(g.end.max()) if hi is None else max(hi, int(g.end.max()))
    if lo is None or hi is None or hi <= lo:
        return None
    return StepSpan(index=0, number=-1, start=lo, end=hi, median=True)


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
class _Level:
    """How coarse the merge is: level 0 keeps micro-batches apart, higher levels only categories."""

    level: int
    tol: int


def _rank_step_blocks(
    rt: RankTimeline | None,
    gaps: Any,
    span: StepSpan,
    lv: _Level,
    window: tuple[int, int] | None = None,
) -> dict[str, dict[str, I64]]:
    """Merged blocks of one rank in one step, by category (work kinds and cause keys), inside the
    rank's own ``window`` of that step (the step's span over all ranks when unknown)."""
    out: dict[str, dict[str, I64]] = {}
    a, b = window if window is not None else (span.start, span.end)
    if rt is not None and len(rt.intervals):
        iv = rt.intervals
        off = rt.clock_offset_ns
        st = iv.start + off
        en = iv.end + off
        sel = (en > a) & (st < b) & (en > st)
        if sel.any():
            idx = np.flatnonzero(sel)
            s = np.maximum(st[idx], a)
            e = np.minimum(en[idx], b)
            kind = iv.kind[idx].astype(np.int64)
            phase = iv.phase[idx].astype(np.int64)
            mb = iv.mb[idx].astype(np.int64)
            chunk = iv.chunk[idx].astype(np.int64)
            peer = iv.peer[idx].astype(np.int64)
            dirn = iv.direction[idx].astype(np.int64)
            name = iv.name[idx].astype(np.int64)
            comp = kind == int(Kind.COMPUTE)
            # category per item: compute by phase; comm kinds; sync kernels are not drawn
            cat = np.full(idx.shape[0], -1, np.int64)
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
            keep = cat >= 0
            for ci, c in enumerate(CAT_ORDER):
                m = keep & (cat == ci)
                if not m.any():
                    continue
                if c in COMPUTE_CATS:
                    if lv.level == 0:
                        # one bar per micro-batch block: the parts of one (micro-batch, chunk) in a
                        # step merge whatever lies between them (short gaps: hidden below)
                        key = (mb[m] + 1) * 65536 + (chunk[m] + 1)
                        lab = mb[m] >= 0
                        extra_m = {
                            "mb": mb[m],
                            "chunk": chunk[m],
                            "peer": peer[m],
                            "direction": dirn[m],
                        }
                        parts = [
                            _merge(
                                s[m][sel],
                                e[m][sel],
                                key[sel],
                                tol,
                                {k: v[sel] for k, v in extra_m.items()},
                                name[m][sel],
                            )
                            for sel, tol in ((lab, b - a), (~lab, lv.tol))
                            if sel.any()
                        ]
                        out[c] = {k: np.concatenate([p_[k] for p_ in parts]) for k in parts[0]}
                        continue
                    key = np.zeros(int(m.sum()), np.int64)
                else:
                    key = ((peer[m] + 1) * 8 + dirn[m]) if lv.level == 0 else np.zeros(int(m.sum()), np.int64)
                out[c] = _merge(
                    s[m],
                    e[m],
                    key,
                    lv.tol,
                    {
                        "mb": mb[m],
                        "chunk": chunk[m],
                        "peer": peer[m],
                        "direction": dirn[m],
                    },
                    name[m],
                )
    if gaps is not None and len(gaps):
        sel = (gaps.end > a) & (gaps.start < b) & (gaps.end > gaps.start)
        if sel.any():
            s = np.maximum(gaps.start[sel], a).astype(np.int64)
            e = np.minimum(gaps.end[sel], b).astype(np.int64)
            cause = gaps.cause[sel].astype(np.int64)
            blame = gaps.blame[sel].astype(np.int64)
            if lv.level == 0:
                shown = _hide_short_gaps(out, s, e, max(lv.tol, (b - a) // 100))
                s, e, cause, blame = s[shown], e[shown], cause[shown], blame[shown]
            for ci, c in enumerate(CAUSE_KEYS):
                m = cause == ci
                if not m.any():
                    continue
                key = blame[m] + 1 if lv.level == 0 else np.zeros(int(m.sum()), np.int64)
                neg = np.full(int(m.sum()), -1, np.int64)
                out["cause:" + c] = _merge(
                    s[m],
                    e[m],
                    key,
                    lv.tol,
                    {"mb": neg, "chunk": neg, "peer": blame[m], "direction": neg},
                    neg,
                )
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
    inside = (j >= 0) & lab[jj] & (e <= be[jj]) & ((e - s) < limit)
    keep = ~inside
    for i, c in enumerate(cats):
        m = inside & (owner[jj] == i)
        np.add.at(out[c]["hidden"], local[jj[m]], (e - s)[m])
    return keep


def _count(blocks: dict[int, dict[str, dict[str, I64]]]) -> int:
    return sum(int(v["start"].shape[0]) for per in blocks.values() for v in per.values())


def build_timeline(
    diag: Analyzed,
    max_blocks: int = MAX_BLOCKS,
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
) -> TimelineData:
    """Turn the diagnosis' columnar timelines and gap tables into drawable merged blocks.

    The median step is always drawn; other steps are added, nearest first, while the total stays
    under ``max_blocks``. When the median step alone is larger, blocks are merged ever more coarsely
    and, at last, only the longest ``max_blocks`` are kept; ``notes`` says what was done.
    """
    notes: list[str] = []
    rows = _pick_rows(diag, max_rows, notes)
    spans = _step_spans(diag)
    if not spans:
        whole = _whole_span(diag, [r.rank for r in rows])
        spans = [whole] if whole else []
        if whole:
            notes.append("No step markers were found: the whole captured window is drawn.")
    by = diag.run.by_rank()
    virtual = any(len(r.stages) > 1 for r in rows) or diag.result.run.virtual_stages > 1
    if not spans or not rows:
        return TimelineData(
            rows=rows,
            spans=spans,
            t0=0,
            sets={},
            notes=notes,
            shown=None,
            virtual=virtual,
        )

    med = next(s for s in spans if s.median)

    # each rank's own step window: the union spans of consecutive steps overlap when the ranks are
    # staggered, and a block drawn by both would show twice
    own = {(w.rank, w.index): (int(w.start), int(w.end)) for w in diag.steps}

    def blocks_of(span: StepSpan, lv: _Level) -> dict[int, dict[str, dict[str, I64]]]:
        return {
            r.rank: _rank_step_blocks(
                by.get(r.rank),
                diag.gaps.get(r.rank),
                span,
                lv,
                own.get((r.rank, span.index)),
            )
            for r in rows
        }

    tol0 = max(5_000, (med.end - med.start) // 20_000)
    drawn: list[tuple[StepSpan, dict[int, dict[str, dict[str, I64]]]]] = []
    first = blocks_of(med, _Level(0, tol0))
    raw = _count(first)
    total = raw
    if total > max_blocks:
        lv = _Level(1, tol0)
        cur = first
        while _count(cur) > max_blocks and lv.tol < (med.end - med.start) // 200:
            lv = _Level(1, lv.tol * 4)
            cur = blocks_of(med, lv)
        n_merged = _count(cur)
        msg = (
            f"Simplified for size: the step has {raw:,} blocks; adjacent blocks of the same kind closer than "
            f"{lv.tol / 1e6:.3g} ms were merged into {n_merged:,}"
        )
        if n_merged > max_blocks:
            cur = _keep_longest(cur, max_blocks)
            msg += f", and only the {max_blocks:,} longest were kept"
        notes.append(msg + ". Zoom in the Perfetto overlay for every kernel.")
        first = cur
        total = _count(cur)
    drawn.append((med, first))
    med.drawn = True
    others = sorted(
        (s for s in spans if s is not med),
        key=lambda s: (abs(s.index - med.index), s.index),
    )
    skipped = []
    for sp in others:
        if len(drawn) >= max_steps:
            skipped.append(sp)
            continue
        bl = blocks_of(sp, _Level(0, tol0))
        n = _count(bl)
        if total + n > max_blocks:
            skipped.append(sp)
            continue
        drawn.append((sp, bl))
        sp.drawn = True
        total += n
        raw += n
    if skipped:
        nums = sorted(s.number if s.number >= 0 else s.index for s in skipped)
        notes.append(
            f"{len(skipped)} of {len(spans)} steps are not drawn to keep the page responsive "
            f"(steps {ranges_text(nums)}); the tables cover every step and the Perfetto overlay "
            "(--perfetto) has every event."
        )

    sets: dict[str, BlockSet] = {}
    for _sp, per_rank in drawn:
        for row in rows:
            for cat, v in per_rank.get(row.rank, {}).items():
                is_cause = cat.startswith("cause:")
                key = cat.split(":", 1)[1] if is_cause else cat
                bs = sets.setdefault(("cause:" if is_cause else "") + key, BlockSet(key, is_cause))
                n = int(v["start"].shape[0])
                if n == 0:
                    continue
                bs.row.append(np.full(n, row.y, np.int64))
                bs.rank.append(np.full(n, row.rank, np.int64))
                bs.start.append(v["start"])
                bs.end.append(v["end"])
                bs.count.append(v["count"])
                bs.mb_lo.append(v["mb_lo"])
                bs.mb_hi.append(v["mb_hi"])
                bs.chunk.append(v["chunk"])
                bs.peer.append(v["peer"])
                bs.direction.append(v["direction"])
                bs.name.append(v["name"])
                bs.hidden.append(v.get("hidden", np.zeros(n, np.int64)))
    t0 = min(sp.start for sp, _ in drawn)
    names = {r.rank: by[r.rank].names for r in rows if r.rank in by}
    return TimelineData(
        rows=rows,
        spans=spans,
        t0=t0,
        sets=sets,
        notes=notes,
        shown=med,
        virtual=virtual,
        raw_blocks=raw,
        names=names,
        path=_path_pieces(diag, rows, [sp for sp, _ in drawn]),
        pp=max(1, diag.result.run.pp),
    )


def _path_pieces(
    diag: Analyzed, rows: list[Row], spans: list[StepSpan]
) -> list[tuple[int, int, int, str, int, str]]:
    """The critical path of the drawn steps on the drawn rows (``TimelineData.path``)."""
    paths = diag.result.critical_path or []
    y = {r.rank: r.y for r in rows}
    want = {sp.index for sp in spans}
    out: list[tuple[int, int, int, str, int, str]] = []
    for cs in paths:
        if cs.index not in want:
            continue
        for pc in cs.pieces:
            if pc.rank not in y:
                continue
            a = cs.start_ns + round(pc.t_ms * 1e6)
            z = a + round(pc.dur_ms * 1e6)
            if pc.kind == "block":
                lab = f"{pc.phase or ''}{'' if pc.mb is None else pc.mb}"
            elif pc.kind == "gap":
                lab = cause_label(pc.cause)
            elif pc.kind == "transfer":
                lab = f"transfer rank {pc.peer} → rank {pc.rank}"
            else:
                lab = "compute outside blocks"
            src = y.get(pc.peer, -1) if pc.kind == "transfer" and pc.peer is not None else -1
            out.append((y[pc.rank], a, z, pc.kind, src, lab))
    return out


def _keep_longest(
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


def ranges_text(nums: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1–3, 7"``."""
    out: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(f"{nums[i]}" if i == j else f"{nums[i]}–{nums[j]}")
        i = j + 1
    return ", ".join(out)
