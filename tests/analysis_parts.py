"""The layer results of an analysis, for tests that look behind the report.

``Diagnosis.context`` and each of its results are optional in the types (a hand-built or decoded
diagnosis has only some); an analysis has them all. Each accessor asserts the part is there, so a
test that needs it fails on that line instead of on an attribute of None.
"""

from __future__ import annotations

from typing import Any

from ppdiag.analysis import AnalysisContext
from ppdiag.attribution.causes import Attribution
from ppdiag.diagnosis import Diagnosis
from ppdiag.pipeline import Pipeline
from ppdiag.rules.noise import NoiseModel
from ppdiag.whatif.fixes import FixPredictions


def context(diag: Diagnosis[Any]) -> AnalysisContext:
    """The diagnosis's layer results (it must come from an analysis)."""
    ctx = diag.context
    assert isinstance(ctx, AnalysisContext), "the diagnosis has no analysis context"
    return ctx


def pipeline(diag: Diagnosis[Any]) -> Pipeline:
    """The rebuilt pipeline of an analysis."""
    pipe = context(diag).pipeline
    assert pipe is not None, "the analysis has no pipeline"
    return pipe


def replay_args(diag: Diagnosis[Any]) -> tuple[Any, ...]:
    """What :class:`~ppdiag.attribution.replay_run.Replay` is built from in an analysis: the
    rank-steps, the timelines by rank, the matched p2p ops and the last virtual stage."""
    pipe = pipeline(diag)
    topo = pipe.topology
    return (context(diag).rank_steps, diag.run.by_rank(), pipe.ops, topo.pp * topo.virtual - 1)


def attribution(diag: Diagnosis[Any]) -> Attribution:
    """The time accounting of an analysis."""
    attr = context(diag).attribution
    assert attr is not None, "the analysis has no attribution"
    return attr


def noise(diag: Diagnosis[Any]) -> NoiseModel:
    """The rules' noise model of an analysis."""
    nm = context(diag).noise
    assert nm is not None, "the analysis has no noise model"
    return nm


def predictions(diag: Diagnosis[Any]) -> FixPredictions:
    """The what-if predictions of an analysis."""
    pred = context(diag).predictions
    assert pred is not None, "the analysis has no fix predictions"
    return pred
