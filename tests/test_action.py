"""The composite GitHub Action (``action.yml``): its shell steps run locally with bash on a
synthetic run, with the inputs substituted as GitHub would. The upload step (``uses:``) is left out;
its files are checked to exist.

In the fast tests the install step runs with a stand-in interpreter whose ``-m venv`` makes a
virtual environment around this test's interpreter and whose ``-m pip`` only records what it was
asked to install (the checkout is on PYTHONPATH instead). The slow test installs for real: the
documented ``"ppdiag[extra] @ git+URL"`` requirement (a ``git+file://`` clone of this tree) with
Debian's externally managed Python (PEP 668) and with Python 3.10 (TOML read through tomli)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def _action() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
    return doc


#: Stands in for the interpreter in the fast tests: ``-m venv DIR`` makes ``DIR/bin/python``, which
#: records ``-m pip`` calls (and the requirements file) instead of installing, and runs the rest.
FAKE_PYTHON = """#!/bin/bash
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cat > "$3/bin/python" <<EOS
#!/bin/bash
if [ "\\$1" = "-m" ] && [ "\\$2" = "pip" ]; then
  printf '%s\\n' "\\$@" > "$3/pip-args"
  for a in "\\$@"; do if [ -f "\\$a" ]; then cp "\\$a" "$3/pip-requirements"; fi; done
  exit 0
fi
exec {exe} "\\$@"
EOS
  chmod +x "$3/bin/python"
  exit 0
fi
echo "unexpected: $*" >&2
exit 3
"""


def _fake_python(tmp: Path) -> Path:
    p = tmp / "fake-python"
    p.write_text(FAKE_PYTHON.replace("{exe}", sys.executable))
    p.chmod(0o755)
    return p


def _run_action(
    tmp: Path,
    inputs: dict[str, str],
    *,
    real_install: bool = False,
    job: str = "gate",
    job_index: str = "0",
) -> tuple[dict[str, str], dict[str, Any], Path]:
    """Run every ``run:`` step; the steps' exit-code outputs, their results and the step summary.
    Without ``real_install`` the interpreter is :data:`FAKE_PYTHON` and the checkout is on PYTHONPATH."""
    doc = _action()
    if not real_install:
        inputs = {"python": str(_fake_python(tmp))} | inputs
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
            if e == "strategy.job-index":
                return job_index
            mm = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", e)
            if mm:
                return outputs.get(mm.group(1), {}).get(mm.group(2), "")
            raise AssertionError(f"unknown expression {e}")

        return EXPR.sub(one, text)

    for step in doc["runs"]["steps"]:
        if "uses" in step:
            results[step["id"]] = {k: expr(str(v)) for k, v in step.get("with", {}).items()}
            continue
        assert step["shell"] == "bash"
        out_file = tmp / f"out_{step['id']}"
        out_file.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PPDIAG_")}
        env |= {k: expr(str(v)) for k, v in step.get("env", {}).items()}
        env |= {
            "GITHUB_OUTPUT": str(out_file),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_JOB": job,
            "RUNNER_TEMP": str(tmp / "runner-temp"),
        }
        if real_install:  # the installed package, not the checkout
            env.pop("PYTHONPATH", None)
        else:
            env["PYTHONPATH"] = str(ROOT)
        (tmp / "runner-temp").mkdir(exist_ok=True)
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
    results["outputs"] = outputs
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


def _venv_of(res: dict[str, Any]) -> Path:
    return Path(res["outputs"]["install"]["python"]).parents[1]


def test_install_input_with_a_direct_reference_stays_one_requirement(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.99\n")
    req = "ppdiag[parquet] @ git+https://github.com/OWNER/ppdiag@v1"
    codes, res, _ = _run_action(tmp_path, {"run-dir": str(run_dir), "install": req})
    assert res["install"].returncode == 0, res["install"].stderr
    venv = _venv_of(res)
    # its own virtual environment under the runner's temp dir, and the check ran with it
    assert venv.parent == tmp_path / "runner-temp"
    assert (venv / "pip-args").read_text().splitlines()[:3] == ["-m", "pip", "install"]
    assert (venv / "pip-requirements").read_text() == req + "\n"
    assert codes["check"] == "0", res["check"].stdout + res["check"].stderr


def test_install_defaults_to_the_action_checkout(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.99\n")
    _, res, _ = _run_action(tmp_path, {"run-dir": str(run_dir)})
    assert (_venv_of(res) / "pip-args").read_text().splitlines()[-1] == str(ROOT)


def test_default_artifact_name_is_unique_per_job_and_matrix_entry(tmp_path: Path, run_dir: Path) -> None:
    (tmp_path / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.99\n")
    names = set()
    for job, index in (("gate", "0"), ("gate", "1"), ("other", "0")):
        d = tmp_path / f"{job}{index}"
        d.mkdir()
        (d / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.99\n")
        _, res, _ = _run_action(d, {"run-dir": str(run_dir)}, job=job, job_index=index)
        names.add(res["upload"]["name"])
    assert names == {"ppdiag-report-gate-0", "ppdiag-report-gate-1", "ppdiag-report-other-0"}
    _, res, _ = _run_action(tmp_path, {"run-dir": str(run_dir), "artifact-name": "mine"})
    assert res["upload"]["name"] == "mine"


def _externally_managed() -> str | None:
    """Debian's system Python when it refuses pip installs (PEP 668) and can make a venv."""
    py = Path("/usr/bin/python3")
    if not py.exists():
        return None
    code = (
        "import os, sysconfig, venv, ensurepip\n"
        "print(os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"
    )
    res = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    return str(py) if res.stdout.strip() == "True" else None


def _python310() -> str | None:
    """A Python 3.10 interpreter (the oldest ppdiag supports), if one is installed."""
    candidates = [
        *sorted(Path.home().glob(".pyenv/versions/3.10.*/bin/python3.10")),
        Path("/usr/bin/python3.10"),
    ]
    for exe in candidates:
        if exe.exists() and subprocess.run([str(exe), "-c", "import venv, ensurepip"]).returncode == 0:
            return str(exe)
    return None


def _git_clone_of_tree(dst: Path) -> str:
    """A git repository holding this tree's files (tracked, or new and not ignored): its file:// URL."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(dst)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "tree"], check=True)
    # a host in the URL: the pip of Debian 12 (23.0) refuses a git+file:/// URL without one
    return f"file://localhost{dst}"


@pytest.mark.slow
@pytest.mark.parametrize("which", ["externally-managed", "python3.10"])
def test_action_installs_the_documented_requirement_for_real(
    tmp_path: Path, run_dir: Path, which: str
) -> None:
    py = _externally_managed() if which == "externally-managed" else _python310()
    if py is None:
        pytest.skip(f"no {which} Python here")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    if which == "externally-managed":  # the premise: a plain pip install is refused
        refused = subprocess.run(
            [py, "-m", "pip", "install", "--dry-run", "six"], capture_output=True, text=True
        )
        assert refused.returncode != 0 and "externally-managed" in refused.stderr
    url = _git_clone_of_tree(tmp_path / "clone")
    (tmp_path / "ppdiag.toml").write_text("[budget]\nmax_lost_ratio = 0.99\n")
    inputs = {"run-dir": str(run_dir), "python": py, "install": f"ppdiag[zstd] @ git+{url}"}
    codes, res, summary = _run_action(tmp_path, inputs, real_install=True)
    assert res["install"].returncode == 0, res["install"].stdout[-2000:] + res["install"].stderr[-2000:]
    assert codes["check"] == "0", res["check"].stdout + res["check"].stderr
    assert res["verdict"].returncode == 0
    assert "ppdiag" in summary.read_text()
    venv_py = res["outputs"]["install"]["python"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [venv_py, "-c", "import ppdiag, zstandard; print(ppdiag.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert where.returncode == 0 and where.stdout.startswith(str(tmp_path / "runner-temp")), where
