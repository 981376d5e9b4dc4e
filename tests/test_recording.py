"""The recording helper (``ppdiag.recording.profiler``) in a real one-process gloo group: the file
it writes, that the trace carries ``distributedInfo`` and the recorded steps, and that ppdiag reads
its rank from it. Every ``ppdiag demo`` run records through the same helper (tests/test_demo_record.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("torch")

SCRIPT = """
import sys
import torch
import torch.distributed as dist
from ppdiag.recording import profiler

dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
w = torch.randn(64, 64, requires_grad=True)
with profiler(sys.argv[1], steps=2, cuda=False) as prof:
    for _ in range(5):
        (torch.randn(32, 64) @ w).sum().backward()
        dist.all_reduce(w.grad)
        prof.step()
dist.destroy_process_group()
"""


def test_profiler_writes_one_rank_file_with_distributed_info(tmp_path: Path) -> None:
    out = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), str(tmp_path / "rendezvous")],
        check=True,
        cwd=REPO,
        timeout=300,
    )
    files = sorted(p.name for p in out.iterdir())
    assert files == ["rank0.pt.trace.json.gz"]
    trace = json.loads(gzip.decompress((out / files[0]).read_bytes()))
    info = trace["distributedInfo"]
    assert info["rank"] == 0 and info["world_size"] == 1 and info["backend"] == "gloo"
    # wait 1 + warm-up 1, then exactly the 2 recorded steps
    names = {str(e.get("name", "")) for e in trace["traceEvents"]}
    steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]

    from ppdiag.parsers.loader import load_run

    run = load_run([out], progress=False, jobs=1)
    assert [tl.rank for tl in run.ranks] == [0] and run.world_size == 1


def test_profiler_refuses_a_schedule_that_records_nothing(tmp_path: Path) -> None:
    from ppdiag.recording import profiler

    with pytest.raises(ValueError, match="steps must be >= 1"):
        profiler(tmp_path, steps=0)
