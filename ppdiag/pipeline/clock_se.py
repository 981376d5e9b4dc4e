"""How well a fitted clock offset is known: the standard error of each host's offset against the
reference host (docs/clocks.md, "How well an offset is known").

The residual of a host is how far its offset may be off at worst (host ops: ``clock_bounds``;
devices: the spread of its ranks' fits). A decision that compares times across two hosts (was
the consumer already waiting when the producer issued? is this link slower than the others?)
needs what the offset is typically off by instead: the standard error of the estimate that placed
it, from the spread of the transfers that placed it over the root of their count, never more than
the residual. Within a host it is 0; between two hosts it is the two hosts' errors in quadrature.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import numpy.typing as npt

_IQR_SIGMA = 1.349  # a normal spread's interquartile range in standard deviations


def mean_se(v: npt.NDArray[np.float64]) -> float:
    """The standard error of a location placed by the values ``v``: their robust standard
    deviation (interquartile range over 1.349, so that a few descheduled transfers do not widen
    it) over the root of their count; 0 for no value."""
    if v.size < 2:
        return 0.0
    q1, q3 = np.quantile(v, (0.25, 0.75))
    return float(q3 - q1) / _IQR_SIGMA / math.sqrt(v.size)


def quantile_se(v: npt.NDArray[np.float64], p: float) -> float:
    """The standard error of the ``p`` quantile of the values ``v``: half the distance between the
    quantiles one binomial standard deviation either side of ``p`` (``sqrt(p (1 - p) / n)``), the
    order statistics that bracket it with 68 % confidence, whatever the values' distribution.
    A quartile of waited receives' one-way times sits where they crowd (the transfer latency)
    while receives that ended behind queued ops spread far above: their interquartile range
    (:func:`mean_se`) is the tail's width, not how well the quartile is known. 0 for no value."""
    if v.size < 2:
        return 0.0
    d = math.sqrt(p * (1.0 - p) / v.size)
    lo, hi = np.quantile(v, (max(p - d, 0.0), min(p + d, 1.0)))
    return float(hi - lo) / 2.0


def host_errors(n_hosts: int, pair_se: dict[tuple[int, int], float]) -> list[float | None]:
    """Each host's standard error against host 0 (the reference, 0) from the standard errors of
    the pairs of hosts that were fitted together: along the path of least accumulated variance
    (errors of the pairs along a path add in quadrature: a shortest path over the variances).
    None for a host no fitted pair reaches. Linear in the pairs (a heap over the hosts)."""
    adj: dict[int, list[tuple[int, float]]] = {}
    for (a, b), se in pair_se.items():
        adj.setdefault(a, []).append((b, se * se))
        adj.setdefault(b, []).append((a, se * se))
    var: list[float | None] = [None] * n_hosts
    heap = [(0.0, 0)]
    while heap:
        v, h = heapq.heappop(heap)
        cur = var[h]
        if cur is not None and cur <= v:
            continue
        var[h] = v
        for nb, w in adj.get(h, []):
            got = var[nb]
            if got is None or v + w < got:
                heapq.heappush(heap, (v + w, nb))
    return [None if x is None else math.sqrt(x) for x in var]


def capped(se: float | None, residual_ns: float | None) -> int | None:
    """``se`` never above the residual (the offset lies within it); None when either is unknown
    and the residual is (a clock that nothing placed), the residual when only the error is."""
    if residual_ns is None:
        return None
    if se is None:
        return round(residual_ns)
    return round(min(se, residual_ns))


__all__ = ["capped", "host_errors", "mean_se", "quantile_se"]
