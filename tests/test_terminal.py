"""Terminal report: fits 80 columns in a real pty without a cut cell, plain text under NO_COLOR
and in a pipe, the full cause tables behind --wide (the default from 150 columns), header words
whole at every width, durations in seconds from 10 s."""

from __future__ import annotations

import fcntl
import io
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
from conftest import shared_trace
from rich.table import Table

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
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    # 8 accounting columns and 7 causes do not fit 80 columns with whole header words: the table is
    # shown in two parts, each starting with rank and stage
    block = text.split("Per rank (ms, mean per step)")[1:]
    assert len(block) == 2 and block[1].startswith(" (continued)")
    heads = [next(ln for ln in b.splitlines() if ln.startswith("┏")) for b in block]
    assert sum(h.count("┳") + 1 for h in heads) == 15 + 2  # every column once, rank and stage twice
    for b in block:
        lines = b.splitlines()
        last_head = lines[next(i for i, ln in enumerate(lines) if ln.startswith("┡")) - 1]
        assert re.match(r"┃ +rank ┃ +stage ┃", last_head), last_head


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


def _known_header_words(report_json: Path) -> set[str]:
    """Every word of every column header the terminal report can show for this report."""
    from ppdiag.report_types import decode
    from ppdiag.reports import terminal
    from ppdiag.reports.whatif_table import whatif_table

    report = decode(report_json.read_bytes())
    tables: list[Table | None] = [whatif_table(report.whatif, lost=False)]
    for wide in (True, False):
        tables += [terminal.stage_table(report, wide), terminal.critical_path_table(report, wide)]
        tables.append(terminal.rank_table(report, wide=wide))
    return {w for t in tables if t is not None for c in t.columns for w in str(c.header).split()}


@pytest.fixture(scope="module")
def real_dir() -> Path:
    return shared_trace("kineto/gloo_cpu_2rank")


@pytest.mark.parametrize("cols", [80, 100, 120, 160])
@pytest.mark.parametrize("source", ["synthetic", "real"])
def test_headers_wrap_between_words(
    run_dir: Path, real_dir: Path, tmp_path: Path, source: str, cols: int
) -> None:
    """Every cause column (--wide): no header word is split across lines, in any table, whatever
    the width; a table too wide for whole words comes in parts."""
    src = run_dir if source == "synthetic" else real_dir
    js = tmp_path / "r.json"
    rc, out = _pty_run(["analyze", str(src), "--wide", "--json", str(js)], cols)
    assert rc == 0, out
    text = ANSI.sub("", out)
    assert max(len(line) for line in text.splitlines()) <= cols
    known = _known_header_words(js)
    shown = [w for t in _header_words(text) for w in t]
    assert shown and [w for w in shown if w not in known] == []  # no fragment of a word
    from ppdiag.reports.style import CAUSE_LABELS

    causes = {w for label in CAUSE_LABELS.values() for w in label.split()}
    assert causes <= set(shown), sorted(causes - set(shown))  # every cause column is there


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
    assert not re.search(r"\d{5,}\.\d+", text)  # no "46666.27 ms", nor a what-if "46666.27"
    assert re.search(r"┃ scenario +┃ step s ┃", text)  # the what-if table in seconds too
    rc, out = _pty_run(["whatif", str(d)], 100)  # and the whatif command
    text = ANSI.sub("", out)
    assert rc == 0 and "step s" in text and not re.search(r"\d{5,}\.\d+", text), text[:600]
    js = tmp_path / "slow.json"
    rc, out = _pty_run(["analyze", str(d), "--json", str(js), "-q"], 100)
    assert rc == 0, out
    rc, out = _pty_run(["diff", str(js), str(js)], 100)  # the diff's tables too
    text = ANSI.sub("", out)
    assert rc == 0 and "(s per step)" in text and not re.search(r"\d{5,}\.\d+", text), text[:600]


def test_duration_unit_switches_at_ten_seconds() -> None:
    from ppdiag.reports.terminal import _dur

    assert _dur(9999.994) == "9999.99 ms" and _dur(10_000.0) == "10.00 s" and _dur(46666.27) == "46.67 s"


@pytest.mark.parametrize("source", ["synthetic", "real"])
def test_every_width_from_80_to_200_keeps_header_words_whole(
    run_dir: Path, real_dir: Path, source: str
) -> None:
    """rich's own column widths (the layout it prints) at every console width from 80 to 200, compact
    and --wide: no table wider than the console, no column narrower than its longest header word.
    (Before: header words split at 54 of these widths, from 80 to 133 columns, and the --wide tables
    were wider than the console, so cut, at 63 widths from 112 to 174.)"""
    from rich.console import Console

    import ppdiag
    from ppdiag.reports import terminal
    from ppdiag.reports.term_fit import fit_table
    from ppdiag.reports.whatif_table import whatif_table

    report = ppdiag.analyze(run_dir if source == "synthetic" else real_dir).report
    bad: list[tuple[int, bool, str]] = []
    for width in range(80, 201):
        con = Console(width=width, file=io.StringIO(), color_system=None)
        for wide in (True, False):
            tables = [terminal.stage_table(report, wide), terminal.critical_path_table(report, wide)]
            tables += [terminal.rank_table(report, wide=wide), whatif_table(report.whatif, lost=False)]
            for t in tables:
                if t is None or not t.columns:
                    continue
                keys = 2 if t.columns[0].header == "rank" else 1
                for part in fit_table(t, width, keys=keys):
                    rules = len(part.columns) + 1
                    # (private, but it is the layout rich prints: widths with the cell padding)
                    got = part._calculate_column_widths(con, con.options.update_width(width - rules))
                    need = [max(len(w) for w in str(c.header).split()) + 2 for c in part.columns]
                    if sum(got) + rules > width or any(g < n for g, n in zip(got, need, strict=True)):
                        bad.append((width, wide, str(part.title)))
    assert bad == [], bad[:5]


def test_wide_is_the_default_from_150_columns(run_dir: Path) -> None:
    # analyze --help: "--wide  Every cause column in the terminal tables (default: when the terminal
    # is wide)"; the README: a terminal of 150+ columns
    from ppdiag.reports.terminal import WIDE_COLUMNS

    assert WIDE_COLUMNS == 150
    for cols, wide in ((149, False), (150, True)):
        rc, out = _pty_run(["analyze", str(run_dir)], cols)
        assert rc == 0, out
        per_rank = ANSI.sub("", out).split("Per rank")[1].split("\n╭")[0]
        assert ("unexplained" in per_rank) is wide and ("top cause" in per_rank) is not wide


def test_stage_ranks_wrap_between_ranks() -> None:
    """A stage's ranks: runs as ranges, parts apart, so a narrow column never splits a rank number
    (a 64-rank op table at 80 columns printed "16,17,18,19,20,2" / "1,22,23")."""
    from rich.console import Console

    from ppdiag.reports.terminal import _rank_list

    assert _rank_list(list(range(8))) == "0-7" and _rank_list([3]) == "3" and _rank_list([1, 2]) == "1, 2"
    assert _rank_list([0, 1, 2, 5, 6, 9, 10, 11, 12]) == "0-2, 5, 6, 9-12"
    strided = _rank_list(list(range(2, 64, 8)))  # one stage of pp 8 x dp 8, in another rank order
    con = Console(width=12, file=io.StringIO(), color_system=None)
    con.print(strided)
    lines = con.file.getvalue().split()  # type: ignore[attr-defined]
    assert [int(x.rstrip(",")) for x in lines] == list(range(2, 64, 8))
