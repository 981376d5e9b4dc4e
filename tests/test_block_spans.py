"""Each rank-step's blocks and excluded span as one set, all steps at once on one line: the same
sets as one union per step, also where the steps' spans do not fit on one line."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.collective_steps import _block_spans
from ppdiag.model import intervals as ivs


def _step(rank: int, step: int, spans: list[tuple[int, int]]) -> Any:
    s = np.array([a for a, _ in spans], np.int64)
    e = np.array([b for _, b in spans], np.int64)
    return SimpleNamespace(rank=rank, step=step, blocks=SimpleNamespace(start=s, end=e))


def _per_step(steps: list[Any], exclude: dict[tuple[int, int], tuple[int, int]] | None) -> dict[Any, Any]:
    out = {}
    for rs in steps:
        x = exclude.get((rs.rank, rs.step)) if exclude else None
        # (int64 throughout: an empty list joined to the blocks would go through float64 and
        # round times past 2**53 ns, as the loop this replaces did)
        s0 = np.array(rs.blocks.start.tolist() + ([x[0]] if x else []), np.int64)
        s1 = np.array(rs.blocks.end.tolist() + ([x[1]] if x else []), np.int64)
        if s0.size:
            out[(rs.rank, rs.step)] = ivs.union(s0, s1)
    return out


def _same(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    return list(a) == list(b) and all(
        a[k][0].tolist() == b[k][0].tolist() and a[k][1].tolist() == b[k][1].tolist() for k in a
    )


def test_hand_built() -> None:
    # rank 0 step 1: blocks [0, 4) and [4, 6) touch -> [0, 6); the excluded span [10, 12) stays
    # apart. rank 1 step 1: no blocks, only its excluded span [3, 5). rank 2 step 1: nothing.
    steps = [_step(0, 1, [(0, 4), (4, 6)]), _step(1, 1, []), _step(2, 1, [])]
    got = _block_spans(steps, {(0, 1): (10, 12), (1, 1): (3, 5)})
    assert list(got) == [(0, 1), (1, 1)]
    assert got[(0, 1)][0].tolist() == [0, 10] and got[(0, 1)][1].tolist() == [6, 12]
    assert got[(1, 1)][0].tolist() == [3] and got[(1, 1)][1].tolist() == [5]


_t = st.integers(min_value=-(10**6), max_value=10**6)
_far = st.sampled_from([0, 1 << 61, -(1 << 61)])  # steps this far apart do not fit on one line


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(_far, st.lists(st.tuples(_t, _t), max_size=6), st.one_of(st.none(), st.tuples(_t, _t))),
        min_size=1,
        max_size=8,
    ),
    with_exclude=st.booleans(),
)
def test_all_at_once_equals_one_per_step(
    rows: list[tuple[int, list[tuple[int, int]], tuple[int, int] | None]], with_exclude: bool
) -> None:
    steps = [
        _step(i % 3, i, [(base + a, base + b) for a, b in spans]) for i, (base, spans, _) in enumerate(rows)
    ]
    exclude = (
        {(i % 3, i): (base + x[0], base + x[1]) for i, (base, _, x) in enumerate(rows) if x is not None}
        if with_exclude
        else None
    )
    assert _same(_block_spans(steps, exclude), _per_step(steps, exclude))


def test_steps_too_long_for_one_line() -> None:
    # a step whose blocks lie 2**62 ns apart cannot go on one int64 line: one union per step
    far = 1 << 61
    steps = [_step(0, 1, [(-far, -far + 5), (far, far + 5)]), _step(1, 1, [(0, 3), (2, 7)])]
    got = _block_spans(steps, {(1, 1): (9, 10)})
    assert got[(0, 1)][0].tolist() == [-far, far] and got[(0, 1)][1].tolist() == [-far + 5, far + 5]
    assert got[(1, 1)][0].tolist() == [0, 9] and got[(1, 1)][1].tolist() == [7, 10]
