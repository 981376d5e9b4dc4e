"""The same synthetic GPU run written as PyTorch Profiler JSON and as Nsight Systems SQLite must
give the same diagnosis: stage map, schedule, per-cause lost time within 1% of the step, top
finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdiag.api import Options, diagnose
from ppdiag.report_types import Cause, Report
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

CASES: dict[str, list[F.Fault]] = {
    "slow_stage": [F.SlowStage(2, 1.6)],
    "slow_link": [F.SlowLink(1, delay_ms=0.5)],
    "host_stall": [F.HostStall(1, 0.5)],
}


def _both(tmp_path: Path, faults: list[F.Fault], per_rank_files: bool = True) -> tuple[Report, Report]:
    run = make_scenario("1f1b", pp=4, microbatches=8, faults=faults, steps=2, clock_skew_ms=4.0, seed=1)
    kd, nd = tmp_path / "kineto", tmp_path / "nsys"
    kd.mkdir()
    nd.mkdir()
    write_kineto(run, kd)
    write_nsys(run, nd, per_rank_files=per_rank_files)
    return diagnose([kd], Options()).result, diagnose([nd], Options()).result


def _same(a: Report, b: Report) -> None:
    assert a.run.format == "kineto" and b.run.format == "nsys"
    for key in ("ranks", "pp", "stage_map", "schedule", "microbatches", "virtual_stages"):
        assert getattr(a.run, key) == getattr(b.run, key), key
    step = a.summary.step_ms
    assert step is not None
    assert b.summary.step_ms == pytest.approx(step, abs=0.01 * step)
    for ra, rb in zip(a.ranks, b.ranks, strict=False):
        for k in Cause:
            assert abs(ra.lost_ms[k] - rb.lost_ms[k]) <= 0.01 * step, (ra.rank, k)
    fa, fb = a.findings[0], b.findings[0]
    assert (fa.code, fa.stages, fa.ranks) == (fb.code, fb.stages, fb.ranks)


@pytest.mark.parametrize("name", list(CASES))
def test_same_diagnosis_from_both_formats(tmp_path: Path, name: str) -> None:
    a, b = _both(tmp_path, CASES[name])
    _same(a, b)


def test_one_report_holding_every_rank(tmp_path: Path) -> None:
    """torchrun under one nsys: one SQLite file with every rank's process."""
    a, b = _both(tmp_path, CASES["slow_stage"], per_rank_files=False)
    _same(a, b)
