"""Help and docs against behaviour: every command's --help names values, not Python types; the
flags that mean "override" in analyze and "predict" in whatif say so; batch with nothing to check
is a usage error; bubble explains a simulated bubble that differs from its formula; docs/ci.md's
example output has the checks its own budget yields; --steps takes both forms its help shows, and
--no-ranks and -q hide what their help says. (--wide's default: tests/test_terminal.py; the docs
pages: tests/test_docs_examples.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

from ppdiag.cli import app
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

COMMANDS = [
    ["analyze"],
    ["check"],
    ["diff"],
    ["whatif"],
    ["bubble"],
    ["batch"],
    ["demo"],
    ["rules"],
    ["cache", "info"],
    ["cache", "clear"],
    [],
]
TYPE_LEAK = re.compile(r"<(int|float|str|path|list|bool)[^>]*>|\{\w+\}|list\[|\bint range\b")


def _help(args: list[str]) -> str:
    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "ppdiag")
def test_help_names_values_not_types(args: list[str]) -> None:
    out = _help(args)
    assert not TYPE_LEAK.search(out), TYPE_LEAK.search(out)


def test_usage_line_names_the_arguments() -> None:
    assert "Usage: ppdiag analyze [OPTIONS] PATHS..." in _help(["analyze"])
    assert "Usage: ppdiag diff [OPTIONS] BASE NEW" in _help(["diff"])
    assert "--pp N" in _help(["analyze"]) and "--json PATH" in _help(["analyze"])
    # each argument's own help, and the markers unescaped (typer 0.16 to 0.25 with click 8.5 drops
    # the former; typer 0.13 to 0.20 print "\\[required]")
    out = _help(["analyze"])
    assert "PATHS...  Run directory" in out and "[required]" in out and "\\[" not in out


def test_override_in_analyze_predict_in_whatif() -> None:
    flat = " ".join(_help(["analyze"]).split())
    assert "-m, --microbatches N Override:" in flat and "--pp N Override:" in flat
    flat = " ".join(_help(["whatif"]).split())
    assert "-m, --microbatches TEXT Predict:" in flat and "--pp TEXT Predict:" in flat


def test_batch_with_nothing_to_check_is_a_usage_error() -> None:
    res = CliRunner().invoke(app, ["batch"])
    assert res.exit_code == 2 and "nothing to check" in res.output
    res = CliRunner().invoke(
        app, ["batch", "--world", "8", "--pp", "4", "--micro-batch", "2", "--global-batch", "64"]
    )
    assert res.exit_code == 0 and "no problems found" in res.output


def test_bubble_says_why_the_simulation_differs_from_the_formula() -> None:
    res = CliRunner().invoke(app, ["bubble", "--schedule", "zbv", "-m", "8", "--pp", "8", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["bubble_ratio"] > doc["closed_form"] + 0.05
    assert "cannot fill its warm-up" in doc["note"] and "agree from M=16" in doc["note"]
    res = CliRunner().invoke(app, ["bubble", "--schedule", "1f1b", "-m", "8", "--pp", "4", "--json"])
    assert json.loads(res.output)["note"] is None  # simulated = formula: nothing to explain


def test_ci_doc_example_has_the_checks_its_budget_yields(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "ci.md").read_text(encoding="utf-8")
    budget = re.search(r"```toml\n# ppdiag.toml\n(.*?)```", doc, re.S)
    example = re.search(r"```\n(ppdiag check (?:PASS|FAIL).*?)```", doc, re.S)
    assert budget and example
    (tmp_path / "ppdiag.toml").write_text(budget.group(1))
    run = tmp_path / "run"
    write_kineto(make_scenario(seed=4, steps=3), run)
    base = tmp_path / "base.json"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PPDIAG_NO_CACHE": "1"}
    subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(run), "--json", str(base), "-q"], env=env, check=True
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppdiag",
            "check",
            str(run),
            "--budget",
            str(tmp_path / "ppdiag.toml"),
            "--baseline",
            str(base),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    n = int(re.search(r"of (\d+) checks", res.stdout).group(1))  # type: ignore[union-attr]
    shown = example.group(1)
    assert f"of {n} checks" in shown
    assert len(re.findall(r"^  (PASS|FAIL)  ", shown, re.M)) == n


@pytest.fixture(scope="module")
def help_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("help") / "run"
    write_kineto(make_scenario(seed=5, steps=4), d)
    return d


@pytest.mark.parametrize("steps", ["6:7", "6,7"])
def test_steps_help_forms_select_those_steps(help_run: Path, tmp_path: Path, steps: str) -> None:
    # analyze/check --help: "Steps to analyze: 'a:b' (ProfilerStep numbers a..b, inclusive) or '5,6'"
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["analyze", str(help_run), "--steps", steps, "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["run"]["steps"] == [6, 7]  # (the synthetic run records 5-8)


def test_ranks_and_quiet_do_what_help_says(help_run: Path) -> None:
    # "--ranks / --no-ranks  Show the per-rank table"; "-q, --quiet  No terminal report"
    shown = CliRunner().invoke(app, ["analyze", str(help_run)])
    hidden = CliRunner().invoke(app, ["analyze", str(help_run), "--no-ranks"])
    quiet = CliRunner().invoke(app, ["analyze", str(help_run), "-q"])
    assert shown.exit_code == hidden.exit_code == quiet.exit_code == 0
    assert "Per rank" in shown.output and "Per rank" not in hidden.output and "Per stage" in hidden.output
    assert "Per stage" not in quiet.output and "PP0" not in quiet.output
