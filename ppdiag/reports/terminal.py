"""Terminal report (rich): headline, per-stage and per-rank tables, findings with fixes."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.reports.sanitize import clean_tree
from ppdiag.reports.style import CAUSE_LABELS, share, share_step_ms, slowest_stage

SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _f(v: Any, nd: int = 2) -> str:
    return "-" if v is None else f"{float(v):.{nd}f}"


def headline(report: dict[str, Any]) -> Text:
    s = report["summary"]
    run = report["run"]
    t = Text()
    step = s.get("step_ms")
    lost = s.get("lost_ratio")
    t.append(f"step {_f(step)} ms", style="bold")
    if s.get("step_mean_ms") is not None:
        t.append(f" median, mean {_f(s.get('step_mean_ms'))}, p95 {_f(s.get('step_p95_ms'))}")
    if lost is not None:
        t.append(f"  ·  lost {lost * 100:.1f}%", style="bold red" if lost > 0.25 else "bold")
    top = sorted(((k, v) for k, v in s["lost_ms"].items() if v > 0), key=lambda kv: -kv[1])[:3]
    if top and share_step_ms(s):
        t.append("  ·  ")
        t.append(
            ", ".join(f"{CAUSE_LABELS[k]} {v:.1f} ms ({(share(s, k) or 0.0) * 100:.0f}%)" for k, v in top)
        )
    t.append("\n")
    pp = run.get("pp", 1)
    if pp and pp > 1:
        t.append(
            f"pipeline: {pp} stages, schedule {run['schedule']}, M={run.get('microbatches')}", style="cyan"
        )
        if run.get("virtual_stages", 1) > 1:
            t.append(f", v={run['virtual_stages']}", style="cyan")
        b = report.get("bubble") or {}
        if b.get("measured_ratio") is not None:
            t.append(f"  ·  bubble measured {b['measured_ratio'] * 100:.1f}%")
            if b.get("theoretical_ratio") is not None:
                t.append(f" vs schedule {b['theoretical_ratio'] * 100:.1f}%")
    else:
        t.append("no pipeline parallelism found", style="cyan")
    t.append(
        f"\n{run['world_size']} ranks in the run, {len(run['ranks'])} traced ({run['format']}"
        f"{', CPU-only' if run.get('cpu_only') else ''}), steps {run['steps']}"
    )
    if run.get("clock_residual_us") is not None:
        t.append(f", clock residual {run['clock_residual_us']:.1f} µs")
    return t


def stage_table(report: dict[str, Any]) -> Table | None:
    stages = report.get("stages") or []
    if not stages:
        return None
    t = Table(title="Per stage (ms per step; fwd/bwd per micro-batch)", title_justify="left")
    t.add_column("stage", justify="right")
    t.add_column("ranks")
    t.add_column("fwd", justify="right")
    t.add_column("bwd", justify="right")
    has_w = any(s.get("wgrad_ms") for s in stages)
    if has_w:
        t.add_column("wgrad", justify="right")
    t.add_column("compute", justify="right")
    for k in CAUSE_KEYS:
        t.add_column(CAUSE_LABELS[k], justify="right")
    idx = slowest_stage(stages)
    slow = stages[idx]["stage"] if idx is not None else None
    for s in stages:
        row = [
            str(s["stage"]),
            ",".join(map(str, s["ranks"])),
            _f((s.get("fwd_ms") or {}).get("mean")),
            _f((s.get("bwd_ms") or {}).get("mean")),
        ]
        if has_w:
            row.append(_f((s.get("wgrad_ms") or {}).get("mean")))
        row.append(_f(s.get("compute_ms")))
        row += [_f(s["lost_ms"].get(k)) for k in CAUSE_KEYS]
        t.add_row(*row, style="bold" if s["stage"] == slow else None)
    return t


def rank_table(report: dict[str, Any], limit: int = 64) -> Table:
    t = Table(title="Per rank (ms, mean per step)", title_justify="left")
    for c in ("rank", "stage", "step", "compute", "exp. p2p", "exp. coll", "exp. copy", "idle"):
        t.add_column(c, justify="right")
    for k in CAUSE_KEYS:
        # the labels of the HTML and Markdown reports; a narrow column wraps them, never cuts them
        t.add_column(CAUSE_LABELS[k], justify="right", overflow="fold")
    rows = report["ranks"]
    for r in rows[:limit]:
        t.add_row(
            str(r["rank"]),
            "-" if r.get("stage") is None else str(r["stage"]),
            _f(r["step_ms"]),
            _f(r["compute_ms"]),
            _f(r["exposed_p2p_ms"]),
            _f(r["exposed_collective_ms"]),
            _f(r.get("exposed_copy_ms")),
            _f(r["idle_ms"]),
            *[_f(r["lost_ms"].get(k, 0.0)) for k in CAUSE_KEYS],
        )
    if len(rows) > limit:
        t.caption = f"{len(rows) - limit} more ranks in the JSON report"
    return t


def findings_panel(report: dict[str, Any], limit: int = 10) -> Group | Text:
    fs = report.get("findings") or []
    if not fs:
        return Text("No findings: nothing stands out.", style="green")
    parts: list[Any] = []
    for f in fs[:limit]:
        head = Text()
        head.append(f"{f['code']} ", style="bold")
        head.append(f"[{f['severity']}] ", style=SEV_STYLE.get(f["severity"], ""))
        head.append(f["title"])
        if f.get("gain_ms"):
            head.append(f"  (gain ≈ {f['gain_ms']:.1f} ms/step, {f['gain_pct']:.0f}%)", style="green")
        body = Text()
        ev = f.get("evidence") or {}
        if ev:
            body.append(
                "evidence: " + ", ".join(f"{k}={v}" for k, v in list(ev.items())[:8]) + "\n", style="dim"
            )
        for fix in f.get("fixes", [])[:4]:
            body.append(f"  → {fix}\n")
        parts.append(Panel(Group(head, body), expand=True, border_style=SEV_STYLE.get(f["severity"], "")))
    if len(fs) > limit:
        parts.append(Text(f"{len(fs) - limit} more findings in the JSON report", style="dim"))
    return Group(*parts)


def render(report: dict[str, Any], console: Console | None = None, ranks: bool = True) -> None:
    """Print the whole terminal report (trace strings without escape sequences or controls)."""
    report = clean_tree(report)
    con = console or Console()
    con.print(Panel(headline(report), title="ppdiag", border_style="blue"))
    st = stage_table(report)
    if st is not None:
        con.print(st)
    if ranks:
        con.print(rank_table(report))
    con.print(findings_panel(report))
    if report.get("whatif"):
        from ppdiag.whatif.render import whatif_table

        con.print(
            whatif_table(
                report["whatif"], "What if (simulated from the measured stage costs)", lost=False, notes=True
            )
        )
    warns = report["run"].get("warnings") or []
    if warns:
        con.print(Text(f"warnings ({len(warns)}):", style="yellow"))
        for w in warns[:20]:
            con.print(Text("  " + w, style="yellow"))
        if len(warns) > 20:
            con.print(Text(f"  … {len(warns) - 20} more in the JSON report", style="yellow"))


__all__ = ["escape", "render"]
