"""The plotly figures of the HTML report beside the timeline (figure dicts, no page): the
per-stage histograms, lost time by cause, the bubble and the stage x replica heat map, all drawn
from the typed :class:`~ppdiag.report_types.Report`; and the figures' JSON for the page.

Strings from traces are entity-escaped inside plotly labels too (plotly interprets a few tags).
The timeline is :mod:`ppdiag.reports.html_timeline`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ppdiag.facts import report_slowest_stage
from ppdiag.report_types import Cause, Dist, RankRow, Report, StageRow
from ppdiag.reports.html_model import MAX_ROWS, esc
from ppdiag.reports.style import CAUSE_COLORS, CAUSE_LABELS, WORK_COLORS, WORK_LABELS, num

#: A figure as plotly's JSON (``data`` and ``layout`` in plotly's own schema, not ppdiag's report).
PlotlyFigure = dict[str, Any]

COMPUTE_COLOR = "#3A4A5C"
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"}

#: (category, per-micro-batch samples, distribution) of each phase of a stage row.
_SERIES = (
    ("fwd", "fwd_samples_ms", "fwd_ms"),
    ("bwd", "bwd_samples_ms", "bwd_ms"),
    ("wgrad", "wgrad_samples_ms", "wgrad_ms"),
)


def _samples(s: StageRow, key: str) -> list[float]:
    """The finite samples of one phase of a stage (``fwd_samples_ms``, ...)."""
    vals: list[float] = getattr(s, key)
    return [v for v in vals if num(v) is not None]


def _dist(s: StageRow, key: str) -> Dist | None:
    d: Dist | None = getattr(s, key)
    return d


def heatmap_figure(report: Report, max_rows: int = MAX_ROWS) -> PlotlyFigure | None:
    """Compute per step of every rank as a stage x replica heat map, for runs whose ranks do not
    fit the timeline (``max_rows``) and hold several pipeline replicas; None otherwise."""
    import plotly.graph_objects as go

    rows = [r for r in report.ranks if r.stage is not None and r.pipeline is not None]
    if len(report.ranks) <= max_rows or len({r.pipeline for r in rows}) < 2:
        return None
    stages, pipes, z, txt = _stage_replica_grid(rows)
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
    return fig_dict(fig)


def _stage_replica_grid(
    rows: list[RankRow],
) -> tuple[list[int], list[int], list[list[float | None]], list[list[str]]]:
    """(stages, pipelines, compute per step, hover text): one cell per stage and replica."""
    stages = sorted({int(r.stage or 0) for r in rows})
    pipes = sorted({int(r.pipeline or 0) for r in rows})
    si = {s: i for i, s in enumerate(stages)}
    pi = {p: i for i, p in enumerate(pipes)}
    z: list[list[float | None]] = [[None] * len(pipes) for _ in stages]
    txt: list[list[str]] = [[""] * len(pipes) for _ in stages]
    for r in rows:
        v = num(r.compute_ms)
        at = si[int(r.stage or 0)], pi[int(r.pipeline or 0)]
        z[at[0]][at[1]] = v
        txt[at[0]][at[1]] = f"rank {r.rank}: {v:.2f} ms" if v is not None else ""
    return stages, pipes, z, txt


def _mean_bars(stages: list[StageRow]) -> PlotlyFigure:
    """Without per-micro-batch samples: the mean per stage with p95 whiskers."""
    import plotly.graph_objects as go

    fig = go.Figure()
    xs = [f"stage {s.stage}" for s in stages]
    for cat, _k, statk in _SERIES:
        dists = [_dist(s, statk) for s in stages]
        ys = [num(d.mean) if d is not None else None for d in dists]
        if all(v is None for v in ys):
            continue
        p95 = [num(d.p95) if d is not None else None for d in dists]
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
    return fig_dict(fig)


def _subplot_titles(stages: list[StageRow], slow: int | None) -> list[str]:
    # two lines (the stage, then its ranks): four titles side by side fit an 800 px page
    titles = []
    for i, s in enumerate(stages):
        head = esc(f"stage {s.stage}") + (" · slowest" if i == slow else "")
        ranks = esc(f"rank {','.join(map(str, s.ranks[:4]))}") if s.ranks else ""
        head = f"<b>{head}</b>" if i == slow else head
        titles.append(f"{head}<br>{ranks}" if ranks else head)
    return titles


def _add_histograms(fig: Any, stages: list[StageRow], cols: int, xbins: dict[str, float]) -> None:
    """One histogram per stage and phase, every stage on the same bins."""
    import plotly.graph_objects as go

    for i, s in enumerate(stages):
        r, c = i // cols + 1, i % cols + 1
        for cat, key, _ in _SERIES:
            vals = _samples(s, key)
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
                    + esc(f"stage {s.stage} ")
                    + WORK_LABELS[cat]
                    + "</extra>",
                ),
                row=r,
                col=c,
            )


def _y_scale_menu(axes: list[str], top: float) -> dict[str, Any]:
    """Buttons that put every stage on one y-scale, or each on its own."""
    return {
        "type": "buttons",
        "direction": "right",
        "x": 1.0,
        "xanchor": "right",
        # under the figure, right of the x title: above it they covered the two-line subplot titles
        "y": 0.0,
        "yanchor": "top",
        "pad": {"t": 48},
        "showactive": True,
        "active": 0,
        "font": {"size": 11},
        "bgcolor": "#f4f6f8",
        "bordercolor": "#c8ced6",
        "buttons": [
            {
                "label": "same y-scale for every stage",
                "method": "relayout",
                "args": [{f"{a}.range": [0, top] for a in axes} | {f"{a}.autorange": False for a in axes}],
            },
            {
                "label": "own y-scale per stage",
                "method": "relayout",
                "args": [{f"{a}.autorange": True for a in axes}],
            },
        ],
    }


def _frame_slowest(fig: Any, slow: int) -> None:
    """A frame around the slowest stage's subplot, its title in the imbalance colour."""
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


def histogram_figure(report: Report) -> PlotlyFigure | None:
    """Per-stage histograms of forward/backward (and W) time per micro-batch; the slowest stage framed."""
    from plotly.subplots import make_subplots

    stages = report.stages
    if not stages:
        return None
    slow = report_slowest_stage(report)
    if not any(getattr(s, k) for s in stages for _, k, _ in _SERIES):
        return _mean_bars(stages)
    n = len(stages)
    cols = min(4, n)
    nrows = math.ceil(n / cols)
    fig = make_subplots(
        rows=nrows,
        cols=cols,
        subplot_titles=_subplot_titles(stages, slow),
        shared_xaxes="all",
        horizontal_spacing=0.04,
        # plotly refuses a spacing above 1 / (rows - 1): many stages (pp >= 33) need less
        vertical_spacing=min(0.14, 0.5 / (nrows - 1)) if nrows > 1 else 0.1,
    )
    # one bin width for every stage, so the histograms compare like with like
    allv = [float(v) for s in stages for _, k, _ in _SERIES for v in _samples(s, k)]
    lo, hi = (min(allv), max(allv)) if allv else (0.0, 1.0)
    width = (hi - lo) / 40 if hi > lo else max(abs(hi), 1e-3) / 20
    xbins = {"start": lo - width / 2, "end": hi + width, "size": width}
    _add_histograms(fig, stages, cols, xbins)
    fig.update_layout(
        template="plotly_white",
        barmode="overlay",
        height=max(350, 230 * nrows + 110),  # room under the axes for the y-scale buttons
        margin={"l": 50, "r": 130, "t": 40, "b": 50},
        legend={"orientation": "v", "x": 1.01, "y": 1, "yanchor": "top"},
        font=_FONT,
    )
    # one x title, under the first column: one per column ran together on a narrow page
    fig.update_xaxes(title_text="ms per micro-batch", row=nrows, col=1)
    fig.update_yaxes(title_text="micro-batches", col=1)
    # counts are whole micro-batches: integer ticks, one y-scale for every stage (a toggle frees it)
    edges = np.arange(xbins["start"], xbins["end"] + width, width)
    ymax = max(
        (
            int(np.histogram(_samples(st, k), bins=edges)[0].max())
            for st in stages
            for _, k, _ in _SERIES
            if getattr(st, k)
        ),
        default=1,
    )
    top = max(1.0, ymax * 1.08)
    fig.update_yaxes(range=[0, top], tickformat="d", rangemode="tozero", dtick=1 if ymax <= 8 else None)
    axes = ["yaxis" + ("" if i == 0 else str(i + 1)) for i in range(nrows * cols)]
    fig.update_layout(updatemenus=[_y_scale_menu(axes, top)])
    fig.update_layout(margin={"l": 50, "r": 130, "t": 70, "b": 100})
    if slow is not None:
        _frame_slowest(fig, slow)
    return fig_dict(fig)


def lost_rows(report: Report) -> tuple[list[str], list[StageRow] | list[RankRow], str]:
    """(labels, rows, "stage" or "rank"): the rows the lost-time figure draws, per stage, or per
    rank for a run without stages (the 64 ranks that lose most, in rank order)."""
    if report.stages:
        return [f"stage {s.stage}" for s in report.stages], report.stages, "stage"
    ranks = list(report.ranks)
    if len(ranks) > 64:
        ranks = sorted(ranks, key=lambda r: -sum(num(v) or 0 for v in r.lost_ms.values()))[:64]
        ranks.sort(key=lambda r: r.rank)
    return [f"rank {r.rank}" for r in ranks], ranks, "rank"


def lost_figure(report: Report) -> PlotlyFigure | None:
    """Lost time per step by cause, stacked, per stage (per rank for runs without stages)."""
    import plotly.graph_objects as go

    labels, rows, _what = lost_rows(report)
    if not rows:
        return None
    fig = go.Figure()
    for c in Cause:
        ys = [num(r.lost_ms.get(c)) or 0.0 for r in rows]
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
        font=_FONT,
    )
    return fig_dict(fig)


def bubble_figure(report: Report) -> PlotlyFigure | None:
    """Measured vs theoretical bubble ratio (two bars)."""
    import plotly.graph_objects as go

    meas, theo = num(report.bubble.measured_ratio), num(report.bubble.theoretical_ratio)
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
        font=_FONT,
    )
    return fig_dict(fig)


def fig_dict(fig: Any) -> PlotlyFigure:
    """A plotly figure as the page's figure dict (its data and layout)."""
    return {
        "data": fig.to_plotly_json()["data"],
        "layout": fig.to_plotly_json()["layout"],
    }


def fig_json(figs: dict[str, PlotlyFigure]) -> str:
    """The figures as one JSON object that is safe inside a ``<script>`` element."""
    import plotly.io as pio
    from plotly.utils import PlotlyJSONEncoder

    try:
        text = json.dumps(figs, cls=PlotlyJSONEncoder, separators=(",", ":"))
    except TypeError:  # pragma: no cover - very old plotly
        text = pio.to_json(figs)
    # inside <script>, "</script>" or "<!--" in a string would end or confuse the element
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
