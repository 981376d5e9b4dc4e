"""Bad input anywhere ends with exit 2 and one line, or is read with a warning: a damaged parse
cache entry, bad environment values, a file name that is not UTF-8, deep nesting in every file
ppdiag reads, and a signal during start-up. Each case runs the command as a user does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPDIAG_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def ppdiag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ppdiag", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env or _env(PPDIAG_NO_CACHE="1"),
    )


def _one_line(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppdiag: error:"), proc.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(pp=2, microbatches=4, steps=2), d, gzip=False, groundtruth=False)
    return d


@pytest.fixture(scope="module")
def budget(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("budget") / "ppdiag.toml"
    p.write_text("[budget]\nmax_lost_ratio = 0.95\n")
    return p


# ---- the parse cache ------------------------------------------------------------------------


def _rewrite_header(entry: Path, name: str, shape: list[int]) -> None:
    """Give array ``name`` of a cache entry another shape in the entry's header, and a checksum
    that matches again: damage that only the entry's own checks on shapes can see."""
    from ppdiag.parsers import cache

    data = entry.read_bytes()
    head = len(cache._ENTRY_MAGIC) + 8
    n0 = head + len(cache._PACK_MAGIC)
    hl = int.from_bytes(data[n0 : n0 + 8], "little")
    arrays = json.loads(data[n0 + 8 : n0 + 8 + hl])
    for a in arrays:
        if a[0] == name:
            a[1:3] = [a[1], shape]
    h = json.dumps(arrays).encode()
    h += b" " * (-(len(cache._PACK_MAGIC) + 8 + len(h)) % 8)
    rest = cache._PACK_MAGIC + len(h).to_bytes(8, "little") + h + data[n0 + 8 + hl :]
    entry.write_bytes(cache._ENTRY_MAGIC + zlib.crc32(rest).to_bytes(8, "little") + rest)


def _short_column(entry: Path) -> None:
    _rewrite_header(entry, "r0.iv.end", [len(_column(entry, "r0.iv.end")) - 3])


def _column(entry: Path, name: str) -> Any:
    from ppdiag.parsers import cache

    buf = np.frombuffer(entry.read_bytes(), np.uint8).copy()
    return cache._unpack(buf, len(cache._ENTRY_MAGIC) + 8)[name]


def _huge_header(entry: Path) -> None:
    """One array's shape claims 10**12 items (7.28 TiB of int64)."""
    _rewrite_header(entry, "r0.iv.start", [10**12])


@pytest.mark.parametrize("damage", [_short_column, _huge_header])
def test_damaged_cache_entry_is_removed_and_the_trace_parsed_again(
    run_dir: Path, tmp_path: Path, damage: Any
) -> None:
    env = _env(PPDIAG_CACHE_DIR=str(tmp_path / "cache"))
    first = tmp_path / "first.json"
    assert ppdiag("analyze", str(run_dir), "-q", "--json", str(first), env=env).returncode == 0
    entries = sorted((tmp_path / "cache").glob("*.cols"))
    assert len(entries) == 2
    for e in entries:
        damage(e)
    # the result cache would serve the re-run whole, without reading the parse cache
    for e in (tmp_path / "cache").glob("*.report"):
        e.unlink()
    again = tmp_path / "again.json"
    proc = ppdiag("analyze", str(run_dir), "-q", "--json", str(again), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warned = [w for w in json.loads(again.read_text())["run"]["warnings"] if "cache entry" in w]
    assert all("was removed; the trace was parsed again" in w for w in warned), warned
    # one warning per file, or the two said once for "2 files"
    assert len(warned) == 2 or (len(warned) == 1 and warned[0].startswith("2 files: ")), warned
    # the new parse gives the first one's report, and a clean entry replaced the damaged one
    a, b = json.loads(first.read_text()), json.loads(again.read_text())
    assert a["summary"] == b["summary"] and a["ranks"] == b["ranks"]
    third = tmp_path / "third.json"
    assert ppdiag("analyze", str(run_dir), "-q", "--json", str(third), env=env).returncode == 0
    assert not [w for w in json.loads(third.read_text())["run"]["warnings"] if "cache entry" in w]


# ---- environment values ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "-1", "0", "lots"])
def test_bad_max_trace_gb_is_one_line(run_dir: Path, tmp_path: Path, value: str) -> None:
    gz = tmp_path / "run"
    gz.mkdir()
    for p in run_dir.glob("*.json"):
        import gzip

        (gz / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes()))
    proc = ppdiag("analyze", str(gz), "-q", env=_env(PPDIAG_NO_CACHE="1", PPDIAG_MAX_TRACE_GB=value))
    line = _one_line(proc)
    assert f"PPDIAG_MAX_TRACE_GB={value!r}" in line


# ---- file names -----------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system that takes any bytes in names")
def test_non_utf8_file_name_reaches_the_json_escaped(run_dir: Path, tmp_path: Path, budget: Path) -> None:
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    first = sorted(d.glob("rank0*"))[0]
    odd = os.fsencode(d) + b"/rank0_\xff" + os.fsencode(first.name)[5:]
    os.rename(os.fsencode(first), odd)
    out = tmp_path / "r.json"
    proc = ppdiag("analyze", str(d), "-q", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw = out.read_bytes()
    raw.decode("utf-8")  # valid UTF-8 throughout
    assert b"rank0_\\\\xff" in raw  # the byte, written as Python's backslash escape
    # and every reader of reports takes the file
    assert ppdiag("check", str(d), "--budget", str(budget), "-q", "--baseline", str(out)).returncode == 0
    assert ppdiag("diff", str(out), str(out)).returncode == 0


# ---- deep nesting ---------------------------------------------------------------------------


def _nest(n: int) -> str:
    return "[" * n + "]" * n


def test_deep_baseline_is_one_line(run_dir: Path, tmp_path: Path, budget: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text('{"schema_version": 1, "x": ' + _nest(200_000) + "}")
    line = _one_line(ppdiag("check", str(run_dir), "--budget", str(budget), "-q", "--baseline", str(base)))
    assert str(base) in line and "nested too deeply" in line


def test_deep_budget_toml_is_one_line(run_dir: Path, tmp_path: Path) -> None:
    b = tmp_path / "ppdiag.toml"
    b.write_text("[budget]\nmax_lost_ratio = 0.5\nx = " + _nest(100_000) + "\n")
    line = _one_line(ppdiag("check", str(run_dir), "--budget", str(b), "-q"))
    assert str(b) in line and "nested too deeply" in line


def test_deep_trace_events_are_one_line(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    p = d / "rank0.pt.trace.json"
    with open(p, "w") as f:
        f.write('{"traceEvents": ')
        for _ in range(10):
            f.write("[" * 1_000_000)
        for _ in range(10):
            f.write("]" * 1_000_000)
        f.write("}")
    line = _one_line(ppdiag("analyze", str(d), "-q"))
    assert p.name in line and "nested too deeply" in line


def test_deep_trace_args_are_one_line(run_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    p = sorted(d.glob("rank0*"))[0]
    doc = json.loads(p.read_text())
    text = json.dumps(doc)
    i = text.index('"args": {') + len('"args": {')
    p.write_text(text[:i] + '"deep": ' + _nest(100_000) + ", " + text[i:])
    line = _one_line(ppdiag("analyze", str(d), "-q"))
    assert p.name in line and "nested too deeply" in line


# ---- signals --------------------------------------------------------------------------------


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has its own handler for ``sig`` yet (from /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    cgt = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), "0")
    return bool(int(cgt, 16) >> (sig - 1) & 1)


def _wait_for(cond: Any, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.0005)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.15])
def test_sigint_during_start_up_is_interrupted_130(run_dir: Path, after_s: float) -> None:
    """SIGINT while the command line is still being imported. ppdiag's start-up handler catches
    SIGTERM as well (Python does not), so the wait below ends the moment it is in place: the signal
    then lands in the imports (~0.3 s and more), where a build without the handler printed a
    KeyboardInterrupt traceback (and a build without it never catches SIGTERM: the wait runs out,
    the command ends by itself and its exit code is not 130). A SIGINT before ppdiag's first line
    runs, while the interpreter still imports ``site``, is Python's own fatal start-up error and
    no program can turn it into 130: on a busy machine that window lasts more than 0.2 s, so the
    signal is never sent in it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppdiag", "analyze", str(run_dir), "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(PPDIAG_NO_CACHE="1"),
    )
    _wait_for(lambda: _catches(proc.pid, signal.SIGTERM) or proc.poll() is not None, 60)
    assert proc.poll() is None, "the command ended before its start-up handler was in place"
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert err.strip().splitlines()[-1] == "ppdiag: interrupted", err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


# ---- corpus classes: readable data read, damage counted -------------------------------------


def _report(d: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{d.name}.report.json"
    proc = ppdiag("analyze", str(d), "-q", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


@pytest.fixture(scope="module")
def clean(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _report(run_dir, tmp_path_factory.mktemp("clean"))


def _edited(run_dir: Path, tmp_path: Path, edit: Any) -> Path:
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    for p in sorted(d.glob("*.json")):
        edit(p)
    return d


def test_utf8_bom_before_the_json_is_read(run_dir: Path, tmp_path: Path, clean: dict[str, Any]) -> None:
    d = _edited(run_dir, tmp_path, lambda p: p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes()))
    got = _report(d, tmp_path)
    assert got["summary"] == clean["summary"] and got["ranks"] == clean["ranks"]


def test_link_ids_beyond_64_bits_are_read(run_dir: Path, tmp_path: Path, clean: dict[str, Any]) -> None:
    def widen(p: Path) -> None:
        doc = json.loads(p.read_text())
        for e in doc["traceEvents"]:
            if isinstance(e.get("id"), int):
                e["id"] += 2**70
            a = e.get("args") or {}
            for k in ("correlation", "External id"):
                if isinstance(a.get(k), int):
                    a[k] += 2**70
        p.write_text(json.dumps(doc))

    got = _report(_edited(run_dir, tmp_path, widen), tmp_path)
    # the links (kernel to its launch, op to its kernels) are the same: so is the diagnosis
    assert got["summary"] == clean["summary"] and got["ranks"] == clean["ranks"]


def test_garbage_items_in_trace_events_are_dropped_and_counted(
    run_dir: Path, tmp_path: Path, clean: dict[str, Any]
) -> None:
    junk: list[Any] = ["junk", 17, None, [1, 2], True]

    def spoil(p: Path) -> None:
        doc = json.loads(p.read_text())
        evs = doc["traceEvents"]
        for i, j in enumerate(junk):
            evs.insert(1 + 40 * i, j)
        p.write_text(json.dumps(doc))

    got = _report(_edited(run_dir, tmp_path, spoil), tmp_path)
    assert got["summary"] == clean["summary"] and got["ranks"] == clean["ranks"]
    said = [w for w in got["run"]["warnings"] if "not JSON objects" in w]
    assert said and all(f"dropped {len(junk)} item(s) of traceEvents" in w for w in said), said


def test_gpu_trace_cut_before_its_gpu_events_is_read_with_a_warning(run_dir: Path, tmp_path: Path) -> None:
    """Kineto writes the GPU events after the host ones: a cut at 30 % can take them all. The rank's
    host ops are still read (with a warning), the other ranks analysed as before."""
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    p = sorted(d.glob("rank1*"))[0]
    doc = json.loads(p.read_text())
    gpu = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
    evs = doc["traceEvents"]
    doc["traceEvents"] = [e for e in evs if e.get("cat") not in gpu] + [e for e in evs if e.get("cat") in gpu]
    text = json.dumps(doc)
    cut = int(len(text) * 0.3)
    assert '"cat": "kernel"' not in text[:cut]  # the cut took every GPU event
    p.write_text(text[:cut])
    got = _report(d, tmp_path)
    said = [w for w in got["run"]["warnings"] if p.name in w]
    assert any("truncated" in w for w in said) and any("cut before its GPU events" in w for w in said), said
    assert sorted(r["rank"] for r in got["ranks"]) == [0, 1]


def test_symlink_loop_warning_names_the_links(run_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    (d / "rank8.pt.trace.json").symlink_to("rank9.pt.trace.json")
    (d / "rank9.pt.trace.json").symlink_to("rank8.pt.trace.json")
    got = _report(d, tmp_path)
    said = [w for w in got["run"]["warnings"] if "lead to no file" in w]
    assert len(said) == 1 and "rank8.pt.trace.json" in said[0] and "rank9.pt.trace.json" in said[0], said
