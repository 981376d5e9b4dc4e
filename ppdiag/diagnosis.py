"""The result of an analysis: what every report and the gate read.

``Diagnosis.result`` is the JSON report (``docs/json.md``) as one typed value
(:class:`ppdiag.report_types.Report`, see ``docs/json.md``); the other fields keep the columnar
timelines and gap tables that the HTML timeline and the Perfetto overlay draw, and ``context``
the layer results behind them (:class:`ppdiag.analysis.AnalysisContext` for an analysis;
the model layer names no type above it, so :class:`Diagnosis` is generic over its context).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from ppdiag.model import Run
from ppdiag.report_types import FindingRow, Report

SCHEMA_VERSION = 1


#: Each cause as a counterfactual (docs/json.md): the idle it adds to a replay of the run, taken in
#: this order, so the causes telescope and add up to the lost time (``ppdiag rules``, docs/json.md).
CAUSE_DEFINITIONS: dict[str, str] = {
    "bubble": "idle the same total work still has spread evenly over the stages (every stage at the "
    "mean cost), with normal links and no host stalls: warm-up, cool-down and the normal latency "
    "of the transfers that fill and drain the pipe",
    "imbalance": "what the actual stage costs add on top of the bubble",
    "comm_wait": "what the actual transfer times add: slow links, transfers above the normal "
    "latency, late transfers",
    "exposed_comm": "what communication that could have overlapped adds: collectives and transfers "
    "with no compute beside them, waiting for one's own send",
    "host": "what host delays add: work launched after the gap began, sends issued late, and the "
    "waits this causes on other ranks",
    "exposed_copy": "what memcpy/memset time with no compute beside it adds",
    "unexplained": "the rest of the lost time (idle with work queued and no evidence)",
}
#: The order in which the counterfactual chain adds each kind of delay.
CAUSE_CHAIN: tuple[str, ...] = (
    "bubble",
    "imbalance",
    "comm_wait",
    "host",
    "exposed_comm",
    "exposed_copy",
    "unexplained",
)


@dataclass
class GapTable:
    """Lost-time pieces of one rank on the aligned clock, each with one primary cause.

    ``blame`` is the rank whose root cause it is (-1 when none), ``step`` the analyzed step index.
    """

    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    cause: npt.NDArray[np.int8]
    blame: npt.NDArray[np.int32]
    step: npt.NDArray[np.int32]

    @classmethod
    def empty(cls) -> GapTable:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z.copy(), np.zeros(0, np.int8), np.zeros(0, np.int32), np.zeros(0, np.int32))

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass
class StepWindow:
    """One analyzed step of one rank on the aligned clock."""

    rank: int
    index: int  # position among the analyzed steps (0..)
    number: int  # ProfilerStep number, or -1
    start: int
    end: int


#: The context type of a :class:`Diagnosis` (an :class:`~ppdiag.analysis.AnalysisContext`).
ContextT = TypeVar("ContextT")


@dataclass(frozen=True)
class Diagnosis(Generic[ContextT]):
    """Everything an analysis produced: ``result`` is the typed report (encode it, or
    ``msgspec.to_builtins`` it for the JSON file's plain-data form), ``context`` the layer results
    behind it (None for a diagnosis built without them). ``run`` is the run on the common clock
    (for an analysis, the pipeline's aligned view of the parsed run, which stays as parsed).
    Frozen: a command that adds to the report (the gate) makes a new one with
    :func:`dataclasses.replace`."""

    run: Run
    result: Report
    steps: list[StepWindow] = field(default_factory=list)
    # the gap tables every reader takes, each gap's root rank named (``blame``); the attribution's
    # own tables (``context.attribution.gaps``) are what they were painted from, without the blame
    gaps: dict[int, GapTable] = field(default_factory=dict)
    context: ContextT | None = None

    @property
    def findings(self) -> list[FindingRow]:
        """The report's findings (``result.findings``), most severe first."""
        return self.result.findings
