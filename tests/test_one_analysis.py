"""The analysis is one call that builds its result once: the parsed run, the rebuilt pipeline and
the rules' context are values, not filled in or trimmed afterwards (issue 26, item 1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ppdiag.api import Options, analyze_run, load
from ppdiag.pipeline import rebuild
from ppdiag.pipeline.checks import checked_run
from ppdiag.rules import RuleContext
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario
from ppsynth.truncate import stop_rank


def test_rebuild_trims_a_stopped_run(tmp_path: Path) -> None:
    full = make_scenario(steps=3, clock_skew_ms=5.0)
    w = full.ranks[2].step_windows
    run, _ = stop_rank(full, 2, int(w[1, 0] + 0.5 * (w[1, 1] - w[1, 0])))
    write_kineto(run, tmp_path)
    pipe = rebuild(load([tmp_path]))
    assert pipe.hang is not None and pipe.hang.complete_steps > 0
    assert all(len(ws) == pipe.hang.complete_steps for ws in pipe.windows.values())
    assert all(int(b.step.max()) < pipe.hang.complete_steps for b in pipe.blocks.values() if len(b))
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipe.hang = None  # type: ignore[misc]


def test_the_parsed_run_and_the_result_stay_as_built(tmp_path: Path) -> None:
    write_kineto(make_scenario(steps=2, pp=4, microbatches=4), tmp_path)
    run = load([tmp_path])
    warnings, doubts = list(run.warnings), list(run.doubts)
    diag = analyze_run(run, Options(microbatches=4))
    assert run.warnings == warnings and run.doubts == doubts
    ctx = diag.context
    assert ctx is not None and ctx.attribution is not None
    # the blamed tables are new ones, built before the Diagnosis; the attribution's stay as painted
    assert all(diag.gaps[r] is not g for r, g in ctx.attribution.gaps.items())
    assert all(not (g.blame >= 0).any() for g in ctx.attribution.gaps.values())
    again = analyze_run(run, Options(microbatches=4))
    assert again.result == diag.result
    for r, g in diag.gaps.items():
        assert (g.blame == again.gaps[r].blame).all()


def test_checked_run_refuses_sizes_and_adds_overlap_warnings(tmp_path: Path) -> None:
    from ppdiag.errors import InputError

    write_kineto(make_scenario(steps=2, pp=2, microbatches=2), tmp_path)
    run = load([tmp_path])
    with pytest.raises(InputError, match="--pp 3 is more than the job's 2 ranks"):
        checked_run(run, 3, None)
    assert checked_run(run, 2, None) is run  # nothing to add: the same run


def test_rule_context_is_a_value() -> None:
    assert dataclasses.fields(RuleContext)
    assert RuleContext.__dataclass_params__.frozen  # type: ignore[attr-defined]
