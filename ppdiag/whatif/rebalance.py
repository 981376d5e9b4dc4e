"""The contiguous split of a model's blocks into pipeline stages that minimises the slowest stage.

Stages hold contiguous runs of blocks (layers) in model order. :func:`min_max_split` finds, among all
``C(n-1, k-1)`` ways to cut ``n`` blocks into ``k`` non-empty stages, one whose most expensive
stage is as cheap as possible — exactly, by dynamic programming over prefix sums:

    best[t][i] = min over j < i of max(best[t-1][j], cost(j..i-1))

(``best[t][i]``: the least possible slowest stage when the first ``i`` blocks fill ``t`` stages).
Each layer of the table is one vectorised numpy reduction, so 80 blocks over 8 stages take about a
millisecond and thousands of blocks stay well under a second.

Several splits usually share the optimal slowest stage. Among them the one with the smallest sum of
squared stage costs is returned (a second exact pass of the same recursion restricted to stages no
more expensive than the optimum): it also evens out the stages that do not set the pace, which
shortens the pipeline's warm-up and cool-down.

An optional per-stage limit on a second quantity (activation memory: each stage keeps a different
number of micro-batches in flight) excludes the cuts that would exceed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

_ROWS = 512  # rows of the (i, j) table evaluated at once: bounds memory at 512 x n floats


@dataclass
class Split:
    """A contiguous split: stage ``s`` holds blocks ``bounds[s] .. bounds[s+1]-1``."""

    bounds: list[int]
    stage_cost: list[float]

    @property
    def stages(self) -> int:
        return len(self.bounds) - 1

    @property
    def max_cost(self) -> float:
        return max(self.stage_cost) if self.stage_cost else 0.0

    @property
    def layers_per_stage(self) -> list[int]:
        return [b - a for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]

    def ranges(self) -> list[tuple[int, int]]:
        """``(first, last)`` block index of every stage, both inclusive."""
        return [(a, b - 1) for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)]


def split_costs(costs: Sequence[float] | F64, bounds: Sequence[int]) -> list[float]:
    """Cost of every stage of a split given by its bounds."""
    pre = np.concatenate(([0.0], np.cumsum(np.asarray(costs, dtype=np.float64))))
    b = np.asarray(bounds, dtype=np.int64)
    return [float(x) for x in pre[b[1:]] - pre[b[:-1]]]


def _check(costs: F64, k: int) -> None:
    n = int(costs.size)
    if k < 1:
        raise ValueError(f"cannot split into {k} stages")
    if n < k:
        raise ValueError(f"cannot split {n} blocks into {k} non-empty stages")
    if not np.isfinite(costs).all() or (costs < 0).any():
        raise ValueError("block costs must be finite and >= 0")


def _j_range(
    pre: F64, wpre: F64 | None, limit: float | None, bound: float | None, t: int, rows: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Smallest start j of stage t ending at each i in ``rows``: every earlier stage needs a block,
    and the stage may not exceed ``bound`` in cost nor ``limit`` in weight (both monotone in j)."""
    lo = np.full(rows.size, t, dtype=np.int64)
    if bound is not None:
        lo = np.maximum(lo, np.searchsorted(pre, pre[rows] - bound * (1 + 1e-12) - 1e-12, side="left"))
    if wpre is not None and limit is not None:
        lo = np.maximum(lo, np.searchsorted(wpre, wpre[rows] - limit * (1 + 1e-12) - 1e-12, side="left"))
    return lo


def _minmax_layer(prev: F64, pre: F64, t: int, k: int, n: int) -> tuple[F64, npt.NDArray[np.int64]]:
    """One stage more for the min-max recursion.

    For a fixed end i, ``best[t-1][j]`` grows with j and the stage cost ``pre[i] - pre[j]`` shrinks,
    so the best j sits where ``best[t-1][j] + pre[j]`` first reaches ``pre[i]`` or just before it: a
    binary search per i, done for all i at once.
    """
    cur = np.full(n + 1, np.inf)
    arg = np.full(n + 1, -1, dtype=np.int64)
    rows = np.arange(t + 1, n - (k - 1 - t) + 1, dtype=np.int64)
    if rows.size == 0:
        return cur, arg
    lo = np.full(rows.size, t, dtype=np.int64)
    hi = rows - 1
    # Without limits prev is finite and non-decreasing on [t, n-k+t] and infinite after it (no
    # stage can end there); the entries before t are never candidates.
    h = prev + pre
    h[:t] = -np.inf
    j = np.searchsorted(h, pre[rows], side="left")
    cand = []
    for jj in (j, j - 1):
        jc = np.clip(jj, lo, np.maximum(hi, lo))
        val = np.maximum(prev[jc], pre[rows] - pre[jc])
        val = np.where(lo <= hi, val, np.inf)
        cand.append((val, jc))
    take = cand[1][0] < cand[0][0]
    cur[rows] = np.where(take, cand[1][0], cand[0][0])
    arg[rows] = np.where(take, cand[1][1], cand[0][1])
    return cur, arg


def _table_layer(
    prev: F64, pre: F64, t: int, k: int, n: int, wpre: F64 | None, limit: float | None, bound: float | None
) -> tuple[F64, npt.NDArray[np.int64]]:
    """One stage more by scanning every admissible start j.

    With ``bound`` the objective is the least sum of squares among stages no more expensive than
    ``bound``; without, the least slowest stage (used when per-stage limits break the monotony the
    binary search needs). Only starts within ``bound`` (and the weight limit) of the end qualify,
    so the table is a band no wider than the longest admissible stage.
    """
    cur = np.full(n + 1, np.inf)
    arg = np.full(n + 1, -1, dtype=np.int64)
    rows_all = np.arange(t + 1, n - (k - 1 - t) + 1, dtype=np.int64)
    for r0 in range(0, rows_all.size, _ROWS):
        rows = rows_all[r0 : r0 + _ROWS]
        lo = _j_range(pre, wpre, limit, bound, t, rows)
        width = int(np.max(rows - lo)) if rows.size else 0
        if width <= 0:
            continue
        js = lo[:, None] + np.arange(width)[None, :]
        valid = js < rows[:, None]
        jc = np.minimum(js, n)
        seg = pre[rows][:, None] - pre[jc]
        val = prev[jc] + seg * seg if bound is not None else np.maximum(prev[jc], seg)
        val = np.where(valid, val, np.inf)
        a = np.argmin(val, axis=1)
        cur[rows] = val[np.arange(rows.size), a]
        arg[rows] = jc[np.arange(rows.size), a]
    return cur, arg


def _solve(costs: F64, k: int, wpre: F64 | None, limits: F64 | None, bound: float | None) -> list[int] | None:
    n = int(costs.size)
    pre = np.concatenate(([0.0], np.cumsum(costs)))
    prev = np.full(n + 1, np.inf)
    prev[0] = 0.0
    args: list[npt.NDArray[np.int64]] = []
    for t in range(k):
        lim = float(limits[t]) if limits is not None else None
        if bound is None and wpre is None:
            prev, arg = _minmax_layer(prev, pre, t, k, n)
        else:
            prev, arg = _table_layer(prev, pre, t, k, n, wpre, lim, bound)
        args.append(arg)
    if not np.isfinite(prev[n]):
        return None
    bounds = [n]
    i = n
    for t in range(k - 1, -1, -1):
        i = int(args[t][i])
        bounds.append(i)
    return bounds[::-1]


def min_max_split(
    costs: Sequence[float] | F64,
    k: int,
    weights: Sequence[float] | F64 | None = None,
    limits: Sequence[float] | F64 | None = None,
) -> Split:
    """The contiguous split of ``costs`` into ``k`` non-empty stages with the cheapest slowest stage.

    ``weights`` / ``limits`` (optional, together): stage ``s`` may only hold blocks whose weights
    sum to at most ``limits[s]`` (e.g. activation MB per micro-batch against the memory left for
    the micro-batches that stage keeps in flight). Raises ValueError when no split exists.
    """
    c = np.asarray(costs, dtype=np.float64)
    _check(c, k)
    wpre: F64 | None = None
    lim: F64 | None = None
    if weights is not None and limits is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != c.shape:
            raise ValueError("weights need one value per block")
        lim = np.asarray(limits, dtype=np.float64)
        if lim.shape != (k,):
            raise ValueError(f"limits need one value per stage ({k})")
        wpre = np.concatenate(([0.0], np.cumsum(np.nan_to_num(w, nan=0.0))))
    first = _solve(c, k, wpre, lim, None)
    if first is None:
        raise ValueError("no split satisfies the per-stage limit")
    best = max(split_costs(c, first))
    # second pass: least sum of squares among the splits whose slowest stage is optimal
    tol = best * 1e-12 + 1e-9
    second = _solve(c, k, wpre, lim, best + tol)
    bounds = second if second is not None else first
    return Split(bounds, split_costs(c, bounds))


def even_split(n: int, k: int) -> list[int]:
    """Bounds of the split with equal block counts (the first ``n % k`` stages get one more)."""
    if n < k or k < 1:
        raise ValueError(f"cannot split {n} blocks into {k} non-empty stages")
    q, r = divmod(n, k)
    sizes = [q + (1 if s < r else 0) for s in range(k)]
    return [0, *np.cumsum(sizes).tolist()]


def continuous_balance(unit_costs: Sequence[float] | F64, k: int) -> list[float]:
    """Fractional bounds that give ``k`` stages of exactly equal cost when every unit's cost is spread
    evenly over it (the ideal a split at block granularity approaches)."""
    c = np.asarray(unit_costs, dtype=np.float64)
    pre = np.concatenate(([0.0], np.cumsum(c)))
    targets = pre[-1] * np.arange(k + 1) / k
    x = np.interp(targets, pre, np.arange(c.size + 1, dtype=np.float64))
    x[0], x[-1] = 0.0, float(c.size)
    return [float(v) for v in x]


__all__ = ["Split", "continuous_balance", "even_split", "min_max_split", "split_costs"]
