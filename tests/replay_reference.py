"""The replay graph's pieces of one rank-step at a time: the reference the run-wide builder
(``ppdiag.attribution.replay_build``) is compared with in ``test_replay_build.py``.

These are the step-at-a-time functions the graph used before it built every rank-step at once:
the wait that released each block of a step (its span and the operation that held the rank) and
the split of the local time around it and inside the block.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.rank_step import RankStep
from ppdiag.attribution.replay_index import _last_waits, _P2PIndex
from ppdiag.attribution.replay_pieces import _outside_wait


class _StepWaits(NamedTuple):
    """The wait before each block of a step: whether there is one, its span, and for each block
    that has one (in block order) the operation that held the rank and whether it was queued on a
    compute stream."""

    has: npt.NDArray[np.bool_]
    start: npt.NDArray[np.int64]
    release: npt.NDArray[np.int64]
    held: list[tuple[int, int, int, int]]
    on_compute: list[bool]


class _LocalPieces(NamedTuple):
    """Per block of a step: the local time before it outside the wait (``pre`` before the wait,
    ``post`` after it) and its split, and the lost time inside the block span."""

    pre: npt.NDArray[np.int64]
    post: npt.NDArray[np.int64]
    host: npt.NDArray[np.int64]
    coll: npt.NDArray[np.int64]
    ux: npt.NDArray[np.int64]
    copy: npt.NDArray[np.int64]
    in_host: npt.NDArray[np.int64]
    in_ux: npt.NDArray[np.int64]
    in_copy: npt.NDArray[np.int64]


def _step_waits(rs: RankStep, idx: _P2PIndex, lo_a: npt.NDArray[np.int64], cpu: bool, tol: int) -> _StepWaits:
    """The wait that released each block of ``rs``: the last run of transfer time before it
    (pieces a few µs apart are one wait); earlier transfers were exposed comm."""
    s_a = rs.blocks.start.astype(np.int64)
    has_w, ws_a, rel_a = _last_waits(rs.wait_set, lo_a, s_a)
    # a "wait" no longer than the timing tolerance is rounding where a transfer touches
    # the block, not a wait: it must not make the peer's block this one's producer
    tiny = has_w & (rel_a - ws_a <= tol)
    has_w &= ~tiny
    ws_a[tiny] = s_a[tiny]
    rel_a[tiny] = s_a[tiny]
    j = np.flatnonzero(has_w)
    # every wait of the step at once: the operation that held the rank in each
    held_l = idx.blocking_many(ws_a[j], rel_a[j], tol)
    if not cpu and j.size:
        # transfers of other operations before the one that held the rank (a send on the
        # compute stream before the receive) are exposed comm, not the wait: the wait is the
        # exposed span of that operation; other transfers before or after it (a send on the
        # compute stream, a receive whose data was there) are exposed comm around the wait
        h = np.array(held_l, np.int64).reshape(-1, 4)
        found = h[:, 0] >= 0
        ws, rel = ws_a[j], rel_a[j]
        rel_n = np.maximum(np.minimum(rel, h[:, 3]), ws)
        ws_n = np.minimum(np.maximum(ws, h[:, 2]), rel_n)
        rel_a[j] = np.where(found, rel_n, rel)
        ws_a[j] = np.where(found, ws_n, ws)
    on_comp_l = idx.on_compute_many(ws_a[j], rel_a[j])
    return _StepWaits(has_w, ws_a, rel_a, held_l, on_comp_l)


def _local_pieces(rs: RankStep, lo_a: npt.NDArray[np.int64], w: _StepWaits) -> _LocalPieces:
    """Split the local time before each block (outside its wait) and the lost time inside it."""
    s_a = rs.blocks.start.astype(np.int64)
    e_a = rs.blocks.end.astype(np.int64)
    host_a, coll_a, copy_a, ux_a, in_set = _outside_wait(rs, lo_a, w.start, w.release, s_a, e_a)
    in_lost, in_copy_m, in_host_m = in_set
    in_copy = np.minimum(in_copy_m, in_lost)
    in_host = np.minimum(in_host_m, in_lost - in_copy)
    pre, post = w.start - lo_a, s_a - w.release
    return _LocalPieces(
        pre, post, host_a, coll_a, ux_a, copy_a, in_host, in_lost - in_host - in_copy, in_copy
    )
