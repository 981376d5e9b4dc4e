"""Synthetic GPU-shaped pipeline runs with known ground truth.

:mod:`ppdiag.synth.run` is the format-neutral description (:class:`SynthRun`);
:mod:`ppdiag.synth.scenario` builds one from the schedule simulator plus injected faults
(its knobs in :mod:`~ppdiag.synth.scenario_params`, what a rank records per step in
:mod:`~ppdiag.synth.scenario_emit`, the true lost time per cause in
:mod:`~ppdiag.synth.scenario_truth`); :mod:`ppdiag.synth.kineto` writes it as PyTorch Profiler
JSON, one file per rank (:mod:`ppdiag.synth.nsys` as Nsight Systems SQLite, on the schema of
:mod:`~ppdiag.synth.nsys_tables`, with NCCL's ranges from :mod:`~ppdiag.synth.nsys_nccl`).
:mod:`ppdiag.synth.collectives` builds runs without a pipeline (data / expert parallel, all-to-all
and all-reduce) whose collectives wait for late or slow ranks, with the same kind of truth.
"""

from __future__ import annotations

from ppdiag.synth.collectives import CollectiveParams, make_collective_run
from ppdiag.synth.faults import (
    CommOnCompute,
    ExposedAllReduce,
    HostStall,
    LateReplica,
    SlowLink,
    SlowStage,
    SlowStep,
    SlowWorker,
)
from ppdiag.synth.kineto import write_kineto
from ppdiag.synth.run import (
    ApiKind,
    GpuOps,
    HostCat,
    HostRanges,
    RuntimeCalls,
    StreamInfo,
    StreamRole,
    SynthRank,
    SynthRun,
)
from ppdiag.synth.scenario import ScenarioParams, make_scenario, write_groundtruth

__all__ = [
    "ApiKind",
    "CollectiveParams",
    "CommOnCompute",
    "ExposedAllReduce",
    "GpuOps",
    "HostCat",
    "HostRanges",
    "HostStall",
    "LateReplica",
    "RuntimeCalls",
    "ScenarioParams",
    "SlowLink",
    "SlowStage",
    "SlowStep",
    "SlowWorker",
    "StreamInfo",
    "StreamRole",
    "SynthRank",
    "SynthRun",
    "make_collective_run",
    "make_scenario",
    "write_groundtruth",
    "write_kineto",
]
