"""pp = 1 synthetic runs whose collectives wait for late ranks: the waiting is charged to the late
ranks' root cause (not exposed_comm) and PP009 names them. Truth comes from the generator."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdiag.api import Options, diagnose
from ppdiag.diagnosis import Diagnosis, Finding
from ppdiag.synth import write_kineto
from ppdiag.synth.collectives import make_collective_run
from ppdiag.synth.nsys import write_nsys
from ppdiag.synth.run import SynthRun


def _diagnose(tmp_path: Path, fmt: str, **kw: object) -> tuple[SynthRun, Diagnosis]:
    run = make_collective_run(**kw)
    paths = write_kineto(run, tmp_path) if fmt == "kineto" else write_nsys(run, tmp_path)
    return run, diagnose(paths, Options())


def _pp009(diag: Diagnosis) -> list[Finding]:
    return [f for f in diag.findings if f.code == "PP009"]


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_late_starting_ranks_are_named_and_their_wait_is_not_exposed_comm(tmp_path: Path, fmt: str) -> None:
    late = {1: 5.0, 4: 4.0}
    run, diag = _diagnose(tmp_path, fmt, world=6, late_ms=late, steps=3, seed=3)
    rep, truth = diag.report, run.truth
    assert rep["run"]["pp"] == 1 and rep["run"]["schedule"] == "none"
    step = rep["summary"]["step_ms"]
    for r in rep["ranks"]:
        if r["rank"] in late:
            continue  # their windows start at their first kernel, later than ProfilerStep
        t = truth["ranks"][str(r["rank"])]["causes_ms"]
        # the 5 ms wait in the first all-to-all is host (the late rank's data loader), not exposed comm
        assert abs(r["lost_ms"]["exposed_comm"] - t["exposed_comm"]) < 0.02 * step
        assert abs(r["lost_ms"]["host"] - t["host"]) < 0.02 * step
        assert t["host"] > 4.5
    (f,) = _pp009(diag)
    assert sorted(f.ranks) == sorted(late) and f.ranks[0] == 1
    for r, ms in late.items():
        got = f.evidence["late_ranks"][str(r)]["late_ms_per_step"]
        assert abs(got - truth["stragglers"][str(r)]) <= 0.05 * truth["stragglers"][str(r)]
        assert f.evidence["late_ranks"][str(r)]["reasons_ms_per_step"]["late_start"] > 0.9 * ms
    assert f.cause == "host"
    assert abs(f.gain_ms - truth["gain_ms_per_step"]) <= 0.05 * truth["gain_ms_per_step"]


def test_slow_gpu_waits_are_imbalance(tmp_path: Path) -> None:
    run, diag = _diagnose(tmp_path, "kineto", world=4, slow={2: 1.4}, steps=3, seed=5)
    step = diag.report["summary"]["step_ms"]
    for r in diag.report["ranks"]:
        t = run.truth["ranks"][str(r["rank"])]["causes_ms"]
        assert abs(r["lost_ms"]["imbalance"] - t["imbalance"]) < 0.02 * step
        assert abs(r["lost_ms"]["exposed_comm"] - t["exposed_comm"]) < 0.02 * step
    (f,) = _pp009(diag)
    assert f.ranks == [2] and f.cause == "imbalance"
    assert f.evidence["main_reason"] == "compute"
    assert abs(f.gain_ms - run.truth["gain_ms_per_step"]) <= 0.05 * run.truth["gain_ms_per_step"]


def test_ranks_on_time_give_no_straggler(tmp_path: Path) -> None:
    run, diag = _diagnose(tmp_path, "kineto", world=4, steps=2)
    assert not _pp009(diag)
    for r in diag.report["ranks"]:
        t = run.truth["ranks"][str(r["rank"])]["causes_ms"]
        assert abs(r["lost_ms"]["exposed_comm"] - t["exposed_comm"]) < 0.01
