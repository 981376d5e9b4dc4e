"""Synthetic GPU-shaped pipeline runs with known ground truth.

:mod:`ppsynth.run` is the format-neutral description (:class:`SynthRun`);
:mod:`ppsynth.scenario` builds one from the schedule simulator plus injected faults
(its knobs in :mod:`~ppsynth.scenario_params`, what a rank records per step in
:mod:`~ppsynth.scenario_emit`, the true lost time per cause in
:mod:`~ppsynth.scenario_truth`); :mod:`ppsynth.kineto` writes it as PyTorch Profiler
JSON, one file per rank (:mod:`ppsynth.nsys` as Nsight Systems SQLite, on the schema of
:mod:`~ppsynth.nsys_tables`, with NCCL's ranges from :mod:`~ppsynth.nsys_nccl`).
:mod:`ppsynth.collectives` builds runs without a pipeline (data / expert parallel, all-to-all
and all-reduce) whose collectives wait for late or slow ranks, with the same kind of truth.

Where it lives: at the root of the repository, beside ``ppdiag/``, not inside it. Only the tests,
the benchmarks and the example notebook use it, so the wheel does not ship it (package discovery
takes ``ppdiag*`` only; ``tests/test_wheel.py`` checks). It is a package of its own rather than
part of ``tests/`` because the benchmarks and the notebook import it as well (pytest's
``pythonpath`` and the benchmarks' ``sys.path`` put the root first), and rather than an extra
because nothing a user installs needs it. It may import only ppdiag's model and simulator
(``ppdiag/_layers.py`` holds it to the simulate layer; ``tests/test_layers.py`` checks).
"""

from __future__ import annotations

from ppsynth.collectives import CollectiveParams, make_collective_run
from ppsynth.faults import (
    CommOnCompute,
    ExposedAllReduce,
    HostStall,
    LateReplica,
    SlowLink,
    SlowStage,
    SlowStep,
    SlowWorker,
)
from ppsynth.kineto import write_kineto
from ppsynth.run import (
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
from ppsynth.scenario import ScenarioParams, make_scenario, write_groundtruth

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
