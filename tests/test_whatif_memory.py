"""The what-if memory column: predicted without allocator events, calibrated on them with them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.report_types import MemoryBasis, WhatifRow
from ppdiag.whatif.model import build_model
from ppdiag.whatif.types import Scenario
from ppsynth.kineto import write_kineto
from ppsynth.memory import with_memory
from ppsynth.scenario import make_scenario

WEIGHTS_MB = 100.0
ACT_MB = 8.0


def _diag(tmp_path: Path, schedule: str, memory: bool) -> Analyzed:
    run = make_scenario(schedule=schedule, pp=4, microbatches=8, steps=2)
    if memory:
        run = with_memory(run, WEIGHTS_MB, ACT_MB)
    write_kineto(run, tmp_path)
    return diagnose([tmp_path], Options())


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Analyzed:
    return _diag(tmp_path_factory.mktemp("plain"), "1f1b", memory=False)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Analyzed:
    return _diag(tmp_path_factory.mktemp("mem"), "1f1b", memory=True)


def test_without_allocator_events_every_row_says_predicted(plain: Analyzed) -> None:
    rows = plain.result.whatif or []
    assert rows and all(r.memory_basis == MemoryBasis.PREDICTED for r in rows)
    m = build_model(plain)
    assert m.measured_row().memory_basis == "predicted"
    g = m.predict(Scenario(schedule="gpipe"))
    # the schedule's in-flight counts alone: a ratio, no MiB
    assert g.memory_basis == "predicted" and g.peak_activation_mb is None
    assert g.activation_vs_measured == pytest.approx(2.0)  # GPipe holds M = 8 where 1F1B holds P = 4


def test_with_allocator_events_the_measured_activation_calibrates(measured: Analyzed) -> None:
    m = build_model(measured)
    # every forward leaves ACT_MB allocated: recovered per stage within 5 %
    assert m.meas.act_mb is not None
    assert m.meas.act_mb == pytest.approx([ACT_MB] * 4, rel=0.05)
    base = m.measured_row()
    assert base.memory_basis == "measured"
    # 1F1B: rank 0 holds P = 4 micro-batches at its peak
    assert base.peak_activation_mb == pytest.approx(4 * ACT_MB, rel=0.05)
    row = m.predict(Scenario(microbatches=16))
    assert row.memory_basis == "calibrated" and row.peak_activation_mb is not None
    rows = measured.result.whatif or []
    assert rows and all(r.memory_basis == MemoryBasis.CALIBRATED for r in rows if not r.measured)


def test_gpipe_peak_predicted_from_a_1f1b_run_within_10_percent(measured: Analyzed, tmp_path: Path) -> None:
    # truth: a GPipe run of the same model records its allocator peak; activations = peak - weights
    gp = _diag(tmp_path, "gpipe", memory=True)
    truth = max(r.peak_allocated_mb for r in gp.result.memory or []) - WEIGHTS_MB
    assert truth == pytest.approx(8 * ACT_MB)  # all M = 8 micro-batches on rank 0
    pred = build_model(measured).predict(Scenario(schedule="gpipe"))
    assert pred.peak_activation_mb == pytest.approx(truth, rel=0.10)


def test_old_json_without_the_field_decodes_as_predicted(plain: Analyzed) -> None:
    row = (plain.result.whatif or [])[0]
    raw = msgspec.to_builtins(row)
    assert raw["memory_basis"] == "predicted"
    del raw["memory_basis"]
    assert msgspec.convert(raw, WhatifRow).memory_basis == MemoryBasis.PREDICTED
