"""The docs against the behaviour: every field docs/json.md's field list names is in the shipped
schema, under the section it is listed in; docs/budget.md's keys are the ones the budget reader
knows, each of its error lines is what ppdiag prints for that mistake, and its Python API example
runs and agrees with ``ppdiag check``. (docs/ci.md's example output: tests/test_cli_help.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

DOCS = REPO / "docs"
ENV = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PPDIAG_NO_CACHE": "1"}


def _block(doc: str, n: int = 0, lang: str = "text") -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", (DOCS / doc).read_text(encoding="utf-8"), re.S)
    return str(blocks[n])


def _names(left: str) -> list[str]:
    """The field names in the left column of a field-list line ("stage, ranks[], chunks[]")."""
    left = re.sub(r"\([^()]*\)|\{[^{}]*\}", "", left)
    names = [t.strip().removesuffix("[]") for t in left.split(",")]
    return [t for t in names if re.fullmatch(r"[a-z_][a-z0-9_]*", t)]


def _fields(schema: dict[str, Any], node: dict[str, Any], seen: set[str]) -> set[str]:
    """Every property name reachable from a schema node (through refs, arrays, anyOf, maps)."""
    out: set[str] = set()
    ref = node.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[1]
        if name in seen:
            return out
        seen.add(name)
        node = schema["$defs"][name]
    for key, sub in node.get("properties", {}).items():
        out.add(key)
        out |= _fields(schema, sub, seen)
    for sub in [node.get("items"), node.get("additionalProperties"), *node.get("anyOf", [])]:
        if isinstance(sub, dict):
            out |= _fields(schema, sub, seen)
    return out


def test_json_doc_fields_exist_in_the_schema() -> None:
    schema = json.loads((REPO / "ppdiag" / "report.schema.json").read_text(encoding="utf-8"))
    report = schema["$defs"]["Report"]["properties"]
    section, wrong = "", []
    for line in _block("json.md").splitlines():
        indent = len(line) - len(line.lstrip(" "))
        left = re.split(r" {2,}", line.strip(), maxsplit=1)[0]
        if indent == 0 and line.strip():
            names = _names(left)
            section = names[0] if names else ""
            # "ppdiag" is the file's first key, written around the report (not one of its fields)
            wrong += [n for n in names if n not in report and n != "ppdiag"]
        elif indent == 2 and section in report:
            known = _fields(schema, report[section], set())
            wrong += [f"{section}.{n}" for n in _names(left) if n not in known]
    assert wrong == [], wrong


def test_budget_doc_keys_are_the_readers() -> None:
    from ppdiag.reports.budget import budget_from_dict

    doc = (DOCS / "budget.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(budget|regression)` \| `(\w+)` \|.*\| (0 – 1|≥ 1|≥ 0) \|$", doc, re.M)
    assert len(rows) == 7
    inside = {"0 – 1": 0.5, "≥ 1": 1.2, "≥ 0": 3.0}
    for table, key, limit in rows:  # each documented key is accepted within its documented range
        budget_from_dict({table: {key: inside[limit]}}, "b.toml")
        if limit != "≥ 0":  # and refused outside it
            with pytest.raises(Exception, match=key):
                budget_from_dict({table: {key: 1.5 if limit == "0 – 1" else 0.9}}, "b.toml")
    with pytest.raises(Exception, match="unknown key"):
        budget_from_dict({"budget": {"max_lost": 0.3}}, "b.toml")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("docs")
    write_kineto(make_scenario(seed=4, steps=3), d / "run")
    subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(d / "run"), "--json", str(d / "report.json"), "-q"],
        env=ENV,
        check=True,
    )
    return d


def _check(d: Path, budget: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ppdiag", "check", str(d / "run"), "--budget", budget, *extra]
    return subprocess.run(cmd, cwd=d, env=ENV, capture_output=True, text=True)


def test_budget_doc_error_lines_are_what_ppdiag_prints(run: Path) -> None:
    lines = _block("budget.md", lang="").strip().splitlines()
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    (run / "v2.json").write_text(json.dumps({**report, "schema_version": 2}), encoding="utf-8")
    # the mistake behind each documented line, in the doc's order
    cases = [
        ("ppdiag.toml", "[budget]\nmax_lost = 0.3\n", ()),
        ("ppdiag.toml", "[budget]\nmax_lost_ratio = 25\n", ()),
        ("ppdiag.toml", "[budget]\nmax_stage_ratio = '1.2'\n", ()),
        ("pyproject.toml", '[project]\nname = "x"\n', ()),
        ("ppdiag.toml", "[budget]\nmax_lost_ratio = 0.9\n", ("--baseline", "baseline.json")),
    ]
    assert len(lines) == len(cases)
    for line, (name, text, extra) in zip(lines, cases, strict=True):
        (run / name).write_text(text, encoding="utf-8")
        if extra:
            (run / "baseline.json").write_text((run / "v2.json").read_text(encoding="utf-8"))
        res = _check(run, name, *extra)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip() == line, (line, res.stderr)


def test_budget_doc_python_example_runs(run: Path) -> None:
    code = _block("budget.md", lang="python")
    (run / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.25\n", encoding="utf-8")
    (run / "baseline.json").write_text((run / "report.json").read_text(encoding="utf-8"))
    res = subprocess.run([sys.executable, "-c", code], cwd=run, env=ENV, capture_output=True, text=True)
    cli = _check(run, "ppdiag.toml", "--baseline", "baseline.json")
    assert res.returncode == cli.returncode and res.returncode in (0, 1, 3), res.stderr
    # the same checks as the CLI prints, in the same words
    printed = [
        ln for ln in res.stdout.splitlines() if ln.startswith("  ") and ln.split()[0] in ("PASS", "FAIL")
    ]
    assert printed and all(ln in cli.stdout for ln in printed)


def test_ci_doc_names_the_actions_inputs_outputs_and_defaults() -> None:
    yaml = pytest.importorskip("yaml")

    action = yaml.safe_load((REPO / "action.yml").read_text(encoding="utf-8"))
    doc = " ".join((DOCS / "ci.md").read_text(encoding="utf-8").split())
    para = doc[doc.index("Inputs: `run-dir`") :]
    inputs, outputs = para.split("Outputs:", 1)
    named = set(re.findall(r"`([a-z][a-z-]+)`", inputs))
    assert set(action["inputs"]) <= named, set(action["inputs"]) - named
    assert set(action["outputs"]) <= set(re.findall(r"`([a-z][a-z-]+)`", outputs.split(". ")[0]))
    defaults = dict(re.findall(r"`([a-z][a-z-]+)` \((?:[^()`]*; )?default `([^`]*)`", inputs))
    assert "`run-dir` (required;" in inputs and action["inputs"]["run-dir"]["required"] is True
    # (empty input: the name the shell step builds, checked below)
    assert defaults.pop("artifact-name") == "ppdiag-report-<job id>-<matrix index>"
    assert action["inputs"]["artifact-name"]["default"] == ""
    for name, value in defaults.items():
        assert action["inputs"][name].get("default") == value, name
    assert set(defaults) == {"budget", "out-dir", "python"}
    # the default artifact name the doc gives is the one the action's shell step builds
    assert "ppdiag-report-${GITHUB_JOB:-job}-${PPDIAG_JOB_INDEX:-0}" in (REPO / "action.yml").read_text()


def test_readme_names_the_runtime_dependencies() -> None:
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)

    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    names = {re.split(r"[<>=;\[ ]", d, maxsplit=1)[0].lower() for d in deps}
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    said = re.search(r"ppdiag itself needs only ([^.]*)\.", readme)
    assert said, "the README's dependency sentence"
    listed = {w.lower() for w in re.findall(r"[A-Za-z][A-Za-z0-9_-]+", said.group(1))}
    assert names <= listed, names - listed
    assert listed - names <= {"and", "on", "python"}, listed - names
