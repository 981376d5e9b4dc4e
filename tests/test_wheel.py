"""ppdiag as a user installs it: the wheel built from the checkout's files, installed into a fresh
virtual environment outside the checkout (no system site packages, dependencies from the package
index), analysing a real two-rank trace with ``--html --json``. This is what checks the packaged
data: the page templates, the vendored plotly.js bundle and the JSON schema."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, SHARED_TRACES

pytestmark = pytest.mark.slow

TRACE = SHARED_TRACES / "kineto" / "gloo_cpu_2rank"


def _user_env(tmp: Path) -> dict[str, str]:
    """An environment without this checkout on the import path and without the test session's cache."""
    keep = (
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "HTTPS_PROXY",
        "HTTP_PROXY",
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return env | {"PPDIAG_CACHE_DIR": str(tmp / "cache"), "NO_COLOR": "1", "COLUMNS": "100"}


def _source_copy(dst: Path) -> Path:
    """The files a clone of the repository holds (tracked, or new and not ignored), copied to ``dst``."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def test_wheel_installs_and_analyses_outside_the_checkout(tmp_path: Path) -> None:
    if not TRACE.is_dir():
        pytest.skip("../shared/traces not available")
    src = _source_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        timeout=600,
    )
    (wheel,) = dist.glob("ppdiag-*.whl")
    # the synthetic-trace writer the tests and benchmarks share (ppsynth, at the repository root) is
    # not shipped
    shipped = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in shipped if n.startswith(("ppsynth/", "ppdiag/synth/"))]
    assert "ppdiag/api.py" in shipped
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    work = tmp_path / "work"
    work.mkdir()
    env = _user_env(tmp_path)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, cwd=work, env=env, timeout=900
    )
    where = subprocess.run(
        [str(py), "-c", "import ppdiag, sys; print(ppdiag.__file__); print('torch' in sys.modules)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where[0].startswith(str(venv)), where  # the installed copy, not the checkout
    assert where[1] == "False"  # and it needs no torch
    res = subprocess.run(
        [str(venv / "bin" / "ppdiag"), "analyze", str(TRACE), "--html", "r.html", "--json", "r.json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    html = (work / "r.html").read_text(encoding="utf-8")
    # the page template and the inlined plotly.js bundle came from the wheel
    assert "Plotly.newPlot" in html or "Plotly.react" in html
    assert len(html) > 1_000_000 and "<script" in html
    report = json.loads((work / "r.json").read_text(encoding="utf-8"))
    assert report["run"]["world_size"] == 2
    # the packaged schema is there and the report decodes against the installed types
    check = (
        "import json, sys\n"
        "from importlib.resources import files\n"
        "import msgspec\n"
        "from ppdiag.report_types import Report\n"
        "schema = json.loads(files('ppdiag').joinpath('report.schema.json').read_text())\n"
        "assert schema['$ref'] or schema['$defs']\n"
        "msgspec.json.decode(open(sys.argv[1], 'rb').read(), type=Report)\n"
    )
    subprocess.run([str(py), "-c", check, "r.json"], cwd=work, env=env, check=True, timeout=120)
