"""Terminal report (rich): headline, per-stage and per-rank tables, critical path, findings; the
registered reporter ``terminal`` (shown on a console, or written to a file as a log shows it).

Fits 80 columns: the per-stage and per-rank tables are compact (rank, stage, step, compute, lost,
top cause) unless ``wide`` is asked for or the console has room for every cause column
(:data:`WIDE_COLUMNS`). No cell is ever cut: every column folds instead of ending in an ellipsis,
and headers wrap between words (:func:`~ppdiag.reports.term_fit.fit_table`: a table too wide for
that is shown in parts that repeat its key columns). Durations switch to seconds from 10 s.
Colour follows the console (rich turns it off for a pipe and under ``NO_COLOR``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ppdiag.io import md_marker
from ppdiag.model.rank_ranges import consecutive_runs
from ppdiag.report_shares import report_slowest_stage, share_of
from ppdiag.report_types import Cause, Dist, FindingRow, Report
from ppdiag.reports import register
from ppdiag.reports.sanitize import clean_report
from ppdiag.reports.style import CAUSE_LABELS, PATH_LABELS, critical_path_rows, evidence_items
from ppdiag.reports.term_fit import fit_table

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed

SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}
#: Console width from which the full cause tables are shown without ``--wide``.
WIDE_COLUMNS = 150


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left")


def _col(t: Table, name: str, right: bool = True) -> None:
    # fold, never cut: a narrow terminal wraps a cell instead of ending it in "…"
    t.add_column(name, justify="right" if right else "left", overflow="fold")


def _top_cause(lost: dict[str, float], seconds: bool = False) -> str:
    vals = [(k, float(v)) for k, v in lost.items() if k in CAUSE_LABELS and v]
    if not vals:
        return "-"
    k, v = max(vals, key=lambda kv: kv[1])
    return f"{CAUSE_LABELS[k]} {v / 1e3:.2f}" if seconds else f"{CAUSE_LABELS[k]} {v:.1f}"


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{float(v):.{nd}f}"


#: From this step time on, durations print in seconds ("46.67 s", not "46666.27 ms").
SECONDS_FROM_MS = 10_000.0


def _dur(ms: float | None, nd: int = 2) -> str:
    """A duration with its unit: ms below :data:`SECONDS_FROM_MS`, else seconds."""
    if ms is None:
        return "-"
    return f"{ms / 1e3:.{nd}f} s" if abs(ms) >= SECONDS_FROM_MS else f"{ms:.{nd}f} ms"


class _Unit:
    """The unit of a report's tables: ms, or seconds when its step is :data:`SECONDS_FROM_MS` or
    longer (one unit per table, named in its title)."""

    def __init__(self, report: Report) -> None:
        self.seconds = (report.summary.step_ms or 0.0) >= SECONDS_FROM_MS
        self.name = "s" if self.seconds else "ms"

    def __call__(self, ms: float | None) -> str:
        if ms is None:
            return "-"
        return f"{float(ms) / 1e3:.3f}" if self.seconds else f"{float(ms):.2f}"


def _rank_list(ranks: list[int]) -> str:
    """Ranks as "0-7" for a run of three or more, ", " between parts: a narrow column wraps between
    ranks, never inside one ("16,17,18,19,20,2" / "1,22,23")."""
    parts: list[str] = []
    for a, b in consecutive_runs(ranks):
        parts += [f"{a}-{b}"] if b - a >= 2 else [str(r) for r in range(a, b + 1)]
    return ", ".join(parts)


def _mean(d: Dist | None) -> float | None:
    return None if d is None else d.mean


def headline(report: Report) -> Text:
    """Step time, lost time and its top causes; the pipeline, its bubble; what was traced."""
    s = report.summary
    run = report.run
    t = Text()
    lost = s.lost_ratio
    u = _Unit(report)
    t.append(f"step {u(s.step_ms)} {u.name}", style="bold")
    if s.step_mean_ms is not None:
        t.append(f" median, mean {u(s.step_mean_ms)}, p95 {u(s.step_p95_ms)}")
    if lost is not None:
        t.append(f"  ·  lost {lost * 100:.1f}%", style="bold red" if lost > 0.25 else "bold")
    top = sorted(((k, v) for k, v in s.lost_ms.items() if v > 0), key=lambda kv: -kv[1])[:3]
    if top and (s.step_mean_ms or s.step_ms):
        t.append("  ·  ")
        parts = [f"{CAUSE_LABELS[k]} {_dur(v, 1)} ({(share_of(s, k) or 0.0) * 100:.0f}%)" for k, v in top]
        t.append(", ".join(parts))
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
    u = _Unit(report)
    t = _table(f"Per stage ({u.name} per step; fwd/bwd per micro-batch)")
    _col(t, "stage")
    _col(t, "ranks", right=False)
    _col(t, "fwd")
    _col(t, "bwd")
    has_w = any(s.wgrad_ms is not None for s in stages)
    if has_w:
        _col(t, "wgrad")
    _col(t, "compute")
    if wide:
        for k in Cause:
            _col(t, CAUSE_LABELS[k])
    else:
        _col(t, "lost")
        _col(t, "top cause", right=False)
    idx = report_slowest_stage(report)
    slow = stages[idx].stage if idx is not None else None
    for s in stages:
        row = [str(s.stage), _rank_list(s.ranks), u(_mean(s.fwd_ms)), u(_mean(s.bwd_ms))]
        if has_w:
            row.append(u(_mean(s.wgrad_ms)))
        row.append(u(s.compute_ms))
        if wide:
            row += [u(s.lost_ms.get(k)) for k in Cause]
        else:
            row += [u(sum(float(v) for v in s.lost_ms.values())), _top_cause(s.lost_ms, u.seconds)]
        t.add_row(*row, style="bold" if s.stage == slow else None)
    return t


def rank_table(report: Report, limit: int = 64, wide: bool = True) -> Table:
    """Per rank: the time accounting and every cause when ``wide``, else rank, stage, step,
    compute, lost and the top cause."""
    rows = report.ranks
    u = _Unit(report)
    t = _table(f"Per rank ({u.name}, mean per step)")
    if not wide:
        for c in ("rank", "stage", "step", "compute", "lost"):
            _col(t, c)
        _col(t, "top cause", right=False)
        for r in rows[:limit]:
            t.add_row(
                str(r.rank),
                "-" if r.stage is None else str(r.stage),
                u(r.step_ms),
                u(r.compute_ms),
                u(sum(float(v) for v in r.lost_ms.values())),
                _top_cause(r.lost_ms, u.seconds),
            )
    else:
        for c in ("rank", "stage", "step", "compute", "exp. p2p", "exp. coll", "exp. copy", "idle"):
            _col(t, c)
        for k in Cause:
            # the labels of the HTML and Markdown reports; a narrow column wraps them, never cuts them
            _col(t, CAUSE_LABELS[k])
        for r in rows[:limit]:
            t.add_row(
                str(r.rank),
                "-" if r.stage is None else str(r.stage),
                u(r.step_ms),
                u(r.compute_ms),
                u(r.exposed_p2p_ms),
                u(r.exposed_collective_ms),
                u(r.exposed_copy_ms),
                u(r.idle_ms),
                *[u(r.lost_ms.get(k, 0.0)) for k in Cause],
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
    u = _Unit(report)
    t = _table(f"Critical path by stage and cause ({u.name} per step: which stage to shorten)")
    _col(t, "stage")
    _col(t, "on path")
    _col(t, "share")
    cats = ("compute", "transfer", "other") if wide else ("compute", "transfer")
    for k in cats:
        _col(t, PATH_LABELS[k])
    if wide:
        for k in Cause:
            _col(t, CAUSE_LABELS[k])
    else:
        _col(t, "lost")
        _col(t, "top cause", right=False)
    top = max(rows, key=lambda r: r[1].get("compute", 0.0))[0]
    for st, ms in rows:
        on = sum(ms.values())
        row = ["-" if st is None else str(st), u(on), f"{100 * on / total:.0f}%"]
        row += [u(ms.get(k, 0.0)) for k in cats]
        lost: dict[str, float] = {k: ms.get(k, 0.0) for k in Cause}
        if wide:
            row += [u(lost[k]) for k in Cause]
        else:
            # compute outside blocks joins the lost column here, so the row adds up to "on path"
            row += [u(sum(lost.values()) + ms.get("other", 0.0)), _top_cause(lost, u.seconds)]
        t.add_row(*row, style="bold" if st == top else None)
    return t


def _finding_panel(f: FindingRow) -> Panel:
    head = Text()
    head.append(f"{f.code} ", style="bold")
    head.append(f"[{f.severity}] ", style=SEV_STYLE.get(f.severity, ""))
    head.append(f.title)
    if f.gain_ms:
        head.append(f"  (gain ≈ {_dur(f.gain_ms, 1)}/step, {f.gain_pct or 0.0:.0f}%)", style="green")
    body = Text()
    items = evidence_items(f.evidence.as_dict(), scalars_only=True)[:8]
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
    from ppdiag.reports.whatif_table import whatif_table

    wt = whatif_table(report.whatif, "What if (simulated from the measured stage costs)", lost=False)
    for c in wt.columns:  # fold, never cut
        c.overflow = "fold"
    # the caption and each scenario's note on lines of their own under the table, at the console's
    # full width (a note column shrank to a few characters and split flag names: "--layers-per-sta"
    # / "ge"; a caption wrapped to the narrow table's width)
    caption, wt.caption = str(wt.caption or ""), None
    for part in fit_table(wt, con.width):
        con.print(part)
    for line in caption.splitlines():
        con.print(Padding(Text(line, style="dim"), (0, 0, 0, 2)))
    for r in report.whatif:
        note = f"not possible: {r.error}" if r.error else r.note
        if note:
            text = Text.assemble((f"{r.scenario}: ", "bold"), (note, "yellow" if r.error else ""))
            con.print(Padding(text, (0, 0, 0, 2)))


def render(
    report: Report,
    console: Console | None = None,
    ranks: bool = True,
    wide: bool | None = None,
    cleaned: bool = False,
) -> None:
    """Print the whole terminal report (trace strings without escape sequences or controls).

    ``wide``: every cause column in the tables; None: when the console has
    :data:`WIDE_COLUMNS` columns or more. The registered reporter ``terminal`` (:data:`REPORTER`)
    shows the same through its ``show`` and writes it to a file through ``write``. ``cleaned``:
    ``report`` is already :func:`~ppdiag.reports.sanitize.clean_report`'s (the result cache keeps
    it so, as cleaning decodes each finding's evidence by its rule's type, which a re-run served
    from the cache has not loaded)."""
    if not cleaned:
        report = clean_report(report)
    con = console or Console()
    if wide is None:
        wide = con.width >= WIDE_COLUMNS
    con.print(Panel(headline(report), title="ppdiag", border_style="blue"))
    tables = [stage_table(report, wide=wide), critical_path_table(report, wide=wide)]
    tables.append(rank_table(report, wide=wide) if ranks else None)
    for table in tables:
        if table is not None:
            # the rank table's parts repeat rank and stage, the others the stage
            keys = 2 if table.columns[0].header == "rank" else 1
            for part in fit_table(table, con.width, keys=keys):
                con.print(part)
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


#: Columns of the report written to a file: what a log gets (``cli.support.report_console``).
LOG_COLUMNS = 140


class TerminalReporter:
    """Reporter ``terminal``: the report the terminal shows. ``show`` prints it on a console;
    ``write`` writes the plain text a log gets (:data:`LOG_COLUMNS` columns, no colour) to a file,
    ending in ppdiag's marker line (so a later run may write over it, and no other file)."""

    name = "terminal"
    suffix = ".txt"

    def show(
        self, report: Report, console: Console | None = None, ranks: bool = True, wide: bool | None = None
    ) -> None:
        render(report, console, ranks=ranks, wide=wide)

    def write(self, diagnosis: Analyzed, path: Path) -> None:
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as fh:
            con = Console(file=fh, width=LOG_COLUMNS, color_system=None, force_terminal=False)
            self.show(diagnosis.result, con)
            fh.write("\n" + md_marker("terminal") + "\n")


REPORTER = register(TerminalReporter())

__all__ = ["REPORTER", "TerminalReporter", "escape", "render"]
