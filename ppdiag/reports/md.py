"""Markdown summary for CI step summaries and PR comments (docs/json.md).

Compact on purpose: the headline, where the step goes, the gate verdict when there is one, a
per-stage table (per-rank for runs without pipeline stages), the top findings with their gain and
first fix. Strings from traces are escaped so a kernel name cannot inject markup.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from ppdiag.report_shares import report_slowest_stage, share_of
from ppdiag.report_types import Cause, FindingRow, Gate, RankRow, Report, RunInfo, Schedule
from ppdiag.reports import register
from ppdiag.reports.sanitize import clean, md_neutral
from ppdiag.reports.style import CAUSE_MARKS, cause_label, fmt_ms, fmt_pct, num, ranks_text

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed

_MD_SPECIAL = "\\`*_[]|~#"


def md_escape(s: object) -> str:
    """Escape text for Markdown (and the HTML GitHub renders inside it); one line."""
    t = html.escape(clean("" if s is None else str(s)), quote=False)
    t = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in t)
    return md_neutral(" ".join(t.split()))


def _f(x: float | None, nd: int = 2) -> str:
    v = num(x)
    return "—" if v is None else f"{v:.{nd}f}"


def _mark(c: str | None) -> str:
    return CAUSE_MARKS.get(c or "", "")


def _pipeline_text(run: RunInfo) -> str:
    pp, sched = run.pp, run.schedule
    if pp == 1 or sched == Schedule.NONE:
        doubt = run.structure.headline() if run.structure is not None else None
        return md_escape(doubt) if doubt else "no pipeline parallelism"
    txt = f"{md_escape(sched)}, P={md_escape(pp)}"
    if run.microbatches:
        txt += f", M={md_escape(run.microbatches)}"
    if run.virtual_stages > 1:
        txt += f", v={md_escape(run.virtual_stages)}"
    return txt


def _gate_md(gate: Gate) -> list[str]:
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}.get(gate.status, "")
    out = [f"### Gate: {icon} {gate.status.upper()} (exit {md_escape(gate.exit_code)})", ""]
    for r in gate.reasons:
        out.append(f"- {md_escape(r)}")
    if gate.allow_partial:
        # what did not take part, said even when --allow-partial let the gate pass
        for r in gate.partial:
            out.append(f"- not part of the gate: {md_escape(r)}")
    if gate.checks:
        if gate.reasons:
            out.append("")
        out += ["| | check |", "|---|---|"]
        for c in gate.checks:
            ic = {"pass": "✅", "fail": "❌", "skip": "➖", "inconclusive": "⚠️"}.get(c.state, "")
            out.append(f"| {ic} | {md_escape(c.text)} |")
    out.append("")
    return out


def _top_cause(lost: dict[str, float]) -> str:
    top = max(Cause, key=lambda c: lost.get(c, 0.0))
    return f"{_mark(top)} {cause_label(top)}" if lost.get(top, 0.0) > 0 else "—"


def _head_md(report: Report) -> list[str]:
    """The headline and the run's facts."""
    run, s = report.run, report.summary
    out = [f"## ppdiag: {fmt_ms(s.step_ms)} per step, {fmt_pct(s.lost_ratio)} lost", ""]
    steps = run.steps
    facts = [f"**{_pipeline_text(run)}**", md_escape(ranks_text(run))]
    if steps:
        facts.append(f"steps {min(steps)}–{max(steps)}" if len(steps) > 1 else f"step {steps[0]}")
    facts.append(md_escape(run.format))
    if s.step_p95_ms is not None:
        facts.append(f"step p95 {fmt_ms(s.step_p95_ms)}")
    return [*out, " · ".join(facts), ""]


def _where_md(report: Report) -> list[str]:
    """Where the step goes: compute and every cause, with its share of the mean step."""
    s = report.summary
    lost = {c: s.lost_ms.get(c, 0.0) for c in Cause}
    out: list[str] = []
    # every share is of the mean step over the same steps the causes are averaged on
    mean_step = s.step_mean_ms or s.step_ms
    if mean_step and s.step_mean_ms is not None:
        out += [f"Shares are of the mean step, {fmt_ms(mean_step)}.", ""]
    out += ["| where the step goes | ms / step | % of step |", "|---|---:|---:|"]
    if s.compute_ms is not None:
        out.append(f"| compute | {s.compute_ms:.2f} | {fmt_pct(share_of(s, 'compute'))} |")
    for c in sorted(Cause, key=lambda c: -lost[c]):
        if lost[c] <= 0:
            continue
        out.append(f"| {_mark(c)} {cause_label(c)} | {lost[c]:.2f} | {fmt_pct(share_of(s, c))} |")
    meas, theo = report.bubble.measured_ratio, report.bubble.theoretical_ratio
    if meas is not None or theo is not None:
        out += ["", f"Bubble: measured {fmt_pct(meas)} vs theoretical {fmt_pct(theo)}."]
    out.append("")
    return out


def _stages_md(report: Report) -> list[str]:
    stages = report.stages
    slow = report_slowest_stage(report)
    out = [
        "### Stages",
        "",
        "| stage | ranks | F ms | B ms | compute ms | lost ms | top cause |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for i, st in enumerate(stages):
        tot = sum(st.lost_ms.values())
        rk = ", ".join(md_escape(r) for r in st.ranks[:6]) + (" …" if len(st.ranks) > 6 else "")
        name = f"{md_escape(st.stage)}" + (" **slowest**" if i == slow else "")
        f_ms = st.fwd_ms.mean if st.fwd_ms is not None else None
        b_ms = st.bwd_ms.mean if st.bwd_ms is not None else None
        out.append(
            f"| {name} | {rk} | {_f(f_ms)} | {_f(b_ms)} | {_f(st.compute_ms)} | {tot:.2f} "
            f"| {_top_cause(st.lost_ms)} |"
        )
    out.append("")
    return out


def _ranks_md(ranks: list[RankRow]) -> list[str]:
    if not ranks:
        return []
    shown = sorted(ranks, key=lambda r: -sum(r.lost_ms.values()))[:16]
    title = (
        "### Ranks"
        if len(shown) == len(ranks)
        else f"### Ranks (the {len(shown)} with most lost time of {len(ranks)})"
    )
    out = [title, "", "| rank | step ms | compute ms | lost ms | top cause |", "|---:|---:|---:|---:|---|"]
    for r in sorted(shown, key=lambda r: r.rank):
        out.append(
            f"| {md_escape(r.rank)} | {_f(r.step_ms)} | {_f(r.compute_ms)} | "
            f"{sum(r.lost_ms.values()):.2f} | {_top_cause(r.lost_ms)} |"
        )
    out.append("")
    return out


def _findings_md(finds: list[FindingRow], max_findings: int) -> list[str]:
    if not finds:
        return ["No finding: nothing worth fixing was detected.", ""]
    out = ["### Top findings", ""]
    for i, f in enumerate(finds[:max_findings], 1):
        gain, gp = f.gain_ms, f.gain_pct
        g = (
            f", gain ≈ {fmt_ms(gain)}/step" + (f" ({gp:.1f} %)" if gp is not None else "")
            if gain is not None
            else ""
        )
        ctext = f"{_mark(f.cause)} {cause_label(f.cause)}" if f.cause else "general"
        # two trailing spaces: a hard line break, so the fix sits on its own line in the item
        brk = "  " if f.fixes else ""
        out.append(f"{i}. **{md_escape(f.code)}** {md_escape(f.title)} — {ctext}{g}{brk}")
        if f.fixes:
            out.append(f"   Fix: {md_escape(f.fixes[0])}")
    if len(finds) > max_findings:
        out.append(f"\n{len(finds) - max_findings} more finding(s) in the full report.")
    out.append("")
    return out


def render_markdown(
    report: Report, gate: Gate | None = None, max_findings: int = 5, html_name: str | None = None
) -> str:
    """The Markdown summary of one report (plus a gate verdict when given; default: the report's
    own ``gate``). Every string from the traces goes through :func:`md_escape`."""
    gate = gate if gate is not None else report.gate
    out = _head_md(report)
    if gate is not None:
        out += _gate_md(gate)
    out += _where_md(report)
    out += _stages_md(report) if report.stages else _ranks_md(report.ranks)
    out += _findings_md(report.findings, max_findings)
    warns = report.run.warnings
    if warns:
        out.append(f"<details><summary>{len(warns)} warning(s)</summary>\n")
        out += [f"- {md_escape(w)}" for w in warns[:50]]
        if len(warns) > 50:
            out.append(f"- … {len(warns) - 50} more")
        out += ["", "</details>", ""]
    if html_name:
        out.append(f"Full report: {md_escape(html_name)} (timeline, histograms, evidence).")
        out.append("")
    return "\n".join(out)


def write_markdown(diag: Analyzed, path: str | Path, gate: Gate | None = None) -> Path:
    """Write the Markdown summary of ``diag`` (the gate from ``gate`` or the report's own)."""
    p = Path(path)
    _write_text(render_markdown(diag.result, gate=gate), p)
    return p


def _write_text(markdown: str, path: Path) -> None:
    """``markdown`` with ppdiag's marker as its last line (the headline stays first for PR comments
    and CI summaries)."""
    from ppdiag.io import md_marker

    text = markdown.rstrip("\n") + "\n\n" + md_marker() + "\n"
    path.write_text(text, encoding="utf-8", errors="backslashreplace")


class MarkdownReporter:
    """Reporter ``md``: the CI / PR summary."""

    name = "md"
    suffix = ".md"

    def write(self, diagnosis: Analyzed, path: Path) -> None:
        write_markdown(diagnosis, path)

    def write_result(self, report: Report, path: Path) -> None:
        """The file from the report alone (a re-run served by the result cache has nothing else)."""
        _write_text(render_markdown(report), path)


register(MarkdownReporter())
