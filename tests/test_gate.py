"""The CI gate: budget files, every check, regression against a baseline, inconclusive baselines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from diag_fixture import base_report
from report_fill import typed

from ppdiag.errors import InputError
from ppdiag.reports.gate import Budget, coverage_of, format_gate, load_budget, load_report, run_gate

# The hand-made report: stage compute 30/30/40/30 ms, step 100 ms (p95 110), lost ratio 0.30,
# comm_wait 2/4/1/1 ms over 100 ms steps, bubble 0.30 measured vs 3/11 theoretical.
STAGE_RATIO = 40.0 / 32.5
COMM_WAIT = (0.02 + 0.04 + 0.01 + 0.01) / 4
BUBBLE_EXCESS = 0.30 - 3 / 11
P95_RATIO = 1.10
LOST = 0.30


def _write(tmp_path: Path, text: str, name: str = "ppdiag.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ------------------------------------------------------------------ loading


def test_load_budget_file_reads_every_key(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        """
[budget]
max_lost_ratio = 0.25
max_bubble_excess = 0.05
max_stage_ratio = 1.15
max_comm_wait_ratio = 0.05
max_step_p95_ratio = 1.2
[regression]
step_pct = 5
lost_pct = 3
""",
    )
    b = load_budget(p)
    assert (b.max_lost_ratio, b.max_bubble_excess, b.max_stage_ratio) == (0.25, 0.05, 1.15)
    assert (b.max_comm_wait_ratio, b.max_step_p95_ratio, b.step_pct, b.lost_pct) == (0.05, 1.2, 5.0, 3.0)
    assert b.source == str(p)


def test_load_budget_from_pyproject_ignores_other_tools(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        """
[project]
name = "trainer"
[tool.ruff]
line-length = 100
[tool.ppdiag.budget]
max_stage_ratio = 1.1
[tool.ppdiag.regression]
lost_pct = 2.5
""",
        name="pyproject.toml",
    )
    b = load_budget(p)
    assert b.max_stage_ratio == 1.1 and b.lost_pct == 2.5
    assert b.max_lost_ratio is None and b.step_pct is None


def test_pyproject_without_ppdiag_table(tmp_path: Path) -> None:
    p = _write(tmp_path, '[project]\nname = "x"\n', name="pyproject.toml")
    with pytest.raises(InputError, match=r"no \[tool\.ppdiag"):
        load_budget(p)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[budget]\nmax_lost = 0.2\n", r"unknown key\(s\) in \[budget\]: max_lost \(known: max_lost_ratio, "),
        ("[budget]\nmax_lost_ratio = 0.2\n[limits]\nx = 1\n", r"unknown key\(s\) in \[top level\]: limits"),
        (
            "[regression]\nstep = 5\n",
            r"unknown key\(s\) in \[regression\]: step \(known: step_pct, lost_pct\)",
        ),
        ('[budget]\nmax_lost_ratio = "0.2"\n', r"budget\.max_lost_ratio must be a number, got str"),
        ("[budget]\nmax_stage_ratio = true\n", r"budget\.max_stage_ratio must be a number, got bool"),
        ("[budget]\nmax_comm_wait_ratio = -0.1\n", r"must not be negative"),
        ("[budget]\nmax_lost_ratio = 25\n", r"ratio of step time between 0 and 1.*write 0\.25"),
        ("[budget]\nmax_stage_ratio = 0.9\n", r"max_stage_ratio must be >= 1"),
        ("budget = 3\n", r"\[budget\] must be a table"),
        ("[budget\nmax_lost_ratio = 0.2\n", r"not valid TOML"),
        ("\x00\x01binary", r"not valid TOML"),
    ],
)
def test_bad_budget_files(tmp_path: Path, text: str, pattern: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(InputError, match=pattern) as ei:
        load_budget(p)
    # one line that names the file
    assert str(ei.value).startswith(str(p) + ": ") and "\n" not in str(ei.value)


def test_pyproject_unknown_key_names_the_full_table(tmp_path: Path) -> None:
    p = _write(tmp_path, "[tool.ppdiag.budget]\nmax_bubble = 0.1\n", name="pyproject.toml")
    with pytest.raises(InputError, match=r"\[tool\.ppdiag\.budget\]: max_bubble"):
        load_budget(p)


def test_missing_budget_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such budget file"):
        load_budget(tmp_path / "nope.toml")


def test_load_report_checks_json_and_schema(tmp_path: Path) -> None:
    good = _write(tmp_path, json.dumps(base_report()), "base.json")
    assert load_report(good).summary.step_ms == 100.0
    with pytest.raises(InputError, match="not valid JSON"):
        load_report(_write(tmp_path, '{"schema_version": 1, "run": ', "trunc.json"))
    with pytest.raises(InputError, match="schema_version 2 is not supported"):
        load_report(_write(tmp_path, json.dumps(base_report(schema_version=2)), "v2.json"))
    with pytest.raises(InputError, match="no schema_version"):
        load_report(_write(tmp_path, "[1, 2]", "list.json"))
    with pytest.raises(InputError, match="no such"):
        load_report(tmp_path / "absent.json")


# ------------------------------------------------------------------ checks


def _all_limits(**over: float) -> Budget:
    b = Budget(
        max_lost_ratio=0.35,
        max_bubble_excess=0.05,
        max_stage_ratio=1.25,
        max_comm_wait_ratio=0.03,
        max_step_p95_ratio=1.2,
    )
    for k, v in over.items():
        setattr(b, k, v)
    return b


def test_gate_passes_and_reports_measured_values() -> None:
    res = run_gate(typed(base_report()), _all_limits())
    assert res.status == "pass" and res.exit_code == 0
    got = {c.name: c.measured for c in res.checks}
    assert got["lost_ratio"] == pytest.approx(LOST)
    assert got["bubble_excess"] == pytest.approx(BUBBLE_EXCESS)
    assert got["stage_ratio"] == pytest.approx(STAGE_RATIO)
    assert got["comm_wait_ratio"] == pytest.approx(COMM_WAIT)
    assert got["step_p95_ratio"] == pytest.approx(P95_RATIO)
    assert all(c.passed for c in res.checks)
    lines = format_gate(res)
    assert lines[0].startswith("ppdiag check PASS")
    assert any(
        line.strip() == f"PASS  slowest / mean stage {STAGE_RATIO:.3f} <= 1.250  (slowest stage 2: "
        "40.00 ms vs mean 32.50 ms)"
        for line in lines
    )


@pytest.mark.parametrize(
    ("key", "check", "measured"),
    [
        ("max_lost_ratio", "lost_ratio", LOST),
        ("max_bubble_excess", "bubble_excess", BUBBLE_EXCESS),
        ("max_stage_ratio", "stage_ratio", STAGE_RATIO),
        ("max_comm_wait_ratio", "comm_wait_ratio", COMM_WAIT),
        ("max_step_p95_ratio", "step_p95_ratio", P95_RATIO),
    ],
)
def test_each_budget_key_can_fail(key: str, check: str, measured: float) -> None:
    limit = max(1.0, measured - 0.01) if key in ("max_stage_ratio", "max_step_p95_ratio") else measured - 0.01
    res = run_gate(typed(base_report()), _all_limits(**{key: limit}))
    assert res.status == "fail" and res.exit_code == 1
    failed = [c.name for c in res.failed]
    assert failed == [check]
    lines = format_gate(res)
    assert lines[0] == "ppdiag check FAIL: 1 of 5 checks over the limit"
    bad = [line for line in lines if line.startswith("  FAIL")]
    assert len(bad) == 1 and f"{measured:.3f} > {limit:.3f}" in bad[0]


def test_a_value_exactly_at_the_limit_passes() -> None:
    res = run_gate(typed(base_report()), Budget(max_lost_ratio=0.30))
    assert res.status == "pass"


def test_bubble_excess_skipped_without_theoretical_bubble() -> None:
    rep = base_report(bubble={"measured_ratio": 0.3, "theoretical_ratio": None})
    res = run_gate(typed(rep), Budget(max_bubble_excess=0.01, max_lost_ratio=0.5))
    c = next(c for c in res.checks if c.name == "bubble_excess")
    assert c.state == "skip" and "no theoretical bubble ratio" in c.text
    # a configured check that could not be computed makes the gate inconclusive, unless the
    # user accepts partial data
    assert res.status == "inconclusive" and res.exit_code == 3
    assert any("bubble_excess could not be computed" in p for p in res.partial)
    assert any(line.startswith("  MISSING  check bubble_excess") for line in format_gate(res))
    res = run_gate(typed(rep), Budget(max_bubble_excess=0.01, max_lost_ratio=0.5), allow_partial=True)
    assert res.status == "pass"


def test_stage_ratio_skipped_without_stages() -> None:
    rep = base_report(stages=[])
    # what the analysis writes without stages: no ratio, no slowest stage
    rep["summary"].update(stage_ratio=None, slowest_stage=None)
    res = run_gate(typed(rep), Budget(max_stage_ratio=1.1))
    assert res.checks[0].state == "skip" and "fewer than 2 pipeline stages" in res.checks[0].text
    assert res.status == "inconclusive" and res.exit_code == 3  # nothing could be checked


def test_empty_budget_without_baseline_is_inconclusive() -> None:
    res = run_gate(typed(base_report()), Budget())
    assert res.status == "inconclusive" and res.exit_code == 3
    assert "nothing to check" in format_gate(res)[0]


# ------------------------------------------------------------------ regression


def _with_summary(step: float, **lost: float) -> dict[str, Any]:
    rep = base_report()
    rep["summary"]["step_ms"] = step
    rep["summary"]["lost_ms"].update(lost)
    return rep


def test_step_regression_uses_5_percent_by_default() -> None:
    base = base_report()
    res = run_gate(typed(_with_summary(106.0)), Budget(), baseline=typed(base))
    assert res.status == "fail" and res.exit_code == 1
    (c,) = res.checks
    assert c.name == "regression.step" and c.limit == 5.0 and c.measured == pytest.approx(6.0)
    assert "step time vs baseline +6.0 % > +5.0 %" in c.text
    ok = run_gate(typed(_with_summary(104.0)), Budget(), baseline=typed(base))
    assert ok.status == "pass" and ok.checks[0].measured == pytest.approx(4.0)
    faster = run_gate(typed(_with_summary(90.0)), Budget(step_pct=0.0), baseline=typed(base))
    assert faster.status == "pass"


def test_cause_regression_in_points_of_step_time() -> None:
    base = base_report()  # imbalance 6 ms of 100 ms, host 1 ms
    new = _with_summary(100.0, imbalance=10.0, host=2.0)  # +4 points and +1 point
    res = run_gate(typed(new), Budget(lost_pct=3.0), baseline=typed(base))
    assert res.status == "fail"
    by = {c.name: c for c in res.checks}
    assert (
        by["regression.imbalance"].measured == pytest.approx(4.0)
        and by["regression.imbalance"].passed is False
    )
    assert by["regression.host"].measured == pytest.approx(1.0) and by["regression.host"].passed is True
    assert by["regression.step"].passed is True
    assert [c.name for c in res.failed] == ["regression.imbalance"]
    # shares, not ms: same ms in a longer step is fewer points
    longer = _with_summary(200.0, imbalance=12.0)
    r2 = run_gate(typed(longer), Budget(lost_pct=3.0, step_pct=200.0), baseline=typed(base))
    assert {c.name: c.measured for c in r2.checks}["regression.imbalance"] == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("section", "key", "value", "why"),
    [
        ("run", "pp", 2, "baseline has pp 2, this run 4"),
        ("run", "schedule", "gpipe", "baseline has schedule gpipe, this run 1f1b"),
        ("run", "microbatches", 16, "baseline has micro-batches (M) 16, this run 8"),
    ],
)
def test_incomparable_baseline_is_inconclusive(section: str, key: str, value: object, why: str) -> None:
    base = base_report()
    base[section][key] = value
    res = run_gate(
        typed(_with_summary(150.0)), Budget(max_lost_ratio=0.5, lost_pct=1.0), baseline=typed(base)
    )
    assert res.status == "inconclusive" and res.exit_code == 3
    assert why in res.reasons
    reg = [c for c in res.checks if c.kind == "regression"]
    assert reg and all(c.state == "inconclusive" for c in reg)
    assert format_gate(res)[0] == f"ppdiag check INCONCLUSIVE: {why}"
    # a failing budget check still fails the gate
    res2 = run_gate(typed(_with_summary(150.0)), Budget(max_lost_ratio=0.1), baseline=typed(base))
    assert res2.status == "fail" and res2.exit_code == 1


def test_gate_result_json_round_trips() -> None:
    res = run_gate(typed(base_report()), _all_limits(max_stage_ratio=1.1))
    data = json.loads(json.dumps(res.to_json()))
    assert data["status"] == "fail" and data["exit_code"] == 1
    assert [c["state"] for c in data["checks"]].count("fail") == 1


# ------------------------------------------------------------------ partial data


def _covered(report: dict[str, Any], **over: object) -> dict[str, Any]:
    rep: dict[str, Any] = json.loads(json.dumps(report))
    rep["run"].update({"world_size": 4, "ranks": [0, 1, 2, 3], "steps": [5, 6, 7]})
    for r in rep["ranks"]:
        r["steps"] = 3
    rep["run"].update(over)
    return rep


def test_every_rank_took_part_passes_and_says_so() -> None:
    rep = _covered(base_report())
    res = run_gate(typed(rep), Budget(max_lost_ratio=0.5), coverage=coverage_of(typed(rep)))
    assert res.status == "pass" and res.partial == []
    lines = format_gate(res)
    assert "  took part: ranks 0-3 (world size 4); steps 5-7" in lines
    assert "  checks computed: lost_ratio" in lines


def test_missing_rank_is_inconclusive_unless_allowed() -> None:
    # the slow stage's rank is gone: what is left passes max_stage_ratio, the run would not
    rep = _covered(base_report(), ranks=[0, 1, 3])
    rep["ranks"] = [r for r in rep["ranks"] if r["rank"] != 2]
    rep["stages"] = [s for s in rep["stages"] if s["stage"] != 2]
    rep["summary"].update(stage_ratio=1.0, slowest_stage=None)  # stages 30/30/30: even
    bud = Budget(max_stage_ratio=1.1)
    res = run_gate(typed(rep), bud, coverage=coverage_of(typed(rep)))
    assert res.status == "inconclusive" and res.exit_code == 3
    assert "1 rank(s) 2 of world size 4 have no trace" in format_gate(res)[0]
    assert "  MISSING  1 rank(s) 2 of world size 4 have no trace" in format_gate(res)
    ok = run_gate(typed(rep), bud, coverage=coverage_of(typed(rep)), allow_partial=True)
    assert ok.status == "pass" and "  NOTE  1 rank(s) 2 of world size 4 have no trace" in format_gate(ok)


def test_rank_without_steps_and_unreadable_file_are_partial() -> None:
    rep = _covered(base_report())
    rep["ranks"][1]["steps"] = 0  # every step of rank 1 excluded by --steps
    cov = coverage_of(typed(rep), ["RUN/rank3.json.gz (zstd-compressed data)"], step_filter="9:9")
    res = run_gate(typed(rep), Budget(max_lost_ratio=0.5), coverage=cov)
    assert res.status == "inconclusive"
    text = "\n".join(format_gate(res))
    assert "rank(s) 1 have no analysed step (excluded by --steps 9:9)" in text
    assert "unreadable trace file RUN/rank3.json.gz (zstd-compressed data)" in text


def test_a_failing_check_on_partial_data_still_fails() -> None:
    rep = _covered(base_report(), ranks=[0, 1, 2])
    res = run_gate(typed(rep), Budget(max_lost_ratio=0.1), coverage=coverage_of(typed(rep)))
    assert res.status == "fail" and res.exit_code == 1


@pytest.mark.parametrize(
    ("step_ms", "why"),
    [
        (None, "baseline has no summary.step_ms"),
        (0, "baseline summary.step_ms is 0.0, not a positive number"),
        (-5.0, "baseline summary.step_ms is -5.0, not a positive number"),
        (float("nan"), "baseline summary.step_ms is nan, not a positive number"),
    ],
)
def test_invalid_baseline_step_is_inconclusive(step_ms: object, why: str) -> None:
    base = base_report()
    if step_ms is None:
        del base["summary"]["step_ms"]
    else:
        base["summary"]["step_ms"] = step_ms
    res = run_gate(typed(base_report()), Budget(max_lost_ratio=0.5), baseline=typed(base))
    assert res.status == "inconclusive" and res.exit_code == 3
    step = next(c for c in res.checks if c.name == "regression.step")
    assert step.state == "inconclusive" and why in step.text


def test_baseline_of_the_wrong_type_is_bad_input(tmp_path: Path) -> None:
    """A field the report's types cannot hold (a string step time) is refused naming the file
    and the field: the baseline is not a report ppdiag wrote."""
    base = base_report()
    base["summary"]["step_ms"] = "100"
    path = _write(tmp_path, json.dumps(base), "b.json")
    with pytest.raises(InputError, match=r"b\.json.*got `str` - at `\$\.summary\.step_ms`"):
        load_report(path)
    del base["summary"]
    with pytest.raises(InputError, match="missing required field `summary`"):
        load_report(_write(tmp_path, json.dumps(base), "c.json"))


def test_baseline_without_lost_ms_is_said() -> None:
    base = base_report()
    del base["summary"]["lost_ms"]
    res = run_gate(typed(base_report()), Budget(lost_pct=1.0), baseline=typed(base))
    lost = next(c for c in res.checks if c.name == "regression.lost")
    assert lost.state == "inconclusive" and "baseline has no valid summary.lost_ms" in lost.text
    assert res.status == "inconclusive"


@pytest.mark.parametrize("ver", ["true", "1.0", '"1"'])
def test_schema_version_must_be_the_integer_1(tmp_path: Path, ver: str) -> None:
    text = json.dumps(base_report()).replace('"schema_version": 1', f'"schema_version": {ver}')
    with pytest.raises(InputError, match=r"schema_version .* is not supported"):
        load_report(_write(tmp_path, text, "b.json"))


def test_stage_ratio_at_1_prints_enough_digits() -> None:
    rep = base_report()
    for s, c in zip(rep["stages"], [30.0, 30.0, 30.01, 30.0], strict=True):
        s["compute_ms"] = c
    res = run_gate(typed(rep), Budget(max_stage_ratio=1.0))
    chk = res.checks[0]
    assert chk.passed is False
    left, right = chk.text.split(" > ")[0].split()[-1], chk.text.split(" > ")[1].split()[0]
    assert left != right and float(left) > float(right)  # never "1.000 > 1.000"


def test_missing_rank_without_world_size() -> None:
    """No trace says the world size: ranks are numbered from 0, so 0, 1, 3 lack rank 2."""
    rep = _covered(base_report(), ranks=[0, 1, 3], world_size=0)
    res = run_gate(typed(rep), Budget(max_lost_ratio=0.5), coverage=coverage_of(typed(rep)))
    assert res.status == "inconclusive"
    assert "1 rank(s) 2 of ranks 0-3 have no trace" in res.partial
