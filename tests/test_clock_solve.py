"""The clock solve: the Laplacian / conjugate-gradient solve equals the dense weighted least squares
it replaced (within 1 ns), and scales to thousands of ranks."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ppdiag.pipeline.clocks import _solve

Row = tuple[int, int, float, int]


def _dense_reference(ranks: list[int], rows: list[Row]) -> dict[int, float]:
    """The former formulation: one weighted lstsq over every row plus one heavy anchor row per
    connected component (lowest rank at 0)."""
    idx = {r: i for i, r in enumerate(ranks)}
    parent = list(range(len(ranks)))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b, _, _ in rows:
        parent[find(idx[a])] = find(idx[b])
    comps: dict[int, list[int]] = {}
    for r in ranks:
        comps.setdefault(find(idx[r]), []).append(idx[r])
    n_rows = len(rows) + len(comps)
    a_mat = np.zeros((n_rows, len(ranks)))
    rhs = np.zeros(n_rows)
    w = np.ones(n_rows)
    for i, (a, b, d, c) in enumerate(rows):
        a_mat[i, idx[b]], a_mat[i, idx[a]], rhs[i], w[i] = 1.0, -1.0, d, np.sqrt(c)
    for j, members in enumerate(comps.values()):
        a_mat[len(rows) + j, min(members)] = 1.0
        w[len(rows) + j] = 1e3
    sol, *_ = np.linalg.lstsq(a_mat * w[:, None], rhs * w, rcond=None)
    return {r: float(sol[idx[r]]) for r in ranks}


def _grid(pp: int, dp: int, seed: int, gaps: bool = False) -> tuple[list[int], list[Row], np.ndarray]:
    """PP x DP ranks: p2p rows both ways along each pipeline, collective rows along each DP group
    (as collective_rows writes them); true offsets up to 1 s, 3 µs noise, random pair counts.
    With ``gaps`` some DP links are missing, so the graph has several components."""
    rng = np.random.default_rng(seed)
    n = pp * dp
    true = rng.uniform(-1e9, 1e9, n)
    rows: list[Row] = []
    for g in range(dp):
        for s in range(pp - 1):
            a, b = g * pp + s, g * pp + s + 1
            rows.append((a, b, true[b] - true[a] + rng.normal(0, 3e3), int(rng.integers(1, 64))))
            rows.append((b, a, true[a] - true[b] + rng.normal(0, 3e3), int(rng.integers(1, 64))))
    for s in range(pp):
        for g in range(dp - 1):
            if gaps and g % 5 == 2:
                continue
            a, b = g * pp + s, (g + 1) * pp + s
            rows.append((a, b, true[b] - true[a] + rng.normal(0, 3e3), int(rng.integers(1, 64))))
    return list(range(n)), rows, true


def _assert_optimal(got: dict[int, int], rows: list[Row]) -> None:
    """The normal equations hold at every rank but the anchor: the weighted sum of its rows'
    residuals is zero, up to the rounding of offsets to whole ns (1 ns x its total weight)."""
    a = np.array([r[0] for r in rows])
    b = np.array([r[1] for r in rows])
    d = np.array([r[2] for r in rows])
    w = np.array([r[3] for r in rows], dtype=np.float64)
    x = np.array([got[i] for i in range(max(got) + 1)], dtype=np.float64)
    res = w * (x[b] - x[a] - d)
    n = len(x)
    grad = np.bincount(b, res, n) - np.bincount(a, res, n)
    tot_w = np.bincount(a, w, n) + np.bincount(b, w, n)
    assert (np.abs(grad[1:]) <= tot_w[1:] * 1.0 + 1e-6).all()


@pytest.mark.parametrize(
    ("pp", "dp", "gaps"), [(4, 1, False), (4, 2, False), (8, 4, True), (8, 40, False), (16, 24, True)]
)
def test_matches_dense_least_squares(pp: int, dp: int, gaps: bool) -> None:
    # 8 x 40 = 320 ranks: above the direct-solve size, so the conjugate-gradient path is compared too
    ranks, rows, _ = _grid(pp, dp, seed=pp * 100 + dp)
    if gaps:
        ranks, rows, _ = _grid(pp, dp, seed=pp * 100 + dp, gaps=True)
    got, n_comp = _solve(ranks, rows)
    ref = _dense_reference(ranks, rows)
    assert max(abs(got[r] - ref[r]) for r in ranks) <= 1.0
    assert n_comp >= 1 if gaps else n_comp == 1


def test_hand_built_triangle() -> None:
    # o1 - o0 = 100 (weight 1), o2 - o1 = 50 (weight 1), o2 - o0 = 180 (weight 2).
    # Minimise (x1-100)^2 + (x2-x1-50)^2 + 2(x2-180)^2 with x0 = 0:
    #   d/dx1: 2x1 - x2 = 50 ; d/dx2: -x1 + 3x2 = 410  ->  x1 = 112, x2 = 174.
    got, n_comp = _solve([0, 1, 2], [(0, 1, 100.0, 1), (1, 2, 50.0, 1), (0, 2, 180.0, 2)])
    assert got == {0: 0, 1: 112, 2: 174}
    assert n_comp == 1


def test_unlinked_ranks_keep_their_clock() -> None:
    got, n_comp = _solve([0, 1, 5, 7], [(5, 7, -42.0, 3)])
    assert got == {0: 0, 1: 0, 5: 0, 7: -42}
    assert n_comp == 3


def test_4096_ranks_fast_and_exact() -> None:
    ranks, rows, true = _grid(8, 512, seed=7)
    t0 = time.process_time()
    got, n_comp = _solve(ranks, rows)
    cpu = time.process_time() - t0
    assert n_comp == 1
    _assert_optimal(got, rows)
    # noise only: the offsets are the truth up to a random walk of 3 µs steps (~70 µs)
    err = np.array([got[r] - (true[r] - true[0]) for r in ranks])
    assert np.abs(err).max() < 300e3
    assert cpu < 1.0, f"4096-rank clock solve took {cpu:.2f} s CPU"


def test_4096_stage_chain() -> None:
    # the longest graph diameter there is: one pipeline of 4096 stages
    ranks, rows, true = _grid(4096, 1, seed=3)
    t0 = time.process_time()
    got, _ = _solve(ranks, rows)
    assert time.process_time() - t0 < 1.0
    _assert_optimal(got, rows)
    err = np.array([got[r] - (true[r] - true[0]) for r in ranks])
    assert np.abs(err).max() < 3e3 * 4096
