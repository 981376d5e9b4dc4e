"""The replay's two placements give the same variants: level by level and node at a time.

``Replay.run_many`` places the variants level by level over the dependency graph when the graph
is wide (many nodes per level, as many ranks of sampled steps are), and one node at a time when
it is deep (a few ranks of many chained steps: tens of thousands of levels of a handful of nodes,
where the levels' fixed cost exceeds the loop's). Either way the numbers must be the same. Here
each synthetic run (schedules, faults, data parallelism, both formats) is replayed with the level
schedule forced (``MIN_WIDTH = 0``) and with the loop forced, and every variant's per-step idle
must agree exactly; and the choice itself follows the graph's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analysis_parts import replay_args
from test_replay_waits_many import CASES as WAIT_CASES

from ppdiag.api import Options, diagnose
from ppdiag.attribution import replay_plan
from ppdiag.attribution.replay_run import Replay, Variant
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

CASES: dict[str, dict[str, Any]] = {
    **WAIT_CASES,
    "gpipe_slow_stage": dict(schedule="gpipe", pp=4, microbatches=8, faults=[F.SlowStage(2, 1.5)]),
}

VARIANTS = [
    Variant(),
    Variant(host=False),
    Variant(comm_excess=False),
    Variant(comm_excess=False, comm=False),
    Variant(copy=False),
    Variant(host=False, comm_excess=False, comm=False, copy=False, ux=False),
]


def _replay_args(tmp_path: Path, name: str, fmt: str) -> tuple[Any, ...]:
    run = make_scenario(steps=3, **CASES[name])
    (write_kineto if fmt == "kineto" else write_nsys)(run, tmp_path)
    return replay_args(diagnose([tmp_path], Options()))


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
@pytest.mark.parametrize("name", list(CASES))
def test_levels_and_loop_place_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, fmt: str
) -> None:
    args = _replay_args(tmp_path, name, fmt)
    monkeypatch.setattr(replay_plan, "MIN_WIDTH", 0)
    levels_rp = Replay(*args)
    assert replay_plan.vectorizable(levels_rp) and replay_plan.wide_enough(levels_rp, 1)
    by_levels = levels_rp.run_many(VARIANTS)
    monkeypatch.setattr(replay_plan, "MIN_WIDTH", 10**12)
    loop_rp = Replay(*args)
    assert not replay_plan.wide_enough(loop_rp, len(VARIANTS))
    by_loop = loop_rp.run_many(VARIANTS)
    assert by_levels == by_loop
    assert levels_rp._placement is not None and loop_rp._placement is None  # each took its path


def test_a_deep_graph_is_placed_node_at_a_time(tmp_path: Path) -> None:
    # 2 ranks x 6 chained steps x 16 blocks: the chains are 96 blocks long, the graph has
    # 2 * 6 * 16 = 192 nodes, so 12 variants give 192 * 12 / 96 = 24 nodes per level, under
    # MIN_WIDTH (256): the loop; a graph of 256 ranks of one step each would take the levels
    run = make_scenario(pp=2, microbatches=8, steps=6)
    write_kineto(run, tmp_path)
    rp = Replay(*replay_args(diagnose([tmp_path], Options())))
    depth = replay_plan.chain_depth(rp)
    nodes = sum(rp.count.values())
    assert nodes == 2 * 6 * 16
    assert depth == 6 * 16, "consecutive steps of a rank are chained"
    assert not replay_plan.wide_enough(rp, 12)
    assert replay_plan.wide_enough(rp, 12 * replay_plan.MIN_WIDTH)
