"""Where each link between two hosts places their clocks' offset (docs/clocks.md, "What fixes an
offset"): a host pair's transfers run on several links (two ranks each) when a host holds more
than one stage's neighbour, as on looped and V-shaped schedules, and the links' one-way times
differ (a rank whose ops queue behind others ends its receives late). Each link is placed by its
own waited receives both ways and weighed by its round trip, which no clock changes.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ppdiag.pipeline.clock_se import mean_se
from ppdiag.pipeline.send_holds import MIN_WAITED, WAITED_NS


def placed_by_link(
    lo_v: npt.NDArray[np.float64],
    l_up: npt.NDArray[np.float64],
    hi_v: npt.NDArray[np.float64],
    l_dn: npt.NDArray[np.float64],
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
    for lk in np.unique(l_up):
        a, b = lo_v[l_up == lk], hi_v[l_dn == lk]
        if a.size < MIN_WAITED or b.size < MIN_WAITED:
            continue
        qa, qb = float(np.quantile(a, 0.75)), float(np.quantile(b, 0.25))
        se = math.hypot(mean_se(a), mean_se(b)) / 2.0
        half_trip = max(qb - qa, 0.0) / 2.0
        places.append(((qa + qb) / 2.0, 1.0 / max(half_trip**2 + se**2, 1.0), se))
    if len(places) < 2:
        return None
    total = sum(w for _, w, _ in places)
    d = sum(x * w for x, w, _ in places) / total
    return d, math.sqrt(sum((w * s) ** 2 for _, w, s in places)) / total


def placed_both_ways(w: tuple[npt.NDArray[np.float64], ...], at: float) -> tuple[float, float] | None:
    """The offset and its standard error from the receives that waited both ways, judged waiting
    on the clock ``at`` (a receive posted :data:`WAITED_NS` before its send began): per link where
    two links or more are timed (:func:`placed_by_link`), else the middle of the pooled quartiles.
    None when fewer than :data:`MIN_WAITED` receives waited either way. ``w``: a host pair's
    transfers as ``host_clocks._transfer_bounds`` gives them (bounds, send and receive starts,
    ends, links; low -> high, then high -> low)."""
    lo_v, s_up, r_up, hi_v, s_dn, r_dn, _, _, l_up, l_dn = w
    # low -> high: the receive on high was posted before the send on low began (D = at)
    w_up = r_up + at < s_up - WAITED_NS
    w_dn = r_dn < s_dn + at - WAITED_NS
    if w_up.sum() < MIN_WAITED or w_dn.sum() < MIN_WAITED:
        return None
    by_link = placed_by_link(lo_v[w_up], l_up[w_up], hi_v[w_dn], l_dn[w_dn])
    if by_link is not None:
        return by_link
    d = (float(np.quantile(lo_v[w_up], 0.75)) + float(np.quantile(hi_v[w_dn], 0.25))) / 2.0
    return d, math.hypot(mean_se(lo_v[w_up]), mean_se(hi_v[w_dn])) / 2.0


__all__ = ["placed_both_ways", "placed_by_link"]
