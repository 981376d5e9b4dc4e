"""The output writer: no report path can cost the user a file, every failure is one named line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ppdiag.errors import InputError
from ppdiag.io import check_target, is_own_output, output_kind, qpath, write_output, write_text
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario


def ppdiag(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "ppdiag", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(pp=2, microbatches=4, steps=2), d)
    return d


def test_write_is_atomic_and_leaves_no_temp_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    write_text(target, json.dumps({"ppdiag": {"kind": "report"}, "x": 1}))
    old = target.read_bytes()

    def half(tmp: Path) -> None:
        tmp.write_text('{"ppdiag": {"kind": "report"}, "x": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match=r"r\.json: cannot write: No space left on device"):
        write_output(target, half)
    assert target.read_bytes() == old  # the old report is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temp file left


def test_refuses_foreign_files_and_inputs(tmp_path: Path) -> None:
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}')
    with pytest.raises(InputError, match="was not written by ppdiag"):
        check_target(foreign)
    trace = tmp_path / "rank0.json"
    trace.write_text('{"ppdiag": {"kind": "report"}}')  # even one of ours, when it is an input
    with pytest.raises(InputError, match="is an input of this run"):
        check_target(tmp_path / "." / "rank0.json", [trace])
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert check_target(empty) == empty  # nothing to lose


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("/dev/full", "cannot write: No space left on device"),
        ("{d}", "is a directory"),
        ("{d}/file.txt/x.json", "a parent of the path is not a directory"),
        ("", "empty output path"),
    ],
)
def test_os_errors_name_the_path(tmp_path: Path, path: str, match: str) -> None:
    if path == "/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    (tmp_path / "file.txt").write_text("x")
    p = path.format(d=tmp_path)
    with pytest.raises(InputError, match=match) as ei:
        write_text(p, "{}")
    assert "\n" not in str(ei.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(InputError, match="cannot write: Permission denied"):
            write_text(ro / "r.json", "{}")
    finally:
        ro.chmod(0o700)


def test_markers_are_recognised(tmp_path: Path) -> None:
    cases = {
        "a.json": ('\ufeff {"ppdiag": {"kind": "report"}, "schema_version": 1}', "report"),
        "b.html": ('<!DOCTYPE html><html><head><meta name="generator" content="ppdiag 0.1">', "html"),
        "c.md": ("## ppdiag: 1 ms\n\n<!-- ppdiag:md -->\n", "md"),
        "d.json": ('{"traceEvents": [], "ppdiag": {"kind": "report"}}', None),  # not the first key
        "e.md": ("<!-- ppdiag:md -->\nuser text after it\n", None),  # not the last line
    }
    for name, (text, kind) in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        assert output_kind(tmp_path / name) == kind, name
    assert not is_own_output(tmp_path / "absent.json")


def test_qpath_quotes_what_a_terminal_would_act_on() -> None:
    assert qpath("/runs/a/rank0.json") == "/runs/a/rank0.json"
    assert qpath("a\nb.json") == "'a\\nb.json'"
    assert qpath("\x1b[31mred.json") == "'\\x1b[31mred.json'"
    assert qpath("") == "''"


def test_cli_never_overwrites_a_trace_or_a_foreign_file(run_dir: Path, tmp_path: Path) -> None:
    trace = sorted(run_dir.glob("rank0*.json.gz"))[0]
    before = trace.read_bytes()
    for flag in ("--json", "--html", "--md", "--perfetto"):
        proc = ppdiag("analyze", "-q", str(run_dir), flag, str(trace))
        assert proc.returncode == 2, (flag, proc.stderr)
        assert "refusing to overwrite" in proc.stderr and "Traceback" not in proc.stderr
    assert trace.read_bytes() == before
    foreign = tmp_path / "mine.md"
    foreign.write_text("my notes\n")
    proc = ppdiag("analyze", "-q", str(run_dir), "--md", str(foreign))
    assert proc.returncode == 2 and "was not written by ppdiag" in proc.stderr
    assert foreign.read_text() == "my notes\n"


def test_an_option_given_as_a_report_path_is_refused(run_dir: Path, tmp_path: Path) -> None:
    """``--json --no-cache``: --json takes the next word as its file; that is refused (exit 2, one
    line naming it) instead of writing a report named after the option and dropping the option."""
    proc = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", "-q", str(run_dir), "--json", "--no-cache"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert proc.returncode == 2, proc.stderr
    assert "--no-cache: looks like an option" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    # the name itself stays writable when it is meant: ./--no-cache
    assert check_target("./--no-cache") == Path("./--no-cache")
    with pytest.raises(InputError, match="looks like an option"):
        check_target("-o")


def test_cli_rewrites_its_own_reports_and_the_run_skips_them(run_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    for p in run_dir.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    outs = [d / "report.json", d / "overlay.json", d / "overlay.json.gz", d / "s.md", d / "r.html"]
    args = ["--json", outs[0], "--perfetto", outs[1], "--md", outs[3], "--html", outs[4]]
    for _ in range(2):  # the second run finds the first run's outputs in the directory
        proc = ppdiag("analyze", str(d), *map(str, args))
        assert proc.returncode == 0, proc.stderr
    proc = ppdiag("analyze", "-q", str(d), "--perfetto", str(outs[2]))
    assert proc.returncode == 0, proc.stderr
    assert all(output_kind(p) for p in outs)
    doc = json.loads(outs[0].read_text())
    assert next(iter(doc)) == "ppdiag" and doc["ppdiag"]["kind"] == "report"
    proc = ppdiag("analyze", str(d), "--no-ranks")
    assert proc.returncode == 0, proc.stderr
    assert "ppdiag wrote" in proc.stdout + proc.stderr  # the overlays were skipped, with a note
    assert len(doc["run"]["ranks"]) == 2


def test_non_utf8_file_name(run_dir: Path, tmp_path: Path) -> None:
    name = os.fsdecode(b"rep\xff\nort.json")
    out = tmp_path / name
    proc = ppdiag("analyze", "-q", str(run_dir), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert output_kind(out) == "report"


def test_diff_json_and_check_outputs_go_through_the_writer(run_dir: Path, tmp_path: Path) -> None:
    rep = tmp_path / "a.json"
    assert ppdiag("analyze", "-q", str(run_dir), "--json", str(rep)).returncode == 0
    out = tmp_path / "d.json"
    proc = ppdiag("diff", str(rep), str(rep), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert output_kind(out) == "diff"
    proc = ppdiag("diff", str(rep), str(rep), "--json", str(rep))
    assert proc.returncode == 2 and "is an input of this run" in proc.stderr
    budget = tmp_path / "b.toml"
    budget.write_text("[budget]\nmax_lost_ratio = 0.99\n")
    proc = ppdiag("check", str(run_dir), "--budget", str(budget), "--md", str(budget))
    assert proc.returncode == 2 and "is an input of this run" in proc.stderr
    assert budget.read_text().startswith("[budget]")
    proc = ppdiag("check", str(run_dir), "--budget", str(budget), "--json", str(out), "--md", str(out))
    assert proc.returncode == 2 and "named for two reports" in proc.stderr
