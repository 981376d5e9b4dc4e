"""What an analysis keeps beside its typed report: the layer results the reporters draw from.

:class:`AnalysisContext` is ``Diagnosis.context`` of an analysis (:func:`ppdiag.api.analyze_run`
builds it, once, with the result): the rebuilt pipeline, the time accounting, the noise model, the
what-if predictions and the flags that disagree with the trace. The JSON report never holds these;
the HTML timeline and the Perfetto overlay draw the transfers and stages from them, and ``whatif``
rebuilds its model from them.

It sits beside :mod:`ppdiag.api`, in its own layer just above the rules and below the reports
(which read it): its fields come from every layer below (the pipeline, the attribution, the
what-if, the rules' noise model); :class:`ppdiag.diagnosis.Diagnosis` (in the model layer) is
generic over it, so the model names no layer above it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from ppdiag.diagnosis import Diagnosis

if TYPE_CHECKING:
    from ppdiag.attribution.causes import Attribution, RankStep
    from ppdiag.pipeline import Pipeline
    from ppdiag.rules.noise import NoiseModel
    from ppdiag.whatif.fixes import FixPredictions


@dataclass(frozen=True)
class AnalysisContext:
    """The layer results of one analysis (every field optional: a hand-built diagnosis in a test,
    or one decoded from a JSON report, has only some of them).

    ``stage_of_rank`` maps a rank to its stage, or to its virtual stages (a list) when a rank
    holds several; ``rank_steps`` are the analyzed (rank, step) windows with their blocks.
    """

    stage_of_rank: Mapping[int, int | list[int]] = field(default_factory=dict)
    pipeline: Pipeline | None = None
    attribution: Attribution | None = None
    rank_steps: list[RankStep] = field(default_factory=list)
    noise: NoiseModel | None = None
    predictions: FixPredictions | None = None
    inputs: tuple[str, ...] = ()  # files the analysis read besides the traces (a budget, a baseline)
    # the flags that disagree with the trace, one line each (``Pipeline.overrides``; also among the
    # report's warnings): the commands repeat them on stderr, the gate among its warnings
    overrides: tuple[str, ...] = ()


#: A diagnosis as :func:`ppdiag.api.analyze_run` returns it (what every reporter takes).
Analyzed: TypeAlias = "Diagnosis[AnalysisContext]"

#: The context of a diagnosis that has none.
EMPTY = AnalysisContext()


def context_of(diag: Diagnosis[AnalysisContext]) -> AnalysisContext:
    """``diag.context``, or :data:`EMPTY` for a diagnosis built without one."""
    return diag.context if diag.context is not None else EMPTY


__all__ = ["EMPTY", "AnalysisContext", "Analyzed", "context_of"]
