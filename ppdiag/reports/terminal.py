"""Terminal report (rich): headline, per-stage and per-rank tables, critical path, findings.

Fits 80 columns: the per-stage and per-rank tables are compact (rank, stage, step, compute, lost,
top cause) unless ``wide`` is asked for or the console has room for every cause column
(:data:`WIDE_COLUMNS`). No cell is ever cut: every column folds instead of ending in an ellipsis.
Colour follows the console (rich turns it off for a pipe and under ``NO_COLOR``).
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.facts import report_slowest_stage, share_of
from ppdiag.report_types import Dist, FindingRow, Report
from ppdiag.reports.sanitize import clean_report
from ppdiag.reports.style import CAUSE_LABELS, PATH_LABELS, critical_path_rows, evidence_items

SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}
#: Console width from which the full cause tables are shown without ``--wide``.
WIDE_COLUMNS = 150


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left")


def _col(t: Table, name: str, right: bool = True) -> None:
    # fold, never cut: a narrow terminal wraps a cell instead of ending it in "…"
    t.add_column(name, justify="right" if right else "left", overflow="fold")


def _top_cause(lost: dict[str, float]) -> str:
    vals = [(k, float(v)) for k, v in lost.items() if k in CAUSE_LABELS and v]
    if not vals:
        return "-"
    k, v = max(vals, key=lambda kv: kv[1])
    return f"{CAUSE_LABELS[k]} {v:.1f}"


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{float(v):.{nd}f}"


def _mean(d: Dist | None) -> float | None:
    return None if d is None else d.mean


def headline(report: Report) -> Text:
    """Step time, lost time and its top causes; the pipeline, its bubble; what was traced."""
    s = report.summary
    run = report.run
    t = Text()
    lost = s.lost_ratio
    t.append(f"step {_f(s.step_ms)} ms", style="bold")
    if s.step_mean_ms is not None:
        t.append(f" median, mean {_f(s.step_mean_ms)}, p95 {_f(s.step_p95_ms)}")
    if lost is not None:
        t.append(f"  ·  lost {lost * 100:.1f}%", style="bold red" if lost > 0.25 else "bold")
    top = sorted(((k, v) for k, v in s.lost_ms.items() if v > 0), key=lambda kv: -kv[1])[:3]
    if top and (s.step_mean_ms or s.step_ms):
        t.append("  ·  ")
        t.append(
            ", ".join(f"{CAUSE_LABELS[k]} {v:.1f} ms ({(share_of(s, k) or 0.0) * 100:.0f}%)" for k, v in top)
        )
    t.append("\n")
    if run.pp > 1:
        t.append(f"pipeline: {run.pp} stages, schedule {run.schedule}, M={run.microbatches}", style="cyan")
        if run.virtual_stages > 1:
            t.append(f", v={run.virtual_stages}", style="cyan")
        b = report.bubble
        if b.measured_ratio is not None:
            t.append(f"  ·  bubble measured {b.measured_ratio * 100:.1f}%")
            if b.theoretical_ratio is not None:
                t.append(f" vs schedule {b.theoretical_ratio * 100:.1f}%")
    else:
        doubt = run.structure.headline() if run.structure is not None else None
        t.append(doubt or "no pipeline parallelism found", style="yellow" if doubt else "cyan")
    t.append(
        f"\n{run.world_size} ranks in the run, {len(run.ranks)} traced ({run.format}"
        f"{', CPU-only' if run.cpu_only else ''}), steps {run.steps}"
    )
    if run.clock_residual_us is not None:
        t.append(f", clock residual {run.clock_residual_us:.1f} µs")
    return t


def stage_table(report: Report, wide: bool = True) -> Table | None:
    """Per stage: F/B/W per micro-batch, compute and lost time per step; every cause when ``wide``,
    else the total lost and the top cause."""
    stages = report.stages
    if not stages:
        return None
    t = _table("Per stage (ms per step; fwd/bwd per micro-batch)")
    _col(t, "stage")
    _col(t, "ranks", right=False)
    _col(t, "fwd")
    _col(t, "bwd")
    has_w = any(s.wgrad_ms is not None for s in stages)
    if has_w:
        _col(t, "wgrad")
    _col(t, "compute")
    if wide:
        for k in CAUSE_KEYS:
            _col(t, CAUSE_LABELS[k])
    else:
        _col(t, "lost")
        _col(t, "top cause", right=False)
    idx = report_slowest_stage(stages)
    slow = stages[idx].stage if idx is not None else None
    for s in stages:
        row = [str(s.stage), ",".join(map(str, s.ranks)), _f(_mean(s.fwd_ms)), _f(_mean(s.bwd_ms))]
        if has_w:
            row.append(_f(_mean(s.wgrad_ms)))
        row.append(_f(s.compute_ms))
        if wide:
            row += [_f(s.lost_ms.get(k)) for k in CAUSE_KEYS]
        else:
            row += [_f(sum(float(v) for v in s.lost_ms.values())), _top_cause(s.lost_ms)]
        t.add_row(*row, style="bold" if s.stage == slow else None)
    return t


def rank_table(report: Report, limit: int = 64, wide: bool = True) -> Table:
    """Per rank: the time accounting and every cause when ``wide``, else rank, stage, step,
    compute, lost and the top cause."""
    rows = report.ranks
    t = _table("Per rank (ms, mean per step)")
    if not wide:
        for c in ("rank", "stage", "step", "compute", "lost"):
            _col(t, c)
        _col(t, "top cause", right=False)
        for r in rows[:limit]:
            t.add_row(
                str(r.rank),
                "-" if r.stage is None else str(r.stage),
                _f(r.step_ms),
                _f(r.compute_ms),
                _f(sum(float(v) for v in r.lost_ms.values())),
                _top_cause(r.lost_ms),
            )
    else:
        for c in ("rank", "stage", "step", "compute", "exp. p2p", "exp. coll", "exp. copy", "idle"):
            _col(t, c)
        for k in CAUSE_KEYS:
            # the labels of the HTML and Markdown reports; a narrow column wraps them, never cuts them
            _col(t, CAUSE_LABELS[k])
        for r in rows[:limit]:
            t.add_row(
                str(r.rank),
                "-" if r.stage is None else str(r.stage),
                _f(r.step_ms),
                _f(r.compute_ms),
                _f(r.exposed_p2p_ms),
                _f(r.exposed_collective_ms),
                _f(r.exposed_copy_ms),
                _f(r.idle_ms),
                *[_f(r.lost_ms.get(k, 0.0)) for k in CAUSE_KEYS],
            )
    if len(rows) > limit:
        t.caption = f"{len(rows) - limit} more ranks in the JSON report"
    return t


def critical_path_table(report: Report, wide: bool = True) -> Table | None:
    """Mean ms per step on the critical path, by stage: its compute, the transfers into it and the
    lost time on its ranks (every cause when ``wide``, else the total and the top cause)."""
    rows = critical_path_rows(report)
    if not rows:
        return None
    total = sum(sum(ms.values()) for _, ms in rows) or 1.0
    t = _table("Critical path by stage and cause (ms per step: which stage to shorten)")
    _col(t, "stage")
    _col(t, "on path")
    _col(t, "share")
    cats = ("compute", "transfer", "other") if wide else ("compute", "transfer")
    for k in cats:
        _col(t, PATH_LABELS[k])
    if wide:
        for k in CAUSE_KEYS:
            _col(t, CAUSE_LABELS[k])
    else:
        _col(t, "lost")
        _col(t, "top cause", right=False)
    top = max(rows, key=lambda r: r[1].get("compute", 0.0))[0]
    for st, ms in rows:
        on = sum(ms.values())
        row = ["-" if st is None else str(st), _f(on), f"{100 * on / total:.0f}%"]
        row += [_f(ms.get(k, 0.0)) for k in cats]
        lost = {k: ms.get(k, 0.0) for k in CAUSE_KEYS}
        if wide:
            row += [_f(lost[k]) for k in CAUSE_KEYS]
        else:
            # compute outside blocks joins the lost column here, so the row adds up to "on path"
            row += [_f(sum(lost.values()) + ms.get("other", 0.0)), _top_cause(lost)]
        t.add_row(*row, style="bold" if st == top else None)
    return t


def _finding_panel(f: FindingRow) -> Panel:
    head = Text()
    head.append(f"{f.code} ", style="bold")
    head.append(f"[{f.severity}] ", style=SEV_STYLE.get(f.severity, ""))
    head.append(f.title)
    if f.gain_ms:
        head.append(f"  (gain ≈ {f.gain_ms:.1f} ms/step, {f.gain_pct or 0.0:.0f}%)", style="green")
    body = Text()
    items = evidence_items(f.evidence, scalars_only=True)[:8]
    if items:
        body.append("evidence: " + ", ".join(f"{k} {v}" for k, v in items) + "\n", style="dim")
    for fix in f.fixes[:4]:
        body.append(f"  → {fix}\n")
    return Panel(Group(head, body), expand=True, border_style=SEV_STYLE.get(f.severity, ""))


def findings_panel(report: Report, limit: int = 10) -> Group | Text:
    """The first ``limit`` findings, each in a panel with its evidence and fixes."""
    fs = report.findings
    if not fs:
        return Text("No findings: nothing stands out.", style="green")
    parts: list[Panel | Text] = [_finding_panel(f) for f in fs[:limit]]
    if len(fs) > limit:
        parts.append(Text(f"{len(fs) - limit} more findings in the JSON report", style="dim"))
    return Group(*parts)


def _print_whatif(con: Console, report: Report) -> None:
    from ppdiag.whatif.render import whatif_table

    wt = whatif_table(
        report.whatif, "What if (simulated from the measured stage costs)", lost=False, notes=True
    )
    for c in wt.columns:  # fold long notes (a flag name) instead of cutting them
        c.overflow = "fold"
    con.print(wt)


def render(
    report: Report, console: Console | None = None, ranks: bool = True, wide: bool | None = None
) -> None:
    """Print the whole terminal report (trace strings without escape sequences or controls).

    ``wide``: every cause column in the tables; None: when the console has
    :data:`WIDE_COLUMNS` columns or more.
    """
    report = clean_report(report)
    con = console or Console()
    if wide is None:
        wide = con.width >= WIDE_COLUMNS
    con.print(Panel(headline(report), title="ppdiag", border_style="blue"))
    for table in (stage_table(report, wide=wide), critical_path_table(report, wide=wide)):
        if table is not None:
            con.print(table)
    if ranks:
        con.print(rank_table(report, wide=wide))
    con.print(findings_panel(report))
    if report.whatif:
        _print_whatif(con, report)
    warns = report.run.warnings
    if warns:
        con.print(Text(f"warnings ({len(warns)}):", style="yellow"))
        for w in warns[:20]:
            con.print(Text("  " + w, style="yellow"))
        if len(warns) > 20:
            con.print(Text(f"  … {len(warns) - 20} more in the JSON report", style="yellow"))


__all__ = ["escape", "render"]
