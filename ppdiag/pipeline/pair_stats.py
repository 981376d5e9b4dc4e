"""Per-pair lookups and per-group medians over the matched transfers as arrays (no Python step
per transfer): the clock fit reads a rank's offset for every transfer and a median per link or
per rank.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt


def offsets_of(offsets: Mapping[int, int], ranks: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """``offsets[r]`` for every r of ``ranks`` (KeyError for a rank without an offset)."""
    keys = np.array(sorted(offsets), dtype=np.int64)
    vals = np.array([offsets[int(k)] for k in keys.tolist()], dtype=np.int64)
    r = np.asarray(ranks, dtype=np.int64)
    if keys.size == 0:
        if r.size:
            raise KeyError(int(r[0]))
        return np.zeros(0, np.int64)
    i = np.minimum(np.searchsorted(keys, r), keys.size - 1)
    miss = keys[i] != r
    if miss.any():
        raise KeyError(int(r[np.flatnonzero(miss)[0]]))
    out: npt.NDArray[np.int64] = vals[i]
    return out


def group_medians(
    key: npt.NDArray[np.int64], values: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per distinct key (ascending): the key, ``np.median`` of its values (the same float: the
    mean of the two middle values on an even count), the count, and the index of its first value
    in the input order."""
    o = np.lexsort((values, key))
    ks, vs = key[o], values[o]
    if ks.size == 0:
        z = np.zeros(0, np.int64)
        return z, np.zeros(0, np.float64), z.copy(), z.copy()
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    counts = np.diff(np.r_[starts, ks.size]).astype(np.int64)
    lo = vs[starts + (counts - 1) // 2].astype(np.float64)
    hi = vs[starts + counts // 2].astype(np.float64)
    med = np.where(counts % 2 == 1, lo, (lo + hi) / 2)
    # the first value of each key in input order: the smallest original index in its run
    first = np.minimum.reduceat(o, starts).astype(np.int64)
    return ks[starts].astype(np.int64), med, counts, first


__all__ = ["group_medians", "offsets_of"]
