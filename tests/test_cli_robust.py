"""The CLI in hostile environments: closed pipes and streams, ASCII locales, bad flags, signals.

No exit 70 and no traceback anywhere; exit codes keep their meaning (0 ok, 1 gate failed, 2 bad
input, 3 inconclusive); an interrupt leaves no parse worker behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def ppdiag(
    *args: str, timeout: int = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ppdiag", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV if env is None else env,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(pp=2, microbatches=4, steps=2), d)
    return d


@pytest.fixture(scope="module")
def budget(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("budget") / "budget.toml"
    p.write_text("[budget]\nmax_lost_ratio = 0.95\n")
    return p


def _closed_pipe_run(*args: str) -> int:
    """Exit code of ``ppdiag ARGS`` whose stdout is a pipe nobody reads (closed at once)."""
    r, w = os.pipe()
    os.close(r)  # every write gets EPIPE, as with `| head -1` after its line
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ppdiag", *args], stdout=w, stderr=subprocess.PIPE, env=ENV, timeout=120
        )
    finally:
        os.close(w)
    assert b"Traceback" not in proc.stderr, proc.stderr
    return proc.returncode


def test_epipe_keeps_the_exit_code(run_dir: Path, budget: Path) -> None:
    assert _closed_pipe_run("check", str(run_dir), "--budget", str(budget)) == 0
    assert _closed_pipe_run("analyze", str(run_dir)) == 0
    assert _closed_pipe_run("rules") == 0
    assert _closed_pipe_run("bubble", "--pp", "4", "-m", "8") == 0


def test_head_one_on_a_passing_gate(run_dir: Path, budget: Path) -> None:
    cmd = f"{sys.executable} -m ppdiag check {run_dir} --budget {budget} | head -1; exit ${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ppdiag check PASS")


def test_closed_stdout_and_ascii_stdout(run_dir: Path) -> None:
    proc = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m ppdiag analyze {run_dir} >&-"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    env = {**ENV, "PYTHONIOENCODING": "ascii", "LC_ALL": "C", "LANG": "C"}
    proc = ppdiag("analyze", str(run_dir), env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--steps", "abc"], "--steps 'abc': expected 'a:b'"),
        (["--steps", "5-7"], "for a range write 5:7"),
        (["--steps", "a:b"], "--steps 'a:b'"),
        (["--steps", "7:5"], "the range is empty"),
        (["-m", "1000000000"], "--microbatches"),
        (["-m", "1e9"], "--microbatches"),
        (["--pp", "100000"], "--pp"),
        (["--jobs", "0"], "--jobs"),
        (["--jobs", "-5"], "--jobs"),
        (["--global-batch", "0"], "--global-batch"),
    ],
)
def test_bad_flags_are_exit_2(run_dir: Path, args: list[str], needle: str) -> None:
    proc = ppdiag("analyze", "-q", str(run_dir), *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_demo_fault_flags_need_their_target(tmp_path: Path) -> None:
    for args, needle in (
        (["--comm-delay-ms", "5"], "needs --comm-delay-rank"),
        (["--slow-factor", "0"], "needs --slow-stage"),
        (["--slow-stage", "9"], "stages 0..3"),
    ):
        proc = ppdiag("demo", "-q", "--out", str(tmp_path / "d"), *args)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert not (tmp_path / "d").exists()  # refused before --out is touched


def test_demo_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "rank0.pt.trace.json.gz").write_bytes(b"precious")
    proc = ppdiag("demo", "-q", "--out", str(tmp_path))
    assert proc.returncode == 2 and "was not made by ppdiag demo" in proc.stderr
    assert (tmp_path / "rank0.pt.trace.json.gz").read_bytes() == b"precious"


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_no_worker(tmp_path: Path, sig: signal.Signals) -> None:
    # 6 ranks of ~10 MB: a multi-worker parse that lasts a few seconds on a shared machine
    write_kineto(make_scenario(pp=6, microbatches=16, steps=24), tmp_path, gzip=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppdiag", "analyze", "-q", str(tmp_path), "--jobs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    workers: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        workers = _children(proc.pid)
        if len(workers) >= 2:
            break
        time.sleep(0.01)
    if len(workers) < 2:
        proc.kill()
        pytest.skip("the parse ended before two workers were seen")
    time.sleep(0.2)  # the workers are parsing now
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + int(sig), err
    assert b"interrupted" in err and b"Traceback" not in err, err
    assert took < 1.5, took  # said within a second (plus scheduling slack on a shared machine)
    time.sleep(0.2)
    alive = [w for w in workers if Path(f"/proc/{w}").exists() and "Z" not in _state(w)]
    assert alive == [], alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["analyze", "-q", "{run}", "-m", "4000"], "fewer than one per micro-batch"),
        (["analyze", "-q", "{run}", "--pp", "64"], "more than the job's 2 ranks"),
        (["whatif", "{run}", "--pp", "100000"], "above the supported maximum"),
        (["whatif", "{run}", "-m", "100000000"], "above the supported maximum"),
        (["whatif", "{run}", "-m", "1e8"], "not a whole number"),
        (["whatif", "{run}", "--pp", "4096", "-m", "16"], "above the simulated maximum"),
        (["bubble", "--pp", "100000", "-m", "8"], "--pp"),
        (["bubble", "--pp", "4", "-m", "100000000"], "--microbatches"),
    ],
)
def test_sizes_are_bounded(run_dir: Path, args: list[str], needle: str) -> None:
    t0 = time.monotonic()
    proc = ppdiag(*(a.format(run=run_dir) for a in args), timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr)
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 30


def test_bubble_of_a_wide_pipeline_is_quick() -> None:
    t0 = time.monotonic()
    proc = ppdiag("bubble", "--pp", "1000", "-m", "8", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 30
    import json

    res = json.loads(proc.stdout)
    assert res["bubble_ratio"] is not None
    assert any("above the simulated maximum" in (r["error"] or "") for r in res["table"])


def test_gate_is_inconclusive_on_a_rank_from_another_run(tmp_path: Path, budget: Path) -> None:
    """Rank 1's steps are 105-106, rank 0's 5-6: merged by position they would pass; the gate
    names the rank instead."""
    import json
    import re

    paths = write_kineto(make_scenario(pp=2, microbatches=4, steps=2), tmp_path, gzip=False)
    p1 = next(p for p in paths if p.name.startswith("rank1"))
    text = re.sub(r"ProfilerStep#(\d+)", lambda m: f"ProfilerStep#{int(m.group(1)) + 100}", p1.read_text())
    p1.write_text(text)
    assert json.loads(text)
    proc = ppdiag("check", str(tmp_path), "--budget", str(budget))
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "rank 1: its steps 105-106 share none with the other ranks' (5-6)" in proc.stdout
    proc = ppdiag("check", str(tmp_path), "--budget", str(budget), "--allow-partial")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)


def test_wide_process_group_is_linear(tmp_path: Path) -> None:
    """A pipeline group listing 16384 ranks (one traced): was 40 s of per-stage scans."""
    import json

    from conftest import TEST_DATA

    d = json.loads((TEST_DATA / "gpu_pp_rank0.json").read_text())
    n = 16384
    d["distributedInfo"]["pg_config"].append(
        {"pg_name": "1", "pg_desc": "pp", "pg_size": n, "ranks": list(range(n))}
    )
    d["distributedInfo"]["world_size"] = n
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d))
    t0 = time.monotonic()
    proc = ppdiag("analyze", "-q", str(p), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 25


def _procs_with(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_interrupted_demo_leaves_nothing_behind(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # a temp folder of its own: another job's demo folders in the shared /tmp are not this run's
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppdiag", "demo", "-q", "--out", str(out), "--steps", "40", "-m", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**ENV, "TMPDIR": str(tmp)},
    )
    work: set[Path] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not work:
        work = set(tmp.glob("ppdiag-demo-*"))
        time.sleep(0.05)
    time.sleep(2.0)  # the ranks are running (and writing) now
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert b"interrupted" in err and b"Traceback" not in err
    assert work and not any(w.exists() for w in work)  # the temp dir is gone
    assert sorted(p.name for p in out.iterdir()) == [".ppdiag-demo"]  # no partial trace
    # no rank left running: killed ranks may take a moment to exit on a loaded host
    deadline = time.monotonic() + 10
    while (left := [p for w in work for p in _procs_with(w.name)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def test_overrides_that_change_the_bubble_warn(run_dir: Path, budget: Path) -> None:
    """The gate and stderr repeat the analysis's own override warnings (one wording, the report's)."""
    proc = ppdiag("check", str(run_dir), "--budget", str(budget), "-m", "2", "--schedule", "gpipe")
    said = "--microbatches 2 disagrees with the trace (4 micro-batches per step); the override is used"
    assert f"WARN  {said}" in proc.stdout, proc.stdout
    assert "WARN  --schedule gpipe disagrees with the trace (its block order is 1f1b)" in proc.stdout
    proc = ppdiag("analyze", "-q", str(run_dir), "-m", "2")
    assert proc.returncode == 0 and f"warning: {said}" in proc.stderr


def test_gate_with_an_unreadable_rank_file_is_inconclusive(
    run_dir: Path, budget: Path, tmp_path: Path
) -> None:
    for p in run_dir.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    victim = next(p for p in sorted(tmp_path.glob("rank1*")))
    victim.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64)  # zstd data under the .json.gz name
    proc = ppdiag("check", str(tmp_path), "--budget", str(budget))
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "MISSING  1 rank(s) 1 of world size 2 have no trace" in proc.stdout
    assert "MISSING  unreadable trace file" in proc.stdout and "zstd-compressed data" in proc.stdout
