"""Findings and the what-if table agree: a finding's gain is the what-if row of its own fix, and a
fix that what-if predicts to be slower is not offered (simulated GPU runs, 1F1B, P=4)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import msgspec
import pytest
from analysis_parts import attribution, context, noise, pipeline, predictions
from report_fill import complete

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.report_types import WhatifRow
from ppdiag.rules import RuleContext, RuleOptions, run_rules
from ppdiag.whatif.scenarios import FixPredictions
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario


def _diag(tmp_path: Path, **kw: Any) -> Analyzed:
    kw.setdefault("schedule", "1f1b")
    kw.setdefault("pp", 4)
    kw.setdefault("microbatches", 16)
    kw.setdefault("gpus_per_node", 1)  # a clock per rank, skewed by up to 2 ms (a host's GPUs share one)
    run = make_scenario(steps=kw.pop("steps", 2), clock_skew_ms=2.0, **kw)
    write_kineto(run, tmp_path)
    return diagnose([tmp_path], Options())


def _rerun(diag: Analyzed, predictions: FixPredictions) -> list[dict[str, Any]]:
    """The rules again on the same analysis, with other what-if predictions."""
    ctx = RuleContext(
        diag.result,
        diag.run,
        pipeline(diag),
        context(diag).rank_steps,
        attribution(diag),
        RuleOptions(),
        predictions=predictions,
        noise=noise(diag),
    )
    return [msgspec.to_builtins(f) for f in run_rules(ctx)]


def _slower(pred: FixPredictions, *keys: str, by_ms: float = 1.0) -> FixPredictions:
    """The same predictions with the fixes ``keys`` predicted ``by_ms`` slower than measured."""
    out = copy.deepcopy(pred)
    for k in keys:
        out.rows[k] = msgspec.structs.replace(out.rows[k], step_ms=out.measured_step_ms + by_ms)
    return out


CASES = [
    ({"microbatches": 4}, "PP001", "microbatches_x2"),
    ({"faults": [F.SlowStage(1, 1.5)]}, "PP003", "rebalanced"),
    ({"faults": [F.SlowLink(1, delay_ms=0.4)]}, "PP004", "no_comm_wait"),
    ({"faults": [F.HostStall(2, 0.5)]}, "PP006", "no_host"),
]


@pytest.mark.parametrize(("kw", "code", "fix"), CASES, ids=[c[1] for c in CASES])
def test_gain_is_the_whatif_row_of_its_fix(tmp_path: Path, kw: dict[str, Any], code: str, fix: str) -> None:
    diag = _diag(tmp_path, **kw)
    rep = diag.result
    f = next(x for x in rep.findings if x.code == code)
    assert f.evidence.as_dict()["whatif_fix"] == fix
    rows = {r.fix: r for r in rep.whatif}
    assert fix in rows, "the table shows the row of every fix a finding used"
    step, fix_step = rep.summary.step_mean_ms, rows[fix].step_ms
    assert step is not None and fix_step is not None and f.gain_ms is not None
    # the same number: measured step minus the fix's predicted step, as the table shows it
    assert f.gain_ms == pytest.approx(step - fix_step, abs=2e-3)
    assert f.evidence.as_dict()["whatif_step_ms"] == fix_step
    assert f.gain_ms > 0
    # no finding anywhere in the report offers a fix the table predicts slower
    for g in rep.findings:
        k = g.evidence.as_dict().get("whatif_fix")
        if k and g.code != "PP002":
            assert isinstance(k, str), g
            k_step = rows[k].step_ms
            assert k_step is not None and k_step < step, g


@pytest.mark.parametrize(("kw", "code", "fix"), CASES, ids=[c[1] for c in CASES])
def test_fix_predicted_slower_is_not_offered(tmp_path: Path, kw: dict[str, Any], code: str, fix: str) -> None:
    diag = _diag(tmp_path, **kw)
    pred = predictions(diag)
    assert code in [f["code"] for f in _rerun(diag, pred)]
    assert code not in [f["code"] for f in _rerun(diag, _slower(pred, fix))]
    # a fix that saves nothing is not offered either
    assert code not in [f["code"] for f in _rerun(diag, _slower(pred, fix, by_ms=0.0))]


def test_no_predictions_no_gain(tmp_path: Path) -> None:
    """Without a what-if model the pipeline findings have no gain to offer: none is invented from
    the cause's lost time."""
    diag = _diag(tmp_path, faults=[F.SlowStage(1, 1.5)])
    assert diag.result.summary.step_ms is not None
    empty = FixPredictions(diag.result.summary.step_ms)
    codes = [f["code"] for f in _rerun(diag, empty)]
    assert not {"PP001", "PP003", "PP004", "PP006"} & set(codes)


def test_pp001_offers_only_faster_alternatives(tmp_path: Path) -> None:
    diag = _diag(tmp_path, microbatches=4)
    pred = predictions(diag)
    assert {"interleaved_v2", "zero_bubble"} <= set(pred.rows)
    both = next(f for f in _rerun(diag, pred) if f["code"] == "PP001")
    assert set(both["evidence"]["alternative_gains_ms"]) == {"interleaved_v2", "zero_bubble"}
    one = next(f for f in _rerun(diag, _slower(pred, "interleaved_v2")) if f["code"] == "PP001")
    assert set(one["evidence"]["alternative_gains_ms"]) == {"zero_bubble"}
    assert not any("interleaved" in x for x in one["fixes"])
    # the finding's own gain stays the M x 2 row
    assert one["gain_ms"] == pytest.approx(pred.gain_ms("microbatches_x2"), abs=2e-3)


def test_pp002_memory_fix(tmp_path: Path) -> None:
    """GPipe: 1F1B frees activations; the finding stays while 1F1B is not slower beyond the noise."""
    diag = _diag(tmp_path, schedule="gpipe", microbatches=8)
    pred = predictions(diag)
    f = next(x for x in _rerun(diag, pred) if x["code"] == "PP002")
    assert f["evidence"]["activation_vs_gpipe_1f1b"] == pytest.approx(0.5, abs=0.01)  # P=4 of M=8
    slow = _slower(pred, "1f1b", "1f1b_microbatches_x2", by_ms=5.0)
    assert "PP002" not in [x["code"] for x in _rerun(diag, slow)]


def test_overlapped_comm_scenario(tmp_path: Path) -> None:
    """The "overlapped comm" what-if row removes the replay's exposed-comm counterfactual: its
    saving is the step time the replay wins by overlapping the transfers (beyond the late ones)."""
    diag = _diag(tmp_path, faults=[F.ExposedAllReduce(3.0)], dp=2)
    pred = predictions(diag)
    rp = attribution(diag).step_replay_ns
    want = (rp["gain_comm_wait"] - rp["gain_comm"]) / 1e6
    assert want > 0.5 * 3.0
    step = diag.result.summary.step_ms
    assert step is not None
    assert pred.gain_ms("no_exposed_comm") == pytest.approx(want, abs=0.01 * step)
    f = next(x for x in diag.result.findings if x.code == "PP005")
    assert f.gain_ms == pytest.approx(pred.gain_ms("no_exposed_comm"), abs=2e-3)


def _row(fix: str, step_ms: float | None) -> WhatifRow:
    """A what-if row with only its key and predicted step set."""
    d = complete({"whatif": [{"fix": fix, "step_ms": step_ms}]})["whatif"][0]
    return msgspec.convert(d, WhatifRow)


def test_fix_predictions_by_hand() -> None:
    """Gains are the measured step minus the row's step; the table adds the rows the findings used."""
    fp = FixPredictions(
        100.0,
        rows={
            "microbatches_x2": _row("microbatches_x2", 90.0),
            "rebalanced": _row("rebalanced", 104.5),
            "zero_bubble": _row("zero_bubble", 80.25),
            "no_host": _row("no_host", None),
        },
        table=["microbatches_x2", "rebalanced"],
    )
    assert fp.gain_ms("microbatches_x2") == 10.0  # 100 - 90
    assert fp.gain_ms("rebalanced") == -4.5  # slower: 100 - 104.5
    assert fp.gain_ms("no_host") is None  # not predicted
    assert fp.gain_ms("interleaved_v2") is None  # not a scenario of this run
    assert [r.fix for r in fp.report_rows()] == ["microbatches_x2", "rebalanced"]
    used = fp.report_rows(["zero_bubble", "rebalanced"])
    assert [r.fix for r in used] == ["microbatches_x2", "rebalanced", "zero_bubble"]
