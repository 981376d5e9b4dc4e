"""The plotly figures of the HTML report (figure dicts, no page): the pipeline timeline (one bar
trace per category, never one trace per block; the critical path outlined with transfer arrows),
the per-stage histograms, lost time by cause, the bubble and the stage x replica heat map.

Strings from traces are entity-escaped inside plotly labels too (plotly interprets a few tags).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.model.timeline import Direction
from ppdiag.reports.html_model import (
    CAT_ORDER,
    COMPUTE_CATS,
    MAX_ROWS,
    TEXT_LIMIT,
    BlockSet,
    TimelineData,
    esc,
    short_name,
)
from ppdiag.reports.style import (
    CAUSE_COLORS,
    CAUSE_LABELS,
    PHASE_LETTERS,
    WORK_COLORS,
    WORK_LABELS,
    cause_label,
    num,
    slowest_stage,
)

I64 = npt.NDArray[np.int64]

# Row geometry (y units, one row per unit): the main band holds compute and gaps, the strip under it
# holds communication kernels, so a recv that spins during a wait stays visible next to its cause.
_MAIN_Y, _MAIN_H = -0.07, 0.62
_COMM_Y, _COMM_H = 0.33, 0.16

COMPUTE_COLOR = "#3A4A5C"

# ----------------------------------------------------------------------------------------------
# figures


def _block_texts(td: TimelineData, bs: BlockSet, label_ok: bool) -> tuple[list[str], list[str]]:
    """Per-block label and hover text (plotly text: names entity-escaped)."""
    rows = {r.y: r for r in td.rows}
    ys = bs.cat("row")
    st, en = bs.cat("start"), bs.cat("end")
    cnt, lo, hi = bs.cat("count"), bs.cat("mb_lo"), bs.cat("mb_hi")
    chunk, peer, dirn, name = (
        bs.cat("chunk"),
        bs.cat("peer"),
        bs.cat("direction"),
        bs.cat("name"),
    )
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
        kname = esc(short_name(names[nid])) if 0 <= nid < len(names) else ""
        if bs.category in COMPUTE_CATS:
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
    order = [c for c in CAT_ORDER if c in td.sets] + [
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
        if td.virtual and bs.category in COMPUTE_CATS and not bs.is_cause:
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
            {
                "label": "all drawn steps",
                "method": "relayout",
                "args": [{"xaxis.range": [a - pad, b + pad]}],
            }
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
                    (i for i, sp in enumerate(sorted(drawn, key=lambda x: x.index)) if sp is shown),
                    0,
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
                marker={
                    "color": "rgba(0,0,0,0)",
                    "line": {"color": PATH_COLOR, "width": 2.5},
                },
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
                marker={
                    "symbol": "arrow",
                    "angleref": "previous",
                    "size": sizes,
                    "color": PATH_COLOR,
                },
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


def stage_rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in rep.get("stages") or [] if isinstance(s, dict)]


def histogram_figure(rep: dict[str, Any]) -> dict[str, Any] | None:
    """Per-stage histograms of forward/backward (and W) time per micro-batch; the slowest stage framed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stages = stage_rows(rep)
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
                    error_y={
                        "type": "data",
                        "array": err,
                        "symmetric": False,
                        "arrayminus": [0] * len(err),
                    },
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
                    marker={
                        "color": WORK_COLORS[cat],
                        "line": {"width": 0.5, "color": "#fff"},
                    },
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
                np.histogram(
                    [float(v) for v in (st.get(k) or []) if num(v) is not None],
                    bins=edges,
                )[0].max()
            )
            for st in stages
            for _, k, _ in series
            if st.get(k)
        ),
        default=1,
    )
    top = max(1.0, ymax * 1.08)
    fig.update_yaxes(
        range=[0, top],
        tickformat="d",
        rangemode="tozero",
        dtick=1 if ymax <= 8 else None,
    )
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
    stages = stage_rows(rep)
    if stages and any(isinstance(s.get("lost_ms"), dict) for s in stages):
        return [f"stage {s.get('stage')}" for s in stages], stages, "stage"
    ranks = [r for r in rep.get("ranks") or [] if isinstance(r, dict)]
    if len(ranks) > 64:
        ranks = sorted(
            ranks,
            key=lambda r: -sum(num(v) or 0 for v in (r.get("lost_ms") or {}).values()),
        )[:64]
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
        xaxis={
            "title": {"text": "bubble, % of step time"},
            "range": [0, max(vals) * 1.25 + 1],
        },
        font={"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"},
    )
    return _fig_dict(fig)


def _fig_dict(fig: Any) -> dict[str, Any]:
    return {
        "data": fig.to_plotly_json()["data"],
        "layout": fig.to_plotly_json()["layout"],
    }


def fig_json(figs: dict[str, dict[str, Any]]) -> str:
    import plotly.io as pio
    from plotly.utils import PlotlyJSONEncoder

    try:
        text = json.dumps(figs, cls=PlotlyJSONEncoder, separators=(",", ":"))
    except TypeError:  # pragma: no cover - very old plotly
        text = pio.to_json(figs)
    # inside <script>, "</script>" or "<!--" in a string would end or confuse the element
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
