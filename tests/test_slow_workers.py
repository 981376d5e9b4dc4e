"""PP009/PP010's slow workers: each rank's block compute per step against the median and the
spread of the same stage in the other DP replicas, on hand-built blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pytest

from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.topology import Topology
from ppdiag.rules import RuleContext
from ppdiag.rules.pp010_mb_variance import _leave_one_out, slow_workers


def _blocks(busy_per_step: list[int]) -> Blocks:
    """One block per step, of the given compute (ns)."""
    n = len(busy_per_step)
    i64 = np.zeros(n, dtype=np.int64)
    return Blocks(
        np.arange(n, dtype=np.int32),
        i64,
        i64.copy(),
        np.array(busy_per_step, dtype=np.int64),
        i64.copy(),
        np.zeros(n, np.int8),
        np.zeros(n, np.int32),
        np.zeros(n, np.int32),
    )


@dataclass
class _Pipeline:
    topology: Topology
    blocks: dict[int, Blocks]


@dataclass
class _Ctx:
    pipeline: _Pipeline


def _ctx(busy: dict[int, list[int]], pp: int = 2) -> RuleContext:
    """pp x dp ranks, rank r on stage r % pp, replica r // pp."""
    dp = len(busy) // pp
    topo = Topology(
        pp=pp,
        stage_of={r: r % pp for r in busy},
        chunks_of={r: [r % pp] for r in busy},
        pipelines=[[d * pp + s for s in range(pp)] for d in range(dp)],
    )
    return cast(RuleContext, _Ctx(_Pipeline(topo, {r: _blocks(b) for r, b in busy.items()})))


def test_slow_workers_hand_worked() -> None:
    """pp 2 x dp 4, two steps.

    Stage 0 (ranks 0, 2, 4, 6), means 100, 100, 100, 140 ns: rank 6 against the others' median 100
    (spread 0, its own steps equal: standard error 0) is 0.4 above, over the 0.03 floor: slow.
    Rank 4 (steps 102 and 98, mean 100) is at its peers' median 100: not slow.

    Stage 1 (ranks 1, 3, 5, 7), means 200, 180, 220, 240: rank 7 is 0.2 above the others' median
    200, but those others (200, 180, 220) spread by std sqrt((0 + 400 + 400) / 3) = 16.33, 0.0816
    of the median: 4 spreads = 0.327 > 0.2, not slow. Rank 5: others 200, 180, 240 (median 200,
    std 24.94 = 0.125 of it), 0.1 above: not slow. So only rank 6, at 0.4.
    """
    busy = {
        0: [100, 100],
        2: [100, 100],
        4: [102, 98],
        6: [140, 140],
        1: [200, 200],
        3: [180, 180],
        5: [220, 220],
        7: [240, 240],
    }
    assert slow_workers(_ctx(busy)) == pytest.approx({6: 0.4})
    # stage 1's spread narrowed (others 200, 200, 200): rank 7's 0.2 now stands out
    busy[3] = busy[5] = [200, 200]
    assert slow_workers(_ctx(busy)) == pytest.approx({6: 0.4, 7: 0.2})


def test_slow_worker_noisy_steps_and_pairs() -> None:
    """A rank whose own steps vary is judged by its standard error: steps 100 and 180 (mean 140,
    std 40, standard error 40 / sqrt 2 = 28.3 = 0.283 of the peers' 100) need 4 x 0.283 = 1.13
    above, and 0.4 is not. With two replicas the one peer has no spread: the floor is the rank's
    own standard error times sqrt 2 (0 here), so 140 against 100 is slow, and 100 against 140 is
    0.29 below, not slow."""
    noisy = {0: [100, 100], 2: [100, 100], 4: [100, 100], 6: [100, 180]}
    noisy.update({r + 1: [100, 100] for r in (0, 2, 4, 6)})
    assert slow_workers(_ctx(noisy)) == {}
    pair = {0: [100, 100], 1: [100, 100], 2: [140, 140], 3: [100, 100]}
    assert slow_workers(_ctx(pair)) == pytest.approx({2: 0.4})


def test_leave_one_out_matches_each_rank_against_the_others() -> None:
    """Median and spread of the others, for every value at once, as one median per value over the
    others gives (ties, odd and even counts); the spread to rounding."""
    rng = np.random.default_rng(7)
    for n in (2, 3, 4, 5, 8, 33):
        for x in (rng.normal(100.0, 10.0, n), np.round(rng.normal(100.0, 10.0, n) / 5) * 5):
            median, std = _leave_one_out(x)
            for i in range(n):
                others = np.delete(x, i)
                assert median[i] == np.median(others)
                assert std[i] == pytest.approx(others.std(), abs=1e-6)
    # hand-worked: 1, 2, 4, 8: without 1 the others 2, 4, 8 (median 4); without 8: 1, 2, 4 (2)
    median, _ = _leave_one_out(np.array([8.0, 1.0, 4.0, 2.0]))
    assert median.tolist() == [2.0, 4.0, 2.0, 4.0]
