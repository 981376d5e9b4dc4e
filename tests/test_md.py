"""Markdown summary: structure, numbers from the simulated run, gate section, escaping."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from diag_fixture import EVIL, base_report, build_nopp_diagnosis, build_pipeline_diagnosis
from report_fill import typed

from ppdiag.reports import write_report
from ppdiag.reports.gate import Budget, run_gate
from ppdiag.reports.md import md_escape, render_markdown


def _tables(md: str) -> list[list[str]]:
    """Consecutive '|' lines of the document, as tables."""
    out: list[list[str]] = []
    cur: list[str] = []
    for line in md.splitlines():
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _cells(line: str) -> list[str]:
    # split on unescaped pipes
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_markdown_of_a_pipeline_run(tmp_path: Path) -> None:
    diag, truth = build_pipeline_diagnosis()
    path = write_report("md", diag, tmp_path / "summary.md")
    md = path.read_text(encoding="utf-8")
    durs = [(b - a) / 1e6 for a, b in truth.step_windows]
    # headline: the median simulated step, with the lost share
    head = md.splitlines()[0]
    assert head.startswith(f"## ppdiag: {np.median(durs):.1f} ms per step, ")
    assert "**1f1b, P=4, M=8**" in md and "steps 5–7" in md
    tables = _tables(md)
    for t in tables:  # every row has as many cells as the header
        n = len(_cells(t[0]))
        assert all(len(_cells(row)) == n for row in t), t
    stage_table = next(t for t in tables if _cells(t[0])[0] == "stage")
    rows = stage_table[2:]
    assert len(rows) == 4
    slow_rows = [r for r in rows if "**slowest**" in r]
    assert len(slow_rows) == 1 and _cells(slow_rows[0])[0].startswith(str(truth.slowest_stage))
    # F/B means per stage equal the simulated block durations
    for r in rows:
        c = _cells(r)
        s = int(c[0].split()[0])
        f = [(e - a) / 1e6 for (rr, _k, ph, _m, a, e) in truth.blocks if rr == s and ph == "F"]
        assert float(c[2]) == round(float(np.mean(f)), 2)
    # findings: the top one with its first fix
    assert "### Top findings" in md
    assert "1. **PP003** Stage 2 is the slowest stage — 🟧 stage imbalance, gain ≈" in md
    assert "   Fix: Move about" in md
    # trace strings never reach the document raw
    assert "<b>bold</b>" not in md and "&lt;b&gt;bold&lt;/b&gt;" in md


def test_markdown_gate_section() -> None:
    rep = base_report()
    gate = run_gate(typed(rep), Budget(max_stage_ratio=1.1, max_lost_ratio=0.5))
    md = render_markdown(typed(rep), gate=gate.to_report())
    assert "### Gate: ❌ FAIL (exit 1)" in md
    t = next(t for t in _tables(md) if _cells(t[0]) == ["", "check"])
    states = [_cells(r)[0] for r in t[2:]]
    assert sorted(states) == ["✅", "❌"]
    ok = render_markdown(typed(rep), gate=run_gate(typed(rep), Budget(max_lost_ratio=0.5)).to_report())
    assert "### Gate: ✅ PASS (exit 0)" in ok


def test_markdown_without_pipeline() -> None:
    diag = build_nopp_diagnosis()
    md = render_markdown(diag.result)
    assert "**no pipeline parallelism**" in md
    assert "### Stages" not in md and "### Ranks" in md
    t = next(t for t in _tables(md) if _cells(t[0])[0] == "rank")
    assert len(t) - 2 == 2
    assert "Bubble:" not in md


def test_markdown_escapes_trace_strings() -> None:
    rep = base_report()
    rep["findings"][0]["title"] = f"kernel {EVIL} | a*b_c"
    rep["findings"][0]["fixes"] = ["[click](javascript:alert(1))"]
    md = render_markdown(typed(rep))
    assert EVIL not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "\\| a\\*b\\_c" in md
    assert "\\[click\\](javascript:alert(1))" in md
    assert md_escape("a\nb") == "a b"


def test_markdown_survives_a_sparse_report() -> None:
    md = render_markdown(typed({"schema_version": 1, "run": {}, "summary": {}}))
    assert md.startswith("## ppdiag: — per step, — lost")
    assert "No finding" in md
