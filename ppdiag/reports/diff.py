"""``ppdiag diff``: what changed between two JSON reports, per stage and cause.

``diff_reports(before, after)`` compares the run-level figures, then each stage (each rank for runs
without pipeline stages): compute and every cause's lost time, before vs after, with the change in
ms and %; plus the findings that appeared, disappeared or changed gain. ``diff_table`` renders it
with rich, ``diff_lines`` as plain text, ``diff_markdown`` for a PR comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ppdiag.report_types import Cause, FindingRow, RankRow, Report, StageRow, Summary
from ppdiag.reports.gate import DEFAULT_STEP_PCT, comparable
from ppdiag.reports.md import md_escape
from ppdiag.reports.style import CAUSE_COLORS, CAUSE_MARKS, cause_label

# Below this change a row is "unchanged" for sorting and colouring (timer noise).
NOISE_MS = 0.005
# A relative change is shown only against a base that can carry one: at least this share of the
# step, or at least MIN_BASE_MS (0.009 -> 7.03 ms is "+7.02 ms", not "+78000 %").
MIN_BASE_STEP_SHARE = 0.01
MIN_BASE_MS = 0.5


@dataclass
class DiffRow:
    """One compared figure.

    ``metric`` is ``step_ms``, ``step_p95_ms``, ``compute_ms``, ``lost_ms`` or a cause key.
    """

    scope: str  # "run", "stage 2", "rank 5"
    metric: str
    before: float | None
    after: float | None
    min_base_ms: float = 0.0  # below this |before| the change is absolute only (delta_pct None)

    @property
    def delta_ms(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def delta_pct(self) -> float | None:
        d = self.delta_ms
        if d is None or not self.before or abs(self.before) < self.min_base_ms:
            return None
        return 100.0 * d / self.before

    @property
    def label(self) -> str:
        return {
            "step_ms": "step time",
            "window_ms": "window (no steps)",
            "step_p95_ms": "step p95",
            "compute_ms": "compute",
            "lost_ms": "lost (all causes)",
        }.get(self.metric, cause_label(self.metric))

    def to_json(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 4)

        return {
            "scope": self.scope,
            "metric": self.metric,
            "before": r(self.before),
            "after": r(self.after),
            "delta_ms": r(self.delta_ms),
            "delta_pct": r(self.delta_pct),
        }


@dataclass
class FindingChange:
    """A finding present on one side or both (``before``/``after`` are gains in ms, None = absent)."""

    code: str
    title: str
    cause: str | None
    where: str
    before: float | None
    after: float | None

    @property
    def status(self) -> str:
        if self.before is None:
            return "appeared"
        if self.after is None:
            return "disappeared"
        return "changed" if abs(self.after - self.before) > NOISE_MS else "unchanged"


@dataclass
class DiffResult:
    """Everything ``ppdiag diff`` shows."""

    run: list[DiffRow] = field(default_factory=list)
    groups: list[DiffRow] = field(default_factory=list)
    by: str = "stage"  # "stage" or "rank"
    findings: list[FindingChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    before_label: str = "before"
    after_label: str = "after"
    threshold_pct: float = DEFAULT_STEP_PCT

    @property
    def regression(self) -> str | None:
        """Why the after run counts as a regression (its step time grew by more than
        ``threshold_pct`` % of the before run's), or None."""
        r = self.row("run", "step_ms")
        if r is None or r.before is None or r.after is None or r.before <= 0:
            return None
        pct = 100.0 * (r.after - r.before) / r.before
        if pct <= self.threshold_pct:
            return None
        return (
            f"step time {r.before:.3f} -> {r.after:.3f} ms ({pct:+.1f} %), "
            f"beyond the {self.threshold_pct:g} % threshold"
        )

    @property
    def appeared(self) -> list[FindingChange]:
        return [f for f in self.findings if f.status == "appeared"]

    @property
    def disappeared(self) -> list[FindingChange]:
        return [f for f in self.findings if f.status == "disappeared"]

    def row(self, scope: str, metric: str) -> DiffRow | None:
        """The row for ``scope`` / ``metric`` (``"run"``, ``"stage 2"``, ``"rank 1"``)."""
        for r in self.run + self.groups:
            if r.scope == scope and r.metric == metric:
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "threshold_pct": self.threshold_pct,
            "regression": self.regression,
            "notes": self.notes,
            "run": [r.to_json() for r in self.run],
            "groups": [r.to_json() for r in self.groups],
            "findings": [
                {
                    "code": f.code,
                    "title": f.title,
                    "cause": f.cause,
                    "where": f.where,
                    "status": f.status,
                    "gain_before_ms": f.before,
                    "gain_after_ms": f.after,
                }
                for f in self.findings
            ],
        }


def _group_map(rep: Report, by: str) -> dict[int, StageRow | RankRow]:
    """The report's stage rows by stage, or its rank rows by rank."""
    if by == "stage":
        return {row.stage: row for row in rep.stages}
    return {row.rank: row for row in rep.ranks}


def _finding_key(f: FindingRow) -> tuple[str, str]:
    """(code, where): a finding is the same on both sides when its code and its stages (ranks for
    one without stages) are, in whatever order the report lists them."""
    st = sorted(set(f.stages))
    if st:
        return f.code, "stages " + ",".join(map(str, st))
    rk = sorted(set(f.ranks))
    return f.code, ("ranks " + ",".join(map(str, rk[:16])) + ("…" if len(rk) > 16 else "")) if rk else ""


def _keyed(findings: list[FindingRow]) -> dict[tuple[str, str, int], FindingRow]:
    """Findings by (code, where, n): the n-th finding with that code and place (two of one key
    on one side pair with the two on the other, not with each other)."""
    out: dict[tuple[str, str, int], FindingRow] = {}
    seen: dict[tuple[str, str], int] = {}
    for f in findings:
        k = _finding_key(f)
        n = seen.get(k, 0)
        seen[k] = n + 1
        out[(k[0], k[1], n)] = f
    return out


def _no_steps(rep: Report) -> bool:
    """The run was analysed as one window without step annotations (``steps`` [-1])."""
    return not rep.run.steps or -1 in rep.run.steps


def _run_rows(res: DiffResult, a: Summary, b: Summary, min_base: float, steps: bool) -> None:
    """Run-level rows: step time, p95, compute, lost time and each cause. Without ``steps`` (a side
    has no step annotations) the window's length is shown as such, never as a step time."""
    for m in ("step_ms", "step_p95_ms", "compute_ms") if steps else ("step_ms", "compute_ms"):
        name = m if steps or m != "step_ms" else "window_ms"
        res.run.append(DiffRow("run", name, getattr(a, m), getattr(b, m), min_base))
    tot_a = sum(a.lost_ms.values()) if a.lost_ms else None
    tot_b = sum(b.lost_ms.values()) if b.lost_ms else None
    res.run.append(DiffRow("run", "lost_ms", tot_a, tot_b, min_base))
    for c in Cause:
        res.run.append(DiffRow("run", c, a.lost_ms.get(c), b.lost_ms.get(c), min_base))


def _group_rows(res: DiffResult, a: Report, b: Report, min_base: float, steps: bool) -> None:
    """Per-stage rows (per-rank for runs without stages): compute and every non-zero cause."""
    have_stages = bool(a.stages) and bool(b.stages)
    res.by = "stage" if have_stages else "rank"
    ga, gb = _group_map(a, res.by), _group_map(b, res.by)
    only_a, only_b = sorted(set(ga) - set(gb)), sorted(set(gb) - set(ga))
    if only_a:
        res.notes.append(f"{res.by}s only in {res.before_label}: {', '.join(map(str, only_a[:32]))}")
    if only_b:
        res.notes.append(f"{res.by}s only in {res.after_label}: {', '.join(map(str, only_b[:32]))}")
    for k in sorted(set(ga) | set(gb)):
        ra, rb = ga.get(k), gb.get(k)
        scope = f"{res.by} {k}"
        if res.by == "rank":
            step_a = ra.step_ms if isinstance(ra, RankRow) else None
            step_b = rb.step_ms if isinstance(rb, RankRow) else None
            res.groups.append(DiffRow(scope, "step_ms" if steps else "window_ms", step_a, step_b, min_base))
        comp_a = ra.compute_ms if ra is not None else None
        comp_b = rb.compute_ms if rb is not None else None
        res.groups.append(DiffRow(scope, "compute_ms", comp_a, comp_b, min_base))
        a_l = ra.lost_ms if ra is not None else {}
        b_l = rb.lost_ms if rb is not None else {}
        for c in Cause:
            va, vb = a_l.get(c), b_l.get(c)
            if (va or 0.0) == 0.0 and (vb or 0.0) == 0.0:
                continue  # nothing on either side: keep the table short
            res.groups.append(DiffRow(scope, c, va, vb, min_base))


def diff_reports(
    a: Report,
    b: Report,
    before_label: str = "before",
    after_label: str = "after",
    threshold_pct: float = DEFAULT_STEP_PCT,
) -> DiffResult:
    """Compare report ``a`` (before) with ``b`` (after); ``threshold_pct`` is the step-time growth
    beyond which :attr:`DiffResult.regression` is set (the gate's default ``step_pct``)."""
    res = DiffResult(before_label=before_label, after_label=after_label, threshold_pct=threshold_pct)
    res.notes += comparable(b, a, base_name=before_label, new_name=after_label)
    step_a = a.summary.step_ms
    # |before| below this gets an absolute change only: "or" keeps 0.5 ms meaningful on long steps
    min_base = min(MIN_BASE_MS, MIN_BASE_STEP_SHARE * step_a) if step_a and step_a > 0 else MIN_BASE_MS
    steps = not (_no_steps(a) or _no_steps(b))
    if not steps:
        sides = [n for n, r in ((before_label, a), (after_label, b)) if _no_steps(r)]
        verb, its = ("have", "their windows are") if len(sides) > 1 else ("has", "its window is")
        res.notes.append(
            f"{' and '.join(sides)} {verb} no step annotations: {its} the capture's length, not a step "
            "time, so no step time is compared (no regression); the figures are ms per window"
        )
    _run_rows(res, a.summary, b.summary, min_base, steps)
    _group_rows(res, a, b, min_base, steps)

    fa, fb = _keyed(a.findings), _keyed(b.findings)
    for key in list(fb) + [k for k in fa if k not in fb]:
        f = fb.get(key) or fa[key]
        res.findings.append(
            FindingChange(
                code=key[0],
                title=f.title,
                cause=None if f.cause is None else str(f.cause),
                where=key[1],
                # a finding present on one side only still needs a number to sort by
                before=(fa[key].gain_ms or 0.0) if key in fa else None,
                after=(fb[key].gain_ms or 0.0) if key in fb else None,
            )
        )
    order = {"appeared": 0, "disappeared": 1, "changed": 2, "unchanged": 3}
    res.findings.sort(key=lambda f: (order[f.status], -(f.after or f.before or 0.0)))
    return res


def _fmt(v: float | None, scale: float = 1.0) -> str:
    return "—" if v is None else f"{v / scale:.3f}"


def _fmt_delta(r: DiffRow, scale: float = 1.0) -> tuple[str, str]:
    d, p = r.delta_ms, r.delta_pct
    return ("—" if d is None else f"{d / scale:+.3f}", "—" if p is None else f"{p:+.1f} %")


#: From this step (or window) length on, the terminal diff shows seconds, as the analysis report does.
SECONDS_FROM_MS = 10_000.0


def _unit(res: DiffResult) -> tuple[str, float]:
    """The terminal tables' unit: ms, or s (divide by 1000) when either run's step is 10 s or longer."""
    steps = [v for r in res.run if r.metric in ("step_ms", "window_ms") for v in (r.before, r.after)]
    return ("s", 1e3) if max((v or 0.0 for v in steps), default=0.0) >= SECONDS_FROM_MS else ("ms", 1.0)


def _interesting(rows: list[DiffRow], limit: int) -> list[DiffRow]:
    """The rows to show: all when few, else the largest changes (kept in their original order)."""
    if len(rows) <= limit:
        return rows
    ranked = sorted(range(len(rows)), key=lambda i: -abs(rows[i].delta_ms or 0.0))[:limit]
    return [rows[i] for i in sorted(ranked)]


def diff_lines(res: DiffResult, limit: int = 60) -> list[str]:
    """Plain-text tables (for logs and tests)."""
    lines = [f"ppdiag diff: {res.before_label} -> {res.after_label}"]
    lines += [f"  note: {n}" for n in res.notes]
    w = max([len(r.label) for r in res.run + res.groups] + [10])
    hdr = f"  {'scope':<10} {'figure':<{w}} {'before':>10} {'after':>10} {'Δ ms':>10} {'Δ %':>9}"
    lines.append(hdr)
    for r in res.run + _interesting(res.groups, limit):
        dm, dp = _fmt_delta(r)
        lines.append(
            f"  {r.scope:<10} {r.label:<{w}} {_fmt(r.before):>10} {_fmt(r.after):>10} {dm:>10} {dp:>9}"
        )
    if len(res.groups) > limit:
        lines.append(f"  ({len(res.groups) - limit} smaller per-{res.by} changes not shown)")
    for f in res.findings:
        if f.status == "unchanged":
            continue
        if f.status == "appeared":
            lines.append(f"  + {f.code} {f.title} ({f.where}) gain {_fmt(f.after)} ms")
        elif f.status == "disappeared":
            lines.append(f"  - {f.code} {f.title} ({f.where}) was {_fmt(f.before)} ms")
        else:
            lines.append(f"  ~ {f.code} {f.title} ({f.where}) gain {_fmt(f.before)} -> {_fmt(f.after)} ms")
    return lines


def diff_table(res: DiffResult, limit: int = 60) -> Any:
    """A rich renderable: run table, per-stage/rank table, findings that changed."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    unit, k = _unit(res)

    def colour_delta(r: DiffRow) -> Text:
        dm, dp = _fmt_delta(r, k)
        d = r.delta_ms
        # more time is worse for every compared figure
        style = "" if d is None or abs(d) <= NOISE_MS else ("red" if d > 0 else "green")
        return Text(f"{dm}  ({dp})", style=style)

    def label(r: DiffRow) -> Text:
        if r.metric in CAUSE_COLORS:
            return Text.assemble(("■ ", CAUSE_COLORS[r.metric]), r.label)
        return Text(r.label, style="bold" if r.metric == "step_ms" else "")

    parts: list[Any] = []
    if res.notes:
        parts.append(Text("\n".join(f"note: {n}" for n in res.notes), style="yellow"))
    t = Table(title=f"{res.before_label} → {res.after_label} ({unit} per step)", title_justify="left")
    for col, just in (
        ("figure", "left"),
        (res.before_label, "right"),
        (res.after_label, "right"),
        ("change", "right"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in res.run:
        if r.before is None and r.after is None:
            continue
        t.add_row(label(r), _fmt(r.before, k), _fmt(r.after, k), colour_delta(r))
    parts.append(t)
    if res.groups:
        g = Table(title=f"per {res.by} ({unit} per step)", title_justify="left")
        for col, just in (
            (res.by, "left"),
            ("figure", "left"),
            (res.before_label, "right"),
            (res.after_label, "right"),
            ("change", "right"),
        ):
            g.add_column(col, justify=just)  # type: ignore[arg-type]
        prev = None
        for r in _interesting(res.groups, limit):
            g.add_row(
                r.scope if r.scope != prev else "",
                label(r),
                _fmt(r.before, k),
                _fmt(r.after, k),
                colour_delta(r),
            )
            prev = r.scope
        parts.append(g)
    ch = [f for f in res.findings if f.status != "unchanged"]
    if ch:
        f_t = Table(title="findings", title_justify="left")
        for col in ("", "code", "finding", "where", f"gain before ({unit})", f"gain after ({unit})"):
            f_t.add_column(col)
        for f in ch:
            sym, style = {"appeared": ("+", "red"), "disappeared": ("−", "green"), "changed": ("~", "")}[
                f.status
            ]
            f_t.add_row(Text(sym, style=style), f.code, f.title, f.where, _fmt(f.before, k), _fmt(f.after, k))
        parts.append(f_t)
    return Group(*parts)


def diff_markdown(res: DiffResult, limit: int = 40) -> str:
    """The diff as Markdown (PR comment): run figures, then only the per-stage/rank rows that changed."""

    def lab(r: DiffRow) -> str:
        return f"{CAUSE_MARKS.get(r.metric, '')} {r.label}".strip()

    bl, al = md_escape(res.before_label), md_escape(res.after_label)
    out = [f"## ppdiag diff: {bl} → {al}", ""]
    out += [f"> {md_escape(n)}" for n in res.notes]
    if res.notes:
        out.append("")
    out += [f"| figure | {bl} | {al} | change |", "|---|---:|---:|---:|"]
    for r in res.run:
        if r.before is None and r.after is None:
            continue
        dm, dp = _fmt_delta(r)
        out.append(f"| {lab(r)} | {_fmt(r.before)} | {_fmt(r.after)} | {dm} ms ({dp}) |")
    moved = [r for r in res.groups if r.delta_ms is None or abs(r.delta_ms) > NOISE_MS]
    if moved:
        out += ["", f"| {res.by} | figure | {bl} | {al} | change |", "|---|---|---:|---:|---:|"]
        for r in _interesting(moved, limit):
            dm, dp = _fmt_delta(r)
            out.append(f"| {r.scope} | {lab(r)} | {_fmt(r.before)} | {_fmt(r.after)} | {dm} ms ({dp}) |")
        rest = len(res.groups) - min(len(moved), limit)
        if rest:
            out.append(f"\n{rest} other per-{res.by} figures unchanged or smaller changes.")
    ch = [f for f in res.findings if f.status != "unchanged"]
    if ch:
        out += ["", "**Findings**", ""]
        for f in ch:
            sym = {"appeared": "🆕", "disappeared": "✅", "changed": "〰️"}[f.status]
            out.append(
                f"- {sym} **{md_escape(f.code)}** {md_escape(f.title)} ({md_escape(f.where)}): {f.status}, "
                f"gain {_fmt(f.before)} → {_fmt(f.after)} ms"
            )
    out.append("")
    return "\n".join(out)


#: The name the CLI uses for the rich rendering.
render_diff = diff_table
