"""Paint every lost-time segment with one cause so that each (rank, step)'s totals are exact.

Each step's lost time is split into pools (host evidence, waits, exposed collectives, other idle,
exposed copies); each cause takes its amount from the pools it prefers (by the precedence of
``_ORDER``), and each pool is cut at those amounts. :func:`paint` does this for every step of the
run at once, on a :class:`~ppdiag.model.interval_groups.Line` holding the steps end to end;
:func:`paint_per_step` is the same one step at a time (the reference, and the path for steps whose
sets stray outside their window).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.rank_step import RankStep
from ppdiag.diagnosis import GapTable
from ppdiag.model import intervals as ivs
from ppdiag.model.interval_groups import Line
from ppdiag.report_types import Cause

Arr = npt.NDArray[np.int64]

# Where each cause is drawn first: pools are 0 host evidence, 1 waits, 2 exposed collectives,
# 3 other idle, 4 exposed copies. Bubble prefers waits at the edges of the step (warm-up and
# cool-down).
_POOLS = {
    "host": (0, 1, 3),
    "comm_wait": (1,),
    "exposed_comm": (2, 1),
    "exposed_copy": (4,),
    "unexplained": (3,),
    "bubble": (1, 3),
    "imbalance": (1, 3),
}
_ORDER = ("host", "exposed_copy", "exposed_comm", "comm_wait", "unexplained", "bubble", "imbalance")
_FALLBACK = (1, 3, 0, 2, 4)


def _pools(lost: ivs.ISet, by_rank: list[ivs.ISet]) -> list[ivs.ISet]:
    """The lost time split into its pools in one sweep: host evidence, then waits, collectives and
    copies (each taking what the earlier ones left), the rest as "other". Returned in the order
    host, wait, collective, other, copy; each a sorted disjoint set with touching pieces merged."""
    if lost[0].size == 0:
        return [ivs.empty() for _ in range(5)]
    sets = [lost, *by_rank]
    pts, at = _points([x for st in sets for x in st])
    seg_s, seg_e = pts[:-1], pts[1:]
    label = np.full(seg_s.size, -1, np.int64)
    in_lost = _covers(pts, lost, (at[0], at[1]))
    label[in_lost] = 3  # other
    # first matching pool wins: host (0), wait (1), collective (2), copy (4)
    for i in (4, 3, 2, 1):
        label[in_lost & _covers(pts, sets[i], (at[2 * i], at[2 * i + 1]))] = (0, 1, 2, 4)[i - 1]
    out: list[ivs.ISet] = []
    for pool in range(5):
        k = np.flatnonzero(label == pool)
        if k.size == 0:
            out.append(ivs.empty())
            continue
        # adjacent elementary segments of one pool touch: merge them
        new = np.r_[True, k[1:] != k[:-1] + 1]
        first = np.flatnonzero(new)
        last = np.r_[first[1:] - 1, k.size - 1]
        out.append((seg_s[k[first]].astype(np.int64), seg_e[k[last]].astype(np.int64)))
    return out


def _points(arrays: list[Arr]) -> tuple[Arr, list[Arr]]:
    """The sorted unique points of ``arrays`` and, for each array, the index of each of its
    values among them: one stable argsort (the arrays come sorted, so it merges runs), which
    costs less than the sort and a search per value into the points it replaces."""
    allp = np.concatenate(arrays)
    o = np.argsort(allp, kind="stable")
    srt = allp[o]
    keep = np.empty(srt.size, np.bool_)
    keep[:1] = True
    np.not_equal(srt[1:], srt[:-1], out=keep[1:])
    idx = np.empty(allp.size, np.int64)
    idx[o] = np.cumsum(keep) - 1
    cut = np.cumsum([a.size for a in arrays])[:-1]
    return srt[keep], np.split(idx, cut)


def _covers(pts: Arr, iset: ivs.ISet, at: tuple[Arr, Arr] | None = None) -> npt.NDArray[np.bool_]:
    """Whether each elementary segment ``[pts[i], pts[i + 1])`` lies in ``iset``, whose bounds are
    all among the sorted unique ``pts`` (at the indices ``at`` where given). For a sorted disjoint
    set, a sweep: the segment is inside while more of its pieces have started than ended (a
    running sum over the indices of the set's bounds, where a search per segment into the set
    cost a third more on a 128-step nsys run's four million points); any other set, the piece
    of the last start before each segment (the same answer on a disjoint set)."""
    s, e = iset
    n = pts.size - 1
    if s.size == 0 or n <= 0:
        return np.zeros(max(n, 0), np.bool_)
    if (e >= s).all() and (s[1:] >= e[:-1]).all():
        a, b = at if at is not None else (np.searchsorted(pts, s), np.searchsorted(pts, e))
        d = np.bincount(a, minlength=n + 1)[:n]
        d -= np.bincount(b, minlength=n + 1)[:n]
        out: npt.NDArray[np.bool_] = np.cumsum(d) > 0
        return out
    seg_s = pts[:-1]
    j = np.searchsorted(s, seg_s, side="right") - 1
    return (j >= 0) & (seg_s < e[np.maximum(j, 0)])


def paint_per_step(
    steps: list[RankStep], causes: dict[tuple[int, int], dict[str, int]]
) -> dict[int, GapTable]:
    """Give every lost-time segment one cause so that the totals per (rank, step) are exact.

    First the amount each cause takes from each pool of segments (by the precedence of _ORDER and
    the pools each cause prefers), then each pool is cut at those amounts in one vectorized pass.
    """
    out: dict[int, list[npt.NDArray[np.int64]]] = {}
    for rs in steps:
        pools = _pools(rs.sets.gaps, [rs.host_set, rs.wait_set, rs.sets.collective, rs.sets.copy])
        left = [ivs.measure(p) for p in pools]
        takes: list[list[tuple[int, int]]] = [[] for _ in pools]  # per pool: (cause, ns)
        c = causes[(rs.rank, rs.step)]
        for key in _ORDER:
            need = c.get(key, 0)
            for p in list(_POOLS[key]) + [q for q in _FALLBACK if q not in _POOLS[key]]:
                if need <= 0:
                    break
                take = min(need, left[p])
                if take > 0:
                    takes[p].append((Cause(key).code, take))
                    left[p] -= take
                    need -= take
        for p, (ps, pe) in enumerate(pools):
            if not takes[p] or ps.size == 0:
                continue
            if p == 1:
                # the schedule's own waits sit at the edges of the step (warm-up, cool-down): bubble
                # takes the waits nearest the edges first, imbalance the steady-state ones
                order = np.argsort(np.minimum(ps - rs.w0, rs.w1 - pe), kind="stable")
                ps, pe = ps[order], pe[order]
                rank_of = {Cause.BUBBLE.code: 0, Cause.IMBALANCE.code: 1}
                takes[p].sort(key=lambda t: rank_of.get(t[0], 2))
            out.setdefault(rs.rank, []).append(_cut(ps, pe, takes[p], rs.step))
    tables: dict[int, GapTable] = {}
    for r, parts in out.items():
        arr = np.concatenate(parts) if parts else np.zeros((0, 4), np.int64)
        arr = arr[np.argsort(arr[:, 0], kind="stable")]
        tables[r] = GapTable(
            arr[:, 0].copy(),
            arr[:, 1].copy(),
            arr[:, 2].astype(np.int8),
            np.full(arr.shape[0], -1, np.int32),
            arr[:, 3].astype(np.int32),
        )
    for rs in steps:
        tables.setdefault(rs.rank, GapTable.empty())
    return tables


def _cut(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], takes: list[tuple[int, int]], step: int
) -> npt.NDArray[np.int64]:
    """Rows (start, end, cause, step): the segments, in their order, handed out to the causes in
    ``takes`` (cause, ns) one after the other."""
    lengths = ends - starts
    cum = np.cumsum(lengths)
    total = int(cum[-1])
    bounds = np.cumsum([t for _, t in takes])
    pos = ivs.sorted_unique(np.concatenate([[0], cum, np.minimum(bounds, total)]))
    pos = pos[pos <= total]
    lo, hi = pos[:-1], pos[1:]
    k = np.searchsorted(cum, lo, side="right")
    before = np.concatenate([[0], cum[:-1]])
    t0 = starts[k] + (lo - before[k])
    cause = np.array([c for c, _ in takes], dtype=np.int64)[
        np.minimum(np.searchsorted(bounds, lo, side="right"), len(takes) - 1)
    ]
    keep = (hi > lo) & (lo < bounds[-1])
    rows: npt.NDArray[np.int64] = np.stack(
        [t0, t0 + (hi - lo), cause, np.full(lo.size, step, np.int64)], axis=1
    )[keep]
    return rows


_CAUSES = tuple(Cause(k).code for k in _ORDER)


def _takes(causes: npt.NDArray[np.int64], left: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """What each cause (columns in ``_ORDER``) takes from each pool: ``[group, pool, cause]`` ns,
    handed out as :func:`paint_per_step` does, for every group at once."""
    left = left.copy()
    out = np.zeros((left.shape[0], left.shape[1], len(_ORDER)), np.int64)
    for j, key in enumerate(_ORDER):
        need = causes[:, j].copy()
        for p in list(_POOLS[key]) + [q for q in _FALLBACK if q not in _POOLS[key]]:
            take = np.where(need > 0, np.minimum(need, left[:, p]), 0)
            out[:, p, j] = take
            left[:, p] -= take
            need -= take
    return out


def _cut_all(
    line: Line, pool: ivs.ISet, takes: npt.NDArray[np.int64], order: list[int], first_edge: bool, w: ivs.ISet
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`_cut` of one pool in every group: rows (start, end on the line, cause code) and the
    group and order of each, for the takes ``[group, cause]`` handed out in the causes' ``order``."""
    ps, pe = pool
    g = line.group_of(ps)
    if first_edge:
        # the schedule's waits sit at the edges of the step: nearest the edges first
        o = _order_by(g, np.minimum(ps - w[0][g], w[1][g] - pe))
        ps, pe, g = ps[o], pe[o], g[o]
    if ps.size == 0:
        z = np.zeros(0, np.int64)
        return np.zeros((0, 3), np.int64), z, z.copy()
    cum = np.cumsum(pe - ps)
    before = np.r_[0, cum[:-1]]
    total = line.measure(pool)
    base = np.r_[0, np.cumsum(total)[:-1]]
    tk = takes[:, order]
    bounds = base[:, None] + np.minimum(np.cumsum(tk, axis=1), total[:, None])
    pos, k, nb = _cut_points(cum, bounds.ravel())
    lo, hi = pos[:-1], pos[1:]
    gk = g[k]
    j = np.minimum(nb - gk * len(order), len(order) - 1)
    keep = (hi > lo) & (lo < bounds[gk, -1])
    lo, hi, k, j, gk = lo[keep], hi[keep], k[keep], j[keep], gk[keep]
    t0 = ps[k] + (lo - before[k])
    codes = np.array([_CAUSES[c] for c in order], np.int64)
    rows = np.stack([t0, t0 + (hi - lo), codes[j]], axis=1)
    return rows, gk, np.arange(gk.size, dtype=np.int64)


def _cut_points(cum: Arr, bounds: Arr) -> tuple[Arr, Arr, Arr]:
    """The cut points ``pos`` (``0``, the pieces' running ends ``cum`` and the takes' ``bounds``,
    sorted, each once) with, for each point but the last, the number of running ends and of
    bounds at or before it. ``cum`` strictly increasing and positive, ``bounds`` sorted inside
    ``[0, cum[-1]]``: the few bounds are slotted among the many ends by a search per bound and
    the counts follow from the slots, where a sort of all the points and two searches per point
    (the general way, kept for any other input) cost twice as much on a million waits."""
    n = cum.size
    if (
        n
        and bool(cum[0] > 0)
        and bool((cum[1:] > cum[:-1]).all())
        and bool(
            bounds.size == 0
            or (bounds[0] >= 0 and bounds[-1] <= cum[-1] and (bounds[1:] >= bounds[:-1]).all())
        )
    ):
        c0 = np.empty(n + 1, np.int64)
        c0[0] = 0
        c0[1:] = cum
        at = np.searchsorted(c0, bounds, side="left")  # <= n: no bound passes the last end
        x_new = c0[at] != bounds
        if x_new.size > 1:
            x_new[1:] &= bounds[1:] != bounds[:-1]
        x, at = bounds[x_new], at[x_new]
        pos = np.insert(c0, at, x)
        # a point of c0 at i has i ends at or before it; a bound slotted at ``at`` has at - 1
        k = np.insert(np.arange(n + 1, dtype=np.int64), at, at - 1)[:-1]
    else:
        pos = ivs.sorted_unique(np.concatenate([[0], cum, bounds]))
        k = np.searchsorted(cum, pos[:-1], side="right")
    lo = pos[:-1]
    # bounds at or before each point: a running count of where each bound falls among the points
    nb = np.cumsum(np.bincount(np.searchsorted(lo, bounds, side="left"), minlength=lo.size + 1)[: lo.size])
    return pos, k.astype(np.int64), nb.astype(np.int64)


def _order_by(*keys: Arr) -> npt.NDArray[np.intp]:
    """The stable order by ``keys[0]``, then ``keys[1]``... (``np.lexsort`` of the keys reversed,
    or two stable sorts): one stable sort of one int64 code per row where the codes fit, which on
    a 128-step nsys run's million waits costs a fifth to a tenth of the sorts it replaces. Equal
    codes are equal keys, so ties keep their input order as in the sorts."""
    n = keys[0].size
    if not n:
        return np.zeros(0, np.intp)
    lows = [int(k.min()) for k in keys]
    spans = [int(k.max()) - lo + 1 for k, lo in zip(keys, lows, strict=True)]
    if math.prod(spans) >= 1 << 62:  # (Python integers: exact)
        return np.lexsort(keys[::-1])
    code = keys[0] - lows[0]
    for k, lo, span in zip(keys[1:], lows[1:], spans[1:], strict=True):
        code = code * span + (k - lo)
    return np.argsort(code, kind="stable")


def paint(steps: list[RankStep], causes: dict[tuple[int, int], dict[str, int]]) -> dict[int, GapTable]:
    """:func:`paint_per_step` for every step of the run at once."""
    if not steps:
        return {}
    w = (np.array([rs.w0 for rs in steps], np.int64), np.array([rs.w1 for rs in steps], np.int64))
    kinds = [[rs.sets.gaps, rs.host_set, rs.wait_set, rs.sets.collective, rs.sets.copy] for rs in steps]
    g_of = [np.repeat(np.arange(len(steps)), [x[i][0].size for x in kinds]) for i in range(5)]
    flat = [
        (np.concatenate([x[i][0] for x in kinds]), np.concatenate([x[i][1] for x in kinds])) for i in range(5)
    ]
    inside = all(bool(((s >= w[0][g]) & (e <= w[1][g])).all()) for (s, e), g in zip(flat, g_of, strict=True))
    try:
        line = Line.of(*w)
    except OverflowError:  # windows too long to lay end to end on one int64 line
        inside = False
    if not inside or bool((w[1] <= w[0]).any()):
        return paint_per_step(steps, causes)
    sets = [(line.put(g, s), line.put(g, e)) for (s, e), g in zip(flat, g_of, strict=True)]
    pools = _pools(sets[0], sets[1:])
    left = np.stack([line.measure(p) for p in pools], axis=1)
    want = np.array([[causes[(rs.rank, rs.step)].get(k, 0) for k in _ORDER] for rs in steps], np.int64)
    takes = _takes(want.reshape(len(steps), len(_ORDER)), left)
    wl = (line.off, line.off + (line.hi - line.lo))
    parts = []
    for p, iset in enumerate(pools):
        order = list(range(len(_ORDER)))
        if p == 1:
            first = {Cause.BUBBLE.code: 0, Cause.IMBALANCE.code: 1}
            order.sort(key=lambda c: first.get(_CAUSES[c], 2))
        rows, g, seq = _cut_all(line, iset, takes[:, p, :], order, p == 1, wl)
        parts.append((rows, g, np.full(g.size, p, np.int64), seq))
    return _tables(line, steps, parts)


def _tables(
    line: Line,
    steps: list[RankStep],
    parts: list[
        tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
    ],
) -> dict[int, GapTable]:
    """Each rank's gap table from the painted rows of every pool: rows in the order of the steps,
    then pools, then pieces (as :func:`paint_per_step` appends them), each rank's sorted by start
    (stable); ranks in the order of their first row, then the rest in the order of the steps."""
    rows = np.concatenate([x[0] for x in parts])
    g, p, seq = (np.concatenate([x[i] for x in parts]) for i in (1, 2, 3))
    o = _order_by(g, p, seq)
    rows, g = rows[o], g[o]
    rank_of = np.array([rs.rank for rs in steps], np.int64)
    step_of = np.array([rs.step for rs in steps], np.int64)
    r = rank_of[g]
    start, end = line.time_of(rows[:, 0], g), line.time_of(rows[:, 1], g)
    o = _order_by(r, start)  # stable: equal starts keep the order of the steps and pools
    start, end, cause, step, r = start[o], end[o], rows[o, 2], step_of[g[o]], r[o]
    ranks, first = np.unique(rank_of[g], return_index=True)
    order = ranks[np.argsort(first, kind="stable")].tolist()
    painted = set(order)
    order += [x for x in dict.fromkeys(rank_of.tolist()) if x not in painted]
    cut = np.searchsorted(r, np.array(order, np.int64), side="left")
    tables: dict[int, GapTable] = {}
    for rk, a in zip(order, cut.tolist(), strict=True):
        b = int(np.searchsorted(r, rk, side="right"))
        tables[rk] = GapTable(
            start[a:b].copy(),
            end[a:b].copy(),
            cause[a:b].astype(np.int8),
            np.full(b - a, -1, np.int32),
            step[a:b].astype(np.int32),
        )
    return tables
