"""Many interval sets at once: the sets of G groups (e.g. every step of a rank) laid end to end on
one number line, so that one call of :mod:`ppdiag.model.intervals` works on all of them.

Group ``g`` owns the span ``[lo[g], hi[g]]`` of its own clock; on the line it becomes
``[off[g], off[g] + hi[g] - lo[g]]``, with one unit of empty line between consecutive groups. Sets
of different groups then never overlap nor touch, so a union, subtraction or intersection on the
line is the per-group operation done G times, and the results are the same canonical sets (sorted,
disjoint, touching pieces merged) the per-set functions give. Only what reads a group's own bounds
(clip, complement) or reports per group (measure, split) needs the group of each piece, which is a
binary search on ``off``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.model import intervals as ivs

Arr = npt.NDArray[np.int64]

# the line must not overflow int64 while the sweeps add and subtract positions on it
_LINE_MAX = 1 << 62


@dataclass(frozen=True)
class Line:
    """The groups' spans ``[lo, hi]`` laid end to end (``off``: where each group begins)."""

    lo: Arr
    hi: Arr
    off: Arr
    shift: Arr = field(init=False, repr=False, compare=False)  # off - lo

    def __post_init__(self) -> None:
        # ``put`` and ``time_of`` gather one array per call instead of two (int64 sums wrap alike
        # in either order, so the positions are the very same)
        object.__setattr__(self, "shift", self.off - self.lo)

    @classmethod
    def of(cls, lo: npt.ArrayLike, hi: npt.ArrayLike) -> Line:
        """The line of groups spanning ``[lo[g], hi[g]]`` (an empty or reversed span keeps one
        unit, so that every group has a place)."""
        lo_a = np.asarray(lo, dtype=np.int64)
        hi_a = np.maximum(np.asarray(hi, dtype=np.int64), lo_a)
        width = hi_a - lo_a + 1
        if lo_a.size and int(width.max()) > _LINE_MAX // max(lo_a.size, 1):
            raise OverflowError("the groups' spans do not fit on one int64 line")
        off = np.zeros(lo_a.size, np.int64)
        if lo_a.size > 1:
            np.cumsum(width[:-1], out=off[1:])
        return cls(lo_a, hi_a, off)

    def __len__(self) -> int:
        return int(self.lo.shape[0])

    def put(self, group: npt.ArrayLike, t: npt.ArrayLike) -> Arr:
        """Times ``t`` of groups ``group`` (inside their spans) as positions on the line."""
        g = np.asarray(group, dtype=np.int64)
        out: Arr = np.asarray(t, dtype=np.int64) + self.shift[g]
        return out

    def group_of(self, x: Arr) -> Arr:
        """The group of each position on the line."""
        # (sorted positions, a set's starts or ends, at least as many as the groups: one merge)
        return ivs.search_sorted(self.off, x) - 1

    def time_of(self, x: Arr, group: Arr | None = None) -> Arr:
        """Positions on the line back on their group's own clock."""
        g = self.group_of(x) if group is None else group
        out: Arr = x - self.shift[g]
        return out

    def spans(self) -> ivs.ISet:
        """Every group's whole span ``[lo, hi)`` as one set on the line."""
        return ivs.union(self.off, self.off + (self.hi - self.lo))

    def clip(self, iset: ivs.ISet, lo: Arr, hi: Arr) -> ivs.ISet:
        """The part of each group's set inside the group's own ``[lo[g], hi[g])``."""
        s, e = iset
        if s.size == 0:
            return ivs.empty()
        g = self.group_of(s)
        cs = np.maximum(s, self.put(g, np.maximum(lo[g], self.lo[g])))
        ce = np.minimum(e, self.put(g, np.minimum(hi[g], self.hi[g])))
        keep = ce > cs
        return cs[keep], ce[keep]

    def complement(self, iset: ivs.ISet) -> ivs.ISet:
        """The gaps of each group's set inside the group's span ``[lo, hi)``."""
        return ivs.subtract(self.spans(), iset)

    def measure(self, iset: ivs.ISet) -> Arr:
        """The measure of each group's part of a disjoint set (one entry per group)."""
        s, e = iset
        cum = np.zeros(s.size + 1, np.int64)
        np.cumsum(e - s, out=cum[1:])
        cut = np.searchsorted(s, self.off, side="left")
        ends = np.r_[cut[1:], s.size]
        out: Arr = cum[ends] - cum[cut]
        return out

    def bounds(self, iset: ivs.ISet) -> Arr:
        """Where each group's pieces begin in a sorted set (G + 1 cuts)."""
        out: Arr = np.r_[np.searchsorted(iset[0], self.off, side="left"), iset[0].size].astype(np.int64)
        return out

    def split(self, iset: ivs.ISet) -> list[ivs.ISet]:
        """Each group's part of a sorted set, on the group's own clock."""
        s, e = iset
        g = self.group_of(s)
        ts, te = self.time_of(s, g), self.time_of(e, g)
        cut = self.bounds(iset)
        return [(ts[a:b], te[a:b]) for a, b in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True)]


def union_of(*sets: ivs.ISet) -> ivs.ISet:
    """The union of several sets on one line."""
    return ivs.union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


__all__ = ["Line", "union_of"]
