"""Terminal rendering of what-if rows, shared by ``ppdiag whatif`` and the analysis report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from rich.table import Table

from ppdiag.report_types import WhatifRow

#: From this step time on, the table shows seconds.
SECONDS_FROM_MS = 10_000.0


def fmt_pct(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 100:.1f}%"


def fmt_ms(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"


_CAUSE_SHORT = {
    "bubble": "bubble",
    "imbalance": "imbal.",
    "comm_wait": "comm wait",
    "exposed_comm": "exp. comm",
    "host": "host",
    "unexplained": "unexpl.",
}


def typed_rows(rows: Sequence[dict[str, Any]]) -> list[WhatifRow]:
    """The ``whatif`` command's scenario rows (``Prediction.to_json``) as the report's typed rows
    (they name no finding's fix)."""
    return [msgspec.convert({"fix": "", **r}, WhatifRow) for r in rows]


def whatif_table(
    rows: Sequence[WhatifRow], title: str = "What if", lost: bool = True, notes: bool = False
) -> Table:
    """A rich table of what-if rows (``report.whatif`` or the ``whatif`` command's scenarios).

    ``lost``: a column with the top lost-time causes; ``notes``: the scenario notes in the last
    column (otherwise the caller lists them under the table).
    """
    t = Table(title=title, title_justify="left")
    # seconds from a 10 s step on, as the analysis report's tables (not "46666.27")
    k = 1e3 if max((r.step_ms or 0.0 for r in rows), default=0.0) >= SECONDS_FROM_MS else 1.0
    unit = "s" if k > 1 else "ms"
    t.add_column("scenario")
    t.add_column(f"step {unit}", justify="right")
    t.add_column("speed-up", justify="right")
    t.add_column("bubble", justify="right")
    if lost:
        t.add_column(f"lost {unit}, top causes")
    t.add_column("peak act.", justify="right")
    if notes:
        t.add_column("note")
    for r in rows:
        if r.error:
            t.add_row(*_error_cells(r, lost, notes), style="yellow")
        else:
            t.add_row(*_cells(r, lost, notes, k), style="bold" if r.measured else None)
    captions = []
    if any(_per_sample(r) for r in rows):
        captions.append("* per sample: the step processes a different number of samples")
    basis = _memory_caption(rows)
    if basis:
        captions.append(basis)
    if captions:
        t.caption = "\n".join(captions)
    return t


def _per_sample(r: WhatifRow) -> bool:
    """The row's speed-up per sample differs from its speed-up per step (marked with a ``*``)."""
    sp, step_sp = r.speedup, r.step_speedup
    return step_sp is not None and sp is not None and abs(step_sp - sp) > 5e-3


def _error_cells(r: WhatifRow, lost: bool, notes: bool) -> list[str]:
    """The cells of a scenario that could not be computed."""
    cells = [r.scenario, "n/a", "", "", *([""] if lost else []), ""]
    if notes:
        cells.append(f"not possible: {r.error}")
    return cells


def _cells(r: WhatifRow, lost: bool, notes: bool, k: float = 1.0) -> list[str]:
    """The cells of a computed scenario, in the columns :func:`whatif_table` laid out (times
    divided by ``k``: 1 for ms, 1000 for seconds)."""
    sp = r.speedup
    sp_txt = "-" if sp is None else f"{sp:.2f}x"
    if _per_sample(r):
        sp_txt += "*"
    act = r.activation_vs_measured
    act_txt = "-" if act is None else f"{act:.2f}x"
    step = "-" if r.step_ms is None else f"{r.step_ms / k:.{3 if k > 1 else 2}f}"
    row = [r.scenario, step, sp_txt, fmt_pct(r.bubble_ratio)]
    if lost:
        lm = r.lost_ms
        top = sorted(((k, v) for k, v in lm.items() if v and v > 0.005), key=lambda kv: -kv[1])[:2]
        row.append(
            ", ".join(f"{_CAUSE_SHORT.get(c, c)} {v / k:.{2 if k > 1 else 1}f}" for c, v in top) or "-"
        )
    row.append(act_txt)
    if notes:
        row.append(r.note)
    return row


def _memory_caption(rows: Sequence[WhatifRow]) -> str:
    """What the 'peak act.' column rests on: measured memory, or the schedule alone."""
    bases = {str(r.memory_basis) for r in rows if not r.error and r.activation_vs_measured is not None}
    if not bases:
        return ""
    if bases <= {"predicted"}:
        return "peak act.: predicted from the schedule, not measured (the traces carry no memory events)"
    return "peak act.: calibrated on the measured activation memory (allocator events)"


__all__ = ["fmt_ms", "fmt_pct", "typed_rows", "whatif_table"]
