"""A stop signal that reaches a parse worker between its fork and its own setup ends that worker
quietly. The parent terminates its workers on an error or Ctrl-C; a worker forked just then held the
parent's handler, which raised inside the child's fork hooks and printed "Exception ignored ...
Interrupted: 15" under the command's one error line (seen as a flaky
``test_bad_max_trace_gb_is_one_line``). Here the signal is made to arrive in that window on every
run: a fork hook sends it to the child itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from concurrent.futures.process import BrokenProcessPool
    from pathlib import Path
    from ppdiag.cli.guards import on_signal
    from ppdiag.parsers import ParseOptions
    from ppdiag.parsers.detect import TraceFile
    from ppdiag.parsers.pool import parse_files

    signal.signal(signal.SIGTERM, on_signal)  # as the CLI installs it
    os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
    files = [TraceFile(p, "kineto") for p in sorted(Path(sys.argv[1]).glob("*.json"))]
    try:
        parse_files(files, ParseOptions(), jobs=2, progress=False)
    except BrokenProcessPool:
        print("workers ended")
    """
)


@pytest.mark.skipif(not hasattr(os, "register_at_fork") or sys.platform != "linux", reason="fork workers")
def test_stop_signal_before_worker_setup_is_quiet(tmp_path: Path) -> None:
    d = tmp_path / "run"
    write_kineto(make_scenario(pp=2, microbatches=2, steps=1), d, gzip=False, groundtruth=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PPDIAG_NO_CACHE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(d)], capture_output=True, text=True, timeout=120, env=env
    )
    assert "Exception ignored" not in proc.stderr and "Interrupted" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip() == "workers ended", (proc.returncode, proc.stdout, proc.stderr[-2000:])
