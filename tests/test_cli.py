"""The command line as a user meets it: exit codes, one-line errors, the rule catalogue."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_TRACES


def ppdiag(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ppdiag", *args], capture_output=True, text=True, timeout=timeout
    )


def _one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def _trace(rank: int, gpu: bool = True) -> dict[str, Any]:
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 10,
            "tid": 10,
            "ts": 1000.0,
            "dur": 500.0,
        }
    ]
    if gpu:
        ev.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "gemm",
                "pid": 0,
                "tid": 7,
                "ts": 1100.0,
                "dur": 100.0,
                "args": {"stream": 7, "device": 0, "correlation": 1},
            }
        )
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "GPU"}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "traceEvents": ev,
    }


def test_not_a_trace(tmp_path: Path) -> None:
    f = tmp_path / "notes.json"
    f.write_text("hello, this is not json")
    _one_error_line(ppdiag("analyze", str(f)), "notes.json")


def test_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "rank0.json"
    f.write_bytes(b"")
    _one_error_line(ppdiag("analyze", str(f)), "rank0.json")


def test_corrupt_gzip(tmp_path: Path) -> None:
    f = tmp_path / "rank0.json.gz"
    f.write_bytes(b"\x1f\x8b\x08\x00" + b"garbage" * 50)
    _one_error_line(ppdiag("analyze", str(f)), "rank0.json.gz")


def test_json_without_trace_events(tmp_path: Path) -> None:
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": []}))
    _one_error_line(ppdiag("analyze", str(f)), "rank0.json")


def test_gpu_trace_without_gpu_events(tmp_path: Path) -> None:
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(_trace(0, gpu=False)))
    _one_error_line(ppdiag("analyze", str(f)), "rank0.json", "GPU")


def test_duplicate_ranks(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_trace(1)))
    (tmp_path / "b.json").write_text(json.dumps(_trace(1)))
    _one_error_line(ppdiag("analyze", str(tmp_path)), "a.json", "b.json")


def test_missing_path(tmp_path: Path) -> None:
    _one_error_line(ppdiag("analyze", str(tmp_path / "nope")), "nope")


def test_empty_directory(tmp_path: Path) -> None:
    _one_error_line(ppdiag("analyze", str(tmp_path)), str(tmp_path.name))


def test_truncated_trace_is_analyzed_with_a_warning(tmp_path: Path) -> None:
    src = SHARED_TRACES / "kineto" / "hta_ddp_nccl_rank0.json.gz"
    if not src.exists():
        pytest.skip("shared traces absent")
    raw = gzip.decompress(src.read_bytes())
    f = tmp_path / "rank0.json"
    f.write_bytes(raw[: int(len(raw) * 0.7)])
    out = tmp_path / "r.json"
    proc = ppdiag("analyze", str(f), "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    warnings = json.loads(out.read_text())["run"]["warnings"]
    assert any("truncated" in w.lower() for w in warnings), warnings


def test_a_good_and_a_bad_file_named_explicitly(tmp_path: Path) -> None:
    good = tmp_path / "rank0.json"
    good.write_text(json.dumps(_trace(0)))
    bad = tmp_path / "rank1.json"
    bad.write_text("{ not json")
    _one_error_line(ppdiag("analyze", str(good), str(bad)), "rank1.json")


def test_rules_catalogue_and_explanation() -> None:
    proc = ppdiag("rules")
    assert proc.returncode == 0
    for code in (f"PP00{i}" for i in range(1, 9)):
        assert code in proc.stdout
    one = ppdiag("rules", "PP003")
    assert one.returncode == 0
    for section in ("What it detects", "Why it matters", "How to fix", "Example"):
        assert section in one.stdout
    _one_error_line(ppdiag("rules", "PP999"), "PP999")


def test_rules_without_typer_print_what_the_typer_command_prints() -> None:
    # ``rules [CODE]`` alone runs without typer; a global option before it (``--no-cache``)
    # sends it through the typer command: the same bytes and exit code either way
    for args in ((), ("PP003",), ("pp009",), ("PP999",)):
        fast, typed = ppdiag("rules", *args), ppdiag("--no-cache", "rules", *args)
        assert (fast.returncode, fast.stdout, fast.stderr) == (
            typed.returncode,
            typed.stdout,
            typed.stderr,
        ), args


def test_version_and_help() -> None:
    assert ppdiag("--version").stdout.startswith("ppdiag ")
    h = ppdiag("--help")
    assert h.returncode == 0
    for cmd in ("analyze", "check", "diff", "demo", "rules"):
        assert cmd in h.stdout


def test_usage_error_exits_2() -> None:
    proc = ppdiag("analyze")
    assert proc.returncode == 2


def test_bad_flag_value(tmp_path: Path) -> None:
    src = SHARED_TRACES / "kineto" / "gloo_cpu_2rank"
    if not src.exists():
        pytest.skip("shared traces absent")
    d = tmp_path / "run"
    shutil.copytree(src, d)
    _one_error_line(ppdiag("analyze", str(d), "--stage-map", "0,x"), "stage-map")


def test_steps_selection(tmp_path: Path) -> None:
    src = SHARED_TRACES / "kineto" / "gloo_cpu_2rank"
    if not src.exists():
        pytest.skip("shared traces absent")
    out = tmp_path / "r.json"
    proc = ppdiag("analyze", str(src), "--steps", "2:2", "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["run"]["steps"] == [2]
    _one_error_line(ppdiag("analyze", str(src), "--steps", "9"), "--steps 9", "[1, 2]")
