"""One palette and one vocabulary for every report (HTML, Markdown, Perfetto, terminal).

A cause has the same colour, label and marker wherever it is shown, so a reader who learned
"orange = stage imbalance" in the HTML timeline recognises it in the CI summary and in Perfetto.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ppdiag.report_types import Cause, Report, RunInfo, path_by_stage

#: Fill colour of each lost-time cause: the Okabe-Ito colour-blind-safe hues (orange, vermillion,
#: reddish purple, yellow), wine and brown from Paul Tol's muted set; bubble a light grey, because it
#: is the part of the idle time the schedule itself predicts. The three greys of the report (bubble,
#: other compute, optimizer) are far apart in lightness.
CAUSE_COLORS: dict[str, str] = {
    "bubble": "#DADDE2",
    "imbalance": "#E69F00",
    "comm_wait": "#D55E00",
    "exposed_comm": "#CC79A7",
    "host": "#F0E442",
    "exposed_copy": "#882255",
    "unexplained": "#8C6D46",
}

#: Human label of each cause, as docs/json.md names them.
CAUSE_LABELS: dict[str, str] = {
    "bubble": "pipeline bubble",
    "imbalance": "stage imbalance",
    "comm_wait": "recv / NCCL wait",
    "exposed_comm": "missing overlap",
    "host": "host / launch bound",
    "exposed_copy": "exposed copies",
    "unexplained": "unexplained",
}

#: Markdown has no colour: a coloured square close to each cause colour keeps the association.
CAUSE_MARKS: dict[str, str] = {
    "bubble": "⬜",
    "imbalance": "🟧",
    "comm_wait": "🟥",
    "exposed_comm": "🟪",
    "host": "🟨",
    "exposed_copy": "🟦",
    "unexplained": "🟫",
}

#: Chrome trace viewer reserved colour names nearest to the cause colours (Perfetto UI colours by
#: slice name instead; both keep one colour per cause).
CAUSE_CNAMES: dict[str, str] = {
    "bubble": "grey",
    "imbalance": "thread_state_iowait",
    "comm_wait": "terrible",
    "exposed_comm": "thread_state_uninterruptible",
    "host": "yellow",
    "exposed_copy": "rail_load",
    "unexplained": "olive",
}

#: Colours of the work drawn on the timeline, by category (Okabe-Ito blue, bluish green and sky
#: blue for F, B and W; a dark and a mid grey for optimizer and other compute).
WORK_COLORS: dict[str, str] = {
    "fwd": "#0072B2",
    "bwd": "#009E73",
    "wgrad": "#56B4E9",
    "optim": "#3B4250",
    "other": "#8E959F",
    "p2p": "#1B2A41",
    "collective": "#6A3D9A",
    "copy": "#A6761D",
}

WORK_LABELS: dict[str, str] = {
    "fwd": "forward",
    "bwd": "backward",
    "wgrad": "weight grad (W)",
    "optim": "optimizer",
    "other": "other compute",
    "p2p": "p2p send/recv",
    "collective": "collective",
    "copy": "memcpy / memset",
}

#: Short letter used in block labels (``F3``, ``B3``, ``W3``).
PHASE_LETTERS: dict[str, str] = {"fwd": "F", "bwd": "B", "wgrad": "W", "optim": "O", "other": ""}

SEVERITY_ORDER: dict[str, int] = {"high": 0, "medium": 1, "low": 2, "info": 3}
SEVERITY_COLORS: dict[str, str] = {
    "high": "#C0392B",
    "medium": "#D68910",
    "low": "#2874A6",
    "info": "#7F8C8D",
}

assert set(CAUSE_COLORS) == set(Cause), "every cause needs a colour"


def cause_label(key: str | None) -> str:
    """Label of a cause key; unknown keys (a newer report) are shown as they are."""
    if key is None:
        return "—"
    return CAUSE_LABELS.get(key, key)


def cause_color(key: str | None) -> str:
    """Colour of a cause key; grey for ``None`` or an unknown key."""
    if key is None:
        return "#7F8C8D"
    return CAUSE_COLORS.get(key, "#7F8C8D")


def fmt_ms(v: float | None, digits: int = 3) -> str:
    """Milliseconds with about ``digits`` significant digits (``12.3 ms``, ``0.0415 ms``)."""
    if v is None:
        return "—"
    a = abs(float(v))
    if a >= 1000:
        return f"{v:,.0f} ms"
    if a == 0:
        return "0 ms"
    dec = max(0, digits - 1 - int(_floor_log10(a)))
    return f"{v:.{min(dec, 4)}f} ms"


def fmt_pct(ratio: float | None, digits: int = 1) -> str:
    """A ratio shown as a percentage (``0.253`` → ``25.3 %``)."""
    if ratio is None:
        return "—"
    return f"{100.0 * float(ratio):.{digits}f} %"


def _floor_log10(a: float) -> float:
    import math

    return math.floor(math.log10(a))


def num(x: object) -> float | None:
    """A finite JSON number as float, else None (bools and NaN are not numbers here)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x)
    return None if math.isnan(v) else v


def ranks_text(run: RunInfo) -> str:
    """``"4 ranks"``, or ``"1 of 8 ranks traced"`` when the traces hold only part of the job."""
    traced = len(run.ranks)
    if run.world_size > traced:
        return f"{traced} of {run.world_size} ranks traced"
    return f"{traced} rank{'s' if traced != 1 else ''}"


def evidence_items(ev: Mapping[str, object], scalars_only: bool = False) -> list[tuple[str, str]]:
    """A finding's evidence as (name, value with unit): ``bubble_ms`` → ``("bubble", "47.07 ms")``,
    ``bubble_share_pct`` → ``("bubble share", "27.7 %")``, ``steps_used`` → ``("steps used", "3")``.
    Nested values (per-link tables) are shown compactly, or left out with ``scalars_only``."""
    out: list[tuple[str, str]] = []
    for k, v in ev.items():
        if isinstance(v, (dict, list)):
            if scalars_only or not v:
                continue
            val = _nested_text(v)
        elif isinstance(v, bool) or v is None:
            val = "yes" if v else "no"
        elif isinstance(v, (int, float)):
            val = _unit_value(k, float(v))
        else:
            val = str(v)
        out.append((_evidence_name(k), val))
    return out


_UNITS = (("_ms_per_step", "ms/step"), ("_ms", "ms"), ("_pct", "%"), ("_us", "µs"), ("_mb", "MB"))


def _evidence_name(key: str) -> str:
    for suffix, _ in _UNITS:
        if key.endswith(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ")


def _unit_value(key: str, v: float) -> str:
    for suffix, unit in _UNITS:
        if key.endswith(suffix):
            return f"{v:.2f} {unit}" if unit != "%" else f"{v:.1f} %"
    if key.endswith("ratio"):
        return fmt_pct(v)
    return f"{v:g}" if not float(v).is_integer() else str(int(v))


def _nested_text(v: object) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_nested_text(x)}" for k, x in list(v.items())[:8]) + (
            ", …" if len(v) > 8 else ""
        )
    if isinstance(v, list):
        return "[" + ", ".join(_nested_text(x) for x in v[:6]) + (", …" if len(v) > 6 else "") + "]"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


#: Columns of the critical-path table beside the causes: block compute, transfers into the stage,
#: compute outside blocks.
PATH_LABELS: dict[str, str] = {"compute": "compute", "transfer": "transfer in", "other": "other compute"}


def critical_path_rows(report: Report) -> list[tuple[int | None, dict[str, float]]]:
    """The report's ``critical_path[]`` as the mean ms per step on the path, per stage and
    category (``compute``, ``transfer``, ``other`` and the causes); empty without a path."""
    return [(r.stage, r.ms) for r in path_by_stage(report.critical_path or [])]
