"""pp = 1 synthetic runs whose collectives wait for late ranks: the waiting is charged to the late
ranks' root cause (not exposed_comm) and PP009 names them. Truth comes from the generator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_parts import attribution

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppsynth import ExposedAllReduce, LateReplica, SlowWorker, make_scenario, write_kineto
from ppsynth.collectives import make_collective_run
from ppsynth.faults import Fault
from ppsynth.nsys import write_nsys
from ppsynth.run import SynthRun


def _diagnose(tmp_path: Path, fmt: str, **kw: object) -> tuple[SynthRun, Analyzed]:
    run = make_collective_run(**kw)
    paths = write_kineto(run, tmp_path) if fmt == "kineto" else write_nsys(run, tmp_path)
    return run, diagnose(paths, Options())


def _pp009(diag: Analyzed) -> list[Any]:
    # Any: the tests read PP009's nested evidence (a JSON object in the typed report)
    return [f for f in diag.findings if f.code == "PP009"]


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_late_starting_ranks_are_named_and_their_wait_is_not_exposed_comm(tmp_path: Path, fmt: str) -> None:
    late = {1: 5.0, 4: 4.0}
    run, diag = _diagnose(tmp_path, fmt, world=6, late_ms=late, steps=3, seed=3)
    rep, truth = diag.result, run.truth
    assert rep.run.pp == 1 and rep.run.schedule == "none"
    step = rep.summary.step_ms
    assert step is not None
    for r in rep.ranks:
        if r.rank in late:
            continue  # their windows start at their first kernel, later than ProfilerStep
        t = truth["ranks"][str(r.rank)]["causes_ms"]
        # the 5 ms wait in the first all-to-all is host (the late rank's data loader), not exposed comm
        assert abs(r.lost_ms["exposed_comm"] - t["exposed_comm"]) < 0.02 * step
        assert abs(r.lost_ms["host"] - t["host"]) < 0.02 * step
        assert t["host"] > 4.5
    (f,) = _pp009(diag)
    assert sorted(f.ranks) == sorted(late) and f.ranks[0] == 1
    for rank, ms in late.items():
        got = f.evidence.as_dict()["late_ranks"][str(rank)]["late_ms_per_step"]
        assert abs(got - truth["stragglers"][str(rank)]) <= 0.05 * truth["stragglers"][str(rank)]
        assert f.evidence.as_dict()["late_ranks"][str(rank)]["reasons_ms_per_step"]["late_start"] > 0.9 * ms
    assert f.cause == "host"
    assert f.gain_ms is not None
    assert abs(f.gain_ms - truth["gain_ms_per_step"]) <= 0.05 * truth["gain_ms_per_step"]


def test_slow_gpu_waits_are_imbalance(tmp_path: Path) -> None:
    run, diag = _diagnose(tmp_path, "kineto", world=4, slow={2: 1.4}, steps=3, seed=5)
    step = diag.result.summary.step_ms
    assert step is not None
    for r in diag.result.ranks:
        t = run.truth["ranks"][str(r.rank)]["causes_ms"]
        assert abs(r.lost_ms["imbalance"] - t["imbalance"]) < 0.02 * step
        assert abs(r.lost_ms["exposed_comm"] - t["exposed_comm"]) < 0.02 * step
    (f,) = _pp009(diag)
    assert f.ranks == [2] and f.cause == "imbalance"
    assert f.evidence.as_dict()["main_reason"] == "compute"
    assert f.gain_ms is not None
    assert abs(f.gain_ms - run.truth["gain_ms_per_step"]) <= 0.05 * run.truth["gain_ms_per_step"]


def test_ranks_on_time_give_no_straggler(tmp_path: Path) -> None:
    run, diag = _diagnose(tmp_path, "kineto", world=4, steps=2)
    assert not _pp009(diag)
    for r in diag.result.ranks:
        t = run.truth["ranks"][str(r.rank)]["causes_ms"]
        assert abs(r.lost_ms["exposed_comm"] - t["exposed_comm"]) < 0.01


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_pipeline_dp_allreduce_waits_for_a_late_replica(tmp_path: Path, fmt: str) -> None:
    delay = 2.5
    faults: list[Fault] = [ExposedAllReduce(1.0), LateReplica(0, delay)]
    run = make_scenario("1f1b", pp=4, microbatches=6, dp=2, faults=faults, steps=3, seed=2)
    on_time = make_scenario("1f1b", pp=4, microbatches=6, dp=2, faults=faults[:1], steps=3, seed=2)
    paths = write_kineto(run, tmp_path) if fmt == "kineto" else write_nsys(run, tmp_path)
    diag = diagnose(paths, Options())
    rep = diag.result
    assert rep.run.pp == 4 and rep.run.schedule == "1f1b"
    late = sorted(run.truth["faults"][1]["ranks"])  # replica 0: global ranks 0, 2, 4, 6
    assert late == [0, 2, 4, 6]
    step = rep.summary.step_ms
    assert step is not None
    attr = attribution(diag)
    for r in (1, 3, 5, 7):  # the waiting replica
        tr = run.truth["ranks"][str(r)]
        for k, ts in enumerate(tr["steps"]):
            got = {c: v / 1e6 for c, v in attr.causes[(r, k)].items()}
            # the 2.5 ms wait in the data-parallel all-reduce is not exposed communication
            assert abs(got["exposed_comm"] - ts["causes_ms"]["exposed_comm"]) < 0.02 * step
            if k > 0:  # step 0 of the late replica starts at its first kernel: its lateness is not seen
                assert abs(got["host"] - ts["causes_ms"]["host"]) < 0.02 * step
    (f,) = _pp009(diag)
    assert f.ranks == late and f.cause == "host"
    for r in late:
        got = f.evidence.as_dict()["late_ranks"][str(r)]["late_ms_per_step"]
        assert abs(got - delay) <= 0.05 * delay
    gain = float(np.mean(run.truth["step_ms"])) - float(np.mean(on_time.truth["step_ms"]))
    assert abs(gain - delay) < 1e-6
    assert f.gain_ms is not None and abs(f.gain_ms - gain) <= 0.05 * gain


def test_generator_truth_adds_up_and_rejects_bad_setups() -> None:
    run = make_collective_run(world=3, late_ms={0: 1.0}, slow={2: 1.2}, steps=2)
    for r in run.truth["ranks"].values():
        for st in r["steps"]:
            assert abs(sum(st["causes_ms"].values()) - st["lost_ms"]) < 1e-9
            assert abs(st["window_ms"] - st["compute_ms"] - st["lost_ms"]) < 1e-9
    # the waiting ranks' host includes rank 0's data loader; rank 2's slow compute is imbalance
    assert run.truth["ranks"]["1"]["causes_ms"]["imbalance"] > 0
    assert set(run.truth["stragglers"]) == {"0", "2"}
    with pytest.raises(ValueError, match="late_ms"):
        make_collective_run(world=2, late_ms={5: 1.0})
    with pytest.raises(ValueError, match="LateReplica"):
        make_scenario("1f1b", pp=2, microbatches=4, dp=2, faults=[LateReplica(0, 1.0)])
    with pytest.raises(ValueError, match="SlowWorker"):
        make_scenario("1f1b", pp=2, microbatches=4, dp=2, faults=[SlowWorker(0, 0, 2.0)])  # no exposed AR
    # coupled replicas: every rank's truth still adds up to its lost time
    sw = make_scenario(
        "1f1b", pp=2, microbatches=4, dp=2, faults=[ExposedAllReduce(1.0), SlowWorker(1, 1, 1.5)]
    )
    for r in sw.truth["ranks"].values():
        for st in r["steps"]:
            assert abs(sum(st["causes_ms"].values()) - st["lost_ms"]) < 1e-6


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_pipeline_slow_worker_is_named_not_its_replica(tmp_path: Path, fmt: str) -> None:
    # pipeline rank 1 of replica 0 (global rank 1 * 2 + 0 = 2) computes 1.4x slower than stage 1 of
    # replica 1: its pipeline waits for it, and replica 1 waits for that pipeline in the DP all-reduce
    faults: list[Fault] = [ExposedAllReduce(0.8), SlowWorker(1, 0, 1.4)]
    run = make_scenario("1f1b", pp=3, microbatches=6, dp=2, faults=faults, steps=3, seed=7)
    on_time = make_scenario("1f1b", pp=3, microbatches=6, dp=2, faults=faults[:1], steps=3, seed=7)
    paths = write_kineto(run, tmp_path) if fmt == "kineto" else write_nsys(run, tmp_path)
    diag = diagnose(paths, Options())
    step = diag.result.summary.step_ms
    assert step is not None
    attr = attribution(diag)
    for r, tr in run.truth["ranks"].items():
        for k, ts in enumerate(tr["steps"]):
            got = {c: v / 1e6 for c, v in attr.causes[(int(r), k)].items()}
            for c in ("bubble", "imbalance", "exposed_comm", "host"):
                assert abs(got[c] - ts["causes_ms"][c]) < 0.02 * step, (r, k, c, got[c], ts["causes_ms"][c])
    (f,) = _pp009(diag)
    assert f.ranks == [2] and f.cause == "imbalance"
    assert set(f.evidence.as_dict()["followers"]) == {
        "0",
        "4",
    }  # its own pipeline, late because it waited for it
    gain = float(np.mean(run.truth["step_ms"])) - float(np.mean(on_time.truth["step_ms"]))
    assert f.gain_ms is not None and abs(f.gain_ms - gain) <= 0.05 * gain


def test_several_late_ranks_of_different_lateness_are_all_named(tmp_path: Path) -> None:
    # rank 3 waits for rank 6 (later still) in the first all-to-all: it is a straggler all the same
    run, diag = _diagnose(tmp_path, "kineto", world=10, late_ms={3: 2.0, 6: 5.0}, slow={8: 1.3}, seed=9)
    (f,) = _pp009(diag)
    truth = run.truth["stragglers"]
    assert sorted(f.ranks) == [3, 6, 8] and f.ranks[0] == 6
    for r in f.ranks:
        got = f.evidence.as_dict()["late_ranks"][str(r)]["late_ms_per_step"]
        assert abs(got - truth[str(r)]) <= 0.05 * truth[str(r)]
    assert f.evidence.as_dict()["late_ranks"]["8"]["reasons_ms_per_step"]["compute"] > 0.9 * truth["8"]
