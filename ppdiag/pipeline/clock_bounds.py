"""How far a host pair's placed offset may be off at worst: the residual (docs/clocks.md, "What
fixes an offset").

A matched host transfer ``a -> b`` (gloo) gives one bound on the offset ``D = o_b - o_a``: its
receive cannot end before its data left, so ``D >= send_start - recv_end`` (a lower bound ``l``),
and one back gives ``D <= recv_end - send_start`` (an upper bound ``h``). Each bound holds only
as far as the profiler's spans are the data's own times: a send span that opens after its data
left breaks it by that lateness. The interval of the fewest broken bounds, widened by the lateness
measured on links within one host, relies on the worst lateness of every transfer across hosts
being no more than that; a recorded ZBV run (P = 4, two ranks moved) broke one bound of 96 by
108 µs where the links within each host broke none, and its offset was 729 µs off against a
residual of 621 µs.

A quantile does not rely on the worst transfer. On each link (two ranks) the upper quartile of
the waited receives' lower bounds and the lower quartile of their upper bounds hold the offset
between them, within the spans' lateness, unless a quarter of the link's transfers one way are
late by more: a link's quartiles sum to its round trip (no clock in it), and the offset lies
within that round trip. Every link bounds the one offset, so their intervals intersect; the
residual is the distance from the placed offset to the farther end of that intersection and of
the interval of the fewest broken bounds (either holds the offset under its own assumption), plus
the lateness measured within a host. It does not depend on how the offset was placed within.
A host linked to the reference through other hosts carries every pair's residual on the way
(:func:`flow_residuals`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.link_places import waited_both_ways
from ppdiag.pipeline.send_holds import MIN_WAITED, same_host

_NO_JITTER_NS = 500_000  # half the host ops' jitter on a loaded host (1 ms), when none is measured


def quartile_interval(w: tuple[npt.NDArray[np.float64], ...], at: float) -> tuple[float, float] | None:
    """The offsets ``D`` every timed link allows by its quartiles: the largest upper quartile of a
    link's waited lower bounds to the smallest lower quartile of a link's waited upper bounds, the
    waited receives (posted :data:`WAITED_NS` before their send began) judged on the clock ``at``;
    the pooled quartiles of all links are one more such interval. A link counts with
    :data:`MIN_WAITED` waited receives each way. Where the links disagree (their intervals do not
    meet: one link's quartiles broken) the span of their ends, so that it still holds the offset.
    None when fewer than :data:`MIN_WAITED` receives waited either way. ``w``: a host pair's
    transfers as ``host_clocks._transfer_bounds`` gives them."""
    lo_v, _, _, hi_v, _, _, _, _, l_up, l_dn = w
    w_up, w_dn = waited_both_ways(w, at)
    if w_up.sum() < MIN_WAITED or w_dn.sum() < MIN_WAITED:
        return None
    # observed values on the safe side of each quartile (no interpolation toward a late one)
    lows, highs = [float(np.quantile(lo_v[w_up], 0.75, method="lower"))], [_q25(hi_v[w_dn])]
    for lk in np.unique(l_up[w_up]):  # a few links per pair of hosts
        a, b = lo_v[w_up & (l_up == lk)], hi_v[w_dn & (l_dn == lk)]
        if a.size >= MIN_WAITED and b.size >= MIN_WAITED:
            lows.append(float(np.quantile(a, 0.75, method="lower")))
            highs.append(_q25(b))
    lo, hi = max(lows), min(highs)
    if hi < lo:  # the links' round trips do not overlap: the span of what they allow
        return min(min(lows), min(highs)), max(max(lows), max(highs))
    return lo, hi


def _q25(v: npt.NDArray[np.float64]) -> float:
    return float(np.quantile(v, 0.25, method="higher"))


def placed_residual(
    lo: float, hi: float, w: tuple[npt.NDArray[np.float64], ...] | None, jitter: float
) -> float:
    """How far the offset placed at the middle of ``lo .. hi`` (the interval of the fewest broken
    bounds, as the placement moved it) may be off: to the farther end of that interval and of the
    links' quartile interval (:func:`quartile_interval` on the causal bounds ``w``, no sender's
    hold taken off: a hold measured on other links may be too long for this one), plus the spans'
    ``jitter`` (:func:`span_jitter`). Either interval holds the offset under its own assumption."""
    d = (lo + hi) / 2.0
    q = quartile_interval(w, d) if w is not None else None
    if q is not None:
        lo, hi = min(lo, q[0]), max(hi, q[1])
    return max(d - lo, hi - d) + jitter


def span_jitter(pairs: Pairs, dom: dict[int, str]) -> float:
    """How far host transfers break causality where the clock is known (both ranks on one host):
    the profiler's spans are not the data's own times (a send span may open after its data left).
    The 98th percentile of ``send_start - recv_end`` over those pairs, at least 0; half the host
    ops' jitter (0.5 ms) when no pair shares a host. A bound across hosts may be broken as much
    (a recorded run with a host's offset 252 µs off and an interval half-width of 244 µs, the
    jitter itself, was outside a residual that took the larger of the two, not their sum). Not
    the largest: one span within a host late by milliseconds would widen every residual by it
    (a recorded zero-bubble run's 3.1 ms residual became 21.9 ms)."""
    if len(pairs) and not pairs.device:
        same = same_host(pairs, dom)
        if same.sum() >= 10:
            v = (pairs.send_start - pairs.recv_end)[same].astype(np.float64)
            return max(0.0, float(np.quantile(v, 0.98)))
    return _NO_JITTER_NS


def flow_residuals(n_hosts: int, edges: list[tuple[int, int, float, float]]) -> list[float | None]:
    """Each host's residual against its component's first host (the reference: host 0) where the
    hosts' offsets are solved by weighted least squares over the pairs ``edges`` (``a, b, weight,
    residual``): the solved offset of host ``h`` is ``sum_e f_e d_e`` over the pairs' placed
    differences ``d_e``, ``f`` the unit electrical flow from the reference to ``h`` (conductance:
    the weight), so its error is at most ``sum_e |f_e| r_e``. On a tree that is the sum of the
    residuals along the path: a host linked to the reference through another carries both pairs'
    errors (the least of its own pairs' residuals is no bound then). None for a host no pair links.
    One grounded Laplacian per component, inverted: hosts, not ranks (hundreds at most)."""
    parent = list(range(n_hosts))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, _, _ in edges:
        parent[find(a)] = find(b)
    out: list[float | None] = [None] * n_hosts
    for root in {find(a) for a, _, _, _ in edges}:
        members = sorted(h for h in range(n_hosts) if find(h) == root)
        pos = {h: i for i, h in enumerate(members)}
        mine = [e for e in edges if find(e[0]) == root]
        ia = np.array([pos[a] for a, _, _, _ in mine])
        ib = np.array([pos[b] for _, b, _, _ in mine])
        w = np.array([max(e[2], 1e-9) for e in mine], dtype=np.float64)
        r = np.array([e[3] for e in mine], dtype=np.float64)
        m = len(members)
        lap = np.zeros((m, m))
        np.add.at(lap, (ia, ib), -w)
        np.add.at(lap, (ib, ia), -w)
        lap[np.arange(m), np.arange(m)] += np.bincount(ia, w, m) + np.bincount(ib, w, m)
        pot = np.zeros((m, m))  # column h: the potentials of a unit flow from h to the first host
        pot[1:, 1:] = np.linalg.inv(lap[1:, 1:])
        flow = w[:, None] * np.abs(pot[ia] - pot[ib])  # pairs x hosts
        for h, v in zip(members, r @ flow, strict=True):
            out[h] = float(v)
    return out


def _consistent(
    lows: npt.NDArray[np.float64], highs: npt.NDArray[np.float64]
) -> tuple[float | None, float | None, int]:
    """The offsets ``D`` that break the fewest bounds ``D >= lows`` and ``D <= highs``: the first
    interval where the fewest are broken (its ends; None for a side without bounds) and how many
    are broken there. A few mispaired transfers (reordered flows on one link) are outvoted."""
    if lows.size == 0 or highs.size == 0:
        return None, None, 0
    ls, hs = np.sort(lows), np.sort(highs)
    cand = np.unique(np.concatenate((ls, hs)))
    # broken at D: lows above D plus highs below D
    broken = (ls.size - np.searchsorted(ls, cand, side="right")) + np.searchsorted(hs, cand, side="left")
    best = int(broken.min())
    i = int(np.argmax(broken == best))
    j = i
    while j + 1 < cand.size and broken[j + 1] == best:
        j += 1
    if best == 0:
        return float(cand[i]), float(cand[j]), best
    # some bounds broken (send spans that start after their data left, mispaired flows): the
    # uncertainty is the stretch around the best where at most a tenth more are broken
    slack = best + max(2, (ls.size + hs.size) // 10)
    lo_i, hi_j = i, j
    while lo_i > 0 and broken[lo_i - 1] <= slack:
        lo_i -= 1
    while hi_j + 1 < cand.size and broken[hi_j + 1] <= slack:
        hi_j += 1
    mid = (float(cand[i]) + float(cand[j])) / 2.0
    half = max(mid - float(cand[lo_i]), float(cand[hi_j]) - mid)
    return mid - half, mid + half, best


__all__ = ["flow_residuals", "placed_residual", "quartile_interval", "span_jitter"]
