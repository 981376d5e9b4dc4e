"""The sections of the HTML report drawn from the typed report alone: the headline tiles and the
step bar, the gate verdict, the findings, the what-if table, the per-stage and per-rank tables,
the critical path by stage, and the run's facts and warnings.

Every string from a trace goes through :func:`~ppdiag.reports.html_model.esc` (or an autoescaped
template) before it reaches the page.
"""

from __future__ import annotations

from ppdiag.facts import share_of
from ppdiag.report_types import (
    PATH_CATEGORIES,
    Cause,
    Dist,
    FindingRow,
    Gate,
    RankRow,
    Report,
    Schedule,
    StageRow,
    Summary,
)
from ppdiag.reports.html_figures import COMPUTE_COLOR
from ppdiag.reports.html_model import esc, ranges_text
from ppdiag.reports.html_page import env
from ppdiag.reports.style import (
    CAUSE_COLORS,
    CAUSE_LABELS,
    PATH_LABELS,
    SEVERITY_COLORS,
    cause_color,
    cause_label,
    critical_path_rows,
    evidence_items,
    fmt_ms,
    fmt_pct,
    num,
    ranks_text,
)

#: Columns of the per-rank table after rank and stage (ms per step).
_RANK_COLS = (
    "step_ms",
    "compute_ms",
    "exposed_p2p_ms",
    "exposed_collective_ms",
    "exposed_copy_ms",
    "idle_ms",
)


def critical_path_html(report: Report) -> str:
    """The "critical path by stage and cause" table (mean ms per step)."""
    rows = critical_path_rows(report)
    if not rows:
        return ""
    cats = [k for k in PATH_CATEGORIES if any(ms.get(k) for _, ms in rows)]
    total = sum(sum(ms.values()) for _, ms in rows) or 1.0
    # the highlighted stage is the report's slowest stage (ppdiag.facts, the one PP003 names) when
    # one stands out; else the stage with the most compute on the path
    slowest = report.summary.slowest_stage
    top = slowest if slowest is not None else max(rows, key=lambda r: r[1].get("compute", 0.0))[0]
    return (
        env()
        .get_template("critical_path.html.j2")
        .render(
            heads=[PATH_LABELS.get(k) or cause_label(k) for k in cats],
            lead=_path_lead(report, rows, slowest),
            rows=[
                {
                    "stage": "-" if st is None else st,
                    "on": sum(ms.values()),
                    "share": 100 * sum(ms.values()) / total,
                    "cells": [ms.get(k, 0.0) for k in cats],
                    "top": st == top,
                }
                for st, ms in rows
            ],
        )
    )


def _path_lead(report: Report, rows: list[tuple[int | None, dict[str, float]]], slowest: int | None) -> str:
    """The sentence under the critical path's heading: the slowest stage when one stands out (the
    report's ``summary.slowest_stage``, the stage PP003 names), else which stage holds the most of
    the path's compute and that no stage stands out."""
    then = "; time spent elsewhere on the path (transfers, causes) points at the links and the causes to fix."
    on_path = [(st, ms.get("compute", 0.0)) for st, ms in rows if st is not None]
    top = max(on_path, key=lambda x: x[1])[0] if on_path else None
    if slowest is not None:
        ratio = report.summary.stage_ratio
        times = f" ({ratio:.2f}x the mean stage compute)" if ratio is not None else ""
        out = f"Stage {slowest} is the slowest stage{times}: shortening its blocks shortens the step" + then
        if top is not None and top != slowest:
            out += f" Stage {top} holds the most compute on the path itself{_slow_ranks_on(report, top)}."
        return out
    if top is None or report.run.pp <= 1:
        return ""
    return (
        f"No stage is much slower than the others; stage {top} holds the most compute on the critical "
        "path" + then
    )


def _slow_ranks_on(report: Report, stage: int) -> str:
    """ ", where PP009 names rank 3" when a straggler finding names ranks of ``stage``, else ""."""
    stage_of = {r.rank: r.stage for r in report.ranks}
    named = sorted(
        {r for f in report.findings if f.code == "PP009" for r in f.ranks if stage_of.get(r) == stage}
    )
    return (
        f", where PP009 names rank(s) {', '.join(map(str, named))} as slower than its replicas"
        if named
        else ""
    )


def _tile(k: str, v: str, sub: str = "") -> str:
    return (
        f'<div class="tile"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div>'
        + (f'<div class="sub">{esc(sub)}</div>' if sub else "")
        + "</div>"
    )


def _lost(s: Summary) -> dict[str, float]:
    return {c: num(s.lost_ms.get(c)) or 0.0 for c in Cause}


def _tiles(report: Report) -> str:
    """Step time, lost time, compute, bubble and the pipeline, one tile each."""
    run, s, b = report.run, report.summary, report.bubble
    p95, mean = num(s.step_p95_ms), num(s.step_mean_ms)
    tiles = [
        _tile(
            "step time (median)",
            fmt_ms(num(s.step_ms)),
            (f"mean {fmt_ms(mean)}, " if mean is not None else "")
            + (f"p95 {fmt_ms(p95)}" if p95 is not None else ""),
        ),
        _tile(
            "lost time",
            fmt_pct(num(s.lost_ratio)),
            f"{fmt_ms(sum(_lost(s).values()))} per step, mean over ranks",
        ),
        _tile("compute", fmt_ms(num(s.compute_ms)), "union of compute per rank"),
    ]
    meas, theo = num(b.measured_ratio), num(b.theoretical_ratio)
    if meas is not None or theo is not None:
        tiles.append(_tile("bubble", fmt_pct(meas), f"theoretical {fmt_pct(theo)}"))
    doubt = run.structure.headline() if run.structure is not None else None
    pipe = (
        (doubt or "no pipeline parallelism")
        if (run.pp == 1 or run.schedule == Schedule.NONE)
        else f"{run.schedule}, P={run.pp}"
        + (f", M={run.microbatches}" if run.microbatches else "")
        + (f", v={run.virtual_stages}" if run.virtual_stages > 1 else "")
    )
    tiles.append(_tile("pipeline", pipe, f"{ranks_text(run)}, {len(run.steps)} steps"))
    return '<div class="tiles">' + "".join(tiles) + "</div>"


def _step_bar(s: Summary, step: float) -> list[str]:
    """Where the step goes: compute and each cause as one bar, with its legend."""
    lost = _lost(s)
    comp = num(s.compute_ms)
    parts = []
    leg = []
    # one denominator: the mean step the causes are averaged on (compute + causes = it)
    base = max(s.step_mean_ms or step, (comp or 0) + sum(lost.values()))
    if comp:
        parts.append(
            f'<span style="width:{100 * comp / base:.3f}%;background:{COMPUTE_COLOR}" '
            f'title="compute {esc(fmt_ms(comp))}"></span>'
        )
        leg.append(
            f'<span><i class="sw" style="background:{COMPUTE_COLOR}"></i>compute {esc(fmt_ms(comp))}</span>'
        )
    for c in sorted(Cause, key=lambda c: -lost[c]):
        if lost[c] <= 0:
            continue
        parts.append(
            f'<span style="width:{100 * lost[c] / base:.3f}%;background:{CAUSE_COLORS[c]}" '
            f'title="{esc(cause_label(c))} {esc(fmt_ms(lost[c]))}"></span>'
        )
        leg.append(
            f'<span><i class="sw" style="background:{CAUSE_COLORS[c]}"></i>{esc(cause_label(c))} '
            f"{esc(fmt_ms(lost[c]))} ({esc(fmt_pct(share_of(s, c)))})</span>"
        )
    return [
        '<div class="bar" role="img" aria-label="step time by cause">' + "".join(parts) + "</div>",
        '<div class="legend">' + "".join(leg) + "</div>",
    ]


def _top_causes(report: Report, step: float | None) -> str:
    """The top causes, each with the finding that would win most of it back."""
    s = report.summary
    lost = _lost(s)
    top = [c for c in sorted(Cause, key=lambda c: -lost[c]) if lost[c] > 0][:3]
    if not top:
        return ""
    items = []
    for c in top:
        fs = sorted((f for f in report.findings if f.cause == c), key=lambda f: -(num(f.gain_ms) or 0))
        pct = f" ({fmt_pct(share_of(s, c))} of step)" if step else ""
        fix = ""
        if fs:
            f = fs[0]
            fix = (
                f' — <span class="code">{esc(f.code)}</span> {esc(f.title)}: '
                f"could win back <b>{esc(fmt_ms(num(f.gain_ms)))}</b>"
            )
        items.append(
            f'<li><i class="sw" style="background:{cause_color(c)}"></i><b>{esc(cause_label(c))}</b> '
            f"{esc(fmt_ms(lost[c]))}{esc(pct)}{fix}</li>"
        )
    return '<h3 style="margin-top:12px">Top causes</h3><ul>' + "".join(items) + "</ul>"


def headline_html(report: Report) -> str:
    """The headline: tiles, the step bar and the top causes with their best fix."""
    step = num(report.summary.step_ms)
    out = [_tiles(report)]
    if step:
        out += _step_bar(report.summary, step)
    out.append(_top_causes(report, step))
    return "".join(out)


def gate_html(gate: Gate | None) -> str:
    """The gate's verdict and its checks (empty without a gate)."""
    if gate is None:
        return ""
    st = str(gate.status)
    rows = []
    for c in gate.checks:
        state = str(c.state)
        cls = {"pass": "pass", "fail": "fail"}.get(state, "inconclusive")
        rows.append(f'<tr><td class="l {cls}">{esc(state.upper())}</td><td class="l">{esc(c.text)}</td></tr>')
    reasons = "".join(f"<li>{esc(r)}</li>" for r in gate.reasons)
    return (
        f'<section id="gate"><h2>CI gate: <span class="{esc(st)}">{esc(st.upper())}</span> '
        f'<span class="sub">(exit {esc(gate.exit_code)})</span></h2>'
        + (f"<ul>{reasons}</ul>" if reasons else "")
        + f"<table><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _finding_card(f: FindingRow, step: float | None) -> str:
    sev = str(f.severity or "info")
    color = cause_color(f.cause)
    gain, gpct = num(f.gain_ms), num(f.gain_pct)
    if gpct is None and gain is not None and step:
        gpct = 100 * gain / step
    where = []
    if f.stages:
        where.append("stages " + ", ".join(esc(x) for x in f.stages[:32]))
    if f.ranks:
        rk = f.ranks
        where.append(
            "ranks " + ", ".join(esc(x) for x in rk[:32]) + (f" … ({len(rk)})" if len(rk) > 32 else "")
        )
    ev_rows = ""
    evidence = f.evidence.as_dict()
    if evidence:
        ev_rows = (
            '<table class="evidence"><tbody>'
            + "".join(
                f'<tr><td>{esc(k)}</td><td class="mono">{esc(v)}</td></tr>'
                for k, v in evidence_items(evidence)
            )
            + "</tbody></table>"
        )
    fixes = "".join(f"<li>{esc(x)}</li>" for x in f.fixes)
    gain_txt = ""
    if gain is not None:
        gain_txt = f"gain ≈ {fmt_ms(gain)} / step" + (f" ({gpct:.1f} %)" if gpct is not None else "")
    return (
        f'<div class="finding" style="border-left-color:{color}">'
        f'<div class="head"><span class="badge" style="background:{SEVERITY_COLORS.get(sev, "#7F8C8D")}">'
        f'{esc(sev)}</span><span class="code">{esc(f.code)}</span><h3>{esc(f.title)}</h3>'
        f'<span class="gain">{esc(gain_txt)}</span></div>'
        f'<div class="meta"><i class="sw" style="background:{color}"></i>'
        f"{esc(cause_label(f.cause) if f.cause else 'general')}"
        + (" · " + " · ".join(where) if where else "")
        + "</div>"
        + ev_rows
        + (f'<b>How to fix</b><ol class="fixes">{fixes}</ol>' if fixes else "")
        + "</div>"
    )


def findings_html(report: Report) -> str:
    """One card per finding: severity, code, title, gain, where, evidence and fixes."""
    if not report.findings:
        return (
            '<section id="findings"><h2>Findings</h2>'
            '<p class="sub">No finding: nothing worth fixing was detected.</p></section>'
        )
    step = num(report.summary.step_mean_ms or report.summary.step_ms)  # gain_pct's denominator
    cards = [_finding_card(f, step) for f in report.findings]
    head = "Findings, most severe first, then by estimated gain"  # the order of report.check()
    return f'<section id="findings"><h2>{head}</h2>' + "".join(cards) + "</section>"


def whatif_html(report: Report) -> str:
    """The what-if table (empty without predictions)."""
    if not report.whatif:
        return ""
    step = num(report.summary.step_ms)
    body = []
    for w in report.whatif:
        sp = num(w.speedup)
        body.append(
            f'<tr><td class="l">{esc(w.scenario)}</td><td>{esc(fmt_ms(num(w.step_ms)))}</td>'
            f"<td>{esc(f'{sp:.2f}×' if sp is not None else '—')}</td>"
            f"<td>{esc(fmt_pct(num(w.bubble_ratio)))}</td>"
            f'<td class="l">{esc(w.note or "")}</td></tr>'
        )
    return (
        '<section id="whatif"><h2>What if</h2><p class="sub">Simulated with the measured per-stage costs'
        + (f"; today's step is {esc(fmt_ms(step))}" if step else "")
        + '.</p><table><thead><tr><th class="l">scenario'
        '</th><th>step</th><th>speed-up</th><th>bubble</th><th class="l">note</th></tr></thead><tbody>'
        + "".join(body)
        + "</tbody></table></section>"
    )


def _stats_cell(d: Dist | None) -> str:
    m, p95 = (num(d.mean), num(d.p95)) if d is not None else (None, None)
    if m is None:
        return "—"
    return f"{m:.3f}" + (f" / {p95:.3f}" if p95 is not None else "")


def _f3(v: float | int | None) -> str:
    x = num(v)
    return "—" if x is None else f"{x:.3f}"


def _cause_heads() -> str:
    return "".join(
        f'<th><i class="sw" style="background:{CAUSE_COLORS[c]}"></i>{esc(CAUSE_LABELS[c])}</th>'
        for c in Cause
    )


def _stage_row(i: int, s: StageRow, slow: int | None, has_w: bool) -> str:
    rk = ", ".join(esc(r) for r in s.ranks[:8]) + (f" … ({len(s.ranks)})" if len(s.ranks) > 8 else "")
    style = ' style="background:#fff4e5"' if i == slow else ""
    return (
        f'<tr{style}><td class="l">{esc(s.stage)}{" (slowest)" if i == slow else ""}</td>'
        f'<td class="l">{rk}</td><td>{_stats_cell(s.fwd_ms)}</td>'
        f"<td>{_stats_cell(s.bwd_ms)}</td>"
        + (f"<td>{_stats_cell(s.wgrad_ms)}</td>" if has_w else "")
        + f"<td>{esc(_f3(s.compute_ms))}</td>"
        + "".join(f"<td>{esc(_f3(s.lost_ms.get(c)))}</td>" for c in Cause)
        + "</tr>"
    )


def stage_table_html(stages: list[StageRow], slow: int | None) -> str:
    """Per stage: F/B/W per micro-batch (mean / p95), compute and each cause; ``slow`` marked."""
    if not stages:
        return ""
    has_w = any(s.wgrad_ms is not None for s in stages)
    head = (
        '<tr><th class="l">stage</th><th class="l">ranks</th><th>F ms mean / p95</th><th>B ms mean / p95</th>'
        + ("<th>W ms mean / p95</th>" if has_w else "")
        + "<th>compute ms</th>"
        + _cause_heads()
        + "</tr>"
    )
    body = [_stage_row(i, s, slow, has_w) for i, s in enumerate(stages)]
    return f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"


def _rank_row(r: RankRow) -> str:
    return (
        f'<tr><td class="l">{esc(r.rank)}</td>'
        f'<td class="l">{esc(r.stage if r.stage is not None else "—")}</td>'
        + "".join(f"<td>{esc(_f3(getattr(r, k)))}</td>" for k in _RANK_COLS)
        + "".join(f"<td>{esc(_f3(r.lost_ms.get(c)))}</td>" for c in Cause)
        + "</tr>"
    )


def rank_table_html(ranks: list[RankRow], limit: int = 512) -> str:
    """Per rank: the time accounting and each cause (folded away beyond 16 ranks)."""
    if not ranks:
        return ""
    head = (
        '<tr><th class="l">rank</th><th class="l">stage</th><th>step ms</th><th>compute ms</th>'
        "<th>exposed p2p ms</th><th>exposed collective ms</th><th>exposed copy ms</th><th>idle ms</th>"
        + _cause_heads()
        + "</tr>"
    )
    body = [_rank_row(r) for r in ranks[:limit]]
    more = (
        f'<p class="sub">{len(ranks) - limit} more ranks are in the JSON report.</p>'
        if len(ranks) > limit
        else ""
    )
    table = f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>{more}"
    if len(ranks) > 16:
        return f"<details><summary>per-rank breakdown ({len(ranks)} ranks)</summary>{table}</details>"
    return table


def _fact_items(report: Report) -> list[tuple[str, object]]:
    run = report.run
    res = run.clock_residual_us
    items: list[tuple[str, object]] = [
        ("format", run.format),
        ("world size", run.world_size),
        ("ranks analyzed", ranges_text(sorted(run.ranks))),
        ("pipeline stages (pp)", run.pp),
        ("virtual stages", run.virtual_stages),
        ("schedule", run.schedule),
        ("micro-batches (M)", run.microbatches),
        ("analyzed steps", ranges_text(sorted(run.steps))),
        ("clock alignment residual", f"{res:.1f} µs" if num(res) is not None else None),
        ("ppdiag", f"{report.tool.version} (report schema {report.schema_version})"),
    ]
    smap = run.stage_map
    if smap:
        txt = ", ".join(f"{s}→{r}" for s, r in list(smap.items())[:64]) + (" …" if len(smap) > 64 else "")
        items.insert(5, ("stage → rank", txt))
    return items


def facts_html(report: Report, run_warnings: list[str]) -> str:
    """The run's facts, and its warnings (the report's, then the parse's ``run_warnings``)."""
    rows = "".join(
        f'<tr><td class="l">{esc(k)}</td><td class="l">{esc(v if v is not None else "—")}</td></tr>'
        for k, v in _fact_items(report)
    )
    warns = list(report.run.warnings)
    for w in run_warnings:
        if w not in warns:
            warns.append(w)
    wl = ""
    if warns:
        wl = (
            '<h3 style="margin-top:12px">Warnings</h3><ul class="warn">'
            + "".join(f"<li>{esc(w)}</li>" for w in warns[:200])
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


__all__ = [
    "critical_path_html",
    "facts_html",
    "findings_html",
    "gate_html",
    "headline_html",
    "rank_table_html",
    "stage_table_html",
    "whatif_html",
]
