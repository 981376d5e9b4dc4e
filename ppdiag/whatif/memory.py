"""Activation memory of a schedule: micro-batches (chunks) in flight per rank, from the simulated
block order."""

from __future__ import annotations

from ppdiag.simulate import rank_orders
from ppdiag.simulate.schedules import B, F, I
from ppdiag.whatif.types import F64


def rank_peaks(sched: str, pp: int, m: int, v: int, act: F64) -> tuple[int, float]:
    """(max chunk-micro-batches held by any rank, max weighted activations of any rank) over time.

    Activations of a micro-batch live from its forward until its (input-gradient) backward.
    """
    orders = rank_orders(sched, pp, m, v)
    peak_n, peak_w = 0, 0.0
    for order in orders:
        n, w = 0, 0.0
        for a in order:
            if a.op == F:
                n += 1
                w += float(act[a.stage])
                peak_n = max(peak_n, n)
                peak_w = max(peak_w, w)
            elif a.op in (B, I):
                n -= 1
                w -= float(act[a.stage])
    return peak_n, peak_w


def _chunk_inflight(sched: str, pp: int, m: int, v: int) -> list[int]:
    """Peak micro-batches each chunk (virtual stage) holds activations for, from the block order."""
    orders = rank_orders(sched, pp, m, v)
    n_st = pp * v
    peak = [0] * n_st
    for order in orders:
        cnt = [0] * n_st
        for a in order:
            if a.op == F:
                cnt[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], cnt[a.stage])
            elif a.op in (B, I):
                cnt[a.stage] -= 1
    return peak
