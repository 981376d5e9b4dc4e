"""The pipeline timeline of the HTML report as a plotly figure dict: one bar trace per category
(never one trace per block), the step boundaries and the step buttons, and the critical path
outlined with transfer arrows.

Strings from traces are entity-escaped inside plotly labels too (plotly interprets a few tags).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Direction
from ppdiag.report_types import Cause
from ppdiag.reports.html_blocks import CAT_ORDER, COMPUTE_CATS
from ppdiag.reports.html_figures import PlotlyFigure, fig_dict
from ppdiag.reports.html_model import (
    TEXT_LIMIT,
    BlockSet,
    StepSpan,
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
)

I64 = npt.NDArray[np.int64]

# Row geometry (y units, one row per unit): the main band holds compute and gaps, the strip under it
# holds communication kernels, so a recv that spins during a wait stays visible next to its cause.
_MAIN_Y, _MAIN_H = -0.07, 0.62
_COMM_Y, _COMM_H = 0.33, 0.16

PATH_COLOR = "#111111"
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif"}


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
            lab = _block_label(td, letter, int(lo[i]), int(hi[i]), int(chunk[i]))
            texts.append(lab if label_ok else "")
            head = f"<b>{esc(WORK_LABELS[bs.category])}{(' ' + lab) if lab else ''}</b>"
            what = f"{int(cnt[i])} kernels, longest: {kname}" if cnt[i] > 1 else kname
            if hidden[i] > 0:
                what += (
                    f"<br>includes {hidden[i] / 1e6:.3f} ms of short gaps (lost time, counted by cause "
                    "in the tables)"
                )
        else:
            head = _comm_head(bs.category, int(peer[i]), int(dirn[i]))
            texts.append("")
            what = f"{int(cnt[i])} kernels, longest: {kname}" if cnt[i] > 1 else kname
        hovers.append(f"{head} · {dur:.3f} ms<br>{where} · at {at:.3f} ms<br>{what}")
    return texts, hovers


def _block_label(td: TimelineData, letter: str, lo: int, hi: int, chunk: int) -> str:
    """``F3``, ``B3–5`` (merged micro-batches), with ``·v1`` for a later virtual-stage chunk."""
    if lo >= 0 and lo == hi:
        lab = f"{letter}{lo}"
    elif lo >= 0:
        lab = f"{letter}{lo}–{hi}"
    else:
        lab = letter
    if td.virtual and chunk >= 0 and lab:
        lab += f"·v{td.chunk_index(chunk)}"
    return lab


_VERBS = {
    int(Direction.SEND): "send to",
    int(Direction.RECV): "recv from",
    int(Direction.BOTH): "send/recv with",
}


def _comm_head(category: str, peer: int, direction: int) -> str:
    """The hover's head of a communication block: the p2p partner, or the kind."""
    if category == "p2p" and peer >= 0:
        return f"<b>{_VERBS.get(direction, 'p2p with')} rank {peer}</b>"
    return f"<b>{esc(WORK_LABELS[category])}</b>"


def _category_trace(td: TimelineData, bs: BlockSet, label_ok: bool) -> Any:
    """The bar trace of one category (a kind of work, or a cause of lost time)."""
    import plotly.graph_objects as go

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
    return go.Bar(
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


def _step_marks(td: TimelineData, drawn: list[StepSpan]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(shapes, annotations): a dotted line at every step boundary and each step's label."""
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
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
    return shapes, annotations


def _zoom_button(label: str, a: float, b: float) -> dict[str, Any]:
    pad = 0.01 * (b - a)
    return {"label": label, "method": "relayout", "args": [{"xaxis.range": [a - pad, b + pad]}]}


def _step_buttons(td: TimelineData, drawn: list[StepSpan]) -> list[dict[str, Any]]:
    """One button per drawn step that zooms to it, and one for all drawn steps."""
    buttons = [
        _zoom_button(
            esc(sp.label + (" (median)" if sp.median else "")),
            (sp.start - td.t0) / 1e6,
            (sp.end - td.t0) / 1e6,
        )
        for sp in sorted(drawn, key=lambda s: s.index)
    ]
    if len(drawn) > 1:
        a = (min(s.start for s in drawn) - td.t0) / 1e6
        b = (max(s.end for s in drawn) - td.t0) / 1e6
        buttons.append(_zoom_button("all drawn steps", a, b))
    return buttons


def _button_menu(td: TimelineData, drawn: list[StepSpan], buttons: list[dict[str, Any]]) -> dict[str, Any]:
    return {
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
            (i for i, sp in enumerate(sorted(drawn, key=lambda x: x.index)) if sp is td.shown),
            0,
        ),
        "font": {"size": 11},
        "bgcolor": "#f4f6f8",
        "bordercolor": "#c8ced6",
    }


def _timeline_layout(td: TimelineData, legend_h: int, drawn: list[StepSpan]) -> dict[str, Any]:
    """The figure layout: axes, legend under the axis, step marks and buttons."""
    n = len(td.rows)
    shapes, annotations = _step_marks(td, drawn)
    xr = None
    if td.shown is not None:
        a, b = (td.shown.start - td.t0) / 1e6, (td.shown.end - td.t0) / 1e6
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
        "font": _FONT,
    }
    buttons = _step_buttons(td, drawn)
    if len(buttons) > 1:
        layout["updatemenus"] = [_button_menu(td, drawn, buttons)]
        layout["margin"]["t"] = 80
    return layout


def timeline_figure(td: TimelineData) -> PlotlyFigure:
    """The pipeline timeline as a plotly figure dict (one bar trace per category)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    label_ok = td.n_blocks <= TEXT_LIMIT
    order = [c for c in CAT_ORDER if c in td.sets] + [f"cause:{c}" for c in Cause if f"cause:{c}" in td.sets]
    for key in order:
        if len(td.sets[key]):
            fig.add_trace(_category_trace(td, td.sets[key], label_ok))
    _add_path_traces(fig, td)
    # the legend sits under the axis, one column per group: room for the longer group
    n_work = sum(1 for k in order if not k.startswith("cause:"))
    legend_h = 75 + 19 * max(n_work, len(order) - n_work, 1)
    fig.update_layout(**_timeline_layout(td, legend_h, [s for s in td.spans if s.drawn]))
    return fig_dict(fig)


def _shade(color: str, chunk: int) -> str:
    """``color`` mixed with white for virtual-stage chunk ``chunk`` (0: unchanged)."""
    if chunk <= 0:
        return color
    f = min(0.6, 0.3 * chunk)
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * f):02X}" for c in rgb)


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


__all__ = ["PATH_COLOR", "timeline_figure"]
