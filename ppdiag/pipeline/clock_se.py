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

from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.send_holds import MIN_WAITED, WAITED_NS, same_host

_IQR_SIGMA = 1.349  # a normal spread's interquartile range in standard deviations


def mean_se(v: npt.NDArray[np.float64]) -> float:
    """The standard error of a location placed by the values ``v``: their robust standard
    deviation (interquartile range over 1.349, so that a few descheduled transfers do not widen
    it) over the root of their count; 0 for no value."""
    if v.size < 2:
        return 0.0
    q1, q3 = np.quantile(v, (0.25, 0.75))
    return float(q3 - q1) / _IQR_SIGMA / math.sqrt(v.size)


def known_clock_error(pairs: Pairs, dom: dict[int, str], holds: npt.NDArray[np.float64]) -> float | None:
    """How far the offset's placement (the middle of the waited receives' one-way times both ways,
    :func:`ppdiag.pipeline.host_clocks._refined`) is off where the clock is known: on each link
    between two ranks of one host it should place 0, and where the two directions' latencies
    differ it does not (docs/clocks.md, "What two clocks cannot tell"). The root mean square over
    those links: the error no count of transfers averages away. None when no link within a host
    has receives that waited both ways."""
    if not len(pairs) or pairs.device:
        return None
    left = (pairs.send_start - pairs.recv_end).astype(np.float64) + holds
    waited = pairs.recv_start < pairs.send_start - WAITED_NS
    same = same_host(pairs, dom)
    errs: list[float] = []
    links = {(int(a), int(b)) for a, b in zip(pairs.src[same], pairs.dst[same], strict=True) if a < b}
    for a, b in sorted(links):
        up = (pairs.src == a) & (pairs.dst == b) & waited
        dn = (pairs.src == b) & (pairs.dst == a) & waited
        if up.sum() >= MIN_WAITED and dn.sum() >= MIN_WAITED:
            errs.append((float(np.quantile(left[up], 0.75)) - float(np.quantile(left[dn], 0.75))) / 2.0)
    return math.sqrt(float(np.mean(np.square(errs)))) if errs else None


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


__all__ = ["capped", "host_errors", "known_clock_error", "mean_se"]
