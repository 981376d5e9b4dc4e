"""ppdiag diff: per-stage / per-rank changes by cause, findings that appeared or disappeared."""

from __future__ import annotations

import copy

import pytest
from diag_fixture import base_report, build_nopp_diagnosis
from rich.console import Console

from ppdiag.reports.diff import diff_lines, diff_markdown, diff_reports, diff_table


def _after() -> dict:
    """The base run after moving layers off stage 2: 40 → 35 ms compute, imbalance 6 → 3 ms, step 100 → 95."""
    b = base_report()
    b["summary"]["step_ms"] = 95.0
    b["summary"]["lost_ms"]["imbalance"] = 3.0
    b["stages"][2]["compute_ms"] = 35.0
    b["stages"][2]["lost_ms"]["imbalance"] = 3.0
    b["stages"][1]["lost_ms"]["comm_wait"] = 6.0  # a new wait elsewhere
    b["findings"] = [f for f in b["findings"] if f["code"] != "PP003"]
    b["findings"][0]["gain_ms"] = 4.0
    b["findings"].append(
        {
            "code": "PP004",
            "cause": "comm_wait",
            "title": "Slow p2p into stage 1",
            "severity": "medium",
            "stages": [1],
            "ranks": [1],
            "gain_ms": 2.0,
            "gain_pct": 2.1,
            "evidence": {},
            "fixes": [],
        }
    )
    return b


def test_diff_run_and_stage_rows() -> None:
    res = diff_reports(base_report(), _after())
    assert res.by == "stage" and res.notes == []
    step = res.row("run", "step_ms")
    assert step is not None and step.delta_ms == pytest.approx(-5.0) and step.delta_pct == pytest.approx(-5.0)
    imb = res.row("run", "imbalance")
    assert imb is not None and (imb.before, imb.after, imb.delta_pct) == (6.0, 3.0, pytest.approx(-50.0))
    comp2 = res.row("stage 2", "compute_ms")
    assert (
        comp2 is not None
        and comp2.delta_ms == pytest.approx(-5.0)
        and comp2.delta_pct == pytest.approx(-12.5)
    )
    cw1 = res.row("stage 1", "comm_wait")
    assert cw1 is not None and (cw1.before, cw1.after, cw1.delta_ms) == (4.0, 6.0, pytest.approx(2.0))
    # causes that are zero on both sides are left out
    assert res.row("stage 0", "unexplained") is None
    # run-level lost total
    lost = res.row("run", "lost_ms")
    assert lost is not None and lost.delta_ms == pytest.approx(-3.0)


def test_diff_findings() -> None:
    res = diff_reports(base_report(), _after())
    assert [(f.code, f.where) for f in res.appeared] == [("PP004", "stages 1")]
    assert [(f.code, f.where) for f in res.disappeared] == [("PP003", "stages 2")]
    changed = [f for f in res.findings if f.status == "changed"]
    assert [(f.code, f.before, f.after) for f in changed] == [("PP001", 5.0, 4.0)]


def test_diff_renderings() -> None:
    res = diff_reports(base_report(), _after(), before_label="main", after_label="pr")
    lines = diff_lines(res)
    assert lines[0] == "ppdiag diff: main -> pr"
    step_line = next(line for line in lines if " step time " in line)
    assert step_line.split()[1:] == ["step", "time", "100.000", "95.000", "-5.000", "-5.0", "%"]
    assert any(line.startswith("  + PP004") for line in lines)
    assert any(line.startswith("  - PP003") for line in lines)
    con = Console(record=True, width=140, color_system=None)
    con.print(diff_table(res))
    text = con.export_text()
    assert "main → pr" in text and "per stage" in text and "stage 2" in text and "-12.5 %" in text
    md = diff_markdown(res)
    assert "| stage 2 | compute | 40.000 | 35.000 | -5.000 ms (-12.5 %) |" in md
    assert "| stage 0 |" not in md  # unchanged stages stay out of a PR comment
    assert "🆕 **PP004**" in md


def test_diff_per_rank_without_stages() -> None:
    a = build_nopp_diagnosis().report
    b = copy.deepcopy(a)
    b["ranks"][1]["lost_ms"]["host"] += 2.0
    b["ranks"][1]["step_ms"] += 2.0
    res = diff_reports(a, b)
    assert res.by == "rank"
    host = res.row("rank 1", "host")
    assert host is not None and host.delta_ms == pytest.approx(2.0)
    st = res.row("rank 1", "step_ms")
    assert st is not None and st.delta_ms == pytest.approx(2.0)
    r0 = res.row("rank 0", "host")
    assert r0 is not None and r0.delta_ms == pytest.approx(0.0)


def test_diff_notes_incomparable_runs() -> None:
    b = base_report()
    b["run"]["pp"] = 2
    b["stages"] = b["stages"][:2]
    res = diff_reports(base_report(), b)
    assert "before has pp 4, after 2" in res.notes
    assert any(n.startswith("stages only in before: 2, 3") for n in res.notes)
