"""predict_fixes: a run the what-if model cannot describe gets a warning; a bug propagates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ppdiag.api import Options, diagnose
from ppdiag.diagnosis import Diagnosis
from ppdiag.errors import InputError
from ppdiag.synth.kineto import write_kineto
from ppdiag.synth.scenario import make_scenario
from ppdiag.whatif import scenarios


@pytest.fixture(scope="module")
def diag(tmp_path_factory: pytest.TempPathFactory) -> Diagnosis:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(steps=2), d)
    return diagnose([d], Options())


def _predict(diag: Diagnosis, report: dict[str, Any]) -> scenarios.FixPredictions | None:
    c = diag.context
    return scenarios.predict_fixes(diag.run, report, c["pipeline"], c["attribution"], c["rank_steps"])


def test_predictions_on_a_normal_run(diag: Diagnosis) -> None:
    rep: dict[str, Any] = {**diag.report, "run": {**diag.report["run"], "warnings": []}}
    fp = _predict(diag, rep)
    assert fp is not None and fp.rows and rep["run"]["warnings"] == []


@pytest.mark.parametrize("exc", [InputError(None, "M unknown"), ValueError("3 layers cannot fill 4 stages")])
def test_undescribable_run_warns(diag: Diagnosis, monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise exc

    monkeypatch.setattr(scenarios, "model_of", boom)
    rep: dict[str, Any] = {**diag.report, "run": {**diag.report["run"], "warnings": []}}
    assert _predict(diag, rep) is None
    assert rep["run"]["warnings"] == [f"what-if: no predictions for this run ({exc})"]


def test_a_bug_is_not_swallowed(diag: Diagnosis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A what-if bug used to remove the table from every report silently."""

    def bug(*a: Any, **k: Any) -> Any:
        raise KeyError("oops")

    monkeypatch.setattr(scenarios, "model_of", bug)
    with pytest.raises(KeyError):
        _predict(diag, dict(diag.report))


def test_run_without_pipeline(tmp_path: Path) -> None:
    assert scenarios.predict_fixes(None, {}, None, None, []) is None
