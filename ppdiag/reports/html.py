"""Self-contained offline HTML report: headline, measured pipeline timeline, per-stage compute
histograms, lost time by cause, bubble, findings, what-if, run facts (docs/json.md).

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

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppdiag.facts import report_slowest_stage
from ppdiag.report_types import Gate, Report
from ppdiag.reports import register
from ppdiag.reports.html_figures import (
    PlotlyFigure,
    bubble_figure,
    heatmap_figure,
    histogram_figure,
    lost_figure,
)
from ppdiag.reports.html_model import (
    MAX_BLOCKS,
    MAX_ROWS,
    TimelineData,
    build_timeline,
    esc,
    short_name,
    stages_by_rank,
)
from ppdiag.reports.html_page import CSP, env, page, plotly_js
from ppdiag.reports.html_sections import (
    critical_path_html,
    facts_html,
    findings_html,
    gate_html,
    headline_html,
    rank_table_html,
    stage_table_html,
    whatif_html,
)
from ppdiag.reports.html_timeline import timeline_figure
from ppdiag.reports.style import fmt_ms, fmt_pct, num, ranks_text

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed

__all__ = [
    "CSP",
    "HtmlReporter",
    "build_timeline",
    "plotly_js",
    "render_html",
    "stages_by_rank",
    "timeline_figure",
    "write_html",
]


def _how_to_read(td: TimelineData) -> str:
    """The "how to read this" box above the timeline: what every mark means."""
    return env().get_template("howto.html.j2").render(virtual=td.virtual)


def _top_kernels(report: Report, td: TimelineData) -> str:
    """The report's top compute kernels (``kernels[]``) of each drawn rank."""
    by_rank = {rk.rank: rk.top for rk in report.kernels or []}
    blocks = []
    for row in td.rows:
        top = by_rank.get(row.rank)
        if top is None:
            continue
        lines = [
            f'<tr><td class="l mono">{esc(short_name(k.name, 200))}</td>'
            f"<td>{k.ms_per_step:.3f}</td>"
            f"<td>{100 * k.share:.1f} %</td><td>{k.calls_per_step:.0f}</td></tr>"
            for k in top
        ]
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


def _timeline_html(td: TimelineData, heatmap: bool) -> str:
    """The timeline section (and the stage x replica heat map under it when there is one)."""
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
        tl += [f'<div class="note">{esc(n)}</div>' for n in td.notes]
        tl.append(_how_to_read(td))
        tl.append('<div id="fig-timeline" class="plot"></div>')
        if heatmap:
            tl.append(
                '<h3>Every replica: compute per step, by stage</h3><p class="sub">Mean compute per step '
                "of each rank, by stage (rows) and pipeline replica (columns): a cell far from its row "
                "is a slow worker (PP009), a row above the others a slow stage (PP003).</p>"
                '<div id="fig-heatmap" class="plot"></div>'
            )
    else:
        tl.append('<p class="sub">No device intervals or gaps to draw.</p>')
        tl += [f'<div class="note">{esc(n)}</div>' for n in td.notes]
    tl.append("</section>")
    return "".join(tl)


def _histogram_html(report: Report, hist: bool) -> str:
    """The per-stage compute section: the histograms, the slowest stage and the stage table."""
    stages = report.stages
    if not hist:
        if stages:
            return ""
        return (
            '<section id="histogram"><h2>Compute per micro-batch, by stage</h2><p class="sub">No pipeline '
            "stages were found (pp 1): there is no stage balance to compare. The per-rank breakdown is "
            "below.</p></section>"
        )
    slow = report_slowest_stage(report)
    slow_txt = ""
    # the stage balance's one measure (ppdiag.facts): the stage's micro-batch block compute, the
    # value the slowest stage, summary.stage_ratio, PP003 and the gate are decided on
    ratio = num(report.summary.stage_ratio)
    if slow is not None and ratio is not None:
        st = stages[slow]
        slow_txt = (
            f" Stage {esc(st.stage)} is the slowest: {esc(fmt_ms(num(st.block_ms)))} of compute per step in "
            f"its micro-batch blocks, {100 * (ratio - 1):+.0f} % vs the mean stage."
        )
    return (
        '<section id="histogram"><h2>Compute per micro-batch, by stage</h2><p class="sub">'
        "Forward and backward time of each micro-batch; a stage whose histogram sits to the right sets "
        f"the pace of the whole pipeline.{slow_txt}</p>"
        '<div id="fig-histogram" class="plot"></div>' + stage_table_html(stages, slow) + "</section>"
    )


def _bubble_text(report: Report) -> str:
    """The measured bubble against the schedule's, and the closed form for GPipe and 1F1B."""
    run = report.run
    meas, theo = num(report.bubble.measured_ratio), num(report.bubble.theoretical_ratio)
    expl = ""
    if meas is not None and theo is not None:
        d = meas - theo
        expl = (
            f"The schedule alone predicts {fmt_pct(theo)} idle; the measured bubble is {fmt_pct(meas)} "
            f"({'+' if d >= 0 else ''}{100 * d:.1f} points). "
        )
    if run.pp and run.microbatches and run.schedule in ("gpipe", "1f1b"):
        expl += f"For {run.schedule}: (P−1)/(M+P−1) with P={run.pp}, M={run.microbatches}."
    return expl


def _lost_html(report: Report, lost: bool, bubble: bool) -> str:
    """Lost time by cause beside the bubble (and the per-rank table for a run without stages)."""
    what = "stage" if report.stages else "rank"
    out = [f'<section id="lost"><div class="grid2"><div><h2>Lost time per {what}, by cause</h2>']
    out.append(
        '<div id="fig-lost" class="plot"></div>'
        if lost
        else '<p class="sub">No per-stage or per-rank figures.</p>'
    )
    out.append("</div><div><h2>Bubble: measured vs theoretical</h2>")
    if bubble:
        out.append(f'<div id="fig-bubble" class="plot"></div><p class="sub">{esc(_bubble_text(report))}</p>')
    else:
        out.append('<p class="sub">No pipeline schedule was identified, so no bubble is computed.</p>')
    out.append("</div></div>")
    if not report.stages:
        out.append(rank_table_html(report.ranks))
    out.append("</section>")
    return "".join(out)


def _ranks_html(diag: Analyzed, td: TimelineData) -> str:
    report = diag.result
    tk = _top_kernels(report, td)
    if report.stages:
        return f'<section id="ranks"><h2>Per rank</h2>{rank_table_html(report.ranks)}{tk}</section>'
    return f'<section id="ranks"><h2>Per rank</h2>{tk}</section>' if tk else ""


def _figures(report: Report, td: TimelineData, max_rows: int) -> dict[str, PlotlyFigure]:
    """Every figure of the page by element id (a figure with nothing to draw is left out)."""
    figs = {
        "fig-timeline": timeline_figure(td) if td.sets else None,
        "fig-histogram": histogram_figure(report),
        "fig-lost": lost_figure(report),
        "fig-bubble": bubble_figure(report),
        "fig-heatmap": heatmap_figure(report, max_rows),
    }
    return {k: v for k, v in figs.items() if v}


def _title(report: Report) -> str:
    run = report.run
    title = "ppdiag report"
    if run.pp and run.pp != 1:
        title += f" — {run.schedule}, P={run.pp}" + (f", M={run.microbatches}" if run.microbatches else "")
    return title


def render_html(
    diag: Analyzed,
    max_blocks: int = MAX_BLOCKS,
    max_rows: int = MAX_ROWS,
    gate: Gate | None = None,
) -> str:
    """The whole report as one self-contained HTML string (``gate``: the gate's verdict, else the
    report's ``gate`` section)."""
    report = diag.result
    td = build_timeline(diag, max_blocks=max_blocks, max_rows=max_rows)
    figs = _figures(report, td, max_rows)
    run, s = report.run, report.summary
    title = _title(report)
    parts = [
        f'<header><h1>{esc(title)}</h1><div class="sub">step {esc(fmt_ms(num(s.step_ms)))} '
        f"(median), {esc(fmt_pct(num(s.lost_ratio)))} of it lost; "
        f"{esc(ranks_text(run))}, {esc(run.format)} traces</div></header>",
        '<div id="ppdiag-errors" hidden><b>Part of this report failed to render:</b><ul></ul></div>',
        gate_html(gate if gate is not None else report.gate),
        f'<section id="headline"><h2>Where the step time goes</h2>{headline_html(report)}</section>',
        _timeline_html(td, "fig-heatmap" in figs),
        critical_path_html(report),
        _histogram_html(report, "fig-histogram" in figs),
        _lost_html(report, "fig-lost" in figs, "fig-bubble" in figs),
        findings_html(report),
        whatif_html(report),
        _ranks_html(diag, td),
        facts_html(report, diag.run.warnings),
    ]
    return page(title, parts, figs)


def write_html(diag: Analyzed, path: str | Path, **kw: Any) -> Path:
    """Write the HTML report to ``path``."""
    p = Path(path)
    p.write_text(render_html(diag, **kw), encoding="utf-8", errors="backslashreplace")
    return p


class HtmlReporter:
    """Reporter ``html``: the self-contained offline report."""

    name = "html"
    suffix = ".html"

    def write(self, diagnosis: Analyzed, path: Path) -> None:
        write_html(diagnosis, path)


register(HtmlReporter())
