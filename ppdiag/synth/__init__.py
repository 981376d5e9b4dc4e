"""Synthetic GPU-shaped pipeline runs with known ground truth.

:mod:`ppdiag.synth.run` is the format-neutral description (:class:`SynthRun`);
:mod:`ppdiag.synth.scenario` builds one from the schedule simulator plus injected faults and
computes the true lost time per cause; :mod:`ppdiag.synth.kineto` writes it as PyTorch Profiler
JSON, one file per rank.
"""

from __future__ import annotations

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

__all__ = [
    "ApiKind",
    "GpuOps",
    "HostCat",
    "HostRanges",
    "RuntimeCalls",
    "StreamInfo",
    "StreamRole",
    "SynthRank",
    "SynthRun",
]
