"""The composite GitHub Action (``action.yml``): its shell steps run locally with bash on a
synthetic run, with the inputs substituted as GitHub would. The install step is left out (it would
pip-install into this interpreter; the checkout is on PYTHONPATH instead) and so is the upload
step (``uses:``), whose files are checked to exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ppdiag.synth.kineto import write_kineto
from ppdiag.synth.scenario import make_scenario

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def _action() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
    return doc


def _run_action(tmp: Path, inputs: dict[str, str]) -> tuple[dict[str, str], dict[str, Any], Path]:
    """Run every ``run:`` step but the install one; the steps' outputs and the step summary."""
    doc = _action()
    values = {k: str(v.get("default", "")) for k, v in doc["inputs"].items()} | inputs
    outputs: dict[str, dict[str, str]] = {}
    summary = tmp / "step_summary.md"
    summary.write_text("")
    results: dict[str, Any] = {}

    def expr(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            e = m.group(1)
            if e.startswith("inputs."):
                return values[e[len("inputs.") :]]
            if e == "github.action_path":
                return str(ROOT)
            mm = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", e)
            if mm:
                return outputs.get(mm.group(1), {}).get(mm.group(2), "")
            raise AssertionError(f"unknown expression {e}")

        return EXPR.sub(one, text)

    for step in doc["runs"]["steps"]:
        if "uses" in step:
            results[step["id"]] = {k: expr(str(v)) for k, v in step.get("with", {}).items()}
            continue
        if step["id"] == "install":
            continue
        assert step["shell"] == "bash"
        out_file = tmp / f"out_{step['id']}"
        out_file.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PPDIAG_")}
        env |= {k: expr(str(v)) for k, v in step.get("env", {}).items()}
        env |= {"GITHUB_OUTPUT": str(out_file), "GITHUB_STEP_SUMMARY": str(summary), "PYTHONPATH": str(ROOT)}
        res = subprocess.run(
            # as GitHub runs a composite step's bash: bash --noprofile --norc -eo pipefail {0}
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", expr(step["run"])],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        results[step["id"]] = res
        outputs[step["id"]] = dict(
            line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line
        )
    return {k: v.get("exit-code", "") for k, v in outputs.items()}, results, summary


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("action") / "run"
    write_kineto(make_scenario(seed=11, steps=3), d)
    return d


def test_action_is_composite_and_documented() -> None:
    doc = _action()
    assert doc["runs"]["using"] == "composite"
    assert {"run-dir", "budget", "baseline"} <= set(doc["inputs"])
    ci = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    assert "uses: " in ci and "action.yml" in ci
    # an install line that works without a package index
    assert "pip install ppdiag\n" not in ci and "git+https://" in ci


def test_action_passes_within_budget(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.99\n")
    codes, res, summary = _run_action(tmp_path, {"run-dir": str(run_dir)})
    assert codes["check"] == "0", res["check"].stdout + res["check"].stderr
    assert res["verdict"].returncode == 0
    out = tmp_path / "ppdiag-report"
    for f in ("report.html", "report.json", "summary.md"):
        assert (out / f).stat().st_size > 0
    assert "ppdiag" in summary.read_text()
    # the upload step names the three files
    assert all(
        str(p) in res["upload"]["path"] for p in ("ppdiag-report/report.html", "ppdiag-report/summary.md")
    )


def test_action_fails_over_budget_but_still_reports(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.0001\n")
    codes, res, summary = _run_action(tmp_path, {"run-dir": str(run_dir)})
    assert codes["check"] == "1"
    assert res["verdict"].returncode == 1
    assert (tmp_path / "ppdiag-report" / "report.html").exists() and summary.read_text().strip()


def test_action_with_a_baseline(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.99\n")
    base = tmp_path / "base.json"
    subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(run_dir), "--json", str(base), "-q"],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    codes, res, _ = _run_action(tmp_path, {"run-dir": str(run_dir), "baseline": str(base)})
    assert codes["check"] == "0", res["check"].stdout
    assert "baseline" in res["check"].stdout
