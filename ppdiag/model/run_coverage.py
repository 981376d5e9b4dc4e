"""The run's own evidence of its completeness (:class:`RunCoverage`): read from the parsed run by
the pipeline layer (``ppdiag/pipeline/coverage.py``), judged by the gate (``reports/coverage.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The share of a rank's events that may be lost (a cut trace) or dropped / altered for a bad field
#: (a negative duration read as zero) before the gate calls its figures partial.
MAX_DAMAGED_SHARE = 0.001
PG_SOURCE = "process-group member lists"
PEER_SOURCE = "the peers the traces name"


@dataclass(frozen=True)
class RunCoverage:
    """The run's own evidence of its completeness."""

    world_stated: bool  # a trace states the world size (or the run is one process alone)
    top_traced: int  # the highest traced rank (-1: none)
    named: dict[str, int] = field(default_factory=dict)  # source -> highest rank it names
    step_gaps: tuple[str, ...] = ()  # ranks with fewer complete steps than the others
    damaged: tuple[str, ...] = ()  # ranks with more than MAX_DAMAGED_SHARE of events lost/altered
