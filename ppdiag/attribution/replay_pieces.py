"""The pieces of one rank-step's blocks that the replay graph reads (docs/json.md): the wait that
released each block (its span and the operation that held the rank) and the split of the local
time around it and inside the block, every block of the step at once.

The graph builds these for every rank-step of the run at once (:mod:`replay_build`), with
:func:`span_measures` for the split; :func:`_outside_wait` splits one rank-step's gaps the same way
(a gap that turned out to be no wait)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.rank_step import RankStep
from ppdiag.model import intervals as ivs

_I64 = npt.NDArray[np.int64]


def span_measures(iset: ivs.ISet, t: _I64) -> tuple[_I64, _I64, _I64]:
    """The measure of ``iset`` in ``[lo, ws]``, ``[rel, s]`` and ``[s, e]`` of each block, where
    ``t`` is ``lo, ws, rel, s, e`` concatenated (n each); 0 for an empty or reversed span. One
    prefix measure at every bound at once (one search per set instead of one per span)."""
    n = t.size // 5
    if iset[0].size == 0 or n == 0:
        z = np.zeros(n, np.int64)
        return z, z, z
    lo, ws, rel, s, e = (t[k * n : (k + 1) * n] for k in range(5))
    p = ivs.prefix_measure(iset, t)
    p_lo, p_ws, p_rel, p_s, p_e = (p[k * n : (k + 1) * n] for k in range(5))
    return (
        np.where(ws > lo, p_ws - p_lo, 0),
        np.where(s > rel, p_s - p_rel, 0),
        np.where(e > s, p_e - p_s, 0),
    )


def _outside_wait(
    rs: RankStep, lo_a: _I64, ws_a: _I64, rel_a: _I64, s_a: _I64, e_a: _I64
) -> tuple[_I64, _I64, _I64, _I64, tuple[_I64, _I64, _I64]]:
    """(host, coll, copy, other) of the local time ``[lo, ws] + [rel, s]`` before each block: the
    time between the rank's previous work and the block outside the wait ``[ws, rel]``; and the
    (lost, copy, host) time inside each block ``[s, e]``. Each set's prefix measure is taken at
    every bound at once (one search per set instead of one per span; the same numbers as
    :func:`_measure_between` span by span)."""
    sets = rs.sets
    t = np.concatenate([lo_a, ws_a, rel_a, s_a, e_a])

    def spans(iset: ivs.ISet) -> tuple[_I64, _I64, _I64]:
        return span_measures(iset, t)

    ph0, ph1, _ = spans(rs.p2p_host)
    h0, h1, h_in = spans(rs.host_set)
    c0, c1, _ = spans(sets.collective)
    q0, q1, _ = spans(sets.p2p)
    k0, k1, k_in = spans(sets.copy)
    g0, g1, g_in = spans(sets.gaps)
    p2p_host = ph0 + ph1
    host_a = h0 + h1 + p2p_host
    coll_a = c0 + c1 + q0 + q1 - p2p_host
    copy_a = k0 + k1
    lost_a = g0 + g1
    return host_a, coll_a, copy_a, np.maximum(lost_a - host_a - coll_a - copy_a, 0), (g_in, k_in, h_in)
