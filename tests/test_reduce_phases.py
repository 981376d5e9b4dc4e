"""The benchmark's phase timer (benchmarks/reduce_phases.py): every phase it names is a function the
analysis still calls, timing it leaves the report as it was, and the functions are put back."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from ppdiag.api import Options, analyze_run, load
from ppdiag.report_types import dumps
from ppsynth.optable import OpTableParams, simulate_optable, write_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from reduce_phases import PHASES, Scope, scope_totals, timed_phases


def test_phases_time_the_analysis_without_changing_it(tmp_path: Path) -> None:
    # 2 replicas of a 2-stage pipeline with a slow worker: the pipeline path (replay, waits)
    df, _ = simulate_optable(OpTableParams(pp=2, dp=2, microbatches=4, steps=(1, 2), slow_worker=(1, 1, 1.5)))
    run = load([write_table(df, tmp_path / "ops.parquet")])
    plain = dumps(analyze_run(run, Options()).result)
    before = {(p.module, p.name): getattr(importlib.import_module(p.module), p.name) for p in PHASES}
    with timed_phases() as cpu:
        timed = dumps(analyze_run(run, Options()).result)
    assert timed == plain
    after = {(p.module, p.name): getattr(importlib.import_module(p.module), p.name) for p in PHASES}
    assert after == before
    assert set(cpu) == {f"{p.module.rsplit('.', 1)[-1]}.{p.name}" for p in PHASES}
    # own CPU: nested phases are taken out of their caller once (float rounding aside)
    assert all(v >= -1e-9 for v in cpu.values())
    assert set(scope_totals(cpu)) == set(Scope)
