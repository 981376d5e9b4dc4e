"""ppdiag diff: per-stage / per-rank changes by cause, findings that appeared or disappeared."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import pytest
from diag_fixture import base_report, build_nopp_diagnosis
from report_fill import typed
from rich.console import Console

from ppdiag.reports.diff import diff_lines, diff_markdown, diff_reports, diff_table


def _after() -> dict[str, Any]:
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
    res = diff_reports(typed(base_report()), typed(_after()))
    assert res.by == "stage" and res.notes == []
    step = res.row("run", "step_ms")
    assert step is not None and step.delta_ms == pytest.approx(-5.0) and step.delta_pct == pytest.approx(-5.0)
    imb = res.row("run", "imbalance")
    assert imb is not None and imb.before == 6.0 and imb.after == 3.0
    assert imb.delta_pct == pytest.approx(-50.0)
    comp2 = res.row("stage 2", "compute_ms")
    assert (
        comp2 is not None
        and comp2.delta_ms == pytest.approx(-5.0)
        and comp2.delta_pct == pytest.approx(-12.5)
    )
    cw1 = res.row("stage 1", "comm_wait")
    assert cw1 is not None and cw1.before == 4.0 and cw1.after == 6.0
    assert cw1.delta_ms == pytest.approx(2.0)
    # causes that are zero on both sides are left out
    assert res.row("stage 0", "unexplained") is None
    # run-level lost total
    lost = res.row("run", "lost_ms")
    assert lost is not None and lost.delta_ms == pytest.approx(-3.0)


def test_diff_findings() -> None:
    res = diff_reports(typed(base_report()), typed(_after()))
    assert [(f.code, f.where) for f in res.appeared] == [("PP004", "stages 1")]
    assert [(f.code, f.where) for f in res.disappeared] == [("PP003", "stages 2")]
    changed = [f for f in res.findings if f.status == "changed"]
    assert [(f.code, f.before, f.after) for f in changed] == [("PP001", 5.0, 4.0)]


def test_diff_renderings() -> None:
    res = diff_reports(typed(base_report()), typed(_after()), before_label="main", after_label="pr")
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
    a = msgspec.to_builtins(build_nopp_diagnosis().result)  # the JSON form, edited below
    b = copy.deepcopy(a)
    b["ranks"][1]["lost_ms"]["host"] += 2.0
    b["ranks"][1]["step_ms"] += 2.0
    res = diff_reports(typed(a), typed(b))
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
    res = diff_reports(typed(base_report()), typed(b))
    assert "before has pp 4, after 2" in res.notes
    assert any(n.startswith("stages only in before: 2, 3") for n in res.notes)


def test_relative_change_needs_a_base() -> None:
    """0.009 -> 7.03 ms printed "+75496.8 %": a base under min(0.5 ms, 1 % of the step) gets the
    absolute change only."""
    a, b = base_report(), base_report()  # step 100 ms: the base must be >= 0.5 ms
    a["summary"]["lost_ms"]["host"] = 0.009
    b["summary"]["lost_ms"]["host"] = 7.03
    a["summary"]["lost_ms"]["unexplained"] = 0.6
    b["summary"]["lost_ms"]["unexplained"] = 0.9
    res = diff_reports(typed(a), typed(b))
    host = res.row("run", "host")
    assert host is not None and host.delta_ms == pytest.approx(7.021) and host.delta_pct is None
    assert host.to_json()["delta_pct"] is None
    une = res.row("run", "unexplained")
    assert une is not None and une.delta_pct == pytest.approx(50.0)  # 0.6 -> 0.9 ms
    assert not any("75" in line and "%" in line for line in diff_lines(res) if "host" in line)
    # a 2 ms step: 1 % of it (0.02 ms) is base enough
    a["summary"]["step_ms"] = 2.0
    a["summary"]["lost_ms"]["host"] = 0.04
    host = diff_reports(typed(a), typed(b)).row("run", "host")
    assert host is not None and host.delta_pct == pytest.approx(100 * (7.03 - 0.04) / 0.04)


def test_findings_matched_by_code_and_place_not_order() -> None:
    """The same finding with its ranks listed in another order (and the findings in another
    order) is one changed finding, not one removed and one added."""
    a, b = base_report(), base_report()
    f = {
        "code": "PP009",
        "cause": "comm_wait",
        "title": "straggler",
        "severity": "medium",
        "stages": [],
        "ranks": [3, 1],
        "gain_ms": 2.0,
        "evidence": {},
        "fixes": [],
    }
    a["findings"] = [*a["findings"], f]
    b["findings"] = [dict(f, ranks=[1, 3], gain_ms=3.0), *reversed(b["findings"])]
    res = diff_reports(typed(a), typed(b))
    pp009 = [x for x in res.findings if x.code == "PP009"]
    assert [(x.status, x.where, x.before, x.after) for x in pp009] == [("changed", "ranks 1,3", 2.0, 3.0)]
    assert res.appeared == [] and res.disappeared == []


def test_regression_beyond_threshold() -> None:
    a, b = base_report(), base_report()
    b["summary"]["step_ms"] = 154.0  # +54 %
    res = diff_reports(typed(a), typed(b))
    assert res.threshold_pct == 5.0 and res.regression is not None and "+54.0 %" in res.regression
    assert diff_reports(typed(a), typed(b), threshold_pct=60.0).regression is None
    b["summary"]["step_ms"] = 105.0  # exactly the threshold: not beyond it
    assert diff_reports(typed(a), typed(b)).regression is None
    b["summary"]["step_ms"] = 80.0
    assert diff_reports(typed(a), typed(b)).regression is None
    assert diff_reports(typed(a), typed(b)).to_json()["regression"] is None


def test_diff_cli_exit_codes(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from ppdiag.cli import app

    a, b = base_report(), base_report()
    b["summary"]["step_ms"] = 154.0
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    run = CliRunner().invoke
    res = run(app, ["diff", str(pa), str(pb)])
    assert res.exit_code == 1, res.output
    assert "regression: step time 100.000 -> 154.000 ms (+54.0 %)" in res.output
    assert run(app, ["diff", str(pa), str(pb), "--threshold", "60"]).exit_code == 0
    assert run(app, ["diff", str(pb), str(pa)]).exit_code == 0  # faster: no regression
    assert run(app, ["diff", str(pa), str(pa)]).exit_code == 0


def test_windows_without_steps_are_not_compared_as_step_times() -> None:
    # two captures without step annotations (steps [-1]): one window each, 100 ms and 154 ms long.
    # A longer capture is no slower step: no step-time row, no regression, a note saying why.
    a, b = base_report(), base_report()
    for rep, window in ((a, 100.0), (b, 154.0)):
        rep["run"]["steps"] = [-1]
        rep["summary"]["step_ms"] = window
    res = diff_reports(typed(a), typed(b))
    assert res.regression is None and res.row("run", "step_ms") is None
    assert res.row("run", "step_p95_ms") is None
    w = res.row("run", "window_ms")
    assert w is not None and w.label == "window (no steps)" and w.delta_ms == pytest.approx(54.0)
    assert any("before and after have no step annotations" in n for n in res.notes)
    # one side with steps, the other without: still no step-time comparison
    a["run"]["steps"] = [3, 4]
    res = diff_reports(typed(a), typed(b))
    assert res.regression is None and any(n.startswith("after has no step annotations") for n in res.notes)
