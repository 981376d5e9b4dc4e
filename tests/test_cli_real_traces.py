"""``ppdiag analyze`` on every real Kineto trace: exit 0, the right ranks, accounts that add up.

None of these public traces is a pipeline-parallel run (shared/traces/README.md), so each must
say so (pp 1, schedule "none") and still give the per-rank time breakdown.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_parts import attribution, context
from conftest import SHARED_TRACES

from ppdiag.api import Options, diagnose
from ppdiag.report_types import Cause

KINETO = SHARED_TRACES / "kineto"
# (path relative to kineto/, expected ranks): ranks come from distributedInfo, or the single file.
CASES = [
    ("hta_2022_format_rank3.json.gz", [3]),
    ("hta_alltoall_rank0.json.gz", [0]),
    ("hta_ddp_nccl_rank0.json.gz", [0]),
    ("hta_ns_resolution_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", [0]),
    ("kineto_2021_resnet50_worker0.pt.trace.json.gz", [0]),
    ("tracelens_b200_rank0.json.gz", [0]),
    ("tracelens_h100_single.json.gz", [0]),
    ("tracelens_mi300_ddp_rank0.json.gz", [0]),
    ("gloo_cpu_2rank", [0, 1]),
    ("hta_sampled_2rank", [0, 1]),
]


def _path(rel: str) -> Path:
    p = KINETO / rel
    if not p.exists():
        pytest.skip(f"{p} not available")
    return p


@pytest.mark.parametrize(("rel", "ranks"), CASES, ids=[c[0].split(".")[0] for c in CASES])
def test_every_real_trace_analyzes(rel: str, ranks: list[int]) -> None:
    diag = diagnose([_path(rel)], Options())
    rep = diag.result
    assert rep.run.ranks == ranks
    assert rep.run.pp == 1 and rep.run.schedule == "none"
    assert rep.stages == []
    assert rep.summary.step_ms is not None and rep.summary.step_ms > 0
    attr, rank_steps = attribution(diag), context(diag).rank_steps
    assert rank_steps, "no step window"
    for rs in rank_steps:
        a = rs.acct
        assert a.window > 0
        assert min(a.compute, a.exposed_p2p, a.exposed_collective, a.exposed_copy, a.idle) >= 0
        assert a.compute + a.exposed_p2p + a.exposed_collective + a.exposed_copy + a.idle == a.window
        assert sum(attr.causes[(rs.rank, rs.step)].values()) == a.lost
    for r in rep.ranks:
        parts = r.compute_ms + r.exposed_p2p_ms + r.exposed_collective_ms + r.exposed_copy_ms + r.idle_ms
        assert parts == pytest.approx(r.step_ms, abs=0.01)
        assert sum(r.lost_ms[k] for k in Cause) == pytest.approx(r.step_ms - r.compute_ms, abs=0.01)


def test_cli_writes_json_and_exits_zero(tmp_path: Path) -> None:
    src = _path("gloo_cpu_2rank")
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(src), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    assert rep["schema_version"] == 1
    for key in ("run", "summary", "bubble", "stages", "ranks", "findings"):
        assert key in rep
    assert rep["run"]["cpu_only"] is True
    assert "Per rank" in proc.stdout


def test_data_loading_bound_resnet_is_host_bound() -> None:
    """The 2021 ResNet-50 sample is a known data-loading-bound run: host is its main loss."""
    rep = diagnose([_path("kineto_2021_resnet50_worker0.pt.trace.json.gz")], Options()).result
    lost = rep.summary.lost_ms
    assert lost["host"] == max(lost.values())
    assert rep.findings and rep.findings[0].code == "PP006"
