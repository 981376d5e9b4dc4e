"""The shared facts (ppdiag/facts.py): one slowest stage for PP003, the report and the gate; the
theoretical bubble from the simulator's closed forms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from report_fill import typed

from ppdiag.api import Options, diagnose
from ppdiag.facts import (
    SLOW_STAGE_RATIO,
    balance_of,
    measured_bubble,
    report_slowest_stage,
    theoretical_bubble,
)
from ppdiag.reports.gate import stage_ratio
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario


def test_balance_hand_built() -> None:
    # 10, 10, 15, 10 ms: mean 11.25, stage 2 at 15 / 11.25 = 1.3333x, spread 5 ms
    b = balance_of({0: 10.0, 1: 10.0, 2: 15.0, 3: 10.0})
    assert b.mean_ms == pytest.approx(11.25)
    assert b.heaviest == 2 and b.slowest == 2
    assert b.ratio == pytest.approx(15 / 11.25)
    assert b.spread_ms == pytest.approx(5.0)


def test_balance_threshold_is_the_one_constant() -> None:
    # 4 stages, one at x and three at 1: ratio = 4x / (x + 3); just under / over SLOW_STAGE_RATIO
    r = SLOW_STAGE_RATIO
    x_at = 3 * r / (4 - r)  # ratio exactly r
    assert balance_of({0: 1.0, 1: 1.0, 2: x_at * 0.999, 3: 1.0}).slowest is None
    assert balance_of({0: 1.0, 1: 1.0, 2: x_at * 1.001, 3: 1.0}).slowest == 2


def test_balance_degenerate() -> None:
    assert balance_of({}).slowest is None and balance_of({}).ratio is None
    assert balance_of({0: 5.0}).heaviest is None
    # no compute at all: no ratio, no slow stage
    z = balance_of({0: 0.0, 1: 0.0})
    assert z.ratio is None and z.slowest is None
    # ties name the lowest stage
    assert balance_of({0: 1.0, 1: 2.0, 2: 2.0}).heaviest == 1


def test_theoretical_bubble() -> None:
    assert theoretical_bubble("1f1b", 4, 8, 1) == pytest.approx(3 / 11)
    assert theoretical_bubble("gpipe", 4, 8, 1) == pytest.approx(3 / 11)
    # interleaved and looped BFS share the ramp (P-1)/(vM+P-1): 3 / 19
    assert theoretical_bubble("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert theoretical_bubble("looped_bfs", 4, 8, 2) == pytest.approx(3 / 19)
    # zero bubble: (P-1)/(3M+P-1) = 3 / 27
    assert theoretical_bubble("zero_bubble", 4, 8, 1) == pytest.approx(3 / 27)
    assert theoretical_bubble("unknown", 4, 8, 1) is None
    assert theoretical_bubble("1f1b", 1, 8, 1) is None
    assert theoretical_bubble("1f1b", 4, None, 1) is None


def test_measured_bubble() -> None:
    # two windows: 2/10 and 0/0 (an empty window counts 0) -> mean 0.1
    assert measured_bubble([2.0, 0.0], [10.0, 0.0]) == pytest.approx(0.1)
    assert measured_bubble([], []) is None


def _stages(block: list[float] | None, compute: list[float]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, c in enumerate(compute):
        s: dict[str, Any] = {"stage": i, "compute_ms": c}
        if block is not None:
            s["block_ms"] = block[i]
        out.append(s)
    return out


def test_reports_and_gate_use_block_ms() -> None:
    # block compute says stage 1 (12 vs mean 10.5 -> 1.143x); the rank compute (optimizer and all)
    # would say stage 0: the facts measure wins
    stages = _stages([9.0, 12.0], [20.0, 18.0])
    # the reports read the slowest stage the analysis wrote (summary.slowest_stage, on block_ms)
    assert report_slowest_stage(typed({"stages": stages, "summary": {"slowest_stage": 1}})) == 1
    assert report_slowest_stage(typed({"stages": stages})) is None
    # the gate reads the ratio and the slowest stage the analysis wrote, never its own
    summary = {"slowest_stage": 1, "stage_ratio": 1.1429}
    v, note = stage_ratio(typed({"stages": stages, "summary": summary}))
    assert v == 1.1429
    assert note == "slowest stage 1: 12.00 ms vs mean 10.50 ms"
    v, note = stage_ratio(typed({"stages": stages, "summary": {"stage_ratio": 1.05}}))
    assert (v, note) == (1.05, "no stage stands out of the mean")
    assert stage_ratio(typed({"stages": stages[:1]}))[0] is None


def test_one_slowest_stage_everywhere(tmp_path: Path) -> None:
    """Stage 1 computes 1.3x slower: PP003, summary.slowest_stage, the stage table and the gate
    all name it, from the same ratio."""
    write_kineto(make_scenario(faults=[F.SlowStage(stage=1, factor=1.3)], steps=2), tmp_path)
    rep = diagnose([tmp_path], Options()).result
    # 4 stages at 1, 1.3, 1, 1: ratio 1.3 / 1.075 = 1.209 (blocks only; p2p/host add nothing)
    assert rep.summary.slowest_stage == 1
    assert rep.summary.stage_ratio == pytest.approx(1.3 / 1.075, rel=0.02)
    pp003 = [f for f in rep.findings if f.code == "PP003"]
    assert pp003 and pp003[0].evidence.as_dict()["slowest_stage"] == 1
    assert pp003[0].evidence.as_dict()["ratio"] == pytest.approx(rep.summary.stage_ratio, abs=1e-3)
    assert rep.stages[report_slowest_stage(typed(rep)) or 0].stage == 1
    assert stage_ratio(typed(rep))[0] == pytest.approx(rep.summary.stage_ratio, abs=1e-4)
    b0, b1 = rep.stages[0].block_ms, rep.stages[1].block_ms
    assert b0 is not None and b1 == pytest.approx(1.3 * b0, rel=0.02)
