"""The end of the ``ppdiag`` process: the console script freezes the garbage collector's objects
before the interpreter exits (ppdiag/__main__.py), and every output is still complete: the
report files, the terminal report on a pipe, the exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, TEST_DATA

from ppdiag.io import html_marker, md_marker

TRACE = TEST_DATA / "gpu_pp_rank0.json"


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PPDIAG_NO_CACHE="1", COLUMNS="100")
    env.pop("PPDIAG_DEBUG", None)
    return env


def test_console_script_freezes_before_exit() -> None:
    # the probe can fail: without the freeze, the count stays 0 after the command
    probe = (
        "import gc, sys\nimport ppdiag.__main__ as m\nsys.argv = ['ppdiag', 'rules', 'PP003']\n"
        "try:\n    m.main()\nexcept SystemExit:\n    pass\nprint('FROZEN', gc.get_freeze_count() > 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=_env(), check=True
    )
    assert proc.stdout.rstrip().endswith("FROZEN True"), proc.stdout + proc.stderr


def test_outputs_complete_at_exit(tmp_path: Path) -> None:
    out = {k: tmp_path / f"r.{k}" for k in ("json", "md", "html")}
    args = [
        "analyze",
        str(TRACE),
        "--json",
        str(out["json"]),
        "--md",
        str(out["md"]),
        "--html",
        str(out["html"]),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "ppdiag", *args], capture_output=True, text=True, env=_env(), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out["json"].read_text(encoding="utf-8"))  # the whole document parses
    assert report["findings"] is not None
    assert out["md"].read_text(encoding="utf-8").rstrip().endswith(md_marker())
    html = out["html"].read_text(encoding="utf-8")
    assert html_marker() in html and html.rstrip().endswith("</html>")
    # the terminal report on a pipe: written to its end (the same text as a run with -q off and
    # its stdout read by the parent process until EOF)
    assert proc.stdout.strip() and proc.stdout.endswith("\n")
    again = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(TRACE)], capture_output=True, text=True, env=_env()
    )
    assert again.stdout == proc.stdout
