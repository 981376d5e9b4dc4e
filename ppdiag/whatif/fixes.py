"""The fixes a finding can name, predicted once per analyzed run (:func:`predict_fixes`): the same
numbers for the report's what-if table and for every finding's gain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ppdiag.errors import InputError
from ppdiag.report_types import Report, WhatifRow
from ppdiag.whatif.costs import (
    MS,
    MeasuredRun,
)
from ppdiag.whatif.model import model_of
from ppdiag.whatif.types import _SINGLE, Scenario

FIX_LABELS = {
    "microbatches_x2": "M x 2",
    "1f1b": "1F1B",
    "1f1b_microbatches_x2": "1F1B, M x 2",
    "interleaved_v2": "interleaved, v=2",
    "zero_bubble": "zero bubble (ZB-H1)",
    "rebalanced": "rebalanced stages",
    "no_comm_wait": "no comm wait",
    "no_host": "no host stalls",
    "no_exposed_comm": "overlapped comm",
}
# The causes whose removal is a scenario, with the fix key that removes each.
_REMOVALS = (("comm_wait", "no_comm_wait"), ("host", "no_host"), ("exposed_comm", "no_exposed_comm"))


def fix_scenarios(meas: MeasuredRun) -> dict[str, Scenario]:
    """Every fix a finding may offer, keyed as in :data:`FIX_LABELS`, for the measured run: more
    micro-batches at the same global batch, 1F1B for GPipe runs, interleaving (v = 2) and a
    zero-bubble schedule for GPipe/1F1B runs, rebalanced stages, and each measured delay removed."""
    m2 = 2 * meas.microbatches
    out: dict[str, Scenario] = {"microbatches_x2": Scenario(microbatches=m2, label=f"M={m2} (M x 2)")}
    if meas.schedule == "gpipe":
        out["1f1b"] = Scenario(schedule="1f1b", label=FIX_LABELS["1f1b"])
        # 1F1B's freed activation memory spent on more micro-batches
        out["1f1b_microbatches_x2"] = Scenario(
            schedule="1f1b", microbatches=m2, label=f"1F1B, M={m2} (M x 2)"
        )
    if meas.schedule in _SINGLE and meas.virtual == 1:
        out["interleaved_v2"] = Scenario(
            schedule="interleaved_1f1b", virtual=2, label=FIX_LABELS["interleaved_v2"]
        )
        out["zero_bubble"] = Scenario(schedule="zero_bubble", label=FIX_LABELS["zero_bubble"])
    out["rebalanced"] = Scenario(rebalance=True, label=FIX_LABELS["rebalanced"])
    for _, key in _REMOVALS:
        out[key] = Scenario(
            no_comm_wait=key == "no_comm_wait",
            no_host=key == "no_host",
            no_exposed_comm=key == "no_exposed_comm",
            label=FIX_LABELS[key],
        )
    return out


def default_scenarios(meas: MeasuredRun, min_gain: float = 0.03) -> list[Scenario]:
    """The table every report shows: M x 2, interleaving (v = 2) or 1F1B for GPipe runs, rebalanced
    stages, and each removable delay worth at least ``min_gain`` of the step."""
    return [fix_scenarios(meas)[k] for k in default_keys(meas, min_gain)]


def default_keys(meas: MeasuredRun, min_gain: float = 0.03) -> list[str]:
    """The fix keys of :func:`default_scenarios`, in table order."""
    keys = ["microbatches_x2"]
    if meas.schedule == "gpipe":
        keys.append("1f1b")
    if meas.schedule in _SINGLE and meas.virtual == 1:
        keys.append("interleaved_v2")
    keys.append("rebalanced")
    for cause, key in _REMOVALS:
        if meas.removable_ns.get(cause, 0.0) >= min_gain * meas.step_ns:
            keys.append(key)
    return keys


@dataclass
class FixPredictions:
    """The what-if answer for every fix of an analyzed run, computed once (one code path for the
    what-if table and the findings' gains). ``rows`` maps a fix key to its prediction's JSON row
    (with ``fix`` set to the key); ``table`` lists the keys the report's table shows by default."""

    measured_step_ms: float
    rows: dict[str, WhatifRow] = field(default_factory=dict)
    table: list[str] = field(default_factory=list)
    calibration: str = ""

    def gain_ms(self, key: str) -> float | None:
        """Step time the fix saves per step (ms; negative: the fix is slower), None when the
        what-if could not predict it."""
        row = self.rows.get(key)
        if row is None or row.step_ms is None:
            return None
        return self.measured_step_ms - row.step_ms

    def report_rows(self, used: Sequence[str] = ()) -> list[WhatifRow]:
        """The report's ``whatif`` list: the default table plus the fixes the findings used."""
        keys = list(self.table) + [k for k in used if k not in self.table]
        return [self.rows[k] for k in keys if k in self.rows]


def predict_fixes(
    run: Any, report: Report, pipe: Any, attr: Any, rank_steps: Sequence[Any]
) -> tuple[FixPredictions | None, list[str]]:
    """Predict every fix of :func:`fix_scenarios` for an analyzed run, and the warnings of the
    prediction; no predictions without a usable pipeline. A run the model cannot describe (it
    raises :class:`InputError` or ValueError: M unknown, no blocks, an impossible layout) gets no
    predictions and one warning; any other exception is a bug and propagates."""
    if pipe is None or pipe.topology.pp <= 1:
        return None, []
    try:
        model = model_of(run, report, pipe, attr, rank_steps)
        preds = {k: model.predict(scn) for k, scn in fix_scenarios(model.meas).items()}
        keys = default_keys(model.meas)
    except (InputError, ValueError) as exc:
        return None, [f"what-if: no predictions for this run ({exc})"]
    out = FixPredictions(model.meas.step_ns / MS, calibration=model.calibration().describe())
    for k, p in preds.items():
        if p.error is None and p.step_ns is not None:
            out.rows[k] = p.to_row(k)
    out.table = [k for k in keys if k in out.rows]
    return out, []


def report_rows(run: Any, report: Report, pipe: Any, attr: Any, rank_steps: Sequence[Any]) -> list[WhatifRow]:
    """The report's default ``whatif`` list for an analyzed run (empty without a usable pipeline)."""
    fp, _ = predict_fixes(run, report, pipe, attr, rank_steps)
    return fp.report_rows() if fp is not None else []
