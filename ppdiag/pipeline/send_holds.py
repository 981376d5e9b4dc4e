"""How long a rank holds its sends before their data leaves, measured where the clock is known
(docs/clocks.md, "What fixes an offset").

A gloo send's span opens at the issue; a rank that holds its sends (a slow sender, a send posted
late by its transport) lets the data leave later, and every one-way time of its sends (a waiting
receive's end minus the send's start) carries the hold. Across hosts that time also carries the
clock offset, so the two directions of a link differ by the hold and the offset placed between
them is half the hold off. Within a host the clock is known: there the hold shows as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.pipeline.clocks import Pairs

WAITED_NS = 200_000  # a receive posted this long before its send began was waiting for it
MIN_WAITED = 3  # waiting receives a link needs to be timed
HOLD_MIN_NS = 1_000_000  # host ops' jitter on a loaded host: a hold must stand out of it


def _link_quantiles(
    src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], v: npt.NDArray[np.float64], q: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per link (sender, receiver): the ``q``-th quartile of its values ("lower": an observed one)
    and their count; the links as rows ``(src, dst)``. One sort, no loop over links."""
    links, inv = np.unique(np.stack((src, dst), axis=1), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    order = np.lexsort((v, inv))  # per link, its values ascending
    counts = np.bincount(inv, minlength=len(links))
    first = np.r_[0, np.cumsum(counts)[:-1]]
    return links, v[order][first + (counts - 1) * q // 4], counts


def same_host(pairs: Pairs, dom: dict[int, str]) -> npt.NDArray[np.bool_]:
    """Per transfer: whether its two ranks share a host (``dom``: each rank's clock domain), where
    the clock is known. One lookup per rank, not per transfer."""
    src, dst = pairs.src.astype(np.int64), pairs.dst.astype(np.int64)
    if not len(src):
        return np.zeros(0, bool)
    code = {h: i for i, h in enumerate(sorted(set(dom.values())))}
    host = np.full(int(max(src.max(), dst.max(), max(dom, default=0))) + 1, -1, np.int64)
    for r, h in dom.items():  # per rank, not per transfer
        host[r] = code[h]
    same: npt.NDArray[np.bool_] = host[src] == host[dst]
    return same


def sender_holds(pairs: Pairs, dom: dict[int, str]) -> npt.NDArray[np.float64]:
    """Per transfer, how long its sender holds its sends before the data leaves, as measured where
    the clock is known: on the links between ranks of one host. A one-way time (a waiting
    receive's end minus its send's start) is the link's latency, plus the sender's hold, plus the
    clock offset across hosts; with the hold in it, the two directions of a link differ and the
    offset's middle is half the hold off (a held send's span opens at the issue; the data leaves
    later). A rank holds its sends when every link it sends on within its host is slower than the
    host links' usual one-way time by more than the host ops' jitter (:data:`HOLD_MIN_NS`), in its
    median and in its lower quartile alike (ops queued ahead of some sends raise the median only);
    the hold is the least excess over those links, the lesser of the two. A link takes its senders'
    holds only where its round trip (no clock in it: the lower quartiles of both directions'
    one-way times) holds them beside two usual latencies, within half the host ops' jitter: one
    slow link of a rank within its host is no hold of the rank's other links. Zero where no link
    of one host has waiting receives."""
    out = np.zeros(len(pairs), np.float64)
    st = hold_stats(pairs, dom)
    if st is None:
        return out
    hold, usual = rank_holds(st, np.ones(len(st.links), dtype=bool))
    if not hold.any():
        return out
    src, dst = pairs.src.astype(np.int64), pairs.dst.astype(np.int64)
    one_way = (pairs.recv_end - pairs.send_start).astype(np.float64)
    # the round trip of each link, both directions' lower quartiles (every transfer: a receive
    # posted late only lengthens it, so a hold is refused only where the link plainly has none).
    # The usual latency is a median and the round trip lower quartiles: a held link's round trip
    # may fall short of hold and latencies by their difference, the spans' jitter (half the host
    # ops', as holds stand more than the whole out of it). Without that slack a recorded rank held
    # 5 ms (P = 8) kept none: 4.93 ms of hold against a 5.26 ms round trip less two 0.22 ms
    # latencies. (Lower quartiles for the latencies too let queued links of V-shaped schedules
    # hold more than they do: 2.5 ms and 1.2 ms worse on two recordings.)
    links, low, _ = _link_quantiles(src, dst, one_way, 1)
    back = {(int(a), int(b)): float(x) for (a, b), x in zip(links, low, strict=True)}
    ok = np.zeros(len(links), dtype=bool)
    for i, (a, b) in enumerate(links.tolist()):
        ok[i] = holds_fit(hold[a], hold[b], low[i] + back.get((b, a), np.inf), usual)
    _, inv = np.unique(np.stack((src, dst), axis=1), axis=0, return_inverse=True)
    return np.where(ok[inv.reshape(-1)], hold[src], 0.0)


@dataclass(frozen=True)
class HoldStats:
    """The links within a host that are timed (:data:`MIN_WAITED` waiting receives): each one's
    ``(sender, receiver)``, and the median and lower quartile of its one-way times; ``n_ranks``
    bounds the rank numbers."""

    links: npt.NDArray[np.int64]
    med: npt.NDArray[np.float64]
    low: npt.NDArray[np.float64]
    n_ranks: int


def hold_stats(pairs: Pairs, dom: dict[int, str]) -> HoldStats | None:
    """What holds are measured on (:func:`sender_holds`); None where no link of one host is
    timed. One sort over the transfers."""
    if not len(pairs) or pairs.device:
        return None
    src, dst = pairs.src.astype(np.int64), pairs.dst.astype(np.int64)
    one_way = (pairs.recv_end - pairs.send_start).astype(np.float64)
    same = same_host(pairs, dom)
    sel = np.flatnonzero(same & (pairs.recv_start < pairs.send_start - WAITED_NS))
    if sel.size == 0:
        return None
    # each link's median and the links' own: the profiler's spans break causality by up to a
    # millisecond now and then (a send span opens after its data left), so low quantiles of a few
    # transfers are no judge of a link's usual time
    links, med, counts = _link_quantiles(src[sel], dst[sel], one_way[sel], 2)
    _, low_w, _ = _link_quantiles(src[sel], dst[sel], one_way[sel], 1)
    timed = counts >= MIN_WAITED
    if not timed.any():
        return None
    return HoldStats(links[timed], med[timed], low_w[timed], int(max(src.max(), dst.max())) + 1)


def rank_holds(st: HoldStats, use: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.float64], float]:
    """Each rank's hold measured on the timed links ``use`` selects (all of them, or all but the
    link a placement is tested on, so that its test is no fit to itself), and the host links'
    usual one-way time (their medians' median). Zero holds where ``use`` selects none."""
    if not use.any():
        return np.zeros(st.n_ranks), 0.0
    med, low_w = st.med[use], st.low[use]
    usual = float(np.quantile(med, 0.5, method="lower"))
    usual_low = float(np.quantile(low_w, 0.5, method="lower"))
    # a hold delays every send alike, its lower quartile as much as its median; ops queued ahead
    # of a send (gloo runs a rank's ops in order) delay some sends, the median more than the
    # lower quartile: the excess of both, the lesser
    excess = np.minimum(med - usual, low_w - usual_low)
    least = np.full(st.n_ranks, np.inf)  # per sending rank
    np.minimum.at(least, st.links[use, 0], excess)
    return np.where(np.isfinite(least) & (least > HOLD_MIN_NS), least, 0.0), usual


def holds_fit(hold_a: float, hold_b: float, round_trip: float, usual: float) -> bool:
    """Whether a link's round trip (its two directions' lower quartiles, no clock in it) holds its
    two senders' holds beside two usual latencies, within half the host ops' jitter (the hold is
    an excess of medians, the round trip lower quartiles): one slow link of a rank within its
    host is no hold of the rank's other links."""
    return bool(hold_a + hold_b <= round_trip - 2.0 * usual + HOLD_MIN_NS / 2.0)


__all__ = [
    "HOLD_MIN_NS",
    "MIN_WAITED",
    "WAITED_NS",
    "HoldStats",
    "hold_stats",
    "holds_fit",
    "rank_holds",
    "same_host",
    "sender_holds",
]
