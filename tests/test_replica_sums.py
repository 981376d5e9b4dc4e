"""The replica comparison's sums for all rank-steps at once equal the same sums taken one
rank-step at a time (binary searches in each rank-step's own sets)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.replica_sums import count_le, replica_sums
from ppdiag.model import intervals as ivs


def _loop(sets: list[Any], lut: Any, n_step: int, k_sorted: Any, order: Any, q_t: Any, tol: int) -> Any:
    comp = np.zeros(q_t.size, np.int64)
    host = np.zeros(q_t.size, np.int64)
    for rs in sets:
        p = int(lut[rs.rank]) if rs.rank < lut.size else -1
        if p < 0:
            continue
        k = p * n_step + rs.step
        a, b = np.searchsorted(k_sorted, k, "left"), np.searchsorted(k_sorted, k, "right")
        qs = order[a:b]
        t = np.maximum(q_t[qs], rs.w0)
        host[qs] += ivs.prefix_measure(rs.host, t) - ivs.prefix_measure(rs.host, np.full(t.shape, rs.w0))
        comp[qs] += rs.block_busy_cum[np.searchsorted(rs.block_end, t + tol, side="right")]
    return comp, host


def _set(rank: int, step: int, w0: int, host: list[tuple[int, int]], blocks: list[tuple[int, int]]) -> Any:
    hs = ivs.union([a for a, _ in host], [a + d for a, d in host])
    ends = np.sort(np.array([e for e, _ in blocks], np.int64))
    cum = np.zeros(len(blocks) + 1, np.int64)
    np.cumsum(np.array([b for _, b in blocks], np.int64), out=cum[1:])
    return SimpleNamespace(rank=rank, step=step, w0=w0, host=hs, block_end=ends, block_busy_cum=cum)


def test_hand_built() -> None:
    # replica 0 = ranks 0, 1; step 0. Rank 0: window from 10, host stall [12, 20), blocks ending at
    # 15 (busy 4) and 30 (busy 6). Rank 1: window from 0, host stall [5, 8), one block ending at
    # 25 (busy 9). Query at 26 (tolerance 1): host 8 + 3 = 11 ns, compute 4 + 9 = 13 ns (30 not
    # finished). Query at 5: below rank 0's window (taken at 10): host 0, compute 0.
    sets = [_set(0, 0, 10, [(12, 8)], [(15, 4), (30, 6)]), _set(1, 0, 0, [(5, 3)], [(25, 9)])]
    lut = np.array([0, 0], np.int64)
    q_t = np.array([26, 5], np.int64)
    k_sorted = np.array([0, 0], np.int64)
    comp, host = replica_sums(sets, lut, 1, k_sorted, np.array([0, 1]), q_t, 1)
    assert comp.tolist() == [13, 0] and host.tolist() == [11, 0]


_t = st.integers(min_value=0, max_value=200)


@settings(max_examples=150, deadline=None)
@given(
    raw=st.lists(
        st.tuples(
            st.integers(0, 5),  # rank
            st.integers(0, 2),  # step
            _t,  # w0
            st.lists(st.tuples(_t, st.integers(0, 30)), max_size=5),  # host pieces
            st.lists(st.tuples(_t, st.integers(0, 40)), max_size=5),  # blocks (end, busy)
        ),
        min_size=1,
        max_size=10,
    ),
    lut_raw=st.lists(st.integers(-1, 2), min_size=1, max_size=6),
    queries=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), _t), max_size=12),
    tol=st.integers(0, 5),
)
def test_all_at_once_equals_one_at_a_time(
    raw: list[Any], lut_raw: list[int], queries: list[tuple[int, int, int]], tol: int
) -> None:
    sets = [_set(*r) for r in raw]
    lut = np.array(lut_raw, np.int64)
    n_step = 3
    q_key = np.array([p * n_step + s for p, s, _ in queries], np.int64)
    q_t = np.array([t for _, _, t in queries], np.int64)
    order = np.argsort(q_key, kind="stable")
    k_sorted = q_key[order]
    got = replica_sums(sets, lut, n_step, k_sorted, order, q_t, tol)
    want = _loop(sets, lut, n_step, k_sorted, order, q_t, tol)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


@given(
    segs=st.lists(st.lists(st.integers(-5, 5), max_size=5), min_size=1, max_size=4),
    q=st.lists(st.tuples(st.integers(0, 3), st.integers(-6, 6)), max_size=8),
)
def test_count_le(segs: list[list[int]], q: list[tuple[int, int]]) -> None:
    q = [(g % len(segs), t) for g, t in q]
    vals = np.array([v for s in segs for v in sorted(s)], np.int64)
    vseg = np.array([i for i, s in enumerate(segs) for _ in s], np.int64)
    got = count_le(vals, vseg, np.array([t for _, t in q], np.int64), np.array([g for g, _ in q], np.int64))
    assert got.tolist() == [int(np.searchsorted(sorted(segs[g]), t, side="right")) for g, t in q]
