"""predict_fixes: a run the what-if model cannot describe gets a warning; a bug propagates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analysis_parts import attribution, context, pipeline
from report_fill import typed

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.errors import InputError
from ppdiag.whatif import fixes, scenarios
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario


@pytest.fixture(scope="module")
def diag(tmp_path_factory: pytest.TempPathFactory) -> Analyzed:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(steps=2), d)
    return diagnose([d], Options())


def _predict(diag: Analyzed, warnings: list[str]) -> scenarios.FixPredictions | None:
    fp, said = scenarios.predict_fixes(
        diag.run, diag.result, pipeline(diag), attribution(diag), context(diag).rank_steps
    )
    warnings.extend(said)
    return fp


def test_predictions_on_a_normal_run(diag: Analyzed) -> None:
    warnings: list[str] = []
    fp = _predict(diag, warnings)
    assert fp is not None and fp.rows and warnings == []


@pytest.mark.parametrize("exc", [InputError(None, "M unknown"), ValueError("3 layers cannot fill 4 stages")])
def test_undescribable_run_warns(diag: Analyzed, monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise exc

    monkeypatch.setattr(fixes, "model_of", boom)
    warnings: list[str] = []
    assert _predict(diag, warnings) is None
    assert warnings == [f"what-if: no predictions for this run ({exc})"]


def test_a_bug_is_not_swallowed(diag: Analyzed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A what-if bug used to remove the table from every report silently."""

    def bug(*a: Any, **k: Any) -> Any:
        raise KeyError("oops")

    monkeypatch.setattr(fixes, "model_of", bug)
    with pytest.raises(KeyError):
        _predict(diag, [])


def test_run_without_pipeline(tmp_path: Path) -> None:
    assert scenarios.predict_fixes(None, typed({}), None, None, []) == (None, [])
