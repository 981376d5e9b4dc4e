"""Terminal report: fits 80 columns in a real pty without a cut cell, plain text under NO_COLOR
and in a pipe, the full cause tables behind --wide."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SGR = re.compile(r"\x1b\[[0-9;]*m")  # colour and bold


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("term") / "run"
    write_kineto(make_scenario(seed=3, steps=3), d)
    return d


def _pty_run(args: list[str], cols: int, env_extra: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``python -m ppdiag ARGS`` on a pty of ``cols`` columns; exit code and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update({"PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "PPDIAG_NO_CACHE": "1"})
    env.update(env_extra or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppdiag", *args], stdin=slave, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    out = bytearray()
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the pty
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=60), out.decode("utf-8", "replace")


def test_80_columns_no_cell_cut(run_dir: Path) -> None:
    rc, out = _pty_run(["analyze", str(run_dir)], 80)
    assert rc == 0, out
    text = ANSI.sub("", out)
    assert SGR.search(out)  # a real terminal: colour is on
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text, [line for line in lines if "…" in line]
    # the compact tables: lost and top cause, not one column per cause
    assert "top cause" in text and "Critical path by stage and cause" in text
    assert "missing overlap" not in text.split("Per rank")[1].split("\n╭")[0]


def test_wide_shows_every_cause_column_without_cuts(run_dir: Path) -> None:
    rc, out = _pty_run(["analyze", str(run_dir), "--wide"], 80)
    assert rc == 0, out
    text = ANSI.sub("", out)
    assert "…" not in text
    top = next(line for line in text.split("Per rank")[1].splitlines() if line.startswith("┏"))
    # 8 accounting columns and 7 causes: the full table, folded into 80 columns
    assert top.count("┳") == 14


def test_no_color_and_pipe_are_plain(run_dir: Path) -> None:
    rc, out = _pty_run(["analyze", str(run_dir)], 80, {"NO_COLOR": "1"})
    # (the progress display on stderr may still hide the cursor: no colour or bold is what counts)
    assert rc == 0 and not SGR.search(out) and "Per rank" in out
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(run_dir)], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and "\x1b[" not in res.stdout and "Per rank" in res.stdout


def _header_words(text: str) -> list[list[str]]:
    """The words of each table's header lines (between ┏ and ┡), one list per table."""
    tables: list[list[str]] = []
    cur: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("┏"):
            inside, cur = True, []
        elif line.startswith("┡"):
            inside = False
            tables.append(cur)
        elif inside:
            cur += [w for cell in line.strip("┃").split("┃") for w in cell.split()]
    return tables


@pytest.mark.parametrize("cols", [140, 160])
def test_headers_wrap_between_words(run_dir: Path, cols: int) -> None:
    # every cause column: the 15 columns fit with whole header words from about 135 columns (in
    # fewer, a header word folds rather than the table being cut: test_wide_shows_every_cause_column)
    from ppdiag.reports.style import CAUSE_LABELS

    rc, out = _pty_run(["analyze", str(run_dir), "--wide"], cols)
    assert rc == 0, out
    text = ANSI.sub("", out)
    assert max(len(line) for line in text.splitlines()) <= cols
    words = {w for label in CAUSE_LABELS.values() for w in label.split()}
    seen = [w for t in _header_words(text) for w in t]
    assert words <= set(seen), sorted(words - set(seen))  # every header word whole, none split


def test_whatif_notes_on_lines_of_their_own(run_dir: Path) -> None:
    rc, out = _pty_run(["analyze", str(run_dir)], 80)
    assert rc == 0, out
    text = ANSI.sub("", out)
    block = text.split("What if (simulated")[1]
    head = next(line for line in block.splitlines() if line.startswith("┃"))
    assert "note" not in head  # no narrow note column
    after = block.split("└")[1]
    flat = " ".join(after.split())
    assert "rebalanced stages: " in flat and "--layers-per-stage" in flat  # whole flag names


def test_long_steps_print_in_seconds(tmp_path: Path) -> None:
    d = tmp_path / "slow"
    write_kineto(
        make_scenario("1f1b", pp=2, microbatches=4, fwd_ms=1500.0, bwd_ms=3000.0, steps=3, seed=2), d
    )
    rc, out = _pty_run(["analyze", str(d)], 100)
    assert rc == 0, out
    text = ANSI.sub("", out)
    assert re.search(r"step \d{2}\.\d{3} s median", text), text[:400]
    assert "Per rank (s, mean per step)" in text and "Per stage (s per step" in text
    assert not re.search(r"\d{5,}\.\d+ ms", text)  # no "46666.27 ms"


def test_duration_unit_switches_at_ten_seconds() -> None:
    from ppdiag.reports.terminal import _dur

    assert _dur(9999.994) == "9999.99 ms" and _dur(10_000.0) == "10.00 s" and _dur(46666.27) == "46.67 s"
