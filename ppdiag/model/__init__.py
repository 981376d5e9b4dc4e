"""The columnar run model (DESIGN.md §3)."""

from __future__ import annotations

from ppdiag.model.run import Run
from ppdiag.model.timeline import (
    COMM_KINDS,
    KIND_NAMES,
    PHASE_NAMES,
    Direction,
    Intervals,
    Kind,
    NameTable,
    Phase,
    ProcessGroup,
    RangeKind,
    Ranges,
    RankTimeline,
)

__all__ = [
    "COMM_KINDS",
    "KIND_NAMES",
    "PHASE_NAMES",
    "Direction",
    "Intervals",
    "Kind",
    "NameTable",
    "Phase",
    "ProcessGroup",
    "RangeKind",
    "Ranges",
    "RankTimeline",
    "Run",
]
