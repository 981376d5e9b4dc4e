"""The replay's node loop by kinds (``replay_run._place_kinds``) against its general row
(``replay_run._place_nodes``) on random rows: every kind of node, epoch-sized times (beyond a
float's exact integers, so each float rounding shows) and values drawn from a coarse grid, so
that ties between a producer's issue and the posting (the general row keeps ``posted``, a float)
come up. Both must give the same ends, as the same Python types."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.replay_columns import (
    K_EDGE,
    K_OTHER,
    K_PLAIN,
    K_WAIT,
    K_WAIT_ONLY,
    _KindRows,
    _Row,
)
from ppdiag.attribution.replay_run import _place_kinds, _place_nodes, _Windows

EPOCH = 1_700_000_000_123_456_789  # beyond 2**53: a float spaces its values 256 ns apart here


class _Starts(_Windows):
    """Windows whose step starts are given (the loop reads no other part of them)."""

    def __init__(self, end: list[int], starts: dict[tuple[int, int], int]) -> None:
        self.end = end
        self.starts = starts

    def start(self, key: tuple[int, int]) -> int:
        return self.starts[key]


def _rows(seed: int, n: int, floats: bool) -> tuple[list[_Row], list[int], dict[tuple[int, int], int]]:
    """Random rows in a loop order (node ids mostly rising), the measured ends and step starts."""
    rng = np.random.default_rng(seed)

    def grid(k: int) -> int:
        # coarse: equal sums (ties) are common; a few off-grid nanoseconds now and then
        return 256 * int(rng.integers(0, k)) + (int(rng.integers(0, 300)) if rng.random() < 0.2 else 0)

    meas = [EPOCH + grid(50) for _ in range(n)]
    order = np.argsort(np.arange(n) + rng.integers(0, 3, n), kind="stable").tolist()
    starts: dict[tuple[int, int], int] = {}
    rows: list[_Row] = []
    for i in order:
        first = i == 0 or rng.random() < 0.1
        fk = (0, i) if first else None
        if fk is not None:
            starts[fk] = EPOCH + grid(40)
        pre = float(grid(4)) * (rng.random() if rng.random() < 0.3 else 1.0)
        post = float(grid(3)) * (rng.random() if rng.random() < 0.3 else 1.0)
        du: float = grid(20) + rng.random() if floats else grid(20)
        c = int(rng.choice([0, 0, 1, 2, 2, 3]))
        ep = int(rng.integers(0, n)) if rng.random() < 0.6 else -1
        # a wait's producer is mostly its label edge's source (the kind loop's fast path)
        prod = ep if ep >= 0 and rng.random() < 0.7 else int(rng.integers(0, n))
        deps: tuple[int | None, list[tuple[int, int]]] | None = None
        if ep < 0 and rng.random() < 0.2:
            rel = EPOCH + grid(60) if rng.random() < 0.7 else None
            deps = (rel, [(int(rng.integers(0, n)), grid(5))] if rng.random() < 0.5 else [])
        rows.append(
            (
                i,
                fk,
                pre,
                post,
                du,
                c,
                grid(6),  # add
                grid(8) - 512 if rng.random() < 0.9 else 2**62,  # lead (2**62: posted at once)
                prod,
                grid(4),  # extra
                EPOCH + grid(60),  # t_issue
                ep,
                grid(6),
                deps,
            )
        )
    return rows, meas, starts


def _kind_rows_of(rows: list[_Row]) -> _KindRows:
    """The rows as the kind loop's streams: kinds as :func:`replay_columns._node_kinds` gives them."""
    main: list[tuple[int, int, float, float, float, int, int, int, int, int]] = []
    others: list[_Row] = []
    for r in rows:
        i, fk, pre, post, du, c, add, lead, prod, extra, _, ep, et, deps = r
        reads = ep
        if fk is not None or deps is not None or c in (1, 3) or (c == 2 and ep >= 0 and ep != prod):
            kind = K_OTHER
            others.append(r)
        elif c == 2:
            kind = K_WAIT if ep >= 0 else K_WAIT_ONLY
            reads = prod
        else:
            kind = K_EDGE if ep >= 0 else K_PLAIN
        main.append((i, kind, pre, post, du, reads, et, add, lead, extra))
    return _KindRows(iter(main), iter(others))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 120), st.booleans())
def test_kind_loop_equals_the_general_row(seed: int, n: int, floats: bool) -> None:
    rows, meas, starts = _rows(seed, n, floats)
    want = _Starts(list(meas), starts)
    _place_nodes(want, iter(rows))
    got = _Starts(list(meas), starts)
    _place_kinds(got, _kind_rows_of(rows))
    assert got.end == want.end
    assert [type(x) for x in got.end] == [type(x) for x in want.end]


def test_kind_loop_on_a_hand_built_chain() -> None:
    """Three blocks of one step (ids 0-2) and a producer on another rank (id 3, placed later: read
    as measured, ends at 1040): block 0 starts at its step's start 1000 and runs 10 ns (ends
    1010); block 1 follows it and has a label edge from the producer (1040 + 5 = 1045 > 1010):
    ends 1045 + 20 = 1065; block 2 waits for the producer's issue (1040 + 2) against its posting
    (1065 - 100), plus 7 ns of transfer: 1049 < 1065, so it does not wait, ends 1065 + 1 = 1066."""
    kinds: list[Any] = [
        (0, K_OTHER, 0.0, 0.0, 10, -1, 0, 0, 0, 0),
        (1, K_EDGE, 0.0, 0.0, 20, 3, 5, 0, 0, 0),
        (2, K_WAIT_ONLY, 0.0, 0.0, 1, 3, 0, 7, 100, 2),
    ]
    first: _Row = (0, (0, 0), 0.0, 0.0, 10, 0, 0, 0, -1, 0, 0, -1, 0, None)
    win = _Starts([0, 0, 0, 1040], {(0, 0): 1000})
    _place_kinds(win, _KindRows(iter(kinds), iter([first])))
    assert win.end == [1010, 1065, 1066, 1040]
