"""Self-contained offline HTML report: headline, measured pipeline timeline, per-stage compute
histograms, lost time by cause, bubble, findings, what-if, run facts (DESIGN.md §7).

The file works without any network: plotly.js (the vendored cartesian partial bundle,
``vendor/``, 1.5 MB instead of the full 4.8 MB) is inlined once, there are no fonts or images to
fetch, and a Content-Security-Policy forbids every request. Every string that comes from a trace
is escaped, both in the HTML (``html.escape``) and inside plotly labels (plotly interprets a few
tags, so names are entity-escaped there too; the figure JSON escapes ``<``, ``>`` and ``/``).

The timeline draws one row per rank (ordered by stage): compute blocks merged per micro-batch
(``F3``, ``B3``, ``W3``), comm kernels in a thin strip under each row, and every gap of the gap
table in its cause colour. It uses one bar trace per category, never one trace per block, and
stays under ``max_blocks`` drawn blocks by merging adjacent blocks (and, as a last resort, by
dropping the shortest ones), saying so on the page.
"""

from __future__ import annotations

import functools
import html
import json
import math
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.io import html_marker
from ppdiag.model.timeline import Direction, Kind, Phase
from ppdiag.reports import register
from ppdiag.reports.style import (
    CAUSE_COLORS,
    CAUSE_LABELS,
    PATH_LABELS,
    PHASE_LETTERS,
    SEVERITY_COLORS,
    WORK_COLORS,
    WORK_LABELS,
    cause_color,
    cause_label,
    critical_path_rows,
    evidence_items,
    fmt_ms,
    fmt_pct,
    num,
    ranks_text,
    share,
    share_step_ms,
    slowest_stage,
)

if TYPE_CHECKING:
    from ppdiag.diagnosis import Diagnosis
    from ppdiag.model.timeline import RankTimeline

I64 = npt.NDArray[np.int64]

#: The plotly.js partial bundle inlined into the page (vendor/README.md: version, source, licence).
PLOTLY_JS = "plotly-cartesian.min.js"
PLOTLY_VERSION = "4.1.1"

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
_CAT_ORDER = ("fwd", "bwd", "wgrad", "optim", "other", "p2p", "collective", "copy")
_COMPUTE_CATS = ("fwd", "bwd", "wgrad", "optim", "other")

# Row geometry (y units, one row per unit): the main band holds compute and gaps, the strip under it
# holds communication kernels, so a recv that spins during a wait stays visible next to its cause.
_MAIN_Y, _MAIN_H = -0.07, 0.62
_COMM_Y, _COMM_H = 0.33, 0.16

_COMPUTE_COLOR = "#3A4A5C"

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'"
)


# ----------------------------------------------------------------------------------------------
# small helpers


@functools.cache
def plotly_js() -> str:
    """The vendored plotly.js bundle (cartesian trace types only: bar, scatter, histogram, heatmap)."""
    return (files("ppdiag.reports") / "vendor" / PLOTLY_JS).read_text(encoding="utf-8")


def esc(x: Any) -> str:
    """HTML-escape any value (quotes included)."""
    return html.escape("" if x is None else str(x), quote=True)


def _short(name: str, n: int = 140) -> str:
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


def stages_by_rank(diag: Diagnosis) -> dict[int, list[int]]:
    """Pipeline stage(s) of each rank (several with virtual stages); empty for a run without PP.

    Merges ``run.stage_map``, ``context['stage_of_rank']`` and ``ranks[].stage``; a report that
    says ``pp`` 1 has no stages, whatever a topology default put in the context.
    """
    out: dict[int, list[int]] = {}
    rep = diag.report or {}
    if (rep.get("run") or {}).get("pp") == 1:
        return out
    smap = (rep.get("run") or {}).get("stage_map") or {}
    if isinstance(smap, dict):
        for s, r in smap.items():
            try:
                ranks = r if isinstance(r, list) else [r]
                for rr in ranks:
                    out.setdefault(int(rr), []).append(int(s))
            except (TypeError, ValueError):
                continue
    ctx = (diag.context or {}).get("stage_of_rank") or {}
    for r, s in ctx.items():
        if s is None:
            continue
        try:
            lst = [int(x) for x in s] if isinstance(s, (list, tuple)) else [int(s)]
            out.setdefault(int(r), [])
            for x in lst:
                if x not in out[int(r)]:
                    out[int(r)].append(x)
        except (TypeError, ValueError):
            continue
    for row in rep.get("ranks") or []:
        r, s = row.get("rank"), row.get("stage")
        if isinstance(r, int) and isinstance(s, int) and s not in out.get(r, []):
            out.setdefault(r, []).append(s)
    return {r: sorted(v) for r, v in out.items()}


def _pick_rows(diag: Diagnosis, max_rows: int, notes: list[str]) -> list[Row]:
    stages = stages_by_rank(diag)
    have = [rt.rank for rt in diag.run.ranks]
    lost: dict[int, float] = {}
    for row in (diag.report or {}).get("ranks") or []:
        if isinstance(row.get("rank"), int):
            lost[row["rank"]] = sum(num(v) or 0.0 for v in (row.get("lost_ms") or {}).values())
    chosen = list(have)
    pipe_of = {
        row["rank"]: row.get("pipeline")
        for row in (diag.report or {}).get("ranks") or []
        if isinstance(row.get("rank"), int) and isinstance(row.get("pipeline"), int)
    }
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


def _step_spans(diag: Diagnosis) -> list[StepSpan]:
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


def _whole_span(diag: Diagnosis, ranks: list[int]) -> StepSpan | None:
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
        out = {"start": z, "end": z, "count": z, "key": z, "name": z, "mb_lo": z, "mb_hi": z}
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
    rt: RankTimeline | None, gaps: Any, span: StepSpan, lv: _Level, window: tuple[int, int] | None = None
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
            for ci, c in enumerate(_CAT_ORDER):
                if c in _COMPUTE_CATS:
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
            for ci, c in enumerate(_CAT_ORDER):
                m = keep & (cat == ci)
                if not m.any():
                    continue
                if c in _COMPUTE_CATS:
                    if lv.level == 0:
                        # one bar per micro-batch block: the parts of one (micro-batch, chunk) in a
                        # step merge whatever lies between them (short gaps: hidden below)
                        key = (mb[m] + 1) * 65536 + (chunk[m] + 1)
                        lab = mb[m] >= 0
                        extra_m = {"mb": mb[m], "chunk": chunk[m], "peer": peer[m], "direction": dirn[m]}
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
                    {"mb": mb[m], "chunk": chunk[m], "peer": peer[m], "direction": dirn[m]},
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
    cats = [c for c in _COMPUTE_CATS if c in out]
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
    diag: Diagnosis, max_blocks: int = MAX_BLOCKS, max_rows: int = MAX_ROWS, max_steps: int = MAX_STEPS
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
    virtual = (
        any(len(r.stages) > 1 for r in rows)
        or int(((diag.report or {}).get("run") or {}).get("virtual_stages") or 1) > 1
    )
    if not spans or not rows:
        return TimelineData(rows=rows, spans=spans, t0=0, sets={}, notes=notes, shown=None, virtual=virtual)

    med = next(s for s in spans if s.median)

    # each rank's own step window: the union spans of consecutive steps overlap when the ranks are
    # staggered, and a block drawn by both would show twice
    own = {(w.rank, w.index): (int(w.start), int(w.end)) for w in diag.steps}

    def blocks_of(span: StepSpan, lv: _Level) -> dict[int, dict[str, dict[str, I64]]]:
        return {
            r.rank: _rank_step_blocks(
                by.get(r.rank), diag.gaps.get(r.rank), span, lv, own.get((r.rank, span.index))
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
    others = sorted((s for s in spans if s is not med), key=lambda s: (abs(s.index - med.index), s.index))
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
            f"(steps {_ranges_text(nums)}); the tables cover every step and the Perfetto overlay "
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
        pp=max(1, int(num(((diag.report or {}).get("run") or {}).get("pp")) or 1)),
    )


def _path_pieces(
    diag: Diagnosis, rows: list[Row], spans: list[StepSpan]
) -> list[tuple[int, int, int, str, int, str]]:
    """The critical path of the drawn steps on the drawn rows (``TimelineData.path``)."""
    from ppdiag.attribution.critical_path import CriticalStep

    paths = (diag.context or {}).get("critical_path")
    if paths is None:
        import msgspec

        try:
            paths = msgspec.convert((diag.report or {}).get("critical_path") or [], list[CriticalStep])
        except msgspec.ValidationError:
            return []
    y = {r.rank: r.y for r in rows}
    want = {sp.index for sp in spans}
    out: list[tuple[int, int, int, str, int, str]] = []
    for cs in paths:
        if not isinstance(cs, CriticalStep) or cs.index not in want:
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


def _ranges_text(nums: list[int]) -> str:
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


# ----------------------------------------------------------------------------------------------
# figures


def _block_texts(td: TimelineData, bs: BlockSet, label_ok: bool) -> tuple[list[str], list[str]]:
    """Per-block label and hover text (plotly text: names entity-escaped)."""
    rows = {r.y: r for r in td.rows}
    ys = bs.cat("row")
    st, en = bs.cat("start"), bs.cat("end")
    cnt, lo, hi = bs.cat("count"), bs.cat("mb_lo"), bs.cat("mb_hi")
    chunk, peer, dirn, name = bs.cat("chunk"), bs.cat("peer"), bs.cat("direction"), bs.cat("name")
    hidden = bs.cat("hidden") if bs.hidden else np.zeros(ys.shape[0], np.int64)
    texts: list[str] = []
    hovers: list[str] = []
    letter = PHASE_LETTERS.get(bs.category, "")
    for i in range(ys.shape[0]):
        row = rows[int(ys[i])]
        dur = (int(en[i]) - int(st[i])) / 1e6
        at = (int(st[i]) - td.t0) / 1e6
        where = esc(row.label)
        if bs.is_cause:
            blame = int(peer[i])
            root = ""
            if blame >= 0 and blame != row.rank:
                root = f"<br>root cause on rank {blame}"
            elif blame >= 0:
                root = "<br>root cause on this rank"
            texts.append("")
            hovers.append(
                f"<b>{esc(cause_label(bs.category))}</b> · {dur:.3f} ms<br>{where} · at {at:.3f} ms"
                f"{root}" + (f"<br>{int(cnt[i])} gaps merged" if cnt[i] > 1 else "")
            )
            continue
        names = td.names.get(row.rank, [])
        nid = int(name[i])
        kname = esc(_short(names[nid])) if 0 <= nid < len(names) else ""
        if bs.category in _COMPUTE_CATS:
            if lo[i] >= 0 and lo[i] == hi[i]:
                lab = f"{letter}{int(lo[i])}"
            elif lo[i] >= 0:
                lab = f"{letter}{int(lo[i])}–{int(hi[i])}"
            else:
                lab = letter
            if td.virtual and chunk[i] >= 0 and lab:
                lab += f"·v{td.chunk_index(int(chunk[i]))}"
            texts.append(lab if label_ok else "")
            head = f"<b>{esc(WORK_LABELS[bs.category])}{(' ' + lab) if lab else ''}</b>"
            what = f"{int(cnt[i])} kernels, longest: {kname}" if cnt[i] > 1 else kname
            if hidden[i] > 0:
                what += (
                    f"<br>includes {hidden[i] / 1e6:.3f} ms of short gaps (lost time, counted by cause "
                    "in the tables)"
                )
        else:
            d = int(dirn[i])
            pr = int(peer[i])
            if bs.category == "p2p" and pr >= 0:
                verb = {
                    int(Direction.SEND): "send to",
                    int(Direction.RECV): "recv from",
                    int(Direction.BOTH): "send/recv with",
                }.get(d, "p2p with")
                head = f"<b>{verb} rank {pr}</b>"
            else:
                head = f"<b>{esc(WORK_LABELS[bs.category])}</b>"
            texts.append("")
            what = f"{int(cnt[i])} kernels, longest: {kname}" if cnt[i] > 1 else kname
        hovers.append(f"{head} · {dur:.3f} ms<br>{where} · at {at:.3f} ms<br>{what}")
    return texts, hovers


def timeline_figure(td: TimelineData) -> dict[str, Any]:
    """The pipeline timeline as a plotly figure dict (one bar trace per category)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    label_ok = td.n_blocks <= TEXT_LIMIT
    order = [c for c in _CAT_ORDER if c in td.sets] + [
        f"cause:{c}" for c in CAUSE_KEYS if f"cause:{c}" in td.sets
    ]
    for key in order:
        bs = td.sets[key]
        if len(bs) == 0:
            continue
        st, en, ys = bs.cat("start"), bs.cat("end"), bs.cat("row")
        texts, hovers = _block_texts(td, bs, label_ok)
        comm = bs.category in ("p2p", "collective", "copy") and not bs.is_cause
        color: str | list[str] = (
            CAUSE_COLORS.get(bs.category, "#999") if bs.is_cause else WORK_COLORS[bs.category]
        )
        if td.virtual and bs.category in _COMPUTE_CATS and not bs.is_cause:
            # one shade per virtual-stage chunk: chunk 0 full, later chunks lighter
            color = [_shade(str(color), td.chunk_index(int(c))) for c in bs.cat("chunk").tolist()]
        name = CAUSE_LABELS.get(bs.category, bs.category) if bs.is_cause else WORK_LABELS[bs.category]
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=ys.astype(np.float64) + (_COMM_Y if comm else _MAIN_Y),
                # ms to 0.1 µs: enough to draw, and half the page weight of full floats
                x=np.round((en - st) / 1e6, 4),
                base=np.round((st - td.t0) / 1e6, 4),
                width=_COMM_H if comm else _MAIN_H,
                marker={"color": color, "line": {"width": 0}},
                name=name,
                legendgroup="lost" if bs.is_cause else "work",
                legendgrouptitle={"text": "lost time, by cause" if bs.is_cause else "work"},
                text=texts if any(texts) else None,
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                textfont={"color": "#ffffff", "size": 11},
                hovertext=hovers,
                hovertemplate="%{hovertext}<extra></extra>",
                cliponaxis=True,
            )
        )
    _add_path_traces(fig, td)
    n = len(td.rows)
    # the legend sits under the axis, one column per group: room for the longer group
    n_work = sum(1 for k in order if not k.startswith("cause:"))
    legend_h = 75 + 19 * max(n_work, len(order) - n_work, 1)
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    drawn = [s for s in td.spans if s.drawn]
    starts = sorted(sp.start for sp in drawn)
    for sp in drawn:
        # one line per step boundary: a step's end is drawn only when no drawn step starts there
        near = max(1, (sp.end - sp.start) // 100)
        ends = [] if any(abs(x - sp.end) <= near for x in starts) else [sp.end]
        for x in (sp.start, *ends):
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": (x - td.t0) / 1e6,
                    "x1": (x - td.t0) / 1e6,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": "#555", "width": 1, "dash": "dot"},
                }
            )
        annotations.append(
            {
                "xref": "x",
                "yref": "paper",
                "x": (sp.start - td.t0) / 1e6,
                "y": 1.0,
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
                "text": esc(sp.label),
                "font": {"size": 11, "color": "#444"},
            }
        )
    buttons = []
    for sp in sorted(drawn, key=lambda s: s.index):
        a, b = (sp.start - td.t0) / 1e6, (sp.end - td.t0) / 1e6
        pad = 0.01 * (b - a)
        buttons.append(
            {
                "label": esc(sp.label + (" (median)" if sp.median else "")),
                "method": "relayout",
                "args": [{"xaxis.range": [a - pad, b + pad]}],
            }
        )
    if len(drawn) > 1:
        a = (min(s.start for s in drawn) - td.t0) / 1e6
        b = (max(s.end for s in drawn) - td.t0) / 1e6
        pad = 0.01 * (b - a)
        buttons.append(
            {"label": "all drawn steps", "method": "relayout", "args": [{"xaxis.range": [a - pad, b + pad]}]}
        )
    shown = td.shown
    xr = None
    if shown is not None:
        a, b = (shown.start - td.t0) / 1e6, (shown.end - td.t0) / 1e6
        pad = 0.01 * (b - a)
        xr = [a - pad, b + pad]
    layout: dict[str, Any] = {
        "template": "plotly_white",
        "barmode": "overlay",
        "bargap": 0,
        # rows stay tall enough for block labels while few, and the figure stays on screen when many
        "height": max(300, 70 + legend_h + n * max(18, min(58, 1400 // max(1, n)))),
        "margin": {"l": 150, "r": 20, "t": 40, "b": legend_h},
        "uniformtext": {"minsize": 9, "mode": "hide"},
        "xaxis": {
            "title": {"text": "time (ms) on the aligned clock"},
            "range": xr,
            "zeroline": False,
            "showgrid": True,
            "gridcolor": "#eee",
        },
        "yaxis": {
            "tickvals": [r.y for r in td.rows],
            "ticktext": [esc(r.label) for r in td.rows],
            "range": [n - 0.5, -0.5],
            "showgrid": False,
            "zeroline": False,
            "fixedrange": n <= 16,
        },
        "legend": {
            "orientation": "h",
            "x": 0,
            "y": 0,
            "yref": "container",
            "yanchor": "bottom",
            "groupclick": "toggleitem",
            "font": {"size": 12},
        },
        "hovermode": "closest",
        "hoverlabel": {"namelength": -1, "font": {"size": 12}},
        "shapes": shapes,
        "annotations": annotations,
        "dragmode": "zoom",
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"},
    }
    if len(buttons) > 1:
        layout["updatemenus"] = [
            {
                "type": "buttons",
                "direction": "right",
                "x": 0,
                "y": 1.0,
                "xanchor": "left",
                "yanchor": "bottom",
                "pad": {"b": 22},
                "buttons": buttons,
                "showactive": True,
                # the shown step's button is the active one
                "active": next(
                    (i for i, sp in enumerate(sorted(drawn, key=lambda x: x.index)) if sp is shown), 0
                ),
                "font": {"size": 11},
                "bgcolor": "#f4f6f8",
                "bordercolor": "#c8ced6",
            }
        ]
        layout["margin"]["t"] = 80
    fig.update_layout(**layout)
    return _fig_dict(fig)


def _shade(color: str, chunk: int) -> str:
    """``color`` mixed with white for virtual-stage chunk ``chunk`` (0: unchanged)."""
    if chunk <= 0:
        return color
    f = min(0.6, 0.3 * chunk)
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * f):02X}" for c in rgb)


PATH_COLOR = "#111111"


def _add_path_traces(fig: Any, td: TimelineData) -> None:
    """The critical path over the timeline: an outline around every block and gap on it, and an
    arrow for every transfer on it (sender row to receiver row)."""
    import plotly.graph_objects as go

    if not td.path:
        return
    boxes = [p for p in td.path if p[3] != "transfer"]
    if boxes:
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=[p[0] + _MAIN_Y for p in boxes],
                x=[round((p[2] - p[1]) / 1e6, 4) for p in boxes],
                base=[round((p[1] - td.t0) / 1e6, 4) for p in boxes],
                width=_MAIN_H + 0.1,
                marker={"color": "rgba(0,0,0,0)", "line": {"color": PATH_COLOR, "width": 2.5}},
                name="critical path",
                legendgroup="path",
                legendgrouptitle={"text": "what sets the step time"},
                hovertext=[
                    f"<b>on the critical path</b><br>{esc(p[5])} · {(p[2] - p[1]) / 1e6:.3f} ms"
                    for p in boxes
                ],
                hovertemplate="%{hovertext}<extra></extra>",
                cliponaxis=True,
            )
        )
    arrows = [p for p in td.path if p[3] == "transfer" and p[4] >= 0]
    if arrows:
        xs: list[float | None] = []
        ys: list[float | None] = []
        hv: list[str | None] = []
        sizes: list[int] = []
        for y, a, z, _k, src, lab in arrows:
            xs += [round((a - td.t0) / 1e6, 4), round((z - td.t0) / 1e6, 4), None]
            ys += [src + _MAIN_Y, y + _MAIN_Y, None]
            hv += [esc(lab), esc(lab), None]
            sizes += [0, 10, 0]  # the arrowhead at the receiving end only
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                line={"color": PATH_COLOR, "width": 1.5},
                marker={"symbol": "arrow", "angleref": "previous", "size": sizes, "color": PATH_COLOR},
                name="transfer on the critical path",
                legendgroup="path",
                hovertext=hv,
                hovertemplate="%{hovertext}<extra></extra>",
                connectgaps=False,
            )
        )


def heatmap_figure(rep: dict[str, Any], max_rows: int = MAX_ROWS) -> dict[str, Any] | None:
    """Compute per step of every rank as a stage x replica heat map, for runs whose ranks do not
    fit the timeline (``max_rows``) and hold several pipeline replicas; None otherwise."""
    import plotly.graph_objects as go

    rows = [
        r
        for r in rep.get("ranks") or []
        if isinstance(r, dict) and isinstance(r.get("stage"), int) and isinstance(r.get("pipeline"), int)
    ]
    if len(rep.get("ranks") or []) <= max_rows or len({r["pipeline"] for r in rows}) < 2:
        return None
    stages = sorted({r["stage"] for r in rows})
    pipes = sorted({r["pipeline"] for r in rows})
    si = {s: i for i, s in enumerate(stages)}
    pi = {p: i for i, p in enumerate(pipes)}
    z: list[list[float | None]] = [[None] * len(pipes) for _ in stages]
    txt: list[list[str]] = [[""] * len(pipes) for _ in stages]
    for r in rows:
        v = num(r.get("compute_ms"))
        z[si[r["stage"]]][pi[r["pipeline"]]] = v
        txt[si[r["stage"]]][pi[r["pipeline"]]] = f"rank {r['rank']}: {v:.2f} ms" if v is not None else ""
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"pipeline {p}" for p in pipes],
            y=[f"stage {s}" for s in stages],
            text=txt,
            colorscale="Cividis",
            colorbar={"title": {"text": "compute ms / step"}},
            hovertemplate="%{y} · %{x}<br>%{text}<extra></extra>",
        )
    )
    fig.update_layout(
        template="plotly_white",
        height=max(260, 60 + 28 * len(stages)),
        margin={"l": 80, "r": 20, "t": 20, "b": 60},
        yaxis={"autorange": "reversed"},
    )
    return _fig_dict(fig)


def _stage_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rep.get("stages") or [] if isinstance(s, dict)]


def histogram_figure(rep: dict[str, Any]) -> dict[str, Any] | None:
    """Per-stage histograms of forward/backward (and W) time per micro-batch; the slowest stage framed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stages = _stage_rows(rep)
    if not stages:
        return None
    series = (
        ("fwd", "fwd_samples_ms", "fwd_ms"),
        ("bwd", "bwd_samples_ms", "bwd_ms"),
        ("wgrad", "wgrad_samples_ms", "wgrad_ms"),
    )
    have_samples = any(isinstance(s.get(k), list) and s.get(k) for s in stages for _, k, _ in series)
    slow = slowest_stage(stages)
    if not have_samples:
        # no per-micro-batch samples: mean with p95 whiskers per stage
        fig = go.Figure()
        xs = [f"stage {s.get('stage')}" for s in stages]
        for cat, _k, statk in series:
            ys = [
                num((s.get(statk) or {}).get("mean")) if isinstance(s.get(statk), dict) else None
                for s in stages
            ]
            if all(v is None for v in ys):
                continue
            p95 = [
                num((s.get(statk) or {}).get("p95")) if isinstance(s.get(statk), dict) else None
                for s in stages
            ]
            err = [(p - m) if (p is not None and m is not None) else 0 for p, m in zip(p95, ys, strict=True)]
            fig.add_trace(
                go.Bar(
                    x=xs,
                    y=ys,
                    name=WORK_LABELS[cat],
                    marker_color=WORK_COLORS[cat],
                    error_y={"type": "data", "array": err, "symmetric": False, "arrayminus": [0] * len(err)},
                    hovertemplate="%{x}: %{y:.3f} ms (mean)<extra>" + WORK_LABELS[cat] + "</extra>",
                )
            )
        fig.update_layout(
            template="plotly_white",
            barmode="group",
            height=360,
            yaxis_title="ms per micro-batch (mean, whisker = p95)",
            margin={"l": 60, "r": 20, "t": 30, "b": 40},
        )
        return _fig_dict(fig)
    n = len(stages)
    cols = min(4, n)
    nrows = math.ceil(n / cols)
    titles = []
    for i, s in enumerate(stages):
        ranks = s.get("ranks") or []
        t = f"stage {s.get('stage')}" + (f" · rank {','.join(map(str, ranks[:4]))}" if ranks else "")
        if i == slow:
            t = f"<b>{esc(t)} · slowest</b>"
        titles.append(esc(t) if i != slow else t)
    fig = make_subplots(
        rows=nrows,
        cols=cols,
        subplot_titles=titles,
        shared_xaxes="all",
        horizontal_spacing=0.04,
        # plotly refuses a spacing above 1 / (rows - 1): many stages (pp >= 33) need less
        vertical_spacing=min(0.14, 0.5 / (nrows - 1)) if nrows > 1 else 0.1,
    )
    # one bin width for every stage, so the histograms compare like with like
    allv = [float(v) for s in stages for _, k, _ in series for v in (s.get(k) or []) if num(v) is not None]
    lo, hi = (min(allv), max(allv)) if allv else (0.0, 1.0)
    width = (hi - lo) / 40 if hi > lo else max(abs(hi), 1e-3) / 20
    xbins = {"start": lo - width / 2, "end": hi + width, "size": width}
    for i, s in enumerate(stages):
        r, c = i // cols + 1, i % cols + 1
        for cat, key, _ in series:
            vals = [v for v in (s.get(key) or []) if num(v) is not None]
            if not vals:
                continue
            fig.add_trace(
                go.Histogram(
                    x=vals,
                    name=WORK_LABELS[cat],
                    legendgroup=cat,
                    showlegend=(i == 0 or cat == "wgrad"),
                    marker={"color": WORK_COLORS[cat], "line": {"width": 0.5, "color": "#fff"}},
                    opacity=0.8,
                    xbins=xbins,
                    hovertemplate="%{x} ms: %{y} micro-batches<extra>"
                    + esc(f"stage {s.get('stage')} ")
                    + WORK_LABELS[cat]
                    + "</extra>",
                ),
                row=r,
                col=c,
            )
    fig.update_layout(
        template="plotly_white",
        barmode="overlay",
        height=max(300, 230 * nrows + 60),
        margin={"l": 50, "r": 130, "t": 40, "b": 50},
        legend={"orientation": "v", "x": 1.01, "y": 1, "yanchor": "top"},
        font={"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"},
    )
    fig.update_xaxes(title_text="ms per micro-batch", row=nrows)
    fig.update_yaxes(title_text="micro-batches", col=1)
    # counts are whole micro-batches: integer ticks, one y-scale for every stage (a toggle frees it)
    edges = np.arange(xbins["start"], xbins["end"] + width, width)
    ymax = max(
        (
            int(
                np.histogram([float(v) for v in (st.get(k) or []) if num(v) is not None], bins=edges)[0].max()
            )
            for st in stages
            for _, k, _ in series
            if st.get(k)
        ),
        default=1,
    )
    top = max(1.0, ymax * 1.08)
    fig.update_yaxes(range=[0, top], tickformat="d", rangemode="tozero", dtick=1 if ymax <= 8 else None)
    axes = ["yaxis" + ("" if i == 0 else str(i + 1)) for i in range(nrows * cols)]
    fig.update_layout(
        updatemenus=[
            {
                "type": "buttons",
                "direction": "right",
                "x": 1.0,
                "xanchor": "right",
                "y": 1.0,
                "yanchor": "bottom",
                "pad": {"b": 24},
                "showactive": True,
                "active": 0,
                "font": {"size": 11},
                "bgcolor": "#f4f6f8",
                "bordercolor": "#c8ced6",
                "buttons": [
                    {
                        "label": "same y-scale for every stage",
                        "method": "relayout",
                        "args": [
                            {f"{a}.range": [0, top] for a in axes} | {f"{a}.autorange": False for a in axes}
                        ],
                    },
                    {
                        "label": "own y-scale per stage",
                        "method": "relayout",
                        "args": [{f"{a}.autorange": True for a in axes}],
                    },
                ],
            }
        ],
    )
    fig.update_layout(margin={"l": 50, "r": 130, "t": 70, "b": 50})
    if slow is not None:
        idx = slow + 1
        ax = "" if idx == 1 else str(idx)
        fig.add_shape(
            type="rect",
            xref=f"x{ax} domain",
            yref=f"y{ax} domain",
            x0=-0.02,
            x1=1.02,
            y0=-0.03,
            y1=1.0,
            line={"color": CAUSE_COLORS["imbalance"], "width": 3},
            fillcolor="rgba(242,142,43,0.06)",
            layer="below",
        )
        for ann in fig.layout.annotations:
            if "slowest" in str(ann.text):
                ann.font = {"color": "#B35900", "size": 13}
    return _fig_dict(fig)


def _group_rows(rep: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]], str]:
    stages = _stage_rows(rep)
    if stages and any(isinstance(s.get("lost_ms"), dict) for s in stages):
        return [f"stage {s.get('stage')}" for s in stages], stages, "stage"
    ranks = [r for r in rep.get("ranks") or [] if isinstance(r, dict)]
    if len(ranks) > 64:
        ranks = sorted(ranks, key=lambda r: -sum(num(v) or 0 for v in (r.get("lost_ms") or {}).values()))[:64]
        ranks.sort(key=lambda r: r.get("rank", 0))
    return [f"rank {r.get('rank')}" for r in ranks], ranks, "rank"


def lost_figure(rep: dict[str, Any]) -> dict[str, Any] | None:
    """Lost time per step by cause, stacked, per stage (per rank for runs without stages)."""
    import plotly.graph_objects as go

    labels, rows, _what = _group_rows(rep)
    if not rows:
        return None
    fig = go.Figure()
    for c in CAUSE_KEYS:
        ys = [num((r.get("lost_ms") or {}).get(c)) or 0.0 for r in rows]
        if not any(ys):
            continue
        fig.add_trace(
            go.Bar(
                x=labels,
                y=ys,
                name=CAUSE_LABELS[c],
                marker_color=CAUSE_COLORS[c],
                hovertemplate="%{x}: %{y:.3f} ms<extra>" + CAUSE_LABELS[c] + "</extra>",
            )
        )
    fig.update_layout(
        template="plotly_white",
        barmode="stack",
        height=380,
        yaxis_title="ms per step",
        margin={"l": 60, "r": 20, "t": 20, "b": 40},
        legend={"orientation": "h", "y": -0.15, "x": 0, "traceorder": "normal"},
        font={"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"},
    )
    return _fig_dict(fig)


def bubble_figure(rep: dict[str, Any]) -> dict[str, Any] | None:
    """Measured vs theoretical bubble ratio (two bars)."""
    import plotly.graph_objects as go

    b = rep.get("bubble") or {}
    meas, theo = num(b.get("measured_ratio")), num(b.get("theoretical_ratio"))
    if meas is None and theo is None:
        return None
    names, vals, colors = [], [], []
    if theo is not None:
        names.append("theoretical")
        vals.append(100 * theo)
        colors.append("#D5D9E0")
    if meas is not None:
        names.append("measured")
        vals.append(100 * meas)
        colors.append(
            CAUSE_COLORS["bubble"] if theo is None or meas <= theo * 1.1 else CAUSE_COLORS["imbalance"]
        )
    fig = go.Figure(
        go.Bar(
            y=names,
            x=vals,
            orientation="h",
            marker_color=colors,
            text=[f"{v:.1f} %" for v in vals],
            textposition="outside",
            hovertemplate="%{y}: %{x:.2f} % of step<extra></extra>",
        )
    )
    fig.update_layout(
        template="plotly_white",
        height=180,
        margin={"l": 90, "r": 40, "t": 10, "b": 40},
        xaxis={"title": {"text": "bubble, % of step time"}, "range": [0, max(vals) * 1.25 + 1]},
        font={"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"},
    )
    return _fig_dict(fig)


def _fig_dict(fig: Any) -> dict[str, Any]:
    return {"data": fig.to_plotly_json()["data"], "layout": fig.to_plotly_json()["layout"]}


def _fig_json(figs: dict[str, dict[str, Any]]) -> str:
    import plotly.io as pio
    from plotly.utils import PlotlyJSONEncoder

    try:
        text = json.dumps(figs, cls=PlotlyJSONEncoder, separators=(",", ":"))
    except TypeError:  # pragma: no cover - very old plotly
        text = pio.to_json(figs)
    # inside <script>, "</script>" or "<!--" in a string would end or confuse the element
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# ----------------------------------------------------------------------------------------------
# HTML sections


_CSS = """
:root{--fg:#1d232b;--muted:#5b6672;--line:#e3e7ec;--bg:#f6f8fa;--card:#fff}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--fg);
background:var(--bg)}
main{max-width:1360px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:17px;margin:0 0 10px}h3{font-size:15px;margin:0}
.sub{color:var(--muted)}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:16px 18px;margin:14px 0}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:10px;margin:12px 0}
.tile{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.tile .v{font-size:22px;font-weight:650}.tile .k{color:var(--muted);font-size:12px;text-transform:uppercase;
letter-spacing:.04em}
.bar{display:flex;height:22px;border-radius:4px;overflow:hidden;border:1px solid var(--line);margin:8px 0 6px}
.bar span{display:block;height:100%}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;color:var(--muted);font-size:13px}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:right;vertical-align:top}
th{background:#fafbfc;font-weight:600}
td.l,th.l{text-align:left}
.finding{border:1px solid var(--line);border-left:6px solid #999;border-radius:6px;padding:10px 14px;
margin:10px 0}
.finding .head{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.badge{font-size:11px;font-weight:700;color:#fff;border-radius:3px;padding:1px 6px;text-transform:uppercase}
.code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-weight:700}
.gain{margin-left:auto;font-weight:650}
.meta{color:var(--muted);font-size:13px;margin:3px 0 6px}
.evidence{width:auto;min-width:40%;margin:4px 0 6px}.evidence td{text-align:left}
.evidence td:first-child{color:var(--muted);white-space:nowrap}
ol.fixes{margin:4px 0 0 18px;padding:0}
.note{background:#fff8e1;border:1px solid #f3e3a1;border-radius:6px;padding:7px 10px;margin:8px 0;
font-size:13px}
.warn li{margin:2px 0}
.grid2{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:14px}
@media (max-width:900px){.grid2{grid-template-columns:1fr}}
.plot{width:100%}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
details>summary{cursor:pointer;color:var(--muted);margin:6px 0}
#ppdiag-errors{background:#fdecea;border:1px solid #f5c2c0;color:#8a1c14;border-radius:6px;padding:8px 12px}
.howto{background:#f4f7fb;border:1px solid #d6e0ec;border-radius:6px;padding:4px 12px;margin:8px 0;
font-size:13px}.howto ul{margin:2px 0 6px 18px;padding:0}.howto summary{font-weight:600;color:var(--fg)}
tr.slow td{font-weight:650;background:#fff6e5}
.pass{color:#1e7d32;font-weight:700}.fail{color:#b71c1c;font-weight:700}.inconclusive{color:#8a6d00;font-weight:700}
"""

_ERROR_HOOK = """
(function(){
  function show(msg){var d=document.getElementById('ppdiag-errors');if(!d)return;d.hidden=false;
    var li=document.createElement('li');li.textContent=String(msg);d.querySelector('ul').appendChild(li);}
  window.addEventListener('error',function(e){show(e.message||e);});
  window.addEventListener('unhandledrejection',function(e){show(e.reason||e);});
})();
"""


def _how_to_read(td: TimelineData) -> str:
    """The "how to read this" box above the timeline: what every mark means."""
    chunk = (
        "<li>Virtual stages: the label ends in ·v<i>k</i> (the chunk) and later chunks are drawn in a "
        "lighter shade of the same colour.</li>"
        if td.virtual
        else ""
    )
    return (
        '<details class="howto" open><summary>How to read this timeline</summary><ul>'
        "<li>One row per rank, in stage order. Time runs left to right on the aligned clock; the dotted "
        "lines are step boundaries, the buttons above switch the step.</li>"
        "<li>Each bar is one micro-batch block: <b>F</b><i>n</i> forward, <b>B</b><i>n</i> backward "
        "(input gradient), <b>W</b><i>n</i> weight gradient, <i>n</i> the micro-batch. Short gaps "
        "inside a block are not drawn: the hover shows them, the tables count them by cause.</li>"
        f"{chunk}"
        "<li>Every other stretch of a row is lost time, coloured by its cause (legend below). The thin "
        "strip under a row is communication (send/recv, collectives).</li>"
        "<li>The <b>black outline</b> and arrows are the critical path: the blocks, transfers and gaps "
        "that set the step's length. Shorten what is on it to make the step shorter; the table "
        "<i>Critical path by stage and cause</i> below adds it up.</li>"
        "</ul></details>"
    )


def _critical_path_html(rep: dict[str, Any]) -> str:
    """The "critical path by stage and cause" table (mean ms per step)."""
    rows = critical_path_rows(rep)
    if not rows:
        return ""
    cats = [k for k in ("compute", "transfer", "other", *CAUSE_KEYS) if any(ms.get(k) for _, ms in rows)]
    total = sum(sum(ms.values()) for _, ms in rows) or 1.0
    head = "".join(f"<th>{esc(PATH_LABELS.get(k) or cause_label(k))}</th>" for k in cats)
    top = max(rows, key=lambda r: r[1].get("compute", 0.0))[0]
    body = []
    for st, ms in rows:
        on = sum(ms.values())
        cls = ' class="slow"' if st == top else ""
        cells = "".join(f'<td class="num">{ms.get(k, 0.0):.2f}</td>' for k in cats)
        body.append(
            f'<tr{cls}><td>{esc("-" if st is None else st)}</td><td class="num">{on:.2f}</td>'
            f'<td class="num">{100 * on / total:.0f} %</td>{cells}</tr>'
        )
    lead = (
        f"Stage {esc(top)} holds the most compute on the critical path: shortening its blocks "
        "shortens the step; time spent elsewhere on the path (transfers, causes) points at the links "
        "and the causes to fix."
        if top is not None
        else ""
    )
    return (
        '<section id="critical-path"><h2>Critical path by stage and cause</h2><p class="sub">The chain '
        "of blocks, transfers and gaps that sets each step's length (outlined in the timeline), in ms "
        f"per step (mean over the analyzed steps), by the stage it runs on. {lead}</p>"
        '<table class="data"><thead><tr><th>stage</th><th>on path</th><th>share</th>'
        f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table></section>"
    )


def _tile(k: str, v: str, sub: str = "") -> str:
    return (
        f'<div class="tile"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div>'
        + (f'<div class="sub">{esc(sub)}</div>' if sub else "")
        + "</div>"
    )


def _headline(rep: dict[str, Any]) -> str:
    run = rep.get("run") or {}
    s = rep.get("summary") or {}
    b = rep.get("bubble") or {}
    step, p95 = num(s.get("step_ms")), num(s.get("step_p95_ms"))
    lost = {c: num((s.get("lost_ms") or {}).get(c)) or 0.0 for c in CAUSE_KEYS}
    total_lost = sum(lost.values())
    ratio = num(s.get("lost_ratio"))
    comp = num(s.get("compute_ms"))
    pp = run.get("pp")
    sched = run.get("schedule") or "unknown"
    m = run.get("microbatches")
    tiles = [
        _tile(
            "step time (median)",
            fmt_ms(step),
            (f"mean {fmt_ms(num(s.get('step_mean_ms')))}, " if num(s.get("step_mean_ms")) is not None else "")
            + (f"p95 {fmt_ms(p95)}" if p95 is not None else ""),
        ),
        _tile("lost time", fmt_pct(ratio), f"{fmt_ms(total_lost)} per step, mean over ranks"),
        _tile("compute", fmt_ms(comp), "union of compute per rank"),
    ]
    meas, theo = num(b.get("measured_ratio")), num(b.get("theoretical_ratio"))
    if meas is not None or theo is not None:
        tiles.append(_tile("bubble", fmt_pct(meas), f"theoretical {fmt_pct(theo)}"))
    pipe = (
        "no pipeline parallelism"
        if (pp in (None, 1) or sched == "none")
        else f"{sched}, P={pp}"
        + (f", M={m}" if m else "")
        + (f", v={run.get('virtual_stages')}" if (run.get("virtual_stages") or 1) > 1 else "")
    )
    tiles.append(_tile("pipeline", pipe, f"{ranks_text(run)}, {len(run.get('steps') or [])} steps"))
    out = ['<div class="tiles">' + "".join(tiles) + "</div>"]
    # where the step goes: compute + each cause, as one bar
    if step:
        parts = []
        leg = []
        # one denominator: the mean step the causes are averaged on (compute + causes = it)
        base = max(share_step_ms(s) or step, (comp or 0) + total_lost)
        if comp:
            parts.append(
                f'<span style="width:{100 * comp / base:.3f}%;background:{_COMPUTE_COLOR}" '
                f'title="compute {esc(fmt_ms(comp))}"></span>'
            )
            leg.append(
                f'<span><i class="sw" style="background:{_COMPUTE_COLOR}"></i>'
                f"compute {esc(fmt_ms(comp))}</span>"
            )
        for c in sorted(CAUSE_KEYS, key=lambda c: -lost[c]):
            if lost[c] <= 0:
                continue
            parts.append(
                f'<span style="width:{100 * lost[c] / base:.3f}%;background:{CAUSE_COLORS[c]}" '
                f'title="{esc(cause_label(c))} {esc(fmt_ms(lost[c]))}"></span>'
            )
            leg.append(
                f'<span><i class="sw" style="background:{CAUSE_COLORS[c]}"></i>{esc(cause_label(c))} '
                f"{esc(fmt_ms(lost[c]))} ({esc(fmt_pct(share(s, c)))})</span>"
            )
        out.append('<div class="bar" role="img" aria-label="step time by cause">' + "".join(parts) + "</div>")
        out.append('<div class="legend">' + "".join(leg) + "</div>")
    # the top causes, each with the finding that would win most of it back
    top = [c for c in sorted(CAUSE_KEYS, key=lambda c: -lost[c]) if lost[c] > 0][:3]
    finds = [f for f in rep.get("findings") or [] if isinstance(f, dict)]
    if top:
        items = []
        for c in top:
            fs = sorted(
                (f for f in finds if f.get("cause") == c), key=lambda f: -(num(f.get("gain_ms")) or 0)
            )
            pct = f" ({fmt_pct(share(s, c))} of step)" if step else ""
            fix = ""
            if fs:
                f = fs[0]
                fix = (
                    f' — <span class="code">{esc(f.get("code"))}</span> {esc(f.get("title"))}: '
                    f"could win back <b>{esc(fmt_ms(num(f.get('gain_ms'))))}</b>"
                )
            items.append(
                f'<li><i class="sw" style="background:{cause_color(c)}"></i><b>{esc(cause_label(c))}</b> '
                f"{esc(fmt_ms(lost[c]))}{esc(pct)}{fix}</li>"
            )
        out.append('<h3 style="margin-top:12px">Top causes</h3><ul>' + "".join(items) + "</ul>")
    return "".join(out)


def _gate_html(gate: Any) -> str:
    if gate is None:
        return ""
    data = gate.to_json() if hasattr(gate, "to_json") else gate
    if not isinstance(data, dict):
        return ""
    st = str(data.get("status", ""))
    rows = []
    for c in data.get("checks") or []:
        state = str(c.get("state", ""))
        cls = {"pass": "pass", "fail": "fail"}.get(state, "inconclusive")
        rows.append(
            f'<tr><td class="l {cls}">{esc(state.upper())}</td><td class="l">{esc(c.get("text"))}</td></tr>'
        )
    reasons = "".join(f"<li>{esc(r)}</li>" for r in data.get("reasons") or [])
    return (
        f'<section id="gate"><h2>CI gate: <span class="{esc(st)}">{esc(st.upper())}</span> '
        f'<span class="sub">(exit {esc(data.get("exit_code"))})</span></h2>'
        + (f"<ul>{reasons}</ul>" if reasons else "")
        + f"<table><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _findings_html(rep: dict[str, Any]) -> str:
    finds = [f for f in rep.get("findings") or [] if isinstance(f, dict)]
    if not finds:
        return (
            '<section id="findings"><h2>Findings</h2>'
            '<p class="sub">No finding: nothing worth fixing was detected.</p></section>'
        )
    step = num((rep.get("summary") or {}).get("step_ms"))
    cards = []
    for f in finds:
        sev = str(f.get("severity") or "info")
        cause = f.get("cause")
        color = cause_color(cause if isinstance(cause, str) else None)
        gain, gpct = num(f.get("gain_ms")), num(f.get("gain_pct"))
        if gpct is None and gain is not None and step:
            gpct = 100 * gain / step
        where = []
        if f.get("stages"):
            where.append("stages " + ", ".join(esc(x) for x in f["stages"][:32]))
        if f.get("ranks"):
            rk = f["ranks"]
            where.append(
                "ranks " + ", ".join(esc(x) for x in rk[:32]) + (f" … ({len(rk)})" if len(rk) > 32 else "")
            )
        ev = f.get("evidence") or {}
        ev_rows = ""
        if isinstance(ev, dict) and ev:
            ev_rows = (
                '<table class="evidence"><tbody>'
                + "".join(
                    f'<tr><td>{esc(k)}</td><td class="mono">{esc(v)}</td></tr>' for k, v in evidence_items(ev)
                )
                + "</tbody></table>"
            )
        fixes = "".join(f"<li>{esc(x)}</li>" for x in (f.get("fixes") or []))
        gain_txt = ""
        if gain is not None:
            gain_txt = f"gain ≈ {fmt_ms(gain)} / step" + (f" ({gpct:.1f} %)" if gpct is not None else "")
        cards.append(
            f'<div class="finding" style="border-left-color:{color}">'
            f'<div class="head"><span class="badge" style="background:{SEVERITY_COLORS.get(sev, "#7F8C8D")}">'
            f'{esc(sev)}</span><span class="code">{esc(f.get("code"))}</span><h3>{esc(f.get("title"))}</h3>'
            f'<span class="gain">{esc(gain_txt)}</span></div>'
            f'<div class="meta"><i class="sw" style="background:{color}"></i>'
            f"{esc(cause_label(cause) if cause else 'general')}"
            + (" · " + " · ".join(where) if where else "")
            + "</div>"
            + ev_rows
            + (f'<b>How to fix</b><ol class="fixes">{fixes}</ol>' if fixes else "")
            + "</div>"
        )
    return '<section id="findings"><h2>Findings, by estimated gain</h2>' + "".join(cards) + "</section>"


def _whatif_html(rep: dict[str, Any]) -> str:
    rows = [w for w in rep.get("whatif") or [] if isinstance(w, dict)]
    if not rows:
        return ""
    step = num((rep.get("summary") or {}).get("step_ms"))
    body = []
    for w in rows:
        sp = num(w.get("speedup"))
        body.append(
            f'<tr><td class="l">{esc(w.get("scenario"))}</td><td>{esc(fmt_ms(num(w.get("step_ms"))))}</td>'
            f"<td>{esc(f'{sp:.2f}×' if sp is not None else '—')}</td>"
            f"<td>{esc(fmt_pct(num(w.get('bubble_ratio'))))}</td>"
            f'<td class="l">{esc(w.get("note") or "")}</td></tr>'
        )
    return (
        '<section id="whatif"><h2>What if</h2><p class="sub">Simulated with the measured per-stage costs'
        + (f"; today's step is {esc(fmt_ms(step))}" if step else "")
        + '.</p><table><thead><tr><th class="l">scenario'
        '</th><th>step</th><th>speed-up</th><th>bubble</th><th class="l">note</th></tr></thead><tbody>'
        + "".join(body)
        + "</tbody></table></section>"
    )


def _stats_cell(d: Any) -> str:
    if not isinstance(d, dict):
        return "—"
    m, p95 = num(d.get("mean")), num(d.get("p95"))
    if m is None:
        return "—"
    return f"{m:.3f}" + (f" / {p95:.3f}" if p95 is not None else "")


def _stage_table(rep: dict[str, Any], slow: int | None) -> str:
    stages = _stage_rows(rep)
    if not stages:
        return ""
    has_w = any(isinstance(s.get("wgrad_ms"), dict) for s in stages)
    head = (
        '<tr><th class="l">stage</th><th class="l">ranks</th><th>F ms mean / p95</th><th>B ms mean / p95</th>'
        + ("<th>W ms mean / p95</th>" if has_w else "")
        + "<th>compute ms</th>"
        + "".join(
            f'<th><i class="sw" style="background:{CAUSE_COLORS[c]}"></i>{esc(CAUSE_LABELS[c])}</th>'
            for c in CAUSE_KEYS
        )
        + "</tr>"
    )
    body = []
    for i, s in enumerate(stages):
        lost = s.get("lost_ms") or {}
        ranks = s.get("ranks") or []
        rk = ", ".join(esc(r) for r in ranks[:8]) + (f" … ({len(ranks)})" if len(ranks) > 8 else "")
        style = ' style="background:#fff4e5"' if i == slow else ""
        body.append(
            f'<tr{style}><td class="l">{esc(s.get("stage"))}{" (slowest)" if i == slow else ""}</td>'
            f'<td class="l">{rk}</td><td>{_stats_cell(s.get("fwd_ms"))}</td>'
            f"<td>{_stats_cell(s.get('bwd_ms'))}</td>"
            + (f"<td>{_stats_cell(s.get('wgrad_ms'))}</td>" if has_w else "")
            + f"<td>{esc(_f3(s.get('compute_ms')))}</td>"
            + "".join(f"<td>{esc(_f3(lost.get(c)))}</td>" for c in CAUSE_KEYS)
            + "</tr>"
        )
    return f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"


def _f3(v: Any) -> str:
    x = num(v)
    return "—" if x is None else f"{x:.3f}"


def _rank_table(rep: dict[str, Any], limit: int = 512) -> str:
    ranks = [r for r in rep.get("ranks") or [] if isinstance(r, dict)]
    if not ranks:
        return ""
    head = (
        '<tr><th class="l">rank</th><th class="l">stage</th><th>step ms</th><th>compute ms</th>'
        "<th>exposed p2p ms</th><th>exposed collective ms</th><th>exposed copy ms</th><th>idle ms</th>"
        + "".join(
            f'<th><i class="sw" style="background:{CAUSE_COLORS[c]}"></i>{esc(CAUSE_LABELS[c])}</th>'
            for c in CAUSE_KEYS
        )
        + "</tr>"
    )
    body = []
    for r in ranks[:limit]:
        lost = r.get("lost_ms") or {}
        body.append(
            f'<tr><td class="l">{esc(r.get("rank"))}</td>'
            f'<td class="l">{esc(r.get("stage") if r.get("stage") is not None else "—")}</td>'
            + "".join(
                f"<td>{esc(_f3(r.get(k)))}</td>"
                for k in (
                    "step_ms",
                    "compute_ms",
                    "exposed_p2p_ms",
                    "exposed_collective_ms",
                    "exposed_copy_ms",
                    "idle_ms",
                )
            )
            + "".join(f"<td>{esc(_f3(lost.get(c)))}</td>" for c in CAUSE_KEYS)
            + "</tr>"
        )
    more = (
        f'<p class="sub">{len(ranks) - limit} more ranks are in the JSON report.</p>'
        if len(ranks) > limit
        else ""
    )
    table = f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>{more}"
    if len(ranks) > 16:
        return f"<details><summary>per-rank breakdown ({len(ranks)} ranks)</summary>{table}</details>"
    return table


def _top_kernels(diag: Diagnosis, td: TimelineData, k: int = 6) -> str:
    """Compute kernels with the most time per analyzed step on each drawn rank (vectorized)."""
    spans = td.spans
    if not spans:
        return ""
    by = diag.run.by_rank()
    blocks = []
    for row in td.rows:
        rt = by.get(row.rank)
        if rt is None or len(rt.intervals) == 0:
            continue
        iv = rt.intervals
        comp = iv.kind == int(Kind.COMPUTE)
        st, en = iv.start + rt.clock_offset_ns, iv.end + rt.clock_offset_ns
        inside = np.zeros(len(iv), dtype=bool)
        for sp in spans:
            inside |= (st >= sp.start) & (st < sp.end)
        m = comp & inside
        if not m.any():
            continue
        tot = np.bincount(iv.name[m], weights=(en[m] - st[m]).astype(np.float64), minlength=len(rt.names))
        cnt = np.bincount(iv.name[m], minlength=len(rt.names))
        all_t = float(tot.sum())
        top = np.argsort(-tot)[:k]
        lines = []
        for i in top:
            if tot[i] <= 0:
                continue
            nm = rt.name_of(int(i))
            lines.append(
                f'<tr><td class="l mono">{esc(_short(nm, 200))}</td><td>{tot[i] / 1e6 / len(spans):.3f}</td>'
                f"<td>{100 * tot[i] / all_t:.1f} %</td><td>{cnt[i] / len(spans):.0f}</td></tr>"
            )
        blocks.append(
            f'<h3 style="margin:10px 0 4px">{esc(row.label)}</h3><table><thead><tr><th class="l">kernel / op'
            "</th><th>ms per step</th><th>share of compute</th><th>calls per step</th></tr></thead><tbody>"
            + "".join(lines)
            + "</tbody></table>"
        )
    if not blocks:
        return ""
    return (
        "<details><summary>Top compute kernels per rank (where a slow stage spends its time)</summary>"
        + "".join(blocks)
        + "</details>"
    )


def _facts(diag: Diagnosis, rep: dict[str, Any]) -> str:
    run = rep.get("run") or {}
    tool = rep.get("tool") or {}
    items = [
        ("format", run.get("format")),
        ("world size", run.get("world_size")),
        ("ranks analyzed", _ranges_text(sorted(x for x in run.get("ranks") or [] if isinstance(x, int)))),
        ("pipeline stages (pp)", run.get("pp")),
        ("virtual stages", run.get("virtual_stages")),
        ("schedule", run.get("schedule")),
        ("micro-batches (M)", run.get("microbatches")),
        ("analyzed steps", _ranges_text(sorted(x for x in run.get("steps") or [] if isinstance(x, int)))),
        (
            "clock alignment residual",
            f"{num(run.get('clock_residual_us')):.1f} µs"
            if num(run.get("clock_residual_us")) is not None
            else None,
        ),
        ("ppdiag", f"{tool.get('version', '?')} (report schema {rep.get('schema_version')})"),
    ]
    smap = run.get("stage_map")
    if isinstance(smap, dict) and smap:
        txt = ", ".join(f"{s}→{r}" for s, r in list(smap.items())[:64]) + (" …" if len(smap) > 64 else "")
        items.insert(5, ("stage → rank", txt))
    rows = "".join(
        f'<tr><td class="l">{esc(k)}</td><td class="l">{esc(v if v is not None else "—")}</td></tr>'
        for k, v in items
    )
    warns = list(run.get("warnings") or [])
    for w in diag.run.warnings:
        if w not in warns:
            warns.append(w)
    wl = ""
    if warns:
        shown = warns[:200]
        wl = (
            '<h3 style="margin-top:12px">Warnings</h3><ul class="warn">'
            + "".join(f"<li>{esc(w)}</li>" for w in shown)
            + "</ul>"
            + (
                f'<p class="sub">{len(warns) - 200} more warnings in the JSON report.</p>'
                if len(warns) > 200
                else ""
            )
        )
    return (
        f'<section id="facts"><h2>The run</h2><table style="width:auto"><tbody>{rows}</tbody></table>'
        f"{wl}</section>"
    )


def render_html(
    diag: Diagnosis, max_blocks: int = MAX_BLOCKS, max_rows: int = MAX_ROWS, gate: Any = None
) -> str:
    """The whole report as one self-contained HTML string."""
    rep = diag.report or {}
    gate = gate if gate is not None else (diag.context or {}).get("gate")
    td = build_timeline(diag, max_blocks=max_blocks, max_rows=max_rows)
    figs: dict[str, dict[str, Any]] = {}
    if td.sets:
        figs["fig-timeline"] = timeline_figure(td)
    hist = histogram_figure(rep)
    if hist:
        figs["fig-histogram"] = hist
    lost = lost_figure(rep)
    if lost:
        figs["fig-lost"] = lost
    bub = bubble_figure(rep)
    if bub:
        figs["fig-bubble"] = bub
    heat = heatmap_figure(rep, max_rows)
    if heat:
        figs["fig-heatmap"] = heat
    stages = _stage_rows(rep)
    slow = slowest_stage(stages)
    run = rep.get("run") or {}
    s = rep.get("summary") or {}

    title = "ppdiag report"
    sched = run.get("schedule")
    if run.get("pp") and run.get("pp") != 1:
        title += f" — {sched}, P={run.get('pp')}" + (
            f", M={run.get('microbatches')}" if run.get("microbatches") else ""
        )
    parts: list[str] = []
    parts.append(
        f'<header><h1>{esc(title)}</h1><div class="sub">step {esc(fmt_ms(num(s.get("step_ms"))))} '
        f"(median), {esc(fmt_pct(num(s.get('lost_ratio'))))} of it lost; "
        f"{esc(ranks_text(run))}, {esc(run.get('format', '?'))} traces</div></header>"
    )
    parts.append('<div id="ppdiag-errors" hidden><b>Part of this report failed to render:</b><ul></ul></div>')
    parts.append(_gate_html(gate))
    parts.append(f'<section id="headline"><h2>Where the step time goes</h2>{_headline(rep)}</section>')
    # timeline
    tl = ['<section id="timeline"><h2>Pipeline timeline</h2>']
    if td.sets and td.shown is not None:
        nst = len(td.spans)
        tl.append(
            f'<p class="sub">Measured, on the aligned clock. One row per rank; compute blocks carry their '
            f"micro-batch (F = forward, B = backward, W = weight grad), the thin strip under each row is "
            f"communication, every gap is coloured by its cause. Showing {esc(td.shown.label)}"
            + (f", the median of {nst} analyzed steps; the buttons show the others" if nst > 1 else "")
            + ". Drag to zoom, double-click to reset, hover for details.</p>"
        )
        for n in td.notes:
            tl.append(f'<div class="note">{esc(n)}</div>')
        tl.append(_how_to_read(td))
        tl.append('<div id="fig-timeline" class="plot"></div>')
        if "fig-heatmap" in figs:
            tl.append(
                '<h3>Every replica: compute per step, by stage</h3><p class="sub">Mean compute per step '
                "of each rank, by stage (rows) and pipeline replica (columns): a cell far from its row "
                "is a slow worker (PP009), a row above the others a slow stage (PP003).</p>"
                '<div id="fig-heatmap" class="plot"></div>'
            )
    else:
        tl.append('<p class="sub">No device intervals or gaps to draw.</p>')
        for n in td.notes:
            tl.append(f'<div class="note">{esc(n)}</div>')
    tl.append("</section>")
    parts.append("".join(tl))
    parts.append(_critical_path_html(rep))
    # histogram
    if hist:
        slow_txt = ""
        if slow is not None:
            st = stages[slow]
            comp = [num(x.get("compute_ms")) for x in stages]
            vals = [c for c in comp if c is not None]
            if vals and num(st.get("compute_ms")) is not None:
                mean = sum(vals) / len(vals)
                slow_txt = (
                    f" Stage {esc(st.get('stage'))} is the slowest: "
                    f"{esc(fmt_ms(num(st.get('compute_ms'))))} of compute per step, "
                    f"{100 * (float(st['compute_ms']) / mean - 1):+.0f} % vs the mean stage."
                )
        parts.append(
            '<section id="histogram"><h2>Compute per micro-batch, by stage</h2><p class="sub">'
            "Forward and backward time of each micro-batch; a stage whose histogram sits to the right sets "
            f"the pace of the whole pipeline.{slow_txt}</p>"
            '<div id="fig-histogram" class="plot"></div>' + _stage_table(rep, slow) + "</section>"
        )
    elif not stages:
        parts.append(
            '<section id="histogram"><h2>Compute per micro-batch, by stage</h2><p class="sub">No pipeline '
            "stages were found (pp 1): there is no stage balance to compare. The per-rank breakdown is "
            "below.</p></section>"
        )
    # lost time + bubble
    what = "stage" if stages else "rank"
    lost_sec = [f'<section id="lost"><div class="grid2"><div><h2>Lost time per {what}, by cause</h2>']
    lost_sec.append(
        '<div id="fig-lost" class="plot"></div>'
        if lost
        else '<p class="sub">No per-stage or per-rank figures.</p>'
    )
    lost_sec.append("</div><div><h2>Bubble: measured vs theoretical</h2>")
    if bub:
        b = rep.get("bubble") or {}
        meas, theo = num(b.get("measured_ratio")), num(b.get("theoretical_ratio"))
        expl = ""
        if meas is not None and theo is not None:
            d = meas - theo
            expl = (
                f"The schedule alone predicts {fmt_pct(theo)} idle; the measured bubble is {fmt_pct(meas)} "
                f"({'+' if d >= 0 else ''}{100 * d:.1f} points). "
            )
        pm = run.get("pp"), run.get("microbatches")
        if pm[0] and pm[1] and sched in ("gpipe", "1f1b"):
            expl += f"For {sched}: (P−1)/(M+P−1) with P={pm[0]}, M={pm[1]}."
        lost_sec.append(f'<div id="fig-bubble" class="plot"></div><p class="sub">{esc(expl)}</p>')
    else:
        lost_sec.append('<p class="sub">No pipeline schedule was identified, so no bubble is computed.</p>')
    lost_sec.append("</div></div>")
    if not stages:
        lost_sec.append(_rank_table(rep))
    lost_sec.append("</section>")
    parts.append("".join(lost_sec))
    parts.append(_findings_html(rep))
    parts.append(_whatif_html(rep))
    if stages:
        parts.append(
            f'<section id="ranks"><h2>Per rank</h2>{_rank_table(rep)}{_top_kernels(diag, td)}</section>'
        )
    else:
        tk = _top_kernels(diag, td)
        if tk:
            parts.append(f'<section id="ranks"><h2>Per rank</h2>{tk}</section>')
    parts.append(_facts(diag, rep))

    config = {
        "displaylogo": False,
        "responsive": True,
        "showLink": False,
        "showSendToCloud": False,
        "typesetMath": False,
        "modeBarButtonsToRemove": ["select2d", "lasso2d"],
        "toImageButtonOptions": {"format": "png", "scale": 2},
    }
    script = (
        "(function(){var F=" + _fig_json(figs) + ";var C=" + json.dumps(config) + ";"
        "for(var id in F){var el=document.getElementById(id);if(!el)continue;"
        # the toolbar only where zooming helps (the timeline): elsewhere it covered the data
        "var c=Object.assign({},C,{displayModeBar:id==='fig-timeline'?'hover':false});"
        "try{Plotly.newPlot(el,F[id].data,F[id].layout,c);}catch(e){"
        "var d=document.getElementById('ppdiag-errors');"
        "if(d){d.hidden=false;var li=document.createElement('li');"
        "li.textContent=id+': '+e;d.querySelector('ul').appendChild(li);}}}})();"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"{html_marker()}"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<script>{_ERROR_HOOK}</script><main>" + "".join(parts) + "</main>"
        f"<script>{plotly_js()}</script><script>{script}</script></body></html>\n"
    )


def write_html(diag: Diagnosis, path: str | Path, **kw: Any) -> Path:
    """Write the HTML report to ``path``."""
    p = Path(path)
    p.write_text(render_html(diag, **kw), encoding="utf-8", errors="backslashreplace")
    return p


class HtmlReporter:
    """Reporter ``html``: the self-contained offline report."""

    name = "html"
    suffix = ".html"

    def write(self, diagnosis: Diagnosis, path: Path) -> None:
        write_html(diagnosis, path)


register(HtmlReporter())
