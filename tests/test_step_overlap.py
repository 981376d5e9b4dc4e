"""Ranks whose step numbers share none with the other ranks' are named (a trace of another run),
each once, in rank order; ranks that share a step with any other rank are not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from ppdiag.model import Run
from ppdiag.pipeline import checks


def _warnings(monkeypatch: pytest.MonkeyPatch, steps: dict[int, list[int]]) -> list[str]:
    """The warnings for ranks holding these step numbers (the annotations' times do not matter)."""
    monkeypatch.setattr(checks, "host_steps", lambda tl: [(n, 0, 1) for n in steps[tl.rank]])
    run = SimpleNamespace(ranks=[SimpleNamespace(rank=r) for r in steps])
    return checks.step_overlap_warnings(cast(Run, run))


def test_only_the_ranks_sharing_no_step_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # 200 ranks on steps 5-7, rank 3 on 100-102, rank 7 on 7-9 (shares 7), rank 9 on 200-201,
    # rank 11 with no numbered step (-1: not a step; left out of everything)
    steps = {r: [5, 6, 7] for r in range(200)}
    steps[3], steps[7], steps[9], steps[11] = [100, 101, 102], [7, 8, 9], [200, 201], [-1]
    # rank 3: the others hold 5-9 and 200-201 -> "(5-201)"; rank 9: the others 5-9 and 100-102
    assert _warnings(monkeypatch, steps) == [
        "rank 3: its steps 100-102 share none with the other ranks' (5-201): a trace from another run?",
        "rank 9: its steps 200-201 share none with the other ranks' (5-102): a trace from another run?",
    ]


def test_two_ranks_with_disjoint_steps_name_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _warnings(monkeypatch, {0: [5, 6], 1: [105, 106]}) == [
        "rank 0: its steps 5-6 share none with the other ranks' (105-106): a trace from another run?",
        "rank 1: its steps 105-106 share none with the other ranks' (5-6): a trace from another run?",
    ]
    assert _warnings(monkeypatch, {0: [5, 6], 1: [6, 7]}) == []
    assert _warnings(monkeypatch, {0: [5, 6]}) == []
