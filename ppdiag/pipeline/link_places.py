"""Where each link between two hosts places their clocks' offset (docs/clocks.md, "What fixes an
offset"): a host pair's transfers run on several links (two ranks each) when a host holds more
than one stage's neighbour, as on looped and V-shaped schedules, and the links' one-way times
differ (a rank whose ops queue behind others ends its receives late). Each link is placed by its
own waited receives both ways and weighed by its round trip, which no clock changes. Where the
host's usual latency is known (measured on links within a host), each direction of a link places
the offset on its own, and the two are weighed by how late their receives end.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ppdiag.pipeline.clock_se import mean_se, quantile_se
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.send_holds import MIN_WAITED, WAITED_NS, _link_quantiles, same_host

# how far a host's usual latency may be off a link's own beyond their spread (µs-level jitter
# of the profiler's spans on a quiet link)
_LATENCY_FLOOR_NS = 50_000.0
_LEAST_Q = 0.05  # the quantile that stands for a direction's least one-way times

Latency = tuple[float, float]  # a host's usual one-way time and its spread over links (ns)


def host_latency(pairs: Pairs, dom: dict[int, str], holds: npt.NDArray[np.float64]) -> Latency | None:
    """The usual one-way time of a transfer where the clock is known (both ranks on one host):
    the median over those links of their waited receives' lower quartile (``recv_end -
    send_start`` less the sender's hold), and the standard deviation of those quartiles over the
    links. None when no link within a host has :data:`MIN_WAITED` waited receives."""
    got = link_latencies(pairs, dom, holds)
    return None if got is None else latency_of(got[1])


def link_latencies(
    pairs: Pairs, dom: dict[int, str], holds: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None:
    """Each timed link within a host (``(sender, receiver)`` rows) and its waited receives' lower
    quartile of one-way times, what :func:`host_latency` sums up; None when no link is timed."""
    if not len(pairs) or pairs.device:
        return None
    same = same_host(pairs, dom)
    sel = same & (pairs.recv_start < pairs.send_start - WAITED_NS)
    if not sel.any():
        return None
    one_way = (pairs.recv_end - pairs.send_start).astype(np.float64)[sel] - holds[sel]
    src, dst = pairs.src[sel].astype(np.int64), pairs.dst[sel].astype(np.int64)
    links, low, counts = _link_quantiles(src, dst, one_way, 1)
    timed = counts >= MIN_WAITED
    return (links[timed], low[timed]) if timed.any() else None


def latency_of(low: npt.NDArray[np.float64]) -> Latency | None:
    """The usual latency and its spread from the links' lower quartiles ``low``; None for none."""
    return (float(np.median(low)), float(np.std(low))) if low.size else None


def _link_place(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], lat: Latency | None) -> float:
    """Where one link's waited receives place the offset: ``a`` the lower bounds of one direction,
    ``b`` the upper bounds of the other. Each direction's quartile is a latency from the offset
    (upper quartile of ``a``, lower of ``b``); with the host's usual latency known (``lat``), each
    direction places it on its own, as far off as its quartile sits above its least one-way times
    (receives that end behind queued ops or compute: gloo runs a rank's ops in order, and an
    irecv's span ends when it is waited on) plus the latency's spread. The two are weighed by
    those: a direction whose every receive ends late no longer drags the middle half its delay
    off (DualPipeV P = 4, last rank moved: 3979 µs off by the middle, 2187 so). Without ``lat``,
    or when the two cross (a round trip shorter than two usual latencies), their middle."""
    qa, qb = float(np.quantile(a, 0.75)), float(np.quantile(b, 0.25))
    if lat is None or qa + lat[0] >= qb - lat[0]:
        return (qa + qb) / 2.0
    s_a = float(np.quantile(a, 1.0 - _LEAST_Q)) - qa + _LATENCY_FLOOR_NS + lat[1]
    s_b = qb - float(np.quantile(b, _LEAST_Q)) + _LATENCY_FLOOR_NS + lat[1]
    w_a, w_b = 1.0 / s_a**2, 1.0 / s_b**2
    return ((qa + lat[0]) * w_a + (qb - lat[0]) * w_b) / (w_a + w_b)


def placed_by_link(
    lo_v: npt.NDArray[np.float64],
    l_up: npt.NDArray[np.float64],
    hi_v: npt.NDArray[np.float64],
    l_dn: npt.NDArray[np.float64],
    lat: Latency | None = None,
) -> tuple[float, float] | None:
    """The offset placed on each link (two ranks) by its own waited receives both ways, the links
    weighed by how far each may be off: a link's two directions' quartiles (``lo_v`` and ``hi_v``,
    the waited receives' bounds) sum to its round trip, which no clock changes, and as neither
    one-way time is negative the middle is off by at most half of it (the directions' difference,
    docs/clocks.md "What two clocks cannot tell"). A link whose transfers queue behind other ops
    (gloo runs a rank's ops in order: a receive ends behind the ops queued before it) has a long
    round trip and may be that far off; pooled with a link that does not queue, its quartiles set
    the place (a recorded looped schedule, P = 4, rank 0 alone: its link to rank 3 has a 25 ms
    round trip, its link to rank 1 none beyond the spans' jitter; pooled, 9.6 ms off, weighed, 1.5).
    Weight: ``1 / ((round trip / 2)^2 + se^2)``. Also the standard error of the weighted mean from
    the links' own (count noise). None unless two links or more have :data:`MIN_WAITED` waited
    receives each way (one link: the pooled quartiles are its own)."""
    places: list[tuple[float, float, float]] = []  # (offset, weight, se)
    links = np.unique(l_up)
    if links.size < 2:
        return None  # one link: the pooled quartiles are its own (not placed twice)
    for lk in links:
        a, b = lo_v[l_up == lk], hi_v[l_dn == lk]
        if a.size < MIN_WAITED or b.size < MIN_WAITED:
            continue
        qa, qb = float(np.quantile(a, 0.75)), float(np.quantile(b, 0.25))
        se = math.hypot(mean_se(a), mean_se(b)) / 2.0
        half_trip = max(qb - qa, 0.0) / 2.0
        places.append((_link_place(a, b, lat), 1.0 / max(half_trip**2 + se**2, 1.0), _place_se(a, b)))
    if len(places) < 2:
        return None
    total = sum(w for _, w, _ in places)
    d = sum(x * w for x, w, _ in places) / total
    return d, math.sqrt(sum((w * s) ** 2 for _, w, s in places)) / total


def waited_both_ways(
    w: tuple[npt.NDArray[np.float64], ...], at: float
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Which receives of a host pair's transfers ``w`` (as ``host_clocks._transfer_bounds`` gives
    them) waited for their data, judged on the clock ``at`` (``D = o_high - o_low``): posted
    :data:`WAITED_NS` before their send began; low -> high, then high -> low."""
    _, s_up, r_up, _, s_dn, r_dn, *_ = w
    # low -> high: the receive on high was posted before the send on low began (D = at)
    return r_up + at < s_up - WAITED_NS, r_dn < s_dn + at - WAITED_NS


def placed_both_ways(
    w: tuple[npt.NDArray[np.float64], ...], at: float, lat: Latency | None = None
) -> tuple[float, float] | None:
    """The offset and its standard error from the receives that waited both ways, judged waiting
    on the clock ``at`` (a receive posted :data:`WAITED_NS` before its send began): per link where
    two links or more are timed (:func:`placed_by_link`), else the pooled quartiles' place.
    None when fewer than :data:`MIN_WAITED` receives waited either way. ``w``: a host pair's
    transfers as ``host_clocks._transfer_bounds`` gives them (bounds, send and receive starts,
    ends, links; low -> high, then high -> low)."""
    lo_v, _, _, hi_v, _, _, _, _, l_up, l_dn = w
    w_up, w_dn = waited_both_ways(w, at)
    if w_up.sum() < MIN_WAITED or w_dn.sum() < MIN_WAITED:
        return None
    by_link = placed_by_link(lo_v[w_up], l_up[w_up], hi_v[w_dn], l_dn[w_dn], lat)
    if by_link is not None:
        return by_link
    d = _link_place(lo_v[w_up], hi_v[w_dn], lat)
    return d, _place_se(lo_v[w_up], hi_v[w_dn])


def _place_se(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    """The standard error that the count of transfers leaves in a place from the upper quartile of
    ``a`` and the lower quartile of ``b``: each quartile's own (:func:`quantile_se`; the spread of
    receives that ended late is not how well a quartile is known), in quadrature, halved."""
    return math.hypot(quantile_se(a, 0.75), quantile_se(b, 0.25)) / 2.0


__all__ = [
    "Latency",
    "host_latency",
    "latency_of",
    "link_latencies",
    "placed_both_ways",
    "placed_by_link",
    "waited_both_ways",
]
