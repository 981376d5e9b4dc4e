"""Terminal rendering of what-if rows, shared by ``ppdiag whatif`` and the analysis report."""

from __future__ import annotations

from typing import Any

from rich.table import Table


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


def whatif_table(
    rows: list[dict[str, Any]], title: str = "What if", lost: bool = True, notes: bool = False
) -> Table:
    """A rich table of what-if rows (``report["whatif"]`` or the ``whatif`` command's scenarios).

    ``lost``: a column with the top lost-time causes; ``notes``: the scenario notes in the last
    column (otherwise the caller lists them under the table).
    """
    t = Table(title=title, title_justify="left")
    t.add_column("scenario")
    t.add_column("step ms", justify="right")
    t.add_column("speed-up", justify="right")
    t.add_column("bubble", justify="right")
    if lost:
        t.add_column("lost ms, top causes")
    t.add_column("peak act.", justify="right")
    if notes:
        t.add_column("note")
    for r in rows:
        if r.get("error"):
            t.add_row(*_error_cells(r, lost, notes), style="yellow")
        else:
            t.add_row(*_cells(r, lost, notes), style="bold" if r.get("measured") else None)
    captions = []
    if any(_per_sample(r) for r in rows):
        captions.append("* per sample: the step processes a different number of samples")
    basis = _memory_caption(rows)
    if basis:
        captions.append(basis)
    if captions:
        t.caption = "\n".join(captions)
    return t


def _per_sample(r: dict[str, Any]) -> bool:
    """The row's speed-up per sample differs from its speed-up per step (marked with a ``*``)."""
    sp, step_sp = r.get("speedup"), r.get("step_speedup")
    return step_sp is not None and sp is not None and abs(step_sp - sp) > 5e-3


def _error_cells(r: dict[str, Any], lost: bool, notes: bool) -> list[str]:
    """The cells of a scenario that could not be computed."""
    cells = [str(r.get("scenario")), "n/a", "", "", *([""] if lost else []), ""]
    if notes:
        cells.append(f"not possible: {r['error']}")
    return cells


def _cells(r: dict[str, Any], lost: bool, notes: bool) -> list[str]:
    """The cells of a computed scenario, in the columns :func:`whatif_table` laid out."""
    sp = r.get("speedup")
    sp_txt = "-" if sp is None else f"{sp:.2f}x"
    if _per_sample(r):
        sp_txt += "*"
    act = r.get("activation_vs_measured")
    act_txt = "-" if act is None else f"{act:.2f}x"
    row = [str(r.get("scenario")), fmt_ms(r.get("step_ms")), sp_txt, fmt_pct(r.get("bubble_ratio"))]
    if lost:
        lm = r.get("lost_ms") or {}
        top = sorted(((k, v) for k, v in lm.items() if v and v > 0.005), key=lambda kv: -kv[1])[:2]
        row.append(", ".join(f"{_CAUSE_SHORT.get(k, k)} {v:.1f}" for k, v in top) or "-")
    row.append(act_txt)
    if notes:
        row.append(str(r.get("note") or ""))
    return row


def _memory_caption(rows: list[dict[str, Any]]) -> str:
    """What the 'peak act.' column rests on: measured memory, or the schedule alone."""
    bases = {
        r.get("memory_basis")
        for r in rows
        if not r.get("error") and r.get("activation_vs_measured") is not None
    }
    if not bases:
        return ""
    if bases <= {"predicted"}:
        return "peak act.: predicted from the schedule, not measured (the traces carry no memory events)"
    return "peak act.: calibrated on the measured activation memory (allocator events)"


__all__ = ["fmt_ms", "fmt_pct", "whatif_table"]
