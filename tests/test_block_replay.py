"""The wave-ordered block replay (ReplayPlan) gives the block-by-block replay's numbers exactly."""

from __future__ import annotations

import numpy as np
import pytest

from ppdiag.model import Phase
from ppdiag.pipeline.blocks import Blocks
from ppdiag.rules.block_replay import ReplayPlan, replay_loop

F, B, W = int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD)


def _rank_blocks(
    rng: np.random.Generator, stage: int, steps: int, m: int, shuffle: float, wgrad: bool
) -> Blocks:
    rows = []
    for s in range(steps):
        order = (
            [(F, i) for i in range(m)]
            + [(B, i) for i in range(m)]
            + ([(W, i) for i in range(m)] if wgrad else [])
        )
        if rng.random() < shuffle:  # an order the dependencies may not satisfy (a cycle: NaN)
            rng.shuffle(order)
        keep = [x for x in order if rng.random() > 0.05]  # a few blocks missing from the trace
        rows += [(s, ph, mb) for ph, mb in keep]
    n = len(rows)
    step = np.array([r[0] for r in rows], np.int32)
    # measured starts: ties on purpose, the replay keeps the index order on a tie
    start = np.arange(n, dtype=np.int64) // 2
    busy = rng.integers(1, 5_000_000, n).astype(np.int64)
    return Blocks(
        step,
        start,
        start + 1,
        busy,
        np.full(n, -1, np.int64),
        np.array([r[1] for r in rows], np.int8),
        np.array([r[2] for r in rows], np.int32),
        np.full(n, stage, np.int32),
        True,
    )


@pytest.mark.parametrize("seed", range(12))
def test_plan_matches_block_by_block(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pp, dp, m, steps = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 6)), 3
    lines = [[d * pp + s for s in range(pp)] for d in range(dp)]
    wgrad = bool(seed % 2)
    blocks = {
        r: _rank_blocks(rng, r % pp, steps, m, 0.3 if seed % 3 == 0 else 0.0, wgrad)
        for line in lines
        for r in line
    }
    cost = {r: b.busy.astype(np.float64) * rng.uniform(0.5, 1.5) for r, b in blocks.items()}
    got = ReplayPlan(lines, blocks, pp - 1).run(cost)
    for s in range(steps):
        want = replay_loop(lines, blocks, s, cost, pp - 1)
        assert (np.isnan(want) and np.isnan(got[s])) or got[s] == want, (s, got[s], want)


def test_duplicate_keys_fall_back() -> None:
    rng = np.random.default_rng(1)
    b = _rank_blocks(rng, 0, 1, 3, 0.0, False)
    dup = b.take(np.r_[np.arange(len(b)), np.arange(len(b))])
    cost = {0: dup.busy.astype(np.float64)}
    plan = ReplayPlan([[0]], {0: dup}, 0)
    assert not plan.ok
    assert plan.run(cost)[0] == replay_loop([[0]], {0: dup}, 0, cost, 0)


def test_unique_rows_as_row_wise_unique() -> None:
    from ppdiag.rules.pp010_mb_variance import _unique_rows

    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(1, 300))
        k = np.stack([rng.integers(0, int(rng.integers(1, 50)), n) for _ in range(3)], 1).astype(np.int64)
        want = np.unique(k, axis=0, return_inverse=True, return_counts=True)
        got = _unique_rows(k)
        assert (want[0] == got[0]).all() and (want[1].ravel() == got[1]).all() and (want[2] == got[2]).all()
