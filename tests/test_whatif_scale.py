"""What-if at scale: every size bounded by what the trace or the simulator allows, linear work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.errors import InputError
from ppdiag.limits import MAX_SIM_CELLS
from ppdiag.simulate import SimConfig, simulate
from ppdiag.whatif import calibration, costs
from ppdiag.whatif.model import build_model
from ppdiag.whatif.types import Scenario
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario


def _listing(tmp_path: Path, n: int) -> Path:
    """Two traced ranks of a 2-stage run whose pipeline process group lists ``n`` ranks."""
    write_kineto(make_scenario(pp=2, microbatches=4, steps=2), tmp_path, gzip=False, groundtruth=False)
    for p in tmp_path.glob("*.pt.trace.json"):
        t = json.loads(p.read_text())
        for g in t["distributedInfo"]["pg_config"]:
            if g["pg_desc"] == "PIPELINE_MODEL_PARALLEL_GROUP":
                g["ranks"] = list(range(n))
                g["pg_size"] = n
        p.write_text(json.dumps(t))
    return tmp_path


def test_thousands_listed_two_traced_is_not_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3000 listed / 2 traced took ~40 s here (35 simulations of a 3000-stage pipeline, each with a
    # stage-to-chunk search quadratic in the stages); the trace shows 2 stages, so nothing is simulated
    calls: list[int] = []

    def counting(cfg: SimConfig) -> Any:
        calls.append(cfg.pp)
        return simulate(cfg)

    monkeypatch.setattr(calibration, "simulate", counting)
    diag = diagnose([_listing(tmp_path, 3000)], Options())
    assert diag.result.run.pp == 3000
    assert calls == [] and not diag.result.whatif
    msg = [w for w in diag.result.run.warnings if w.startswith("what-if:")]
    assert len(msg) == 1 and "only 2 of the 3000 pipeline stages have traced blocks" in msg[0]


@pytest.mark.parametrize(("seen", "n_st", "ok"), [(2, 4, True), (1, 4, False), (3, 5, True), (2, 5, False)])
def test_coverage_bound_is_half_the_stages(seen: int, n_st: int, ok: bool) -> None:
    # half or more of the stages traced: the others take the traced mean (with a note)
    if ok:
        costs._check_coverage(seen, n_st)
    else:
        with pytest.raises(InputError, match=f"only {seen} of the {n_st} pipeline stages"):
            costs._check_coverage(seen, n_st)


def test_a_long_stage_list_is_cut_in_notes() -> None:
    assert costs._stage_list(np.arange(3)) == "0, 1, 2"
    assert costs._stage_list(np.arange(2, 3000)) == "2, 3, 4, 5, 6, 7, 8, 9, ... (2998 stages)"


@pytest.fixture(scope="module")
def diag(tmp_path_factory: pytest.TempPathFactory) -> Analyzed:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(steps=2), d)
    return diagnose([d], Options())


def test_a_scenario_above_the_simulated_maximum_is_refused_unsimulated(
    diag: Analyzed, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = build_model(diag)
    m.calibration()  # the measured shape's calibrations may simulate; the scenario may not

    def refuse(cfg: SimConfig) -> Any:
        raise AssertionError(f"simulated P={cfg.pp} M={cfg.microbatches}")

    monkeypatch.setattr(calibration, "simulate", refuse)
    # pp 4, v 1: M = MAX_SIM_CELLS / 4 + 1 gives P x M x v = MAX_SIM_CELLS + 4
    mm = MAX_SIM_CELLS // 4 + 1
    pred = m.predict(Scenario(microbatches=mm))
    assert pred.step_ns is None
    assert pred.error == f"P x M x v = {4 * mm} is above the simulated maximum {MAX_SIM_CELLS}"


@pytest.mark.parametrize(
    ("schedule", "virtual", "chunks"),
    [
        # interleaved, 2 ranks x 2 chunks: stages 0, 1, 2, 3 on ranks 0, 1, 0, 1
        ("interleaved_1f1b", 2, [0, 0, 1, 1]),
        # V placement: stages 0, 1, 2, 3 on ranks 0, 1, 1, 0
        ("zbv", 2, [0, 0, 1, 1]),
        ("1f1b", 1, [0, 0]),
    ],
)
def test_chunk_of_each_stage(schedule: str, virtual: int, chunks: list[int]) -> None:
    res = simulate(SimConfig(schedule, 2, 4, virtual))
    got = {int(s): int(c) for s, c in zip(res.stage, res.chunk, strict=True)}
    assert [got[s] for s in range(2 * virtual)] == chunks
