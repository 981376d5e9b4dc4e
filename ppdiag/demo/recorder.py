"""Record a real pipeline-parallel training run on CPU processes, with faults and ground truth.

:func:`record` starts one launcher process (``python -m ppdiag.demo.worker``), which imports torch
once and forks one process per rank. The ranks train a small model with
``torch.distributed.pipelining`` over gloo under the chosen schedule, profile the active steps with
``torch.profiler`` and write ``rank{r}.pt.trace.json.gz``; the recorder then merges their measured
intervals into ``groundtruth.json``. The recorder itself never imports torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ppdiag.demo import groundtruth
from ppdiag.demo.config import SCHEDULE_CLASSES, DemoConfig
from ppdiag.errors import InputError, PpdiagError

Progress = Callable[[str, float], None]

TORCH_MISSING = "ppdiag demo needs torch: pip install torch (the ppdiag[demo] extra)"
FAILURE_LOG = "demo-failure.log"
_RANK_TRACE = re.compile(r"rank\d+\.pt\.trace\.json\.gz")


class DemoError(PpdiagError):
    """A demo run failed: a rank raised, died, or the run timed out. ``str()`` is one line."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        self.rank = rank
        self.message = message
        super().__init__(message)


def torch_available() -> bool:
    """True when torch can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env.update(
        {
            # One compute thread per rank: ranks share the cores, oversubscription only adds noise.
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # all ranks are on this host
    return env


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the launcher and every rank (they share the launcher's process group), then reap it.

    The group outlives a launcher that already exited while any rank it forked is alive.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class _Monitor:
    """Reads the ranks' progress/error lines and turns them into progress and the first failure."""

    def __init__(self, cfg: DemoConfig, progress: Progress | None) -> None:
        self.cfg = cfg
        self.progress = progress
        self.buf = b""
        self.steps_done = [0] * cfg.pp
        self.done: set[int] = set()
        self.errors: list[tuple[int, int, str]] = []  # (time_ns, rank, message)
        self.exits: list[tuple[int, int]] = []  # (rank, code)
        self.torch_version = ""
        self.total_units = cfg.pp * cfg.total_iterations

    def feed(self, data: bytes) -> None:
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            self._handle(msg)

    def _handle(self, msg: dict[str, Any]) -> None:
        ev, rank = msg.get("event"), int(msg.get("rank", -1))
        if ev == "imported":
            self.torch_version = str(msg.get("torch_version", ""))
            self._report(f"torch {self.torch_version} loaded, starting {self.cfg.pp} ranks", 0.05)
        elif ev == "step" and 0 <= rank < self.cfg.pp:
            self.steps_done[rank] = int(msg.get("step", 0)) + 1
            units = sum(self.steps_done)
            low = min(self.steps_done)
            self._report(
                f"{low}/{self.cfg.total_iterations} steps done on all {self.cfg.pp} ranks",
                0.05 + 0.9 * units / self.total_units,
            )
        elif ev == "done":
            self.done.add(rank)
        elif ev == "error":
            self.errors.append((int(msg.get("t", 0)), rank, str(msg.get("message", "unknown error"))))
        elif ev == "exit":
            self.exits.append((rank, int(msg.get("code", 1))))

    def _report(self, message: str, fraction: float) -> None:
        if self.progress is not None:
            self.progress(message, min(max(fraction, 0.0), 1.0))

    def timeout_error(self) -> DemoError:
        done = self.steps_done
        if not self.torch_version:
            where = "before torch was imported"
        elif len(set(done)) == 1:
            where = f"all ranks had finished {done[0]}/{self.cfg.total_iterations} steps"
        else:
            lag = min(range(self.cfg.pp), key=lambda r: done[r])
            where = (
                f"rank {lag} had finished {done[lag]}/{self.cfg.total_iterations} steps, "
                f"the others up to {max(done)}"
            )
        return DemoError(f"demo run timed out after {self.cfg.timeout_s:g} s ({where})")

    def first_failure(self) -> DemoError | None:
        if self.errors:
            # The earliest error is the root cause; later ones are peers losing their connection.
            _, rank, message = min(self.errors)
            who = f"rank {rank}" if rank >= 0 else "demo launcher"
            return DemoError(f"demo run failed on {who}: {message}", rank if rank >= 0 else None)
        if self.exits:
            rank, code = self.exits[0]
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            return DemoError(f"demo run failed: rank {rank} died ({how})", rank)
        return None


def record(config: DemoConfig, out_dir: Path, progress: Progress | None = None) -> Path:
    """Record one demo run into ``out_dir``; returns ``out_dir``.

    ``out_dir`` receives ``rank{r}.pt.trace.json.gz`` for every rank and ``groundtruth.json``
    (schema in :mod:`ppdiag.demo.groundtruth`). ``progress(message, fraction)`` is called as ranks
    finish steps. Raises :class:`~ppdiag.errors.InputError` for a bad config or missing torch and
    :class:`DemoError` when the run fails or exceeds ``config.timeout_s``; no process outlives it.
    """
    cfg = config.validated()
    if not torch_available():
        raise InputError(None, TORCH_MISSING)
    if not hasattr(os, "fork"):
        raise InputError(None, "ppdiag demo needs a POSIX system (Linux or macOS) to start its ranks")
    out = _clean_out_dir(Path(out_dir))
    work = Path(tempfile.mkdtemp(prefix="ppdiag-demo-"))
    log_path = work / "ranks.log"
    t_start = time.monotonic()
    proc: subprocess.Popen[bytes] | None = None
    rfd, wfd = os.pipe()
    try:
        (work / "run.json").write_text(
            json.dumps({"config": cfg.to_dict(), "out_dir": str(out.resolve())}), encoding="utf-8"
        )
        monitor = _Monitor(cfg, progress)
        monitor._report(f"starting {cfg.pp} ranks ({cfg.schedule}, {cfg.microbatches} micro-batches)", 0.0)
        proc = _launch(work, wfd, log_path)
        os.close(wfd)
        wfd = -1
        _watch(proc, rfd, monitor, t_start + cfg.timeout_s)
        code = proc.returncode
        if code != 0 or len(monitor.done) != cfg.pp:
            missing = sorted(set(range(cfg.pp)) - monitor.done)
            raise monitor.first_failure() or DemoError(
                f"demo run failed: launcher exited with code {code}; ranks {missing} did not finish "
                f"({_log_tail(log_path)})"
            )
        proc = None  # finished cleanly: every rank reported done and the launcher reaped them
        monitor._report("writing ground truth", 0.97)
        _merge_truth(cfg, work, out, monitor.torch_version)
        monitor._report(f"recorded {cfg.pp} ranks in {time.monotonic() - t_start:.1f} s", 1.0)
        return out
    except DemoError:
        _keep_log(log_path, out)
        raise
    finally:
        if proc is not None:
            _kill_group(proc)
        if wfd >= 0:
            os.close(wfd)
        os.close(rfd)
        _remove_work(work)


def _remove_work(work: Path, patience_s: float = 10.0) -> None:
    """Remove the run's work folder, again while it reappears. A rank sent SIGKILL may still
    finish a write it is in the middle of (the kill takes effect when the call returns), and on a
    loaded host that can land after one ``rmtree`` has listed the folder, which then stays."""
    end = time.monotonic() + patience_s
    while True:
        shutil.rmtree(work, ignore_errors=True)
        if not work.exists() or time.monotonic() > end:
            return
        time.sleep(0.05)


def _clean_out_dir(out: Path) -> Path:
    """Create ``out``; never mix a new run with an old one's traces (of any size)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(str(out), f"cannot create the output directory ({exc.strerror})") from None
    stale = [p for p in out.glob("rank*.pt.trace.json.gz") if _RANK_TRACE.fullmatch(p.name)]
    for old in [*stale, out / groundtruth.FILENAME, out / FAILURE_LOG]:
        if old.is_file():
            old.unlink(missing_ok=True)
    return out


def _launch(work: Path, wfd: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start the launcher process (its own session, so that one kill ends every rank)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ppdiag.demo.worker", str(work), str(wfd)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            pass_fds=(wfd,),
            start_new_session=True,
        )


def _watch(proc: subprocess.Popen[bytes], rfd: int, monitor: _Monitor, deadline: float) -> None:
    """Feed the ranks' reports to ``monitor`` until the launcher is done; raises the first rank
    failure, or a timeout past ``deadline`` (monotonic)."""
    eof = False
    while True:
        failure = monitor.first_failure()
        if failure is not None:
            # Give the other ranks a moment to report, so the earliest error wins.
            _drain(rfd, monitor, 0.3)
            raise monitor.first_failure() or failure
        if eof and proc.poll() is not None:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise monitor.timeout_error()
        ready, _, _ = select.select([rfd], [], [], min(0.2, max(left, 0.0)))
        if ready:
            data = os.read(rfd, 65536)
            if data:
                monitor.feed(data)
            else:
                eof = True
        elif eof:
            time.sleep(0.05)


def _drain(fd: int, monitor: _Monitor, seconds: float) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return
        data = os.read(fd, 65536)
        if not data:
            return
        monitor.feed(data)


def _log_tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no output"


def _keep_log(log_path: Path, out: Path) -> None:
    """Keep the ranks' stdout/stderr next to the traces when a run fails, for a closer look."""
    try:
        if log_path.exists():
            shutil.copyfile(log_path, out / FAILURE_LOG)
    except OSError:
        pass


def _merge_truth(cfg: DemoConfig, work: Path, out: Path, torch_version: str) -> Path:
    parts = []
    for r in range(cfg.pp):
        p = work / f"rank{r}.gt.json"
        if not p.exists():
            raise DemoError(f"demo run failed: rank {r} wrote no ground truth", r)
        if not (out / groundtruth.trace_name(r)).exists():
            raise DemoError(f"demo run failed: rank {r} wrote no trace", r)
        parts.append(json.loads(p.read_text(encoding="utf-8")))
    header = {
        "torch_version": torch_version,
        "config": cfg.to_dict(),
        "schedule": cfg.schedule,
        "schedule_class": SCHEDULE_CLASSES[cfg.schedule],
        "compute": cfg.compute,
        "pp": cfg.pp,
        "world_size": cfg.pp,
        "microbatches": cfg.microbatches,
        "num_stages": cfg.num_stages,
        "stages_per_rank": cfg.stages_per_rank,
        "stage_to_rank": cfg.stage_to_rank(),
        "stage_layers": cfg.layers(),
        "stage_costs_ms": cfg.stage_costs_ms() if cfg.compute == "sleep" else None,
        "faults": cfg.faults(),
        "steps": list(range(cfg.total_iterations - cfg.steps, cfg.total_iterations)),
    }
    return groundtruth.write(out / groundtruth.FILENAME, header, parts)
