"""Per-rank time accounting of one step window (docs/json.md, *Time accounting*).

``window = compute + exposed_p2p + exposed_collective + exposed_copy + idle``, where compute is the
union of compute kernels, exposed p2p the p2p time not under compute, exposed collective the
collective time under neither, exposed copy the memcpy/memset time under none of them, and idle the
rest. A NCCL kernel spinning for its peer is not compute: its time is exposed communication, and
therefore lost; a copy with nothing computing beside it (a pageable host-to-device load) is lost
too. The lost time is everything not under compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.model import Intervals, Kind
from ppdiag.model import intervals as ivs

COMPUTE_KINDS = (int(Kind.COMPUTE),)
COPY_KINDS = (int(Kind.MEMCPY), int(Kind.MEMSET))
# kernels the host launches onto the GPU queue (a gap before one of them is host-bound when it
# was launched after the gap began)
BUSY_KINDS = COMPUTE_KINDS + COPY_KINDS


@dataclass
class Account:
    """Time accounting of one rank in one window, in ns."""

    window: int
    compute: int
    exposed_p2p: int
    exposed_collective: int
    idle: int
    exposed_copy: int = 0

    @property
    def lost(self) -> int:
        """Everything in the window that is not compute."""
        return self.exposed_p2p + self.exposed_collective + self.exposed_copy + self.idle


@dataclass
class WindowSets:
    """The interval sets of one window, reused by the cause attribution."""

    compute: ivs.ISet
    p2p: ivs.ISet  # exposed p2p (not under compute)
    collective: ivs.ISet  # exposed collectives (under neither compute nor p2p)
    gaps: ivs.ISet  # everything not under compute: the lost time
    copy: ivs.ISet  # copies (memcpy/memset) under none of the above


# per intervals object: its order by start, the sorted starts and the running maximum of the ends
# in that order, built once instead of per step; the entry keeps the object it was built from, so
# a reused id() never matches
_BY_START: dict[
    int, tuple[Intervals, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
] = {}
_BY_START_MAX = 256


def _by_start(iv: Intervals) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    hit = _BY_START.get(id(iv))
    if hit is not None and hit[0] is iv and hit[1].size == len(iv):
        return hit[1], hit[2], hit[3]
    order = np.argsort(iv.start, kind="stable").astype(np.int64)
    st = iv.start[order]
    reach = np.maximum.accumulate(iv.end[order]) if order.size else iv.end[order]
    if len(_BY_START) >= _BY_START_MAX:
        _BY_START.clear()
    _BY_START[id(iv)] = (iv, order, st, reach)
    return order, st, reach


def _any_of(k: npt.NDArray[np.int8], kinds: tuple[int, ...]) -> npt.NDArray[np.bool_]:
    """``np.isin(k, kinds)`` by one comparison per kind (isin sorts its inputs: slow on the small
    arrays of one step)."""
    out = np.zeros(k.shape, np.bool_)
    for x in kinds:
        out |= k == x
    return out


def window_sets(iv: Intervals, offset: int, lo: int, hi: int) -> WindowSets:
    """Interval sets of ``iv`` (own clock; ``offset`` maps to the window's clock) inside ``[lo, hi)``."""
    order, st, reach = _by_start(iv)
    # the intervals that reach into the window: binary search on the sorted starts and on the
    # running maximum of the ends (no scan of the whole rank per step)
    j0 = int(np.searchsorted(reach, lo - offset, side="right"))
    j1 = int(np.searchsorted(st, hi - offset, side="left"))
    idx = order[j0:j1]
    s = iv.start[idx] + offset
    e = iv.end[idx] + offset
    near = (e > lo) & (s < hi)
    s, e, k = s[near], e[near], iv.kind[idx][near]
    busy = _any_of(k, COMPUTE_KINDS)
    comp = ivs.clip(ivs.union(s[busy], e[busy]), lo, hi)
    pm = k == int(Kind.P2P)
    cm = k == int(Kind.COLLECTIVE)
    p2p = ivs.subtract(ivs.clip(ivs.union(s[pm], e[pm]), lo, hi), comp)
    coll = ivs.subtract(ivs.subtract(ivs.clip(ivs.union(s[cm], e[cm]), lo, hi), comp), p2p)
    cp = _any_of(k, COPY_KINDS)
    copy = ivs.clip(ivs.union(s[cp], e[cp]), lo, hi)
    if copy[0].size:
        copy = ivs.subtract(ivs.subtract(ivs.subtract(copy, comp), p2p), coll)
    gaps = ivs.complement(comp, lo, hi)
    return WindowSets(comp, p2p, coll, gaps, copy)


def account(sets: WindowSets, lo: int, hi: int) -> Account:
    """The five-way split of one window."""
    window = hi - lo
    compute = ivs.measure(sets.compute)
    p2p = ivs.measure(sets.p2p)
    coll = ivs.measure(sets.collective)
    copy = ivs.measure(sets.copy)
    return Account(window, compute, p2p, coll, window - compute - p2p - coll - copy, copy)
