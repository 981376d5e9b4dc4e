"""How far the placement of a host-op offset is off, measured where the clock is known
(docs/clocks.md, "How well an offset is known").

Host ops give one-way times only, and how a link's round trip splits into its two directions is
not in any timestamp ("What two clocks cannot tell"): the placement (``host_clocks``: the causal
interval, the waited receives both ways, the host's usual latency, the senders' holds) is off by
what its assumptions miss. On a link between two ranks of one host the true offset is 0, so the
same placement run there, as if the link crossed hosts, measures that error. To be a test of the
placement and not a fit to itself, what the placement learns from the links within a host (the
usual latency, the senders' holds) is measured on the other links: the link under test is left
out. Linear in the transfers (one sort, then each tested link's own slice) and in the links
(at most :data:`_MAX_LINKS` are tested, each left-out latency and hold a pass over the timed
links).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.link_places import Latency, latency_of, link_latencies
from ppdiag.pipeline.send_holds import (
    MIN_WAITED,
    WAITED_NS,
    HoldStats,
    _link_quantiles,
    hold_stats,
    holds_fit,
    rank_holds,
    same_host,
)

_MAX_LINKS = 64  # links within hosts the placement is tested on

# places the offset of one link's transfers (ranks a < b, ``D = o_b - o_a``) given each
# transfer's sender hold and the host's usual latency: the offset and its count's standard error
Place = Callable[[Pairs, npt.NDArray[np.float64], Latency | None], tuple[float, float] | None]


def _subset(pairs: Pairs, idx: npt.NDArray[np.int64]) -> Pairs:
    """The transfers ``idx`` of ``pairs``."""
    return Pairs(
        pairs.src[idx],
        pairs.dst[idx],
        pairs.send_start[idx],
        pairs.send_end[idx],
        pairs.recv_start[idx],
        pairs.recv_end[idx],
        pairs.device,
    )


def _left_out(rows: npt.NDArray[np.int64], a: int, b: int) -> npt.NDArray[np.bool_]:
    """The rows ``(sender, receiver)`` that are not the link ``a``-``b`` in either direction."""
    out: npt.NDArray[np.bool_] = ~(
        ((rows[:, 0] == a) & (rows[:, 1] == b)) | ((rows[:, 0] == b) & (rows[:, 1] == a))
    )
    return out


def _link_holds(
    st: HoldStats | None, own: npt.NDArray[np.float64], sub: Pairs, a: int, b: int
) -> npt.NDArray[np.float64]:
    """Each transfer of the link ``a``-``b`` (``sub``) with its sender's hold as measured on the
    host's other links (``send_holds.sender_holds`` without this link; ``st`` what holds are
    measured on; ``own``: the holds measured on every link), where the link's round trip holds
    it. A sender that sends on no other link
    within its host keeps the hold this link measures: a link of it across hosts would take
    that one (a held rank of a chain has one neighbour within its host when the other is across;
    left out, its hold was unknown and the test placed 2 to 4 ms off where the fit does not)."""
    out = np.zeros(len(sub), np.float64)
    if st is None:
        return out
    use = _left_out(st.links, a, b)
    hold, usual = rank_holds(st, use)
    others = set(st.links[use, 0].tolist())
    hold = np.where(np.isin(np.arange(hold.size), list(others)), hold, own)
    if not (hold[a] or hold[b]):
        return out
    one_way = (sub.recv_end - sub.send_start).astype(np.float64)
    _, low, _ = _link_quantiles(sub.src.astype(np.int64), sub.dst.astype(np.int64), one_way, 1)
    if low.size < 2 or not holds_fit(float(hold[a]), float(hold[b]), float(low.sum()), usual):
        return out
    held: npt.NDArray[np.float64] = np.where(sub.src == a, hold[a], hold[b])
    return held


def link_errors(
    pairs: Pairs, dom: dict[int, str], holds: npt.NDArray[np.float64], place: Place
) -> list[tuple[float, float]]:
    """Per link between two ranks of one host with :data:`MIN_WAITED` waiting receives each way:
    where ``place`` puts its offset (the truth is 0), each link left out of what the placement
    learns within the host, and the standard error ``place`` gives it. ``holds``: each transfer's
    sender hold (``send_holds.sender_holds``), taken off the other links' latencies."""
    if not len(pairs) or pairs.device:
        return []
    idx = np.flatnonzero(same_host(pairs, dom))
    if not idx.size:
        return []
    lo_r, hi_r = np.minimum(pairs.src[idx], pairs.dst[idx]), np.maximum(pairs.src[idx], pairs.dst[idx])
    key = lo_r.astype(np.int64) * (1 << 32) + hi_r.astype(np.int64)
    order = np.argsort(key, kind="stable")
    idx, key = idx[order], key[order]
    bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    lat_rows = link_latencies(pairs, dom, holds)
    st = hold_stats(pairs, dom)
    own = rank_holds(st, np.ones(len(st.links), dtype=bool))[0] if st is not None else np.zeros(0)
    out: list[tuple[float, float]] = []
    # at most _MAX_LINKS links, spread over them all: a root mean square of 64 is known to about
    # a tenth, and each link is a placement (256 ranks on 32 hosts: 224 links, 0.35 s of CPU)
    starts = bounds[:-1][:: max(1, -(-(bounds.size - 1) // _MAX_LINKS))]
    for i in starts:  # one slice per link, no scan
        j = bounds[np.searchsorted(bounds, i, side="right")]
        sub = _subset(pairs, idx[i:j])
        a, b = int(key[i] >> 32), int(key[i] & 0xFFFFFFFF)
        waited = sub.recv_start < sub.send_start - WAITED_NS
        if (waited & (sub.src == a)).sum() < MIN_WAITED or (waited & (sub.src == b)).sum() < MIN_WAITED:
            continue
        held = _link_holds(st, own, sub, a, b)
        lat = None
        if lat_rows is not None:
            lat = latency_of(lat_rows[1][_left_out(lat_rows[0], a, b)])
        got = place(sub, held, lat)
        if got is not None:
            out.append(got)
    return out


def known_clock_error(
    pairs: Pairs, dom: dict[int, str], holds: npt.NDArray[np.float64], place: Place
) -> float | None:
    """The error of the placement no count of transfers averages away, measured on the links
    within a host (:func:`link_errors`): the root mean square of their placed offsets. None when
    no link within a host has receives that waited both ways."""
    errs = link_errors(pairs, dom, holds, place)
    if not errs:
        return None
    return math.sqrt(float(np.mean([e * e for e, _ in errs])))


__all__ = ["Place", "known_clock_error", "link_errors"]
