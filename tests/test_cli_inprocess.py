"""Every command in-process (typer's CliRunner): exit codes, the files written, and that what
``analyze`` writes is the typed report that ``check`` and ``diff`` read back.

One small synthetic run (P=4, M=4, stage 2 at 1.5x) is written once per module; its numbers are
the simulator's, so the assertions are about structure and exit codes, not hard-coded times
(except where a test makes the numbers itself, e.g. a baseline 20 % faster).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from ppdiag.cli import app
from ppdiag.report_types import Report, decode, dumps
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

RUNNER = CliRunner()


def _invoke(*args: str) -> tuple[int, str]:
    res = RUNNER.invoke(app, list(args))
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(steps=2, pp=4, microbatches=4, faults=[F.SlowStage(2, 1.5)]), d)
    return d


@pytest.fixture(scope="module")
def report_json(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "report.json"
    code, text = _invoke("analyze", str(run_dir), "-q", "--json", str(out))
    assert code == 0, text
    return out


def _budget(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "ppdiag.toml"
    p.write_text(text, encoding="utf-8")
    return p


def _scaled(report: Report, factor: float) -> Report:
    """The same report with every step time ``factor`` times as long (a slower or faster run)."""
    s = report.summary
    summ = msgspec.structs.replace(
        s,
        step_ms=None if s.step_ms is None else s.step_ms * factor,
        step_p95_ms=None if s.step_p95_ms is None else s.step_p95_ms * factor,
    )
    return msgspec.structs.replace(report, summary=summ)


def test_analyze_writes_the_typed_report(run_dir: Path, report_json: Path, tmp_path: Path) -> None:
    rep = decode(report_json.read_bytes())
    assert rep.run.pp == 4 and rep.run.microbatches == 4 and rep.gate is None
    assert [s.stage for s in rep.stages] == [0, 1, 2, 3]
    assert any(f.code == "PP003" and f.stages == [2] for f in rep.findings)
    # the file is the report's own encoding: decode and encode again gives the same bytes
    text = report_json.read_text(encoding="utf-8")
    assert dumps(rep, {"ppdiag": {"kind": "report"}}) + "\n" == text
    assert next(iter(json.loads(text))) == "ppdiag"  # the marker is the first key
    # the terminal report and the Markdown summary of the same run
    md = tmp_path / "summary.md"
    code, out = _invoke("analyze", str(run_dir), "--md", str(md))
    assert code == 0, out
    assert "per step" in out and "PP003" in out
    assert md.read_text(encoding="utf-8").startswith("## ppdiag: ")


def test_analyze_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.json"
    bad.write_text("{not json", encoding="utf-8")
    code, out = _invoke("analyze", str(bad), "-q")
    assert code == 2 and "rank0.json" in out and "Traceback" not in out


def test_check_pass_fail_and_gate_section(run_dir: Path, report_json: Path, tmp_path: Path) -> None:
    loose = _budget(tmp_path, "[budget]\nmax_lost_ratio = 0.95\n")
    out_json = tmp_path / "gate.json"
    code, out = _invoke("check", str(run_dir), "-q", "--budget", str(loose), "--json", str(out_json))
    assert code == 0, out
    assert "PASS" in out
    rep = decode(out_json.read_bytes())
    assert rep.gate is not None and rep.gate.status == "pass" and rep.gate.exit_code == 0
    assert [c.name for c in rep.gate.checks] == ["lost_ratio"]
    # a stage 1.5x the others fails a 1.1 stage-ratio budget
    tight = _budget(tmp_path, "[budget]\nmax_stage_ratio = 1.1\n")
    code, out = _invoke("check", str(run_dir), "-q", "--budget", str(tight))
    assert code == 1, out
    assert "FAIL" in out


def test_check_against_a_baseline(run_dir: Path, report_json: Path, tmp_path: Path) -> None:
    bud = _budget(tmp_path, "[regression]\nstep_pct = 5\n")
    # the run against its own report: no regression
    code, out = _invoke("check", str(run_dir), "-q", "--budget", str(bud), "--baseline", str(report_json))
    assert code == 0, out
    # against a baseline 20 % faster: the step grew by 25 % > 5 %
    fast = tmp_path / "fast.json"
    fast.write_text(dumps(_scaled(decode(report_json.read_bytes()), 0.8)), encoding="utf-8")
    code, out = _invoke("check", str(run_dir), "-q", "--budget", str(bud), "--baseline", str(fast))
    assert code == 1, out
    assert "+25.0 %" in out


def test_check_baseline_of_the_wrong_type_is_bad_input(
    run_dir: Path, report_json: Path, tmp_path: Path
) -> None:
    doc = json.loads(report_json.read_text(encoding="utf-8"))
    doc["summary"]["step_ms"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    bud = _budget(tmp_path, "[regression]\nstep_pct = 5\n")
    code, out = _invoke("check", str(run_dir), "-q", "--budget", str(bud), "--baseline", str(bad))
    assert code == 2, out
    assert "bad.json" in out and "$.summary.step_ms" in out and "Traceback" not in out


def test_diff_exit_codes_and_json(report_json: Path, tmp_path: Path) -> None:
    rep = decode(report_json.read_bytes())
    slow = tmp_path / "slow.json"
    slow.write_text(dumps(_scaled(rep, 1.2)), encoding="utf-8")
    out_json = tmp_path / "diff.json"
    code, out = _invoke("diff", str(report_json), str(report_json), "--json", str(out_json))
    assert code == 0, out
    doc = json.loads(out_json.read_text(encoding="utf-8"))
    assert doc["ppdiag"] == {"kind": "diff"} and doc["regression"] is None
    # +20 % is beyond the default 5 % (the gate's step_pct), not beyond 25 %
    code, out = _invoke("diff", str(report_json), str(slow))
    assert code == 1 and "regression" in out and "+20.0 %" in out
    assert _invoke("diff", str(report_json), str(slow), "--threshold", "25")[0] == 0
    assert _invoke("diff", str(slow), str(report_json))[0] == 0  # faster: no regression


def test_diff_of_a_run_directory(run_dir: Path, report_json: Path) -> None:
    code, out = _invoke("diff", str(report_json), str(run_dir))
    assert code == 0, out
    assert "stage 2" in out


def test_whatif_json(run_dir: Path) -> None:
    code, out = _invoke("whatif", str(run_dir), "-m", "8", "--json")
    assert code == 0, out
    doc = json.loads(out)
    rows = doc["scenarios"] if "scenarios" in doc else doc["predictions"]
    assert any(r["microbatches"] == 8 for r in rows)


def test_whatif_without_pipeline_is_exit_2(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data" / "cpu_gloo_rank0.json"
    code, out = _invoke("whatif", str(data))
    assert code == 2 and "Traceback" not in out


def test_bubble_and_batch() -> None:
    # 1F1B, P=4, M=8: (P-1)/(M+P-1) = 3/11 = 27.3 %
    code, out = _invoke("bubble", "--pp", "4", "--microbatches", "8")
    assert code == 0 and "27.3%" in out
    # 8 ranks / (tp 1 x pp 4) = dp 2; 32 samples / (2 x micro-batch 2) = 8 accumulation steps
    code, out = _invoke(
        "batch", "--world", "8", "--tp", "1", "--pp", "4", "--micro-batch", "2", "--global-batch", "32"
    )
    assert code == 0 and "dp" in out
    row = next(ln for ln in out.splitlines() if "accumulation steps" in ln)
    assert row.rstrip(" │").split()[-1] == "8"
    assert _invoke("bubble", "--pp", "4", "--microbatches", "8", "--schedule", "nope")[0] == 2


def test_rules_catalogue() -> None:
    code, out = _invoke("rules")
    assert code == 0 and "PP001" in out and "PP011" in out
    code, out = _invoke("rules", "PP003")
    assert code == 0 and "How to fix" in out
    assert _invoke("rules", "PP999")[0] == 2


def test_cache_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PPDIAG_CACHE_DIR", str(tmp_path / "cache"))
    code, out = _invoke("cache", "info")
    assert code == 0 and "entries: 0" in out
    assert _invoke("cache", "clear")[0] == 0


def test_demo_refuses_a_bad_size_before_recording() -> None:
    code, out = _invoke("demo", "--pp", "0")
    assert code == 2 and "pp must be between" in out


def test_version_and_help() -> None:
    code, out = _invoke("--version")
    assert code == 0 and "ppdiag" in out
    code, out = _invoke("--help")
    assert code == 0
    for cmd in ("analyze", "check", "diff", "whatif", "bubble", "batch", "demo", "rules", "cache"):
        assert cmd in out
