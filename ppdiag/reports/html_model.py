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

from ppdiag.analysis import context_of
from ppdiag.model.rank_ranges import consecutive_runs
from ppdiag.reports.html_blocks import (
    Blocks,
    Level,
    count,
    keep_longest,
    rank_step_blocks,
)
from ppdiag.reports.style import (
    cause_label,
    num,
)

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed
    from ppdiag.model.timeline import RankTimeline

I64 = npt.NDArray[np.int64]


MAX_BLOCKS = 20_000  # drawn blocks (work + gaps) over all drawn steps
MAX_ROWS = 64  # timeline rows (ranks)
MAX_STEPS = 12  # steps drawn for the step buttons
TEXT_LIMIT = 4_000  # above this many blocks, labels only in the hover


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


def _one_replica(
    have: list[int], pipe_of: dict[int, int], lost: dict[int, float], max_rows: int, notes: list[str]
) -> list[int]:
    """One pipeline in full (the one holding the rank with the most lost time) when the run has
    several and one fits the rows; the replicas' stage costs are in the heat map under the timeline.
    Every rank otherwise."""
    if len(set(pipe_of.values())) <= 1:
        return list(have)
    worst = max((r for r in have if r in pipe_of), key=lambda r: (lost.get(r, 0.0), -r))
    mine = [r for r in have if pipe_of.get(r) == pipe_of[worst]]
    if not 0 < len(mine) <= max_rows:
        return list(have)
    notes.append(
        f"{len(have)} ranks in {len(set(pipe_of.values()))} pipelines: the timeline shows "
        f"pipeline {pipe_of[worst]} in full (it holds rank {worst}, the most lost time); the heat "
        "map below compares every replica's stages, and every rank is in the tables and the "
        "Perfetto overlay."
    )
    return mine


def _pick_rows(diag: Analyzed, max_rows: int, notes: list[str]) -> list[Row]:
    stages = stages_by_rank(diag)
    have = [rt.rank for rt in diag.run.ranks]
    lost = {row.rank: sum(num(v) or 0.0 for v in row.lost_ms.values()) for row in diag.result.ranks}
    pipe_of = {row.rank: row.pipeline for row in diag.result.ranks if row.pipeline is not None}
    chosen = _one_replica(have, pipe_of, lost, max_rows, notes) if len(have) > max_rows else list(have)
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


#: (step, its blocks by rank) of every drawn step.
Drawn = list[tuple[StepSpan, dict[int, Blocks]]]


@dataclass
class _Builder:
    """What drawing one step's blocks needs: the rows, each rank's timeline, gaps and own windows."""

    diag: Analyzed
    rows: list[Row]
    by: dict[int, RankTimeline]
    # each rank's own step window: the union spans of consecutive steps overlap when the ranks are
    # staggered, and a block drawn by both would show twice
    own: dict[tuple[int, int], tuple[int, int]]

    def blocks_of(self, span: StepSpan, lv: Level) -> dict[int, Blocks]:
        return {
            r.rank: rank_step_blocks(
                self.by.get(r.rank),
                self.diag.gaps.get(r.rank),
                self.own.get((r.rank, span.index), (span.start, span.end)),
                lv,
            )
            for r in self.rows
        }


def _median_blocks(
    bld: _Builder, med: StepSpan, tol0: int, max_blocks: int, notes: list[str]
) -> tuple[dict[int, Blocks], int]:
    """The median step's blocks, merged ever more coarsely (then cut to the longest) while over
    ``max_blocks``; and its block count before any simplification."""
    first = bld.blocks_of(med, Level(0, tol0))
    raw = count(first)
    if raw <= max_blocks:
        return first, raw
    lv = Level(1, tol0)
    cur = first
    while count(cur) > max_blocks and lv.tol < (med.end - med.start) // 200:
        lv = Level(1, lv.tol * 4)
        cur = bld.blocks_of(med, lv)
    n_merged = count(cur)
    msg = (
        f"Simplified for size: the step has {raw:,} blocks; adjacent blocks of the same kind closer than "
        f"{lv.tol / 1e6:.3g} ms were merged into {n_merged:,}"
    )
    if n_merged > max_blocks:
        cur = keep_longest(cur, max_blocks)
        msg += f", and only the {max_blocks:,} longest were kept"
    notes.append(msg + ". Zoom in the Perfetto overlay for every kernel.")
    return cur, raw


def _add_steps(
    bld: _Builder, drawn: Drawn, spans: list[StepSpan], tol0: int, limits: tuple[int, int], notes: list[str]
) -> int:
    """The other steps, nearest to the median first, while the blocks stay under ``limits``
    (max blocks, max steps); returns the blocks they add."""
    max_blocks, max_steps = limits
    med = drawn[0][0]
    total = count(drawn[0][1])
    added = 0
    skipped = []
    for sp in sorted((s for s in spans if s is not med), key=lambda s: (abs(s.index - med.index), s.index)):
        bl = bld.blocks_of(sp, Level(0, tol0)) if len(drawn) < max_steps else None
        n = count(bl) if bl is not None else 0
        if bl is None or total + n > max_blocks:
            skipped.append(sp)
            continue
        drawn.append((sp, bl))
        sp.drawn = True
        total += n
        added += n
    if skipped:
        nums = sorted(s.number if s.number >= 0 else s.index for s in skipped)
        notes.append(
            f"{len(skipped)} of {len(spans)} steps are not drawn to keep the page responsive "
            f"(steps {ranges_text(nums)}); the tables cover every step and the Perfetto overlay "
            "(--perfetto) has every event."
        )
    return added


def _block_sets(drawn: Drawn, rows: list[Row]) -> dict[str, BlockSet]:
    """The drawn blocks of every step and row gathered per category."""
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
                for col in ("start", "end", "count", "mb_lo", "mb_hi", "chunk", "peer", "direction", "name"):
                    getattr(bs, col).append(v[col])
                bs.hidden.append(v.get("hidden", np.zeros(n, np.int64)))
    return sets


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
        return TimelineData(rows=rows, spans=spans, t0=0, sets={}, notes=notes, shown=None, virtual=virtual)
    med = next(s for s in spans if s.median)
    bld = _Builder(diag, rows, by, {(w.rank, w.index): (int(w.start), int(w.end)) for w in diag.steps})
    tol0 = max(5_000, (med.end - med.start) // 20_000)
    first, raw = _median_blocks(bld, med, tol0, max_blocks, notes)
    drawn: Drawn = [(med, first)]
    med.drawn = True
    raw += _add_steps(bld, drawn, spans, tol0, (max_blocks, max_steps), notes)
    return TimelineData(
        rows=rows,
        spans=spans,
        t0=min(sp.start for sp, _ in drawn),
        sets=_block_sets(drawn, rows),
        notes=notes,
        shown=med,
        virtual=virtual,
        raw_blocks=raw,
        names={r.rank: by[r.rank].names for r in rows if r.rank in by},
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


def ranges_text(nums: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1–3, 7"``."""
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in consecutive_runs(nums))
