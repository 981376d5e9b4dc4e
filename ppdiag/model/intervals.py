"""Vectorized interval algebra on sorted int64 arrays (union, clip, subtract, measure).

An interval set is a pair ``(starts, ends)`` of int64 arrays, sorted and non-overlapping after
:func:`union`. Everything here is numpy; no per-interval Python loop.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

Arr = npt.NDArray[np.int64]
ISet = tuple[Arr, Arr]


def empty() -> ISet:
    z = np.zeros(0, dtype=np.int64)
    return z, z.copy()


def sorted_unique(x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``np.unique`` of an int64 array by a sort (numpy's hash-based unique is several times
    slower on the million points of a large run). Points that come as a few concatenated sorted
    runs (one per set) the stable sort (timsort) merges in near-linear time: a quicksort of the
    four million points of a 128-step nsys run costs thirty times more."""
    a = np.sort(x, kind="stable")
    if a.size < 2:
        return a
    keep = np.empty(a.size, np.bool_)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def search_sorted(
    a: npt.NDArray[np.int64], v: npt.NDArray[np.int64], side: Literal["left", "right"] = "right"
) -> npt.NDArray[np.int64]:
    """``np.searchsorted(a, v, side)`` as int64, in one merge when ``v`` is sorted too and not
    shorter than ``a`` (the compute in start order, the cuts among it): each element of ``a`` is
    placed among the ``v`` instead, and ``v[i]`` counts the elements placed at or before ``i``."""
    if v.size > 1 and a.size <= v.size and _ascending(v) and _ascending(a):
        first = np.searchsorted(v, a, side="left" if side == "right" else "right")
        return np.cumsum(np.bincount(first, minlength=v.size + 1)[: v.size]).astype(np.int64)
    return np.searchsorted(a, v, side=side).astype(np.int64)


def _ascending(x: npt.NDArray[np.int64]) -> bool:
    return bool((x[1:] >= x[:-1]).all())


def union(starts: npt.ArrayLike, ends: npt.ArrayLike) -> ISet:
    """Merge possibly overlapping intervals into a sorted disjoint set (touching ones merge)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    if s.size == 0:
        return empty()
    if s.size > 1 and not (s[1:] >= s[:-1]).all():  # a stable sort of sorted starts is the identity
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # A new merged interval begins where the start lies beyond every earlier end.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], run_end[:-1], out=new[1:])
    idx = np.flatnonzero(new)
    last = np.empty_like(idx)  # the last interval of each merged run
    last[:-1] = idx[1:] - 1
    last[-1] = s.size - 1
    return s[idx], run_end[last]


def measure(iset: ISet) -> int:
    s, e = iset
    return int((e - s).sum()) if s.size else 0


def clip(iset: ISet, lo: int, hi: int) -> ISet:
    """The part of a disjoint set inside ``[lo, hi)``."""
    s, e = iset
    if s.size == 0 or hi <= lo:
        return empty()
    cs = np.maximum(s, lo)
    ce = np.minimum(e, hi)
    keep = ce > cs
    return cs[keep], ce[keep]


def subtract(a: ISet, b: ISet) -> ISet:
    """``a`` minus ``b`` for disjoint sorted sets."""
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0 or b_s.size == 0:
        return a_s.copy(), a_e.copy()
    if (a_e >= a_s).all() and (b_e >= b_s).all() and (b_s.size == 1 or (b_s[1:] >= b_e[:-1]).all()):
        return _subtract_gaps(a_s, a_e, b_s, b_e)
    return _subtract_sweep(a_s, a_e, b_s, b_e)


_MIN, _MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _subtract_gaps(a_s: Arr, a_e: Arr, b_s: Arr, b_e: Arr) -> ISet:
    """:func:`subtract` where ``b`` is sorted and disjoint: each interval of ``a`` cut by the gaps
    of ``b`` it meets (two binary searches per interval of ``a``), then merged by :func:`union`,
    which gives the sweep's set in the same canonical form. About half the sweep's cost on a
    million intervals (the sweep sorts and scans every boundary of both sets)."""
    nb = b_s.size
    g_s = np.empty(nb + 1, np.int64)  # the gaps of b: (-inf, b_s[0]), (b_e[k], b_s[k+1]), (b_e[-1], inf)
    g_s[0] = _MIN
    g_s[1:] = b_e
    g_e = np.empty(nb + 1, np.int64)
    g_e[:-1] = b_s
    g_e[-1] = _MAX
    lo = np.searchsorted(g_e, a_s, side="right")  # the first gap ending after the interval starts
    hi = np.searchsorted(g_s, a_e, side="left")  # past the last gap starting before it ends
    cnt = hi - lo
    np.maximum(cnt, 0, out=cnt)
    if (cnt == 1).all():  # each interval meets one gap (the common case): no expansion
        return union(np.maximum(a_s, g_s[lo]), np.minimum(a_e, g_e[lo]))
    rep = np.repeat(np.arange(a_s.size), cnt)
    first = np.cumsum(cnt) - cnt
    k = lo[rep] + (np.arange(rep.size) - first[rep])
    return union(np.maximum(a_s[rep], g_s[k]), np.minimum(a_e[rep], g_e[k]))


def _subtract_sweep(a_s: Arr, a_e: Arr, b_s: Arr, b_e: Arr) -> ISet:
    """:func:`subtract` by a sweep on the merged boundaries (any input)."""
    # Boundaries of b inside each a interval, via a sweep on a merged event list.
    pts = np.concatenate([a_s, a_e, b_s, b_e])
    na, nb = a_s.size, b_s.size
    delta_a = np.zeros(pts.size, np.int64)
    delta_a[:na] = 1
    delta_a[na : 2 * na] = -1
    delta_b = np.zeros(pts.size, np.int64)
    delta_b[2 * na : 2 * na + nb] = 1
    delta_b[2 * na + nb :] = -1
    order = np.argsort(pts, kind="stable")
    pts = pts[order]
    ca = np.cumsum(delta_a[order])
    cb = np.cumsum(delta_b[order])
    inside = (ca > 0) & (cb <= 0)
    seg_s = pts[:-1][inside[:-1]]
    seg_e = pts[1:][inside[:-1]]
    keep = seg_e > seg_s
    return union(seg_s[keep], seg_e[keep])


def intersect(a: ISet, b: ISet) -> ISet:
    """Intersection of two disjoint sorted sets."""
    return subtract(a, subtract(a, b))


def complement(iset: ISet, lo: int, hi: int) -> ISet:
    """The gaps of a disjoint set inside ``[lo, hi)``."""
    full = (np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64))
    return subtract(full, clip(iset, lo, hi))


def window(iset: ISet, lo: int, hi: int) -> ISet:
    """:func:`clip` for a sorted disjoint set in O(log n + k): only the k intervals that reach into
    ``[lo, hi)`` are touched (binary search on the ends and starts)."""
    s, e = iset
    if s.size == 0 or hi <= lo:
        return empty()
    i0 = int(np.searchsorted(e, lo, side="right"))
    i1 = int(np.searchsorted(s, hi, side="left"))
    if i1 <= i0:
        return empty()
    cs = np.maximum(s[i0:i1], lo)
    ce = np.minimum(e[i0:i1], hi)
    keep = ce > cs
    return cs[keep], ce[keep]


def measure_in(iset: ISet, lo: int, hi: int) -> int:
    """``measure(clip(iset, lo, hi))`` for a sorted disjoint set in O(log n + k)."""
    s, e = iset
    if s.size == 0 or hi <= lo:
        return 0
    i0 = int(np.searchsorted(e, lo, side="right"))
    i1 = int(np.searchsorted(s, hi, side="left"))
    if i1 <= i0:
        return 0
    return int(np.maximum(np.minimum(e[i0:i1], hi) - np.maximum(s[i0:i1], lo), 0).sum())


def prefix_measure(iset: ISet, t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Measure of a sorted disjoint set before each time in ``t`` (binary search and prefix sums:
    one pass for any number of query times)."""
    s, e = iset
    if s.size == 0:
        return np.zeros(t.shape, np.int64)
    if t.dtype != np.int64:
        lens = e - s
        return _prefix_at(s, lens, np.concatenate([[0], np.cumsum(lens)]), t)
    # the set padded in front by a piece of no length at its first start: the piece before each
    # time is then the search's own index (a time before the set finds the pad and measures 0),
    # with no test and no select over the times
    n = s.size
    s_p = np.empty(n + 1, np.int64)
    s_p[0] = s[0]
    s_p[1:] = s
    l_p = np.zeros(n + 1, np.int64)
    np.subtract(e, s, out=l_p[1:])
    b_p = np.zeros(n + 1, np.int64)  # the measure before each piece of the padded set
    np.cumsum(l_p[1:-1], out=b_p[2:])
    if t.ndim == 1 and t.size > PREFIX_CHUNK:
        # a chunk of the times at a time: the search's temporaries (~4 arrays the size of the
        # times) stay bounded where a run's millions of block bounds are measured at once
        out = np.empty(t.size, np.int64)
        for a in range(0, t.size, PREFIX_CHUNK):
            out[a : a + PREFIX_CHUNK] = _prefix_padded(s, s_p, l_p, b_p, t[a : a + PREFIX_CHUNK])
        return out
    return _prefix_padded(s, s_p, l_p, b_p, t)


# query times per pass of :func:`prefix_measure`
PREFIX_CHUNK = 1 << 20


def _prefix_padded(s: Arr, s_p: Arr, l_p: Arr, b_p: Arr, t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """:func:`_prefix_at` of int64 times on the padded set: the same numbers (a time at or after
    piece ``k``'s start measures ``before[k] + min(t - s[k], len[k])``, both terms non-negative;
    one before the set the pad's ``max(min(t - s[0], 0), 0) = 0``) in four passes, not nine."""
    j = np.searchsorted(s, t, side="right")
    d: npt.NDArray[np.int64] = t - s_p[j]
    np.minimum(d, l_p[j], out=d)
    np.maximum(d, 0, out=d)
    d += b_p[j]
    return d


def _prefix_at(s: Arr, lens: Arr, before: Arr, t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    k = np.searchsorted(s, t, side="right") - 1
    kc = np.maximum(k, 0)
    # np.clip's wrapper costs more than the work on the small arrays of one step
    inside = np.minimum(np.maximum(t - s[kc], 0), lens[kc])
    return np.where(k >= 0, before[kc] + inside, 0).astype(np.int64)
