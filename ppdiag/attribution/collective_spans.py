"""How much of several interval sets lies between pairs of times, for many (rank, step) sets at
once: the sets laid end to end on a :class:`~ppdiag.model.interval_groups.Line` (one group per
rank-step, spanning its window), one prefix measure per kind of set for all the queries.

A set lies inside its window, so a query time outside the window measures as the window's edge
does: the times are clamped into the window, then placed on the line, where the difference of two
prefix measures of the same group is that group's measure between them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ppdiag.model import intervals as ivs
from ppdiag.model.interval_groups import Line

Arr = npt.NDArray[np.int64]


class SpanMeasures:
    """Sets of kinds (e.g. compute, host, comm) of G groups with windows ``[w0, w1]`` on one line.

    ``SpanMeasures.of`` is None when some set strays outside its window (the per-set measure is
    then the only exact one)."""

    def __init__(self, line: Line, kinds: list[ivs.ISet]) -> None:
        self.line = line
        self.kinds = kinds

    @classmethod
    def of(cls, w0: Arr, w1: Arr, kinds: Sequence[Sequence[ivs.ISet]]) -> SpanMeasures | None:
        """``kinds[j][g]``: the j-th kind of set of group g (sorted, disjoint, own clock)."""
        if bool((w1 < w0).any()):
            return None
        try:
            line = Line.of(w0, w1)
        except OverflowError:  # windows too long to lay end to end on one int64 line
            return None
        placed = []
        for sets in kinds:
            got = cls._place(line, sets)
            if got is None:
                return None
            placed.append(got)
        return cls(line, placed)

    @staticmethod
    def _place(line: Line, sets: Sequence[ivs.ISet]) -> ivs.ISet | None:
        g = np.repeat(np.arange(len(sets), dtype=np.int64), [s.size for s, _ in sets])
        s = np.concatenate([x for x, _ in sets]).astype(np.int64) if sets else np.zeros(0, np.int64)
        e = np.concatenate([x for _, x in sets]).astype(np.int64) if sets else np.zeros(0, np.int64)
        if not bool(((s >= line.lo[g]) & (e <= line.hi[g])).all()):
            return None
        return line.put(g, s), line.put(g, e)

    def clipped(self, sets: Sequence[ivs.ISet]) -> ivs.ISet:
        """Each group's set clipped to its window, on the line (sorted, disjoint)."""
        line = self.line
        g = np.repeat(np.arange(len(sets), dtype=np.int64), [s.size for s, _ in sets])
        s = np.concatenate([x for x, _ in sets]).astype(np.int64) if sets else np.zeros(0, np.int64)
        e = np.concatenate([x for _, x in sets]).astype(np.int64) if sets else np.zeros(0, np.int64)
        s, e = np.maximum(s, line.lo[g]), np.minimum(e, line.hi[g])
        keep = e > s
        return ivs.union(line.put(g[keep], s[keep]), line.put(g[keep], e[keep]))

    def between(self, iset: ivs.ISet, group: Arr, a: Arr, b: Arr) -> Arr:
        """Measure of ``iset`` (on the line) between ``a`` and ``b`` (own clock) of each query's
        group: ``P(b) - P(a)`` with ``P`` the measure before a time, as the per-set code takes it."""
        line = self.line
        lo, hi = line.lo[group], line.hi[group]
        pa = line.put(group, np.minimum(np.maximum(a, lo), hi))
        pb = line.put(group, np.minimum(np.maximum(b, lo), hi))
        out: Arr = ivs.prefix_measure(iset, pb) - ivs.prefix_measure(iset, pa)
        return out


__all__ = ["SpanMeasures"]
