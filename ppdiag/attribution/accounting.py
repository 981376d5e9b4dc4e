"""Per-rank time accounting of one step window (DESIGN.md §5, first equation).

``window = compute + exposed_p2p + exposed_collective + idle``, where compute is the union of
compute, copy and memset intervals, exposed p2p the p2p time not under compute, exposed collective
the collective time under neither, and idle the rest. A NCCL kernel spinning for its peer is not
compute: its time is exposed communication, and therefore lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppdiag.attribution import intervals as ivs
from ppdiag.model import Intervals, Kind

BUSY_KINDS = (int(Kind.COMPUTE), int(Kind.MEMCPY), int(Kind.MEMSET))


@dataclass
class Account:
    """Time accounting of one rank in one window, in ns."""

    window: int
    compute: int
    exposed_p2p: int
    exposed_collective: int
    idle: int

    @property
    def lost(self) -> int:
        return self.exposed_p2p + self.exposed_collective + self.idle


@dataclass
class WindowSets:
    """The interval sets of one window, reused by the cause attribution."""

    compute: ivs.ISet
    p2p: ivs.ISet  # exposed p2p (not under compute)
    collective: ivs.ISet  # exposed collectives (under neither compute nor p2p)
    gaps: ivs.ISet  # everything not under compute: the lost time


def window_sets(iv: Intervals, offset: int, lo: int, hi: int) -> WindowSets:
    """Interval sets of ``iv`` (own clock; ``offset`` maps to the window's clock) inside ``[lo, hi)``."""
    s = iv.start + offset
    e = iv.end + offset
    near = (e > lo) & (s < hi)
    s, e, k = s[near], e[near], iv.kind[near]
    busy = np.isin(k, BUSY_KINDS)
    comp = ivs.clip(ivs.union(s[busy], e[busy]), lo, hi)
    pm = k == int(Kind.P2P)
    cm = k == int(Kind.COLLECTIVE)
    p2p = ivs.subtract(ivs.clip(ivs.union(s[pm], e[pm]), lo, hi), comp)
    coll = ivs.subtract(ivs.subtract(ivs.clip(ivs.union(s[cm], e[cm]), lo, hi), comp), p2p)
    gaps = ivs.complement(comp, lo, hi)
    return WindowSets(comp, p2p, coll, gaps)


def account(sets: WindowSets, lo: int, hi: int) -> Account:
    """The four-way split of one window."""
    window = hi - lo
    compute = ivs.measure(sets.compute)
    p2p = ivs.measure(sets.p2p)
    coll = ivs.measure(sets.collective)
    return Account(window, compute, p2p, coll, window - compute - p2p - coll)
