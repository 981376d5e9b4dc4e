"""Property: a fault of known size injected into a random pipeline run is recovered by the replay.

Hypothesis draws the shape (P, M, schedule, interleaving) and one fault with its size (a slow
stage, a slow link, a host stall, an exposed all-reduce, p2p on the compute stream, or none); the
synthetic run's truth comes from differences of simulations (``ppsynth/scenario.py``,
docs/json.md "Time accounting" order). Every cause on every rank must match within 2 % of the step (plus the
few-µs gaps between the kernels of a block, which the truth books apart).

Host stalls are left out: with few micro-batches or interleaving part of a stall still lands in
bubble (up to ~3 % of the step at P=2, M=2, and far more on interleaved P=5), and a stall before
the first block of the first profiled step lies outside the measured window. The fixed host-stall
cases in test_diagnosis_synth.py hold at 1.5 %. p2p on the compute stream with interleaving is
left out too (P=3, M=3, v=2: 2.3 % of the step moves from bubble to exposed_comm).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppdiag.api import Options, diagnose
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario, write_groundtruth

TRUTH_KEYS = ("bubble", "imbalance", "comm_wait", "exposed_comm", "host")
TOL = 0.02


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    pp = draw(st.integers(2, 4))
    sched = draw(st.sampled_from(["1f1b", "gpipe", "interleaved_1f1b"]))
    m = draw(st.integers(pp, 2 * pp + 2)) if sched != "interleaved_1f1b" else pp * draw(st.integers(1, 2))
    kinds = ["none", "slow_stage", "slow_link", "allreduce"]
    if sched != "interleaved_1f1b":
        kinds.append("on_compute")
    kind = draw(st.sampled_from(kinds))
    rank = draw(st.integers(0, pp - 1))
    faults: list[Any] = []
    kw: dict[str, Any] = {}
    if kind == "slow_stage":
        faults.append(F.SlowStage(rank, draw(st.sampled_from([1.25, 1.5, 2.0]))))
    elif kind == "slow_link":
        faults.append(F.SlowLink(rank, delay_ms=draw(st.sampled_from([0.1, 0.3, 0.6]))))
    elif kind == "allreduce":
        faults.append(F.ExposedAllReduce(draw(st.sampled_from([1.0, 3.0]))))
        kw["dp"] = 2
    elif kind == "on_compute":
        faults.append(F.CommOnCompute())
    if sched == "interleaved_1f1b":
        kw["virtual"] = 2
        if kind == "slow_stage":
            faults = [F.SlowStage(draw(st.integers(0, 2 * pp - 1)), faults[0].factor)]
    return dict(schedule=sched, pp=pp, microbatches=m, faults=faults, **kw)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(runs())
def test_random_faults_are_recovered_by_the_replay(cfg: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        run = make_scenario(steps=2, clock_skew_ms=3.0, gpus_per_node=1, **cfg)
        write_kineto(run, out)
        write_groundtruth(run, out)
        truth = json.loads((out / "groundtruth.json").read_text())
        rep = diagnose([out], Options()).result
    for r in rep.ranks:
        t = truth["ranks"][str(r.rank)]
        slack = TOL * t["step_ms"] + t["kernel_gaps_ms"]
        for k in TRUTH_KEYS:
            assert abs(r.lost_ms[k] - t["causes_ms"][k]) <= slack, (
                cfg,
                r.rank,
                k,
                r.lost_ms,
                t["causes_ms"],
            )
        assert r.lost_ms["unexplained"] <= slack, (cfg, r.lost_ms)
