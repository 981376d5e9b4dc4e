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
import json
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np
import numpy.typing as npt
from markupsafe import Markup

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.io import html_marker
from ppdiag.model.timeline import Kind
from ppdiag.report_types import Gate, Report
from ppdiag.reports import register
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
    share,
    share_step_ms,
    slowest_stage,
)

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

if TYPE_CHECKING:
    from ppdiag.reports.context import Analyzed

from ppdiag.reports.html_figures import (
    COMPUTE_COLOR,
    bubble_figure,
    fig_json,
    heatmap_figure,
    histogram_figure,
    lost_figure,
    stage_rows,
    timeline_figure,
)
from ppdiag.reports.html_model import (
    MAX_BLOCKS,
    MAX_ROWS,
    TimelineData,
    build_timeline,
    esc,
    ranges_text,
    short_name,
    stages_by_rank,
)

I64 = npt.NDArray[np.int64]

#: The plotly.js partial bundle inlined into the page (vendor/README.md: version, source, licence).
PLOTLY_JS = "plotly-cartesian.min.js"
PLOTLY_VERSION = "4.1.1"

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'"
)


@functools.cache
def plotly_js() -> str:
    """The vendored plotly.js bundle (cartesian trace types only: bar, scatter, histogram, heatmap)."""
    return (files("ppdiag.reports") / "vendor" / PLOTLY_JS).read_text(encoding="utf-8")


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


@functools.cache
def _env() -> jinja2.Environment:
    """The page templates (``templates/*.html.j2``), autoescaped: a trace string can only reach the
    page as text."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("ppdiag.reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
    )


def _how_to_read(td: TimelineData) -> str:
    """The "how to read this" box above the timeline: what every mark means."""
    return _env().get_template("howto.html.j2").render(virtual=td.virtual)


def _critical_path_html(report: Report) -> str:
    """The "critical path by stage and cause" table (mean ms per step)."""
    rows = critical_path_rows(report)
    if not rows:
        return ""
    cats = [k for k in ("compute", "transfer", "other", *CAUSE_KEYS) if any(ms.get(k) for _, ms in rows)]
    total = sum(sum(ms.values()) for _, ms in rows) or 1.0
    top = max(rows, key=lambda r: r[1].get("compute", 0.0))[0]
    return (
        _env()
        .get_template("critical_path.html.j2")
        .render(
            heads=[PATH_LABELS.get(k) or cause_label(k) for k in cats],
            top=top,
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
        _tile(
            "lost time",
            fmt_pct(ratio),
            f"{fmt_ms(total_lost)} per step, mean over ranks",
        ),
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
                f'<span style="width:{100 * comp / base:.3f}%;background:{COMPUTE_COLOR}" '
                f'title="compute {esc(fmt_ms(comp))}"></span>'
            )
            leg.append(
                f'<span><i class="sw" style="background:{COMPUTE_COLOR}"></i>'
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
                (f for f in finds if f.get("cause") == c),
                key=lambda f: -(num(f.get("gain_ms")) or 0),
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


def _gate_html(gate: Gate | None) -> str:
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
    stages = stage_rows(rep)
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


def _top_kernels(diag: Analyzed, td: TimelineData, k: int = 6) -> str:
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
        tot = np.bincount(
            iv.name[m],
            weights=(en[m] - st[m]).astype(np.float64),
            minlength=len(rt.names),
        )
        cnt = np.bincount(iv.name[m], minlength=len(rt.names))
        all_t = float(tot.sum())
        top = np.argsort(-tot)[:k]
        lines = []
        for i in top:
            if tot[i] <= 0:
                continue
            nm = rt.name_of(int(i))
            lines.append(
                f'<tr><td class="l mono">{esc(short_name(nm, 200))}</td>'
                f"<td>{tot[i] / 1e6 / len(spans):.3f}</td>"
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


def _facts(diag: Analyzed, rep: dict[str, Any]) -> str:
    run = rep.get("run") or {}
    tool = rep.get("tool") or {}
    items = [
        ("format", run.get("format")),
        ("world size", run.get("world_size")),
        (
            "ranks analyzed",
            ranges_text(sorted(x for x in run.get("ranks") or [] if isinstance(x, int))),
        ),
        ("pipeline stages (pp)", run.get("pp")),
        ("virtual stages", run.get("virtual_stages")),
        ("schedule", run.get("schedule")),
        ("micro-batches (M)", run.get("microbatches")),
        (
            "analyzed steps",
            ranges_text(sorted(x for x in run.get("steps") or [] if isinstance(x, int))),
        ),
        (
            "clock alignment residual",
            f"{num(run.get('clock_residual_us')):.1f} µs"
            if num(run.get("clock_residual_us")) is not None
            else None,
        ),
        (
            "ppdiag",
            f"{tool.get('version', '?')} (report schema {rep.get('schema_version')})",
        ),
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
    diag: Analyzed,
    max_blocks: int = MAX_BLOCKS,
    max_rows: int = MAX_ROWS,
    gate: Gate | None = None,
) -> str:
    """The whole report as one self-contained HTML string (``gate``: the gate's verdict, else the
    report's ``gate`` section)."""
    rep = diag.report or {}
    gate = gate if gate is not None else diag.result.gate
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
    stages = stage_rows(rep)
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
    parts.append(_critical_path_html(diag.result))
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
        "(function(){var F=" + fig_json(figs) + ";var C=" + json.dumps(config) + ";"
        "for(var id in F){var el=document.getElementById(id);if(!el)continue;"
        # the toolbar only where zooming helps (the timeline): elsewhere it covered the data
        "var c=Object.assign({},C,{displayModeBar:id==='fig-timeline'?'hover':false});"
        "try{Plotly.newPlot(el,F[id].data,F[id].layout,c);}catch(e){"
        "var d=document.getElementById('ppdiag-errors');"
        "if(d){d.hidden=false;var li=document.createElement('li');"
        "li.textContent=id+': '+e;d.querySelector('ul').appendChild(li);}}}})();"
    )
    page = (
        _env()
        .get_template("page.html.j2")
        .render(
            marker=Markup(html_marker()),
            csp=Markup(CSP),
            title=title,
            css=Markup(_CSS),
            error_hook=Markup(_ERROR_HOOK),
            parts=[Markup(p) for p in parts],  # built here, every trace string escaped
            plotly=Markup(plotly_js()),
            script=Markup(script),
        )
    )
    return page + "\n"


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
