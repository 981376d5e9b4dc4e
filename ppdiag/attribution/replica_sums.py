"""What each replica's ranks had done by given times in one step, for the replica comparison of
collective waits (:func:`ppdiag.attribution.collective_waits._replica_excess`): for every query,
the host-stall time since the window began and the compute of the blocks finished, summed over
the ranks of the queried (replica, step). All rank-steps at once: the rank-steps' sets are laid
one after another and each query is answered in its own rank-step's part by one sort."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ppdiag.model import intervals as ivs

Arr = npt.NDArray[np.int64]


class _SetLike(Protocol):
    rank: int
    step: int
    w0: int
    host: ivs.ISet
    block_end: Arr
    block_busy_cum: Arr


def count_le(vals: Arr, vseg: Arr, q: Arr, qseg: Arr) -> Arr:
    """For each query ``q[j]``, how many values of its own segment ``qseg[j]`` are <= it (what
    ``np.searchsorted(segment, q, side="right")`` gives). ``vals`` are sorted within each segment
    and ``vseg`` (the segment of each value) is non-decreasing."""
    n = vals.size
    # values before queries at equal (segment, time): a value equal to the query counts
    kind = np.r_[np.zeros(n, np.int8), np.ones(q.size, np.int8)]
    o = np.lexsort((kind, np.r_[vals, q], np.r_[vseg, qseg]))
    cum = np.cumsum(o < n)
    pos = np.empty(o.size, np.int64)
    pos[o] = np.arange(o.size)
    out: Arr = cum[pos[n:]] - np.searchsorted(vseg, qseg, side="left")
    return out


def prefix_measures(s: Arr, e: Arr, seg: Arr, qseg: Arr, t: Arr) -> Arr:
    """:func:`ppdiag.model.intervals.prefix_measure` of segment ``qseg[j]``'s set before ``t[j]``
    for every query at once (the sets back to back, each sorted and disjoint)."""
    if s.size == 0:
        return np.zeros(t.shape, np.int64)
    k = count_le(s, seg, t, qseg) - 1
    first = np.searchsorted(seg, qseg, side="left")
    kc = np.minimum(first + np.maximum(k, 0), s.size - 1)
    lens = e - s
    before = np.zeros(s.size + 1, np.int64)
    np.cumsum(lens, out=before[1:])
    inside = np.minimum(np.maximum(t - s[kc], 0), lens[kc])
    out: Arr = np.where(k >= 0, before[kc] - before[np.minimum(first, s.size)] + inside, 0).astype(np.int64)
    return out


def replica_sums(
    sets: Sequence[_SetLike], lut: Arr, n_step: int, k_sorted: Arr, order: Arr, q_t: Arr, tol_ns: int
) -> tuple[Arr, Arr]:
    """(compute, host stall) per query: query ``order[j]`` asks the ranks of key ``k_sorted[j]``
    (replica * ``n_step`` + step; ``lut``: the replica of each rank) what they had done by
    ``q_t``. A block that ends within ``tol_ns`` after the query counts as finished."""
    n_lut = lut.size
    if not sets or n_lut == 0:
        return np.zeros(q_t.size, np.int64), np.zeros(q_t.size, np.int64)
    rank = np.array([rs.rank for rs in sets], np.int64)
    step = np.array([rs.step for rs in sets], np.int64)
    w0 = np.array([rs.w0 for rs in sets], np.int64)
    p = np.where(rank < n_lut, lut[np.minimum(rank, n_lut - 1)], -1)
    key = p * n_step + step
    a = np.searchsorted(k_sorted, key, side="left")
    c = np.where(p >= 0, np.searchsorted(k_sorted, key, side="right") - a, 0)
    # one row per (rank-step, query of its key)
    ps = np.repeat(np.arange(len(sets), dtype=np.int64), c)
    pq = order[np.arange(ps.size, dtype=np.int64) + np.repeat(a - (np.cumsum(c) - c), c)]
    t = np.maximum(q_t[pq], w0[ps])
    hn = np.array([rs.host[0].size for rs in sets], np.int64)
    hseg = np.repeat(np.arange(len(sets), dtype=np.int64), hn)
    hs = np.concatenate([rs.host[0] for rs in sets]).astype(np.int64)
    he = np.concatenate([rs.host[1] for rs in sets]).astype(np.int64)
    host_add = prefix_measures(hs, he, hseg, ps, t) - prefix_measures(hs, he, hseg, ps, w0[ps])
    bn = np.array([rs.block_end.size for rs in sets], np.int64)
    bseg = np.repeat(np.arange(len(sets), dtype=np.int64), bn)
    be = np.concatenate([rs.block_end for rs in sets]).astype(np.int64)
    cum = np.concatenate([rs.block_busy_cum for rs in sets]).astype(np.int64)
    cum_at = np.cumsum(bn + 1) - (bn + 1)  # where each rank-step's running sums begin
    comp_add = cum[cum_at[ps] + count_le(be, bseg, t + tol_ns, ps)]
    comp = np.zeros(q_t.size, np.int64)
    host = np.zeros(q_t.size, np.int64)
    np.add.at(comp, pq, comp_add)
    np.add.at(host, pq, host_add)
    return comp, host


__all__ = ["count_le", "prefix_measures", "replica_sums"]
