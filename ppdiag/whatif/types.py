"""What-if types: a scenario, the options, a prediction and its one-line description."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.model.schedule import parse_schedule
from ppdiag.report_types import LayerSplit, MemoryBasis, WhatifRow
from ppdiag.whatif.costs import (
    MS,
    MeasuredRun,
)

F64 = npt.NDArray[np.float64]


CALIBRATIONS = ("per-block", "per-step", "ratio", "none")
_SOURCES = {
    "trace": "the per-layer costs of the trace's module ranges",
    "file": "the --layer-costs file",
    "layers-per-stage": "per-layer costs estimated from the stage totals",
}
_INTERLEAVED = ("interleaved_1f1b",)
_SINGLE = ("gpipe", "1f1b")


@dataclass
class Scenario:
    """One change to predict; ``None`` keeps the measured value."""

    microbatches: int | None = None
    schedule: str | None = None
    virtual: int | None = None
    pp: int | None = None
    rebalance: bool = False
    fixed_microbatch_size: bool = False
    no_comm_wait: bool = False
    no_host: bool = False
    no_exposed_comm: bool = False  # communication overlapped with compute (asynchronous p2p, reduce)
    label: str | None = None


@dataclass
class WhatifOptions:
    """How predictions are made."""

    calibration: str = "per-block"
    wgrad_fraction: float = 0.5  # weight-gradient share of a backward when the trace does not split it
    micro_batch: int | None = None  # samples per micro-batch in the measured run (time per sample)
    max_activation_mb: float | None = None  # memory limit per rank for the rebalanced split


@dataclass
class Prediction:
    """The predicted step of one scenario (``error`` set when it cannot be simulated)."""

    scenario: str
    schedule: str
    pp: int
    virtual: int
    microbatches: int
    step_ns: float | None = None
    speedup: float | None = None
    step_speedup: float | None = None
    bubble_ratio: float | None = None
    schedule_bubble_ratio: float | None = None
    closed_form_bubble: float | None = None
    lost_ns: dict[str, float] = field(default_factory=dict)
    samples_vs_measured: float = 1.0
    ms_per_sample: float | None = None
    peak_inflight: int | None = None
    activation_vs_measured: float | None = None
    peak_activation_mb: float | None = None
    stage_ns: list[float] = field(default_factory=list)
    split: LayerSplit | None = None
    calibration: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    measured: bool = False
    # "measured" / "calibrated" with allocator events in the trace, else "predicted" (MemoryBasis)
    memory_basis: str = "predicted"

    @property
    def note(self) -> str:
        return "; ".join(self.notes)

    def to_row(self, fix: str = "") -> WhatifRow:
        """The report's ``whatif[]`` row of this prediction; ``fix`` is the key a finding's gain
        names ("" for a scenario of the ``whatif`` command)."""

        def r(v: float | None, nd: int = 4) -> float | None:
            return None if v is None else round(float(v), nd)

        return WhatifRow(
            scenario=self.scenario,
            measured=self.measured,
            schedule=self.schedule,
            pp=self.pp,
            virtual=self.virtual,
            microbatches=self.microbatches,
            step_ms=r(self.step_ns / MS if self.step_ns is not None else None),
            speedup=r(self.speedup, 3),
            step_speedup=r(self.step_speedup, 3),
            bubble_ratio=r(self.bubble_ratio),
            schedule_bubble_ratio=r(self.schedule_bubble_ratio),
            closed_form_bubble=r(self.closed_form_bubble),
            lost_ms={k: round(v / MS, 4) for k, v in self.lost_ns.items()},
            samples_vs_measured=r(self.samples_vs_measured, 4),
            ms_per_sample=r(self.ms_per_sample, 5),
            peak_inflight=self.peak_inflight,
            activation_vs_measured=r(self.activation_vs_measured, 3),
            peak_activation_mb=r(self.peak_activation_mb, 2),
            stage_ms=[round(x / MS, 4) for x in self.stage_ns],
            split=self.split,
            calibration=self.calibration,
            note=self.note,
            error=self.error,
            fix=fix,
            memory_basis=MemoryBasis(self.memory_basis),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``whatif`` command's JSON row: :meth:`to_row` as plain JSON values, without ``fix``
        (one field list for both)."""
        row: dict[str, Any] = msgspec.to_builtins(self.to_row())
        del row["fix"]
        return row


@dataclass
class _Layout:
    """A scenario's shape and per-chunk costs (ns per micro-batch, before the micro-batch scaling)."""

    schedule: str
    pp: int
    virtual: int
    fwd: F64
    bwd: F64  # input-gradient part for split schedules, whole backward otherwise
    wgrad: F64
    act: F64  # activation weight of one micro-batch per chunk (MB, or measured-stage units)
    act_in_mb: bool
    split: LayerSplit | None
    notes: list[str]


def describe(scn: Scenario, m: MeasuredRun) -> str:
    """A short label for a scenario, naming only what it changes."""
    parts: list[str] = []
    if scn.microbatches and scn.microbatches != m.microbatches:
        parts.append(f"M={scn.microbatches}")
    if scn.schedule and parse_schedule(scn.schedule).value != m.schedule:
        name = parse_schedule(scn.schedule).value
        parts.append("interleaved" if name == "interleaved_1f1b" else name)
    if scn.virtual and scn.virtual != m.virtual:
        parts.append(f"v={scn.virtual}")
    if scn.pp and scn.pp != m.pp:
        parts.append(f"pp={scn.pp}")
    if scn.rebalance:
        parts.append("rebalanced")
    if scn.no_comm_wait:
        parts.append("no comm wait")
    if scn.no_host:
        parts.append("no host stalls")
    if scn.no_exposed_comm:
        parts.append("overlapped comm")
    if scn.fixed_microbatch_size and scn.microbatches and scn.microbatches != m.microbatches:
        parts.append("same micro-batch size")
    return ", ".join(parts) or "as measured (model)"
