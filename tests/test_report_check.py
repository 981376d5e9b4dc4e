"""A report agrees with itself: :meth:`Report.check` on hand-built reports (each class of claim
broken in turn), and the texts a new user found contradicting their own report, now right.

Every analysis in the suite runs the check (``PPDIAG_STRICT_CHECK``, set in conftest.py); these
tests hold the checker itself to account and pin the texts it was built to catch.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import shared_trace
from hypothesis import given, settings
from hypothesis import strategies as st
from report_fill import typed

from ppdiag import report_check
from ppdiag.api import Options, diagnose
from ppdiag.report_types import Report
from ppdiag.reports.html_sections import critical_path_html, findings_html
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.optable import OpTableParams, simulate_optable, write_table
from ppsynth.scenario import make_scenario


def _clean() -> dict[str, Any]:
    """A 2-stage run, one rank per stage, that agrees with itself.

    Rank 0: step 20 ms = compute 14 + bubble 4 + host 2. Rank 1: step 20 = compute 16 + bubble 4.
    Summary (means): step 20 (the median 18), compute 15, bubble 4, host 1; shares of the mean
    step: compute 0.75, bubble 0.2, host 0.05. PP006 wins back 1 ms of the 1 ms host time: 5 % of
    the mean step; its noise 0.2 ms; rank 0 launches 2 ms per step late (the title's 2.0 ms).
    """
    zero = {k: 0.0 for k in ("imbalance", "comm_wait", "exposed_comm", "exposed_copy", "unexplained")}
    lost0 = {"bubble": 4.0, "host": 2.0, **zero}
    lost1 = {"bubble": 4.0, "host": 0.0, **zero}
    return {
        "run": {"world_size": 2, "ranks": [0, 1], "pp": 2, "stage_map": {"0": 0, "1": 1}},
        "summary": {
            "step_ms": 18.0,
            "step_mean_ms": 20.0,
            "compute_ms": 15.0,
            "lost_ratio": 0.25,
            "lost_ms": {"bubble": 4.0, "host": 1.0, **zero},
            "shares": {"compute": 0.75, "bubble": 0.2, "host": 0.05, **zero},
        },
        "stages": [{"stage": 0, "ranks": [0]}, {"stage": 1, "ranks": [1]}],
        "ranks": [
            {"rank": 0, "stage": 0, "step_ms": 20.0, "compute_ms": 14.0, "lost_ms": lost0},
            {"rank": 1, "stage": 1, "step_ms": 20.0, "compute_ms": 16.0, "lost_ms": lost1},
        ],
        "findings": [
            {
                "code": "PP006",
                "cause": "host",
                "title": "host-bound: the work of rank(s) 0 is launched late (2.0 ms per step)",
                "severity": "medium",
                "ranks": [0],
                "gain_ms": 1.0,
                "gain_pct": 5.0,
                "evidence": {"noise_ms": 0.2, "direct_host_ms_per_rank": {"0": 2.0, "1": 0.0}},
                "fixes": ["remove host synchronizations from the step (.item(), .cpu())"],
            },
            {
                "code": "PP001",
                "cause": "bubble",
                "title": "pipeline bubble takes 20% of the step (P=2, M=4)",
                "severity": "low",
                "stages": [0, 1],
                "gain_ms": 0.5,
                "gain_pct": 2.5,
                "evidence": {"noise_ms": 0.6},
            },
        ],
    }


def _violations(over: dict[str, Any]) -> list[str]:
    return typed(over).check()


def _finding(d: dict[str, Any], i: int = 0) -> dict[str, Any]:
    f: dict[str, Any] = d["findings"][i]
    return f


def test_clean_report_has_no_violation() -> None:
    assert _violations(_clean()) == []


def _broken(edit: Any) -> list[str]:
    d = copy.deepcopy(_clean())
    edit(d)
    return _violations(d)


@pytest.mark.parametrize(
    ("name", "edit", "klass"),
    [
        # the production op table's PP006: an empty rank list in the title and in ranks[]
        (
            "empty list",
            lambda d: _finding(d).update(
                ranks=[], title="host-bound: the work of rank(s)  is launched late (0.0 ms per step)"
            ),
            ("scope:", "empty list:"),
        ),
        ("ghost rank", lambda d: _finding(d).update(ranks=[5]), ("scope:",)),
        ("stage beyond pp", lambda d: _finding(d, 1).update(stages=[0, 1, 2]), ("scope:",)),
        # rank 60 traced in a "world of 16"
        ("rank beyond world", lambda d: d["run"].update(ranks=[0, 60]), ("world size:",)),
        (
            "world != tp x pp x dp",
            lambda d: _finding(d).update(
                evidence={"noise_ms": 0.2, "world_size": 16, "tp": 4, "pp": 2, "dp": 4}
            ),
            ("world size:",),
        ),
        # the gain of PP006 from nothing: 100.5 ms of a 1 ms host time
        ("gain from nothing", lambda d: _finding(d).update(gain_ms=10.0, gain_pct=50.0), ("gain:",)),
        # gain_pct of the median step (1 / 18) instead of the mean (1 / 20)
        ("median denominator", lambda d: _finding(d).update(gain_pct=5.56), ("denominator:",)),
        # the MI300 title: a share of the median step beside the report's share of the mean
        (
            "title share",
            lambda d: _finding(d, 1).update(title="pipeline bubble takes 22% of the step (P=2, M=4)"),
            ("denominator:",),
        ),
        (
            "high within noise",
            lambda d: _finding(d).update(severity="high", evidence={"noise_ms": 1.5}),
            ("severity:",),
        ),
        # a time quoted in a title that no field holds (computed where it was printed)
        (
            "quoted time",
            lambda d: _finding(d).update(
                title="host-bound: the work of rank(s) 0 is launched late (2.4 ms per step)"
            ),
            ("quoted:",),
        ),
        ("causes do not add up", lambda d: d["ranks"][1].update(compute_ms=17.0), ("sums:",)),
        ("summary does not add up", lambda d: d["summary"].update(compute_ms=16.0), ("sums:",)),
        ("stage rows", lambda d: d["stages"].pop(), ("pipeline:",)),
        ("rank rows out of order", lambda d: d["ranks"].reverse(), ("order:",)),
        ("stage of another rank", lambda d: d["stages"][0].update(ranks=[1]), ("pipeline:",)),
        # the HTML heading "by estimated gain" above unsorted gains
        (
            "order",
            lambda d: d["findings"].insert(
                0, {**_finding(d), "code": "PP005", "gain_ms": 0.5, "gain_pct": 2.5}
            ),
            ("order:",),
        ),
        (
            "slowest stage",
            lambda d: (
                d["summary"].update(slowest_stage=1)
                or d["findings"].append(
                    {
                        "code": "PP003",
                        "cause": "imbalance",
                        "title": "stage 0 is 1.10x",
                        "severity": "low",
                        "stages": [0],
                        "ranks": [0],
                        "gain_ms": 0.1,
                        "gain_pct": 0.5,
                        "evidence": {"noise_ms": 1.0},
                    }
                )
            ),
            ("pipeline:",),
        ),
    ],
)
def test_each_broken_claim_is_found(name: str, edit: Any, klass: tuple[str, ...]) -> None:
    found = _broken(edit)
    for k in klass:
        assert any(v.startswith(k) for v in found), (name, found)


def test_analyze_turns_violations_into_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a checker that finds one violation: strict (the suite) raises, else a report warning
    run = make_scenario(schedule="1f1b", pp=2, microbatches=4, steps=2)
    write_kineto(run, tmp_path)
    monkeypatch.setattr(report_check, "_CHECKS", (lambda r: ["sums: made up for the test"],))
    with pytest.raises(report_check.InconsistentReport, match="made up"):
        diagnose([tmp_path])
    monkeypatch.setenv(report_check.STRICT_ENV, "0")
    rep = diagnose([tmp_path]).result
    assert "internal inconsistency: sums: made up for the test" in rep.run.warnings


def _pct_in(text: str) -> float:
    m = re.search(r"(\d+)% of the step", text)
    assert m is not None, text
    return float(m.group(1))


def test_mi300_exposed_comm_share_and_gain_of_the_mean_step() -> None:
    # before: "100% of the step is exposed communication (gain 99.9 %)" beside a 64 % share; the
    # steps jitter (median 18.6 ms, mean 28.9 ms) and the title and gain_pct divided by the median
    rep = diagnose([shared_trace("kineto/tracelens_mi300_ddp_rank0.json.gz")]).result
    s = rep.summary
    assert s.step_mean_ms is not None and s.step_ms is not None and s.step_mean_ms > 1.3 * s.step_ms
    f = next(x for x in rep.findings if x.code == "PP005")
    share = 100 * s.lost_ms["exposed_comm"] / s.step_mean_ms
    assert abs(_pct_in(f.title) - share) <= 0.5
    assert f.gain_ms is not None and f.gain_pct is not None
    assert f.gain_pct == pytest.approx(100 * f.gain_ms / s.step_mean_ms, abs=0.01)
    assert f.gain_ms <= s.lost_ms["exposed_comm"] + 1e-3  # one stage: the exposed time is the gain
    assert rep.check() == []


def test_jitter_gain_of_the_mean_step(tmp_path: Path) -> None:
    # one slow step of five: the median and the mean differ, every percentage is of the mean
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=5, faults=[F.SlowStep(2, 40.0)])
    write_kineto(run, tmp_path)
    rep = diagnose([tmp_path]).result
    s = rep.summary
    assert s.step_mean_ms is not None and s.step_ms is not None and s.step_mean_ms > s.step_ms
    f = next(x for x in rep.findings if x.code == "PP007")
    assert f.gain_ms is not None and f.gain_pct == pytest.approx(100 * f.gain_ms / s.step_mean_ms, abs=0.01)
    for x in rep.findings:
        if x.gain_ms is not None and x.gain_pct is not None:
            assert x.gain_pct == pytest.approx(100 * x.gain_ms / s.step_mean_ms, abs=0.01), x.code


def test_pp006_names_a_rank_or_is_not_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # before: with no rank launching late (an op table has no launch times) PP006 said "the work
    # of rank(s)  is launched late (0.0 ms per step ...)" with a what-if gain; now no finding
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=2, faults=[F.HostStall(3, 0.5)])
    write_kineto(run, tmp_path)
    f = next(x for x in diagnose([tmp_path]).result.findings if x.code == "PP006")
    assert f.ranks == [3] and "rank(s) 3 " in f.title
    import ppdiag.rules.pp006_host as pp006

    monkeypatch.setattr(pp006, "direct_host_ms", lambda steps, **kw: dict.fromkeys(range(4), 0.0))
    rep = diagnose([tmp_path]).result
    assert all(x.code != "PP006" for x in rep.findings)


def test_optable_gains_within_their_cause(tmp_path: Path) -> None:
    # 8 replicas whose micro-batches vary: the reduce-scatter waits for the replica that drew the
    # longest micro-batches. Before: PP005 claimed 11.56 ms from 2.39 ms of exposed communication
    # (the replay removed the wait with the transfer); a fix wins at most what its cause loses
    df, _ = simulate_optable(OpTableParams(dp=8, mb_cv=0.2, seed=1))
    path = tmp_path / "ops.csv"
    write_table(df, path)
    rep = diagnose([path], Options(jobs=1)).result
    lost = rep.summary.lost_ms
    for f in rep.findings:
        noise = float(f.evidence.as_dict().get("noise_ms") or 0.0)  # type: ignore[arg-type]
        if f.code in ("PP004", "PP005", "PP006", "PP011") and f.gain_ms is not None:
            assert f.cause is not None and f.gain_ms <= lost[str(f.cause)] + noise + 0.02 * (
                rep.summary.step_mean_ms or 0
            )
        assert f.ranks or f.stages, f.code


def test_pp008_names_the_stage_count(tmp_path: Path) -> None:
    # before: "M=4 < 2 x pp=8" on a 4-stage pipeline (read as pp=8)
    df, _ = simulate_optable(OpTableParams(pp=4, dp=2, microbatches=4))
    path = tmp_path / "ops.csv"
    write_table(df, path)
    rep = diagnose([path], Options(jobs=1)).result
    f = next(x for x in rep.findings if x.code == "PP008")
    assert "M=4 < 2 × pp = 8 (4 stages)" in f.title, f.title
    assert "pp=8" not in f.title


def _heavy_stage_report(tmp_path: Path) -> Report:
    df, _ = simulate_optable(OpTableParams(heavy_stage=(0, 1.4)))
    path = tmp_path / "ops.csv"
    write_table(df, path)
    return diagnose([path], Options(jobs=1)).result


def test_html_critical_path_names_the_slowest_stage(tmp_path: Path) -> None:
    # stage 0 is 1.3x in both replicas (PP003); rank 3, stage 1 of replica 1, computes 1.6x (PP009)
    # and holds the most compute on the path. Before: "Stage 1 holds the most compute on the
    # critical path: shortening its blocks shortens the step" beside PP003's stage 0
    df, _ = simulate_optable(
        OpTableParams(pp=4, dp=2, microbatches=8, heavy_stage=(0, 1.3), slow_worker=(1, 1, 1.6))
    )
    path = tmp_path / "ops.csv"
    write_table(df, path)
    rep = diagnose([path], Options(jobs=1)).result
    f = next(x for x in rep.findings if x.code == "PP003")
    assert f.stages == [0] and rep.summary.slowest_stage == 0
    text = critical_path_html(rep)
    assert "Stage 0 is the slowest stage" in text
    assert "Stage 1 holds the most compute on the path itself, where PP009 names rank(s) 3" in text
    assert "Stage 1 holds the most compute on the critical path: shortening" not in text


def test_html_findings_heading_says_their_order(tmp_path: Path) -> None:
    # before: "Findings, by estimated gain" above gains 6.1, 41.6, 30.0, 16.8 ms (sorted by
    # severity first); the heading now says the order, and check() holds the order
    rep = _heavy_stage_report(tmp_path)
    low = msgspec.structs.replace(rep.findings[0], severity="low", gain_ms=0.0, gain_pct=0.0)
    html = findings_html(rep)
    assert "most severe first, then by estimated gain" in html
    shuffled = msgspec.structs.replace(rep, findings=[low, *rep.findings[1:], rep.findings[0]])
    assert any(v.startswith("order:") for v in shuffled.check()) or len(rep.findings) < 2


def test_pp_override_against_the_trace_says_what_is_used(tmp_path: Path) -> None:
    # before: "--pp 3 disagrees with the trace (...: 4 stages)" and pp stayed 4 while the README
    # said the override "is used"; now the warning and the README say the trace's stages are used
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=2)
    write_kineto(run, tmp_path)
    rep = diagnose([tmp_path], Options(pp=3)).result
    assert rep.run.pp == 4
    (w,) = [x for x in rep.run.warnings if x.startswith("--pp 3")]
    assert "the trace's 4 stages are used" in w and "--stage-map" in w
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "`--pp`\nplaces ranks (Megatron's default order) only in traces that show no pipeline" in readme


_CAUSES = ("bubble", "imbalance", "comm_wait", "exposed_comm", "host", "exposed_copy", "unexplained")


@st.composite
def _consistent(draw: st.DrawFn) -> dict[str, Any]:
    """A report of 1 to 4 stages whose rows add up by construction (ms rounded as the report does)."""
    pp = draw(st.integers(1, 4))
    n = pp * draw(st.integers(1, 2))
    ms = st.floats(0.0, 50.0, allow_nan=False).map(lambda x: round(x, 4))
    ranks: list[dict[str, Any]] = []
    for r in range(n):
        lost = {k: draw(ms) for k in _CAUSES}
        comp = draw(st.floats(1.0, 100.0).map(lambda x: round(x, 4)))
        step = round(comp + sum(lost.values()), 4)
        ranks.append(
            {
                "rank": r,
                "stage": r % pp if pp > 1 else None,
                "step_ms": step,
                "compute_ms": comp,
                "lost_ms": lost,
            }
        )
    mean = sum(x["step_ms"] for x in ranks) / n
    lost_mean = {k: sum(x["lost_ms"][k] for x in ranks) / n for k in _CAUSES}
    comp_mean = sum(x["compute_ms"] for x in ranks) / n
    return {
        "run": {"world_size": n, "ranks": list(range(n)), "pp": pp},
        "summary": {
            "step_ms": mean,
            "step_mean_ms": mean,
            "compute_ms": comp_mean,
            "lost_ratio": sum(lost_mean.values()) / mean,
            "lost_ms": lost_mean,
            "shares": {"compute": comp_mean / mean, **{k: v / mean for k, v in lost_mean.items()}},
        },
        "stages": [{"stage": s, "ranks": [r for r in range(n) if r % pp == s]} for s in range(pp)]
        if pp > 1
        else [],
        "ranks": ranks,
    }


@settings(max_examples=60, deadline=None)
@given(_consistent(), st.data())
def test_sums_hold_and_a_changed_rank_breaks_them(d: dict[str, Any], data: st.DataObject) -> None:
    assert _violations(d) == []
    # one rank's compute moved by more than the rounding tolerance: compute + causes != its step
    r = data.draw(st.integers(0, len(d["ranks"]) - 1))
    row = d["ranks"][r]
    # (beyond the check's tolerance: 0.01 ms or 0.1 % of the larger of the rank's and the mean step)
    worst = max(row["step_ms"], d["summary"]["step_mean_ms"])
    row["compute_ms"] = round(row["compute_ms"] + max(0.02, 0.002 * worst), 4)
    assert any(v.startswith(f"sums: rank {r} ") for v in _violations(d))
