"""The replay graph's node columns held as int32 where their values allow (``replay_nodes.narrow``):
the values and every sum the graph takes of them stay those of int64 columns.

A column is narrowed only when each value lies within ``NARROW_LIMIT`` (2**31 / 16) of 0; a value
written later that does not fit widens its column first; the busy time summed per (rank, stage,
phase) over many blocks, which does not fit int32, is summed in int64.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ppdiag.attribution.replay_graph import ReplayGraph
from ppdiag.attribution.replay_nodes import MEASURED, NARROW_LIMIT, ByNode, NodeColumns, narrow
from ppdiag.model import Phase


@given(st.lists(st.integers(-(2**40), 2**40), max_size=50))
def test_narrow_keeps_every_value(vals: list[int]) -> None:
    a = np.array(vals, np.int64)
    got = narrow(a)
    assert got.tolist() == vals
    fits = all(-NARROW_LIMIT < v < NARROW_LIMIT for v in vals)
    assert got.dtype == (np.int32 if fits else np.int64)


def test_narrow_at_the_limit() -> None:
    assert narrow(np.array([NARROW_LIMIT - 1, -NARROW_LIMIT + 1], np.int64)).dtype == np.int32
    assert narrow(np.array([NARROW_LIMIT], np.int64)).dtype == np.int64
    assert narrow(np.array([-NARROW_LIMIT], np.int64)).dtype == np.int64
    assert narrow(np.zeros(0, np.int64)).dtype == np.int32


def _columns(n: int, busy: int) -> NodeColumns:
    cols = {c: narrow(np.zeros(n, np.int64)) for c in MEASURED}
    cols["busy"] = narrow(np.full(n, busy, np.int64))
    cols["phase"] = narrow(np.full(n, int(Phase.FWD), np.int64))
    return NodeColumns(cols, np.zeros(n, np.bool_))


def test_put_widens_a_narrowed_column() -> None:
    nc = _columns(4, 5)
    nc.put("pre", 1, 7)  # fits: the column stays int32
    assert nc.cols["pre"].dtype == np.int32
    # a 3 s gap (3e9 ns) does not fit int32: the column is widened, its other values kept
    nc.put("pre", 2, 3_000_000_000)
    assert nc.cols["pre"].dtype == np.int64
    assert nc.cols["pre"].tolist() == [0, 7, 3_000_000_000, 0]


def test_busy_summed_per_label_in_int64() -> None:
    # 30 forward blocks of 100 ms on rank 0, stage 0: each fits int32 (1e8 ns), their sum
    # 3e9 ns does not (int32 would wrap to -1,294,967,296)
    g = ReplayGraph.__new__(ReplayGraph)
    g.cols = _columns(30, 100_000_000)
    assert g.cols.cols["busy"].dtype == np.int32
    tot, cnt = g._work_by_label((int(Phase.FWD),))
    assert tot == {(0, 0, int(Phase.FWD)): 3_000_000_000}
    assert cnt == {(0, 0, int(Phase.FWD)): 30}


def test_by_node_narrowed_widens_on_a_value_that_does_not_fit() -> None:
    t = ByNode(4, 2, listed=True, narrowed=True)
    t.set_many(np.array([0, 1]), (np.array([3, 0]), np.array([50_000, -20])))
    assert t.val.dtype == np.int32
    # a 5 s transfer (5e9 ns) set one node at a time: the table is widened, the others kept
    t[2] = [(1, 5_000_000_000)]
    assert t.val.dtype == np.int64
    assert dict(t.items()) == {0: [(3, 50_000)], 1: [(0, -20)], 2: [(1, 5_000_000_000)]}
    u = ByNode(3, 3, narrowed=True)
    u.set_many(np.array([1]), (np.array([2]), np.array([-(2**40)]), np.array([7])))
    assert u.val.dtype == np.int64
    assert u[1] == (2, -(2**40), 7)
