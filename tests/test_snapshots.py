"""Snapshots of the Markdown summary and the terminal report of one fixed small run.

The run is the simulator's (P=4, M=4, 1F1B, stage 2 at 1.5x, a host stall on rank 1, seed 0), so
its numbers are the same on every machine. A change to either output shows up here as a diff to
review; when the change is meant, regenerate the files deliberately:

    PPDIAG_UPDATE_SNAPSHOTS=1 python3 -m pytest tests/test_snapshots.py

Paths of the temporary run directory are written as ``<RUN>``.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.errors import InputError
from ppdiag.io import output_kind
from ppdiag.reports import write_report
from ppdiag.reports.md import render_markdown
from ppdiag.reports.terminal import render
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("PPDIAG_UPDATE_SNAPSHOTS") == "1"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Analyzed, Path]:
    d = tmp_path_factory.mktemp("snap")
    run = make_scenario(
        steps=2, pp=4, microbatches=4, faults=[F.SlowStage(2, 1.5), F.HostStall(1, 0.5)], seed=0
    )
    write_kineto(run, d)
    return diagnose([d], Options()), d


def _check(name: str, text: str, run_dir: Path, test_file: str = __file__) -> None:
    """Compare ``text`` with the snapshot file ``name`` (written under ``PPDIAG_UPDATE_SNAPSHOTS=1``);
    ``test_file`` is the test to rerun that way."""
    text = text.replace(str(run_dir), "<RUN>")
    path = SNAPSHOTS / name
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"no snapshot {path}: run with PPDIAG_UPDATE_SNAPSHOTS=1 to write it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    want = path.read_text(encoding="utf-8")
    assert text == want, f"{name} changed; if meant: PPDIAG_UPDATE_SNAPSHOTS=1 pytest {test_file}"


def test_markdown_snapshot(small: tuple[Analyzed, Path]) -> None:
    diag, d = small
    _check("small_run.md", render_markdown(diag.result), d)


def test_terminal_snapshot(small: tuple[Analyzed, Path]) -> None:
    diag, d = small
    buf = io.StringIO()
    # fixed width, no colour codes: what a 120-column log shows
    render(diag.result, Console(file=buf, width=120, color_system=None, force_terminal=False))
    _check("small_run.txt", buf.getvalue(), d)


def test_terminal_reporter_writes_what_a_log_shows(small: tuple[Analyzed, Path], tmp_path: Path) -> None:
    """The registered reporter ``terminal`` writes the text a 140-column log gets, then its marker:
    a second run may write over its own file, never over another text file."""
    diag, _ = small
    buf = io.StringIO()
    render(diag.result, Console(file=buf, width=140, color_system=None, force_terminal=False))
    out = write_report("terminal", diag, tmp_path / "report.txt")
    assert out.read_text(encoding="utf-8") == buf.getvalue() + "\n<!-- ppdiag:terminal -->\n"
    assert output_kind(out) == "terminal"
    write_report("terminal", diag, out)  # its own file: written over
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(InputError):
        write_report("terminal", diag, tmp_path / "notes.txt")


def test_snapshot_check_can_fail(small: tuple[Analyzed, Path], tmp_path: Path) -> None:
    """The comparison is exact: one changed figure is a failure."""
    diag, d = small
    md = render_markdown(diag.result)
    if UPDATE:
        pytest.skip("regenerating")
    want = (SNAPSHOTS / "small_run.md").read_text(encoding="utf-8")
    assert md.replace(str(d), "<RUN>") == want
    assert md.replace("per step", "per stp", 1) != want
