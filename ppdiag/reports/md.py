"""Markdown summary for CI step summaries and PR comments (DESIGN.md §7).

Compact on purpose: the headline, where the step goes, the gate verdict when there is one, a
per-stage table (per-rank for runs without pipeline stages), the top findings with their gain and
first fix. Strings from traces are escaped so a kernel name cannot inject markup.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.reports import register
from ppdiag.reports.sanitize import clean, clean_tree, md_neutral
from ppdiag.reports.style import (
    CAUSE_MARKS,
    cause_label,
    fmt_ms,
    fmt_pct,
    num,
    ranks_text,
    share,
    share_step_ms,
    slowest_stage,
)

if TYPE_CHECKING:
    from ppdiag.diagnosis import Diagnosis

_MD_SPECIAL = "\\`*_[]|~#"


def md_escape(s: Any) -> str:
    """Escape text for Markdown (and the HTML GitHub renders inside it); one line."""
    t = html.escape(clean("" if s is None else str(s)), quote=False)
    t = "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in t)
    return md_neutral(" ".join(t.split()))


def _f(x: Any, nd: int = 2) -> str:
    v = num(x)
    return "—" if v is None else f"{v:.{nd}f}"


def _mark(c: str | None) -> str:
    return CAUSE_MARKS.get(c or "", "")


def _pipeline_text(run: dict[str, Any]) -> str:
    pp, sched = run.get("pp"), run.get("schedule")
    if pp in (None, 1) or sched == "none":
        return "no pipeline parallelism"
    txt = f"{md_escape(sched)}, P={md_escape(pp)}"
    if run.get("microbatches"):
        txt += f", M={md_escape(run.get('microbatches'))}"
    if (run.get("virtual_stages") or 1) > 1:
        txt += f", v={md_escape(run.get('virtual_stages'))}"
    return txt


def _gate_md(gate: Any) -> list[str]:
    data = gate.to_json() if hasattr(gate, "to_json") else gate
    if not isinstance(data, dict):
        return []
    st = str(data.get("status", ""))
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}.get(st, "")
    out = [f"### Gate: {icon} {st.upper()} (exit {md_escape(data.get('exit_code'))})", ""]
    for r in data.get("reasons") or []:
        out.append(f"- {md_escape(r)}")
    if data.get("allow_partial"):
        # what did not take part, said even when --allow-partial let the gate pass
        for r in data.get("partial") or []:
            out.append(f"- not part of the gate: {md_escape(r)}")
    checks = data.get("checks") or []
    if checks:
        if data.get("reasons"):
            out.append("")
        out += ["| | check |", "|---|---|"]
        for c in checks:
            s = str(c.get("state", ""))
            ic = {"pass": "✅", "fail": "❌", "skip": "➖", "inconclusive": "⚠️"}.get(s, "")
            out.append(f"| {ic} | {md_escape(c.get('text'))} |")
    out.append("")
    return out


def render_markdown(
    report: dict[str, Any], gate: Any = None, max_findings: int = 5, html_name: str | None = None
) -> str:
    """The Markdown summary of one JSON report (plus a gate result when given)."""
    report = clean_tree(report)  # trace strings: no terminal escapes or control characters
    run = report.get("run") or {}
    s = report.get("summary") or {}
    step = num(s.get("step_ms"))
    lost = {c: num((s.get("lost_ms") or {}).get(c)) or 0.0 for c in CAUSE_KEYS}
    out: list[str] = []
    out.append(f"## ppdiag: {fmt_ms(step)} per step, {fmt_pct(num(s.get('lost_ratio')))} lost")
    out.append("")
    steps = [x for x in run.get("steps") or [] if isinstance(x, int)]
    facts = [f"**{_pipeline_text(run)}**", md_escape(ranks_text(run))]
    if steps:
        facts.append(f"steps {min(steps)}–{max(steps)}" if len(steps) > 1 else f"step {steps[0]}")
    if run.get("format"):
        facts.append(md_escape(run.get("format")))
    if num(s.get("step_p95_ms")) is not None:
        facts.append(f"step p95 {fmt_ms(num(s.get('step_p95_ms')))}")
    out.append(" · ".join(facts))
    out.append("")
    if gate is not None:
        out += _gate_md(gate)
    # where the step goes
    # every share is of the mean step over the same steps the causes are averaged on
    mean_step = share_step_ms(s)
    if mean_step and num(s.get("step_mean_ms")) is not None:
        out += [f"Shares are of the mean step, {fmt_ms(mean_step)}.", ""]
    out += ["| where the step goes | ms / step | % of step |", "|---|---:|---:|"]
    comp = num(s.get("compute_ms"))
    if comp is not None:
        sh = share(s, "compute")
        out.append(f"| compute | {comp:.2f} | {fmt_pct(sh)} |")
    for c in sorted(CAUSE_KEYS, key=lambda c: -lost[c]):
        if lost[c] <= 0:
            continue
        out.append(f"| {_mark(c)} {cause_label(c)} | {lost[c]:.2f} | {fmt_pct(share(s, c))} |")
    b = report.get("bubble") or {}
    meas, theo = num(b.get("measured_ratio")), num(b.get("theoretical_ratio"))
    if meas is not None or theo is not None:
        out += ["", f"Bubble: measured {fmt_pct(meas)} vs theoretical {fmt_pct(theo)}."]
    out.append("")
    # per stage (or per rank)
    stages = [x for x in report.get("stages") or [] if isinstance(x, dict)]
    if stages:
        slow = slowest_stage(stages)
        out += [
            "### Stages",
            "",
            "| stage | ranks | F ms | B ms | compute ms | lost ms | top cause |",
            "|---:|---|---:|---:|---:|---:|---|",
        ]
        for i, st in enumerate(stages):
            sl = st.get("lost_ms") or {}
            tot = sum(num(v) or 0.0 for v in sl.values())
            top = max(CAUSE_KEYS, key=lambda c: num(sl.get(c)) or 0.0)
            top_txt = f"{_mark(top)} {cause_label(top)}" if (num(sl.get(top)) or 0) > 0 else "—"
            ranks = st.get("ranks") or []
            rk = ", ".join(md_escape(r) for r in ranks[:6]) + (" …" if len(ranks) > 6 else "")
            name = f"{md_escape(st.get('stage'))}" + (" **slowest**" if i == slow else "")
            f_ms = (st.get("fwd_ms") or {}).get("mean") if isinstance(st.get("fwd_ms"), dict) else None
            b_ms = (st.get("bwd_ms") or {}).get("mean") if isinstance(st.get("bwd_ms"), dict) else None
            out.append(
                f"| {name} | {rk} | {_f(f_ms)} | {_f(b_ms)} | {_f(st.get('compute_ms'))} | {tot:.2f} "
                f"| {top_txt} |"
            )
        out.append("")
    else:
        ranks = [r for r in report.get("ranks") or [] if isinstance(r, dict)]
        if ranks:
            shown = sorted(
                ranks, key=lambda r: -sum(num(v) or 0.0 for v in (r.get("lost_ms") or {}).values())
            )[:16]
            title = (
                "### Ranks"
                if len(shown) == len(ranks)
                else f"### Ranks (the {len(shown)} with most lost time of {len(ranks)})"
            )
            out += [
                title,
                "",
                "| rank | step ms | compute ms | lost ms | top cause |",
                "|---:|---:|---:|---:|---|",
            ]
            for r in sorted(shown, key=lambda r: r.get("rank", 0)):
                rl = r.get("lost_ms") or {}
                tot = sum(num(v) or 0.0 for v in rl.values())
                top = max(CAUSE_KEYS, key=lambda c: num(rl.get(c)) or 0.0)
                top_txt = f"{_mark(top)} {cause_label(top)}" if (num(rl.get(top)) or 0) > 0 else "—"
                out.append(
                    f"| {md_escape(r.get('rank'))} | {_f(r.get('step_ms'))} | {_f(r.get('compute_ms'))} | "
                    f"{tot:.2f} | {top_txt} |"
                )
            out.append("")
    # findings
    finds = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    if finds:
        out += ["### Top findings", ""]
        for i, f in enumerate(finds[:max_findings], 1):
            gain, gp = num(f.get("gain_ms")), num(f.get("gain_pct"))
            g = (
                f", gain ≈ {fmt_ms(gain)}/step" + (f" ({gp:.1f} %)" if gp is not None else "")
                if gain is not None
                else ""
            )
            cause = f.get("cause")
            ctext = f"{_mark(cause)} {cause_label(cause)}" if cause else "general"
            fixes = f.get("fixes") or []
            # two trailing spaces: a hard line break, so the fix sits on its own line in the item
            brk = "  " if fixes else ""
            out.append(f"{i}. **{md_escape(f.get('code'))}** {md_escape(f.get('title'))} — {ctext}{g}{brk}")
            if fixes:
                out.append(f"   Fix: {md_escape(fixes[0])}")
        if len(finds) > max_findings:
            out.append(f"\n{len(finds) - max_findings} more finding(s) in the full report.")
        out.append("")
    else:
        out += ["No finding: nothing worth fixing was detected.", ""]
    warns = run.get("warnings") or []
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


def write_markdown(diag: Diagnosis, path: str | Path, gate: Any = None) -> Path:
    """Write the Markdown summary of ``diag`` (the gate from ``gate`` or ``diag.context['gate']``)."""
    p = Path(path)
    g = gate if gate is not None else (diag.context or {}).get("gate")
    from ppdiag.io import md_marker

    # the marker is the last line: the headline stays first for PR comments and CI summaries
    text = render_markdown(diag.report or {}, gate=g).rstrip("\n") + "\n\n" + md_marker() + "\n"
    p.write_text(text, encoding="utf-8", errors="backslashreplace")
    return p


class MarkdownReporter:
    """Reporter ``md``: the CI / PR summary."""

    name = "md"
    suffix = ".md"

    def write(self, diagnosis: Diagnosis, path: Path) -> None:
        write_markdown(diagnosis, path)


register(MarkdownReporter())
