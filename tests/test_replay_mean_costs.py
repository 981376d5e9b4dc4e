"""The rebalanced variant's cost factors (:meth:`ReplayGraph.mean_costs`) from one sort of the
blocks: the same factors, in the same order, as the block-at-a-time sums they replace."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.replay_graph import ReplayGraph
from ppdiag.attribution.replay_mean_costs import mean_cost_factors
from ppdiag.model import Phase

_PHASES = (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD))


def _reference(
    rank: list[int], stage: list[int], phase: list[int], busy: list[int]
) -> dict[tuple[int, int, int], float]:
    """The block-at-a-time sums (the former implementation)."""
    tot: dict[tuple[int, int, int], int] = {}
    cnt: dict[tuple[int, int, int], int] = {}
    for k, b in zip(zip(rank, stage, phase, strict=True), busy, strict=True):
        if k[2] not in _PHASES:
            continue
        tot[k] = tot.get(k, 0) + b
        cnt[k] = cnt.get(k, 0) + 1
    return mean_cost_factors(tot, cnt, _PHASES)  # the means themselves are shared


def _factors(
    rank: list[int], stage: list[int], phase: list[int], busy: list[int]
) -> dict[tuple[int, int, int], float]:
    cols = {
        "rank": np.array(rank, np.int32),
        "stage": np.array(stage, np.int16),
        "phase": np.array(phase, np.int8),
        "busy": np.array(busy, np.int64),
    }
    graph = SimpleNamespace(cols=SimpleNamespace(cols=cols))
    graph._work_by_label = functools.partial(ReplayGraph._work_by_label, graph)  # type: ignore[arg-type]
    return ReplayGraph._compute_mean_costs(graph)  # type: ignore[arg-type]


_block = st.tuples(
    st.integers(0, 5), st.integers(0, 3), st.sampled_from([*_PHASES, 9]), st.integers(0, 10**9)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_block, max_size=60))
def test_mean_costs_match_the_block_at_a_time_sums(blocks: list[tuple[int, int, int, int]]) -> None:
    cols = [list(c) for c in zip(*blocks, strict=True)] if blocks else [[], [], [], []]
    got, want = _factors(*cols), _reference(*cols)
    assert list(got.items()) == list(want.items())  # same keys, same order, same floats


def test_mean_costs_of_two_ranks() -> None:
    # forward blocks: rank 0 stage 0 costs 10 + 20 = 30 ms, rank 1 stage 1 costs 50 + 70 = 120 ms;
    # the mean stage work is 75 ms: factors 75 / 30 = 2.5 and 75 / 120 = 0.625 (the 9: no phase)
    fwd = int(Phase.FWD)
    got = _factors([0, 1, 0, 1, 1], [0, 1, 0, 1, 1], [fwd, fwd, fwd, fwd, 9], [10, 50, 20, 70, 5])
    assert got == {(0, 0, fwd): 2.5, (1, 1, fwd): 0.625}
