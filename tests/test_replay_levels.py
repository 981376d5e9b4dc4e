"""The level-by-level placement of the replay against a plain node-at-a-time loop on random graphs.

:func:`ppdiag.attribution.replay_levels.place` places every node of a level of the dependency
graph at once, for every variant at once; :func:`_reference` below is the loop it stands for, one
node after another in id order with Python's own ``int``/``float`` arithmetic (an ``int``
compared with a ``float`` exactly, a float rounded where the loop rounds it). On random acyclic
graphs with epoch-sized times (beyond a float's exact integers) the two must agree exactly.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.replay_levels import NEG_I, EdgeList, LevelGraph, NodeValues, levels, place

EPOCH = 1_700_000_000_123_456_789  # beyond 2**53: float rounding matters


def _random_graph(
    seed: int, n: int, nv: int
) -> tuple[EdgeList, EdgeList, np.ndarray, np.ndarray, np.ndarray]:
    """Random X- and I-edges (from a lower id to a higher one, or constants from the sentinel
    ``n``), producers, virtual nodes and per-variant flags."""
    rng = np.random.default_rng(seed)
    xr: list[tuple[int, int, int, int, int, int]] = []
    ir: list[tuple[int, int, int, int, int, int]] = []
    for i in range(n):
        for _ in range(int(rng.integers(1, 4))):
            live = i > 0 and rng.random() < 0.8
            src = int(rng.integers(0, i)) if live else n
            k0 = int(rng.integers(-50, 5_000)) + (0 if live else EPOCH + int(rng.integers(0, 10**6)))
            kh, kc, kk = (int(x) for x in rng.integers(0, 300, 3))
            xr.append((i, src, k0, kh, kc, kk))
        n_i = int(rng.integers(0, 3))
        for _ in range(n_i):
            live = i > 0 and rng.random() < 0.7
            src = int(rng.integers(0, i)) if live else n
            k0 = int(rng.integers(-20, 3_000)) + (0 if live else EPOCH + int(rng.integers(0, 10**6)))
            ir.append((i, src, k0, 0, 0, 0))
        if n_i == 0:
            ir.append((i, n, NEG_I, 0, 0, 0))
    prod = np.array(
        [int(rng.integers(0, i)) if i > 0 and rng.random() < 0.6 else n for i in range(n)], np.int64
    )
    virtual = rng.random(n) < 0.1
    flags = rng.random((nv, 3)) < 0.5

    def edges(rows: list[tuple[int, int, int, int, int, int]]) -> EdgeList:
        a = np.array(rows, np.int64).reshape(-1, 6)
        return EdgeList(*(a[:, k] for k in range(6)))

    return edges(xr), edges(ir), prod, virtual, flags


def _values(seed: int, n: int, nv: int) -> NodeValues:
    rng = np.random.default_rng(seed + 1)
    # fractional local delays (scaled by a variant's kept share) and whole or fractional durations
    pre = rng.integers(0, 2_000, (nv, n)) * rng.choice([1.0, 0.37, 0.0], (nv, n))
    post = rng.integers(0, 2_000, (nv, n)) * rng.choice([1.0, 0.61, 0.0], (nv, n))
    dur = rng.integers(1, 10_000, (nv, n)) * rng.choice([1.0, 1.3], (nv, n))
    lead = np.where(rng.random((nv, n)) < 0.1, 2**62, rng.integers(0, 3_000, (nv, n)))
    pconst = rng.integers(0, 400, (nv, n)) + np.where(rng.random((nv, n)) < 0.2, EPOCH, 0)
    return NodeValues(
        pre.astype(np.float64),
        post.astype(np.float64),
        dur.astype(np.float64),
        rng.integers(0, 4, (nv, n)),
        rng.integers(0, 2_000, (nv, n)),
        lead.astype(np.int64),
        pconst.astype(np.int64),
    )


def _reference(
    n: int,
    xe: EdgeList,
    ie: EdgeList,
    prod: np.ndarray,
    virtual: np.ndarray,
    flags: np.ndarray,
    v: NodeValues,
) -> list[list[int]]:
    """The loop: each node in id order reads the ends of the nodes before it."""
    out: list[list[int]] = []
    for k in range(flags.shape[0]):
        fh, fc, fk = (int(x) for x in flags[k])
        end = [0] * (n + 1)  # the sentinel's end is 0: a constant edge is its latency
        xs = [[] for _ in range(n)]  # type: list[list[tuple[int, int]]]
        for d, s, k0, kh, kc, kk in zip(
            *(a.tolist() for a in (xe.dst, xe.src, xe.k0, xe.k_host, xe.k_comm, xe.k_copy)), strict=True
        ):
            xs[d].append((s, k0 + fh * kh + fc * kc + fk * kk))
        ins = [[] for _ in range(n)]  # type: list[list[tuple[int, int]]]
        for d, s, k0 in zip(ie.dst.tolist(), ie.src.tolist(), ie.k0.tolist(), strict=True):
            ins[d].append((s, k0))
        pre, post, dur = v.pre[k].tolist(), v.post[k].tolist(), v.dur[k].tolist()
        code, add, lead, pconst = (
            v.code[k].tolist(),
            v.add[k].tolist(),
            v.lead[k].tolist(),
            v.pconst[k].tolist(),
        )
        for i in range(n):
            x = max(end[s] + t for s, t in xs[i])
            base = x + pre[i]
            if code[i] == 1:
                base += add[i]
            elif code[i] in (2, 3):
                posted = base - lead[i]
                issued = end[int(prod[i])] + pconst[i]
                arrive = (issued if issued > posted else posted) + add[i]
                if arrive > base:
                    base = arrive
            for s, t in ins[i]:
                if end[s] + t > base:
                    base = end[s] + t
            end[i] = x if virtual[i] else int((base + post[i]) + dur[i])
        out.append(end[:n])
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 4))
def test_level_placement_equals_the_node_at_a_time_loop(seed: int, n: int, nv: int) -> None:
    xe, ie, prod, virtual, flags = _random_graph(seed, n, nv)
    v = _values(seed, n, nv)
    g = LevelGraph.build(n, xe, ie, prod, virtual)
    arrays = [getattr(v, f.name) for f in fields(v)]
    cols = NodeValues(*(g.columns(list(a), a.dtype.type) for a in arrays))
    got = place(g, xe.tau(flags), ie.k0, cols)
    assert got.tolist() == _reference(n, xe, ie, prod, virtual, flags, v)


def test_levels_are_the_longest_path_from_a_source() -> None:
    # 0 -> 1 -> 3, 0 -> 2, 2 -> 3, 4 alone: 3 is two steps from 0
    src = np.array([0, 1, 0, 2], np.int64)
    dst = np.array([1, 3, 2, 3], np.int64)
    assert levels(5, src, dst).tolist() == [0, 1, 1, 2, 0]
    with pytest.raises(ValueError, match="cycle"):
        levels(2, np.array([0, 1], np.int64), np.array([1, 0], np.int64))
