"""Waits in collectives for the last arriver, charged to the late rank's root cause (docs/json.md).

A blocking collective ends together on all members of its group, so the member that arrived last
spends only the transfer in it and every earlier member spends ``its duration - transfer`` waiting.
The transfer of an instance is the shortest member's duration (the last arriver's, clock-free);
an instance whose members do not end together (an asynchronous op, clocks that could not be
aligned) is not a sync point and keeps its time as communication.

The wait of a member is exposed lost time only where the collective ran with no compute beside
it (the window's exposed communication). That part is moved out of ``exposed_comm`` to the reason
the last arriver was late, found by comparing it with the waiting member over the stretch since
their previous instance of the group (or since their step start):

* it began that stretch later (a late step start: CPU, data loading, the previous step) → ``host``;
* it had more idle time with host evidence (a host stall, an event-less stretch on CPU runs) → ``host``;
* it computed longer → ``imbalance``;
* it had more other idle (work queued, no evidence) → ``unexplained``;
* it spent more time in other communication → what its own waits there were charged to (waits
  propagate: a rank late to a data-parallel all-reduce because it waited for its tensor-parallel
  peer's slow GPU passes on ``imbalance``), else it stays ``exposed_comm``.

A last arriver of another pipeline replica (a data-parallel group of one stage across replicas)
that was late because it waited for its own pipeline (its point-to-point receives, which the
replay charges) passes on why that replica was slower than the waiting member's: the excess of
its replica's block compute (``imbalance``: a slow worker, longer micro-batches) and host-stall
time (``host``) over the waiting member's replica, summed over the replica's ranks up to each
member's arrival. So a slow worker in one replica makes the other replicas' waits in
``grads-reduce-scatter`` / ``params-all-gather`` its root cause's, not exposed communication.

Without a pipeline (not a rejected one's chain: ``causes._no_pipeline``), p2p ops are matched the
same way, each rank pair as a group of two (a send and its receive end together). The wait is
split over the positive differences in proportion, so the causes add up to the lost time exactly;
the same comparison against the member with the median arrival gives each late rank's lateness
and its reasons for the straggler finding (PP009).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.collective_spans import SpanMeasures
from ppdiag.attribution.replica_sums import replica_sums
from ppdiag.attribution.tolerance import ROUND_NS
from ppdiag.model import intervals as ivs
from ppdiag.pipeline.collectives import SYNC_TOL_NS, CollectiveMatch
from ppdiag.report_types import Cause

# a member whose arrival is later than the median member's by less than this is on time
LATE_TOL_NS = 20_000
# component order of the late rank's reasons, and the cause each is charged to
REASONS = ("late_start", "host_stall", "compute", "idle", "comm")
REASON_CAUSE: dict[str, Cause] = {
    "late_start": Cause.HOST,
    "host_stall": Cause.HOST,
    "compute": Cause.IMBALANCE,
    "idle": Cause.UNEXPLAINED,
    "comm": Cause.EXPOSED_COMM,
}


@dataclass
class RankSets:
    """What the waits need of one rank in one step: window and interval sets on the aligned clock."""

    rank: int
    step: int
    w0: int
    w1: int
    compute: ivs.ISet
    host: ivs.ISet  # lost time with host evidence
    comm: ivs.ISet  # exposed p2p and collectives
    # the step's first device work (the window may begin earlier, at the host's step start): a
    # rank whose device starts late is a late start, not a host stall inside the step
    first_work: int = 0
    # the step's pipeline blocks: their ends (sorted) and the running sum of their compute, for the
    # replica comparison (empty without a pipeline)
    block_end: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    block_busy_cum: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(1, np.int64))


@dataclass
class LateRank:
    """One rank that others waited for in collectives, totals over the analyzed steps (ns)."""

    rank: int
    instances: int = 0  # instances in which it arrived late
    lateness_ns: int = 0  # its arrival after the median member's, summed
    made_wait_ns: int = 0  # the others' waiting for it: each earlier member's wait beyond its own
    reasons_ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    groups: set[int] = field(default_factory=set)


@dataclass
class CollectiveWaits:
    """Collective waits of a run: the ns to move per (rank, step) and the late ranks."""

    moves: dict[tuple[int, int], dict[str, int]]  # cause -> ns moved out of exposed_comm
    waited: dict[tuple[int, int], int]  # exposed ns spent waiting for a later member (all of it)
    late: dict[int, LateRank]
    gain_ns: dict[int, int]  # per step index: time the step would save with every member on time
    n_steps: int
    instances: int
    syncs: int
    groups: list[tuple[int, ...]]
    notes: list[str] = field(default_factory=list)

    @property
    def total_waited_ns(self) -> int:
        return sum(self.waited.values())


def _alloc(total: npt.NDArray[np.int64], weights: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Split each row's ``total`` ns over its row of ``weights`` (negatives count as 0) in integers
    that add up exactly; a row without positive weight gets nothing."""
    w = np.maximum(weights, 0.0)
    ws = w.sum(axis=1)
    live = (ws > 0) & (total > 0)
    raw = np.where(live[:, None], total[:, None] * w / np.where(ws > 0, ws, 1.0)[:, None], 0.0)
    out = np.floor(raw).astype(np.int64)
    rest = np.where(live, total - out.sum(axis=1), 0)
    # the remainder (< number of columns) goes to the largest fractional parts
    rank_of = np.argsort(np.argsort(-(raw - out), axis=1, kind="stable"), axis=1, kind="stable")
    out += (rank_of < rest[:, None]).astype(np.int64)
    return out


def _rows_before(
    key: npt.NDArray[np.integer],
    t: npt.NDArray[np.int64],
    q_key: npt.NDArray[np.integer],
    q_t: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """For rows sorted by (``key``, ``t``): how many come before each query (``q_key``, ``q_t``),
    rows equal to a query after it (``searchsorted(side="left")`` on the pairs), by one sort of
    rows and queries together (a search per key would scan the queries once per key)."""
    n = key.size
    kind = np.r_[np.ones(n, np.int8), np.zeros(q_key.size, np.int8)]  # a query before equal rows
    o = np.lexsort((kind, np.r_[t, q_t], np.r_[key, q_key]))
    is_q = o >= n
    pos = np.flatnonzero(is_q)
    out = np.empty(q_key.size, np.int64)
    # a query's place in the merged order less the queries before it: the rows before it
    out[o[is_q] - n] = pos - np.arange(pos.size)
    return out


def _inherit(
    match: CollectiveMatch,
    seg0: npt.NDArray[np.int64],
    waiting: npt.NDArray[np.int64],
    lrow: npt.NDArray[np.int64],
    shares: npt.NDArray[np.int64],
    rounds: int = 3,
) -> npt.NDArray[np.int64]:
    """Waits propagate: a last arriver that was late because it waited in another collective
    first (its ``comm`` excess) passes on the causes that wait was charged to.

    For each waiting row, the ``comm`` share moves to the non-comm causes of the last arriver's
    own waits since its stretch began (as far as they go), in proportion; a few rounds follow
    chains (a TP peer's slow GPU delays a DP all-reduce).
    """
    comm = REASONS.index("comm")
    n_rows = len(match.inst)
    if waiting.size == 0:
        return shares
    # every row in (rank, start) order: a rank's rows are one slice, so the running sums of the
    # shares over all rows give any stretch of one rank's rows as a difference; each waiting row's
    # stretch (its last arriver's rows that began in [seg0, start)) is found once for all rounds
    by_rs = np.lexsort((match.start, match.rank))
    r_sorted, s_sorted, lr_rank = match.rank[by_rs], match.start[by_rs], match.rank[lrow]
    lo = _rows_before(r_sorted, s_sorted, lr_rank, seg0[lrow])
    hi = _rows_before(r_sorted, s_sorted, lr_rank, match.start[lrow])
    full = np.zeros((n_rows, len(REASONS)), np.int64)
    cum = np.zeros((n_rows + 1, len(REASONS)), np.int64)
    for _ in range(rounds):
        full[:] = 0
        full[waiting] = shares
        np.cumsum(full[by_rs], axis=0, out=cum[1:])
        passed = passed_on(shares, cum[hi] - cum[lo], comm)
        if passed is None:
            break
        shares = passed
    return shares


def passed_on(
    shares: npt.NDArray[np.int64], seg_tot: npt.NDArray[np.int64], comm: int
) -> npt.NDArray[np.int64] | None:
    """One round of :func:`_inherit`: each waiting row's ``comm`` share moves to the non-comm
    causes of its stretch (``seg_tot``, one row per waiting row, modified), as far as they go, in
    proportion; None when nothing moves."""
    seg_tot[:, comm] = 0
    take = np.minimum(shares[:, comm], seg_tot.sum(axis=1))
    if not take.any():
        return None
    moved = _alloc(take, seg_tot.astype(np.float64))
    out = shares.copy()
    out[:, comm] -= moved.sum(axis=1)
    return out + moved


def _replica_excess(
    sets: list[RankSets],
    match: CollectiveMatch,
    row_key: npt.NDArray[np.int64],
    waiting: npt.NDArray[np.int64],
    lrow: npt.NDArray[np.int64],
    shares: npt.NDArray[np.int64],
    pipeline_of: Mapping[int, int],
    tol_ns: int = ROUND_NS,
) -> npt.NDArray[np.int64]:
    """The ``comm`` share of each wait for a last arriver of another pipeline replica, moved to
    why that replica was slower (module docstring): its ranks' block compute finished before its
    arrival and their host-stall time up to it, minus the same of the waiting member's replica up
    to the waiting member's arrival. At most the positive excess moves (a replica late for a reason
    seen in neither, a slow link, keeps the rest as communication)."""
    comm = REASONS.index("comm")
    if not pipeline_of or waiting.size == 0:
        return shares
    n_lut = max(max(pipeline_of), int(match.rank.max())) + 1
    lut = np.full(n_lut, -1, np.int64)
    for r, p in pipeline_of.items():  # one entry per rank
        lut[r] = p
    pw, pl = lut[match.rank[waiting]], lut[match.rank[lrow]]
    todo = np.flatnonzero((shares[:, comm] > 0) & (pw >= 0) & (pl >= 0) & (pw != pl) & (row_key[lrow] >= 0))
    if todo.size == 0:
        return shares
    step_of_set = np.array([rs.step for rs in sets], np.int64)
    n_step = int(step_of_set.max()) + 1
    # two queries per row (the late replica up to its arrival, the waiting one up to its own),
    # grouped by (replica, step) so that each rank-step answers its batch in one vectorized pass
    q_t = np.r_[match.start[lrow[todo]], match.start[waiting[todo]]]
    q_key = (
        np.r_[pl[todo], pw[todo]] * n_step
        + np.r_[step_of_set[row_key[lrow[todo]]], step_of_set[row_key[waiting[todo]]]]
    )
    order = np.argsort(q_key, kind="stable")
    k_sorted = q_key[order]
    comp, host = replica_sums(sets, lut, n_step, k_sorted, order, q_t, tol_ns)
    n = todo.size
    ex = np.zeros((n, len(REASONS)), np.float64)
    ex[:, REASONS.index("host_stall")] = host[:n] - host[n:]
    ex[:, REASONS.index("compute")] = comp[:n] - comp[n:]
    avail = np.maximum(ex, 0).sum(axis=1).astype(np.int64)
    take = np.minimum(shares[todo, comm], avail)
    moved = _alloc(take, ex)
    shares = shares.copy()
    shares[todo, comm] -= moved.sum(axis=1)
    shares[todo] += moved
    return shares


class _Sync(NamedTuple):
    """Per matched instance (``xfer``, ``sync``) and member row (``dur``, ``wait``): the
    transfer (the shortest member's duration), whether its members end together, and each
    member's wait in it."""

    ok: npt.NDArray[np.bool_]  # an instance with two members at least
    safe_first: npt.NDArray[np.int64]  # each instance's first row (clipped for reduceat)
    dur: npt.NDArray[np.int64]
    xfer: npt.NDArray[np.int64]
    shift: npt.NDArray[np.int64]  # each row's correction to the group's common clock
    sync: npt.NDArray[np.bool_]
    wait: npt.NDArray[np.int64]


class _Rows(NamedTuple):
    """Per member row: its (rank, step) in ``sets`` (-1 outside every analyzed step), the start of
    the stretch before its arrival, that stretch's components (``REASONS`` order), and its wait's
    exposed part (``wexp`` without, ``wall`` with the excluded spans)."""

    key: npt.NDArray[np.int64]
    seg0: npt.NDArray[np.int64]
    comps: npt.NDArray[np.int64]
    wexp: npt.NDArray[np.int64]
    wall: npt.NDArray[np.int64]


def _sync_split(match: CollectiveMatch) -> _Sync:
    """Transfer and waits of every instance: a member waits ``its duration - transfer`` where the
    members end together (on the group's common clock)."""
    first, count = match.first, match.count
    ok = count >= 2
    dur = match.end - match.start
    inst = match.inst
    # transfer = the shortest member's duration; the sync test: members end together
    safe_first = np.minimum(first, max(len(dur) - 1, 0))
    xfer = np.where(ok, np.minimum.reduceat(dur, safe_first), 0) if len(dur) else np.zeros(0, np.int64)
    shift = match.shift if match.shift is not None else np.zeros(len(inst), np.int64)
    e_hi = np.maximum.reduceat(match.end + shift, safe_first)
    e_lo = np.minimum.reduceat(match.end + shift, safe_first)
    sync = ok & (e_hi - e_lo <= np.maximum(xfer // 2, SYNC_TOL_NS))
    wait = np.where(sync[inst], dur - xfer[inst], 0).astype(np.int64)
    return _Sync(ok, safe_first, dur, xfer, shift, sync, wait)


def _row_keys(sets: list[RankSets], match: CollectiveMatch) -> npt.NDArray[np.int64]:
    """Each member row's (rank, step) from the rank's windows: its index into ``sets`` or -1."""
    by_rank: dict[int, list[RankSets]] = defaultdict(list)
    for rs in sets:
        by_rank[rs.rank].append(rs)
    row_key = np.full(len(match.inst), -1, np.int64)  # index into `sets`
    index = {id(rs): i for i, rs in enumerate(sets)}
    # rows grouped by rank (and below by rank-step) with one sort, so each group is a slice
    by_r = np.argsort(match.rank, kind="stable")
    r_sorted = match.rank[by_r]
    for r, lst in by_rank.items():
        lst.sort(key=lambda x: x.w0)
        w0 = np.array([x.w0 for x in lst], np.int64)
        w1 = np.array([x.w1 for x in lst], np.int64)
        rows = by_r[np.searchsorted(r_sorted, r, "left") : np.searchsorted(r_sorted, r, "right")]
        if rows.size == 0:
            continue
        k = np.searchsorted(w0, match.start[rows], side="right") - 1
        kc = np.maximum(k, 0)
        inside = (k >= 0) & (match.start[rows] < w1[kc])
        ids = np.array([index[id(x)] for x in lst], np.int64)
        row_key[rows[inside]] = ids[kc[inside]]
    return row_key


_NONE: ivs.ISet = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def _measures_per_set(
    sets: list[RankSets],
    row_key: npt.NDArray[np.int64],
    seg0: npt.NDArray[np.int64],
    arrive: npt.NDArray[np.int64],
    wait: npt.NDArray[np.int64],
    exclude: dict[tuple[int, int], ivs.ISet] | None,
) -> tuple[npt.NDArray[np.int64], ...]:
    """:func:`_arrivals`' compute, host and comm before each arrival, and the exposed part of each
    wait with and without the exclusion, one rank-step at a time (sets outside their window)."""
    n = row_key.size
    comp, host, comm, wexp, wall = (np.zeros(n, np.int64) for _ in range(5))
    by_k = np.argsort(row_key, kind="stable")
    k_sorted = row_key[by_k]
    bounds = np.searchsorted(k_sorted, np.arange(len(sets) + 1), "left")
    for i, rs in enumerate(sets):
        rows = by_k[bounds[i] : bounds[i + 1]]
        if rows.size == 0:
            continue
        a, b = seg0[rows], np.maximum(arrive[rows], seg0[rows])
        comp[rows] = ivs.prefix_measure(rs.compute, b) - ivs.prefix_measure(rs.compute, a)
        host[rows] = ivs.prefix_measure(rs.host, b) - ivs.prefix_measure(rs.host, a)
        comm[rows] = ivs.prefix_measure(rs.comm, b) - ivs.prefix_measure(rs.comm, a)
        ws, we = arrive[rows], arrive[rows] + wait[rows]
        wx = ivs.prefix_measure(rs.comm, we) - ivs.prefix_measure(rs.comm, ws)
        wall[rows] = wx
        if exclude and (rs.rank, rs.step) in exclude:
            # the part of the wait inside the excluded spans is the other model's
            other = ivs.intersect(rs.comm, exclude[(rs.rank, rs.step)])
            wx = wx - (ivs.prefix_measure(other, we) - ivs.prefix_measure(other, ws))
        wexp[rows] = wx
    return comp, host, comm, wexp, wall


def _arrivals(
    sets: list[RankSets],
    match: CollectiveMatch,
    sy: _Sync,
    exclude: dict[tuple[int, int], ivs.ISet] | None,
) -> _Rows:
    """The stretch before each arrival (since the rank's previous instance of the group in the
    step) split into compute, host, comm and idle, and the exposed part of each member's wait."""
    inst = match.inst
    row_key = _row_keys(sets, match)
    grp = match.group[inst]
    order = np.lexsort((match.start, grp, match.rank))
    prev_end = np.full(len(inst), np.iinfo(np.int64).min, np.int64)
    same = (match.rank[order][1:] == match.rank[order][:-1]) & (grp[order][1:] == grp[order][:-1])
    prev_end[order[1:][same]] = match.end[order][:-1][same]
    w0_sets = np.array([rs.first_work for rs in sets], np.int64)
    w0_row = np.where(row_key >= 0, w0_sets[np.maximum(row_key, 0)], 0)
    seg0 = np.maximum(prev_end, w0_row)
    arrive = match.start
    # per row: compute, host, comm in [seg0, arrive] and the exposed part of its wait
    comp = np.zeros(len(inst), np.int64)
    host = np.zeros(len(inst), np.int64)
    comm = np.zeros(len(inst), np.int64)
    wexp = np.zeros(len(inst), np.int64)
    wall = np.zeros(len(inst), np.int64)  # the same without the exclusion (for lateness and gain)
    sm = SpanMeasures.of(
        np.array([rs.w0 for rs in sets], np.int64),
        np.array([rs.w1 for rs in sets], np.int64),
        [[rs.compute for rs in sets], [rs.host for rs in sets], [rs.comm for rs in sets]],
    )
    if sm is None:
        comp, host, comm, wexp, wall = _measures_per_set(sets, row_key, seg0, arrive, sy.wait, exclude)
    else:
        # every rank-step at once: the sets on one line, one prefix measure per kind
        rows = np.flatnonzero(row_key >= 0)
        k = row_key[rows]
        a, b = seg0[rows], np.maximum(arrive[rows], seg0[rows])
        ws, we = arrive[rows], arrive[rows] + sy.wait[rows]
        for out, iset in zip((comp, host, comm), sm.kinds, strict=True):
            out[rows] = sm.between(iset, k, a, b)
        wall[rows] = sm.between(sm.kinds[2], k, ws, we)
        wexp[rows] = wall[rows]
        if exclude:
            # the part of the wait inside the excluded spans is the other model's
            spans = [exclude.get((rs.rank, rs.step), _NONE) for rs in sets]
            other = ivs.intersect(sm.kinds[2], sm.clipped(spans))
            wexp[rows] -= sm.between(other, k, ws, we)
    idle = np.maximum((np.maximum(arrive, seg0) - seg0) - comp - host - comm, 0)
    # REASONS order; the start is relative (absolute ns would lose precision as floats)
    # (on the group's common clock: a member's shift corrects what the clock alignment left)
    comps = np.stack([seg0 + sy.shift - int(match.start.min()), host, comp, idle, comm], axis=1)
    return _Rows(row_key, seg0, comps, wexp, wall)


def collective_waits(
    sets: list[RankSets],
    match: CollectiveMatch,
    exclude: dict[tuple[int, int], ivs.ISet] | None = None,
    pipeline_of: Mapping[int, int] | None = None,
    tol_ns: int = ROUND_NS,
) -> CollectiveWaits:
    """Split every matched collective into waiting and transfer and charge the waiting.

    ``exclude`` maps (rank, step) to spans whose time another model already charges (the replay's
    step-end sync, its blocks): the waits inside them are measured but not moved.
    ``pipeline_of`` maps ranks to their pipeline replica, for waits on a late replica.
    ``tol_ns``: how far two times may disagree from the input's rounding (``tolerance``).
    """
    n_steps = len({s.step for s in sets})
    if len(match) == 0 or not sets:
        return CollectiveWaits({}, {}, {}, {}, n_steps, len(match), 0, list(match.groups))
    sy = _sync_split(match)
    rw = _arrivals(sets, match, sy, exclude)
    inst, first, count = match.inst, match.first, match.count
    # the last arriver of each instance (shortest duration) and the median member (median wait)
    last_row = np.lexsort((sy.dur, inst))[first]
    o_w = np.lexsort((sy.wait, inst))
    med_row = o_w[first + count // 2]
    moves, waited = _charge_waiting(sets, match, rw, last_row, pipeline_of or {}, tol_ns)
    late = _late_ranks(match, sy, rw, o_w, med_row)
    gain = _step_gain(sets, sy, rw, inst, med_row)
    notes: list[str] = []
    n_async = int((sy.ok & ~sy.sync).sum())
    if n_async:
        notes.append(
            f"{n_async} of {int(sy.ok.sum())} matched collective instances do not end together on their "
            "members (asynchronous, or clocks not aligned): their time is not split into waiting and transfer"
        )
    return CollectiveWaits(
        moves,
        waited,
        late,
        dict(gain),
        n_steps,
        len(match),
        int(sy.sync.sum()),
        list(match.groups),
        notes,
    )


def _charge_waiting(
    sets: list[RankSets],
    match: CollectiveMatch,
    rw: _Rows,
    last_row: npt.NDArray[np.int64],
    pipeline_of: Mapping[int, int],
    tol_ns: int,
) -> tuple[dict[tuple[int, int], dict[str, int]], dict[tuple[int, int], int]]:
    """The waiting members: each wait charged to the last arriver's excess over the member, as
    causes moved per (rank, step), and the time waited per (rank, step) (also where another
    model, the replay's sync, charges it)."""
    inst, row_key = match.inst, rw.key
    valid = row_key >= 0
    n_sets = len(sets)
    waiting = np.flatnonzero(valid & (rw.wexp > 0) & (match.rank != match.rank[last_row[inst]]))
    lrow = last_row[inst[waiting]]
    shares = _alloc(rw.wexp[waiting], (rw.comps[lrow] - rw.comps[waiting]).astype(np.float64))
    # no visible reason: the wait stays unexplained; a last arriver outside the analyzed steps
    # cannot be compared: its members' waits stay communication
    rest = rw.wexp[waiting] - shares.sum(axis=1)
    shares[:, REASONS.index("idle")] += np.where(valid[lrow], rest, 0)
    shares[:, REASONS.index("comm")] += np.where(valid[lrow], 0, rest)
    shares = _inherit(match, rw.seg0, waiting, lrow, shares)
    shares = _replica_excess(sets, match, row_key, waiting, lrow, shares, pipeline_of, tol_ns)
    per_set = np.zeros((n_sets, len(REASONS)), np.int64)
    np.add.at(per_set, row_key[waiting], shares)
    # the waiting itself, also where another model (the replay's sync) charges it
    all_waiting = np.flatnonzero(valid & (rw.wall > 0) & (match.rank != match.rank[last_row[inst]]))
    waited_set = np.zeros(n_sets, np.int64)
    np.add.at(waited_set, row_key[all_waiting], rw.wall[all_waiting])
    moves: dict[tuple[int, int], dict[str, int]] = {}
    waited: dict[tuple[int, int], int] = {}
    for si in np.flatnonzero(waited_set > 0).tolist():
        key = (sets[si].rank, sets[si].step)
        waited[key] = int(waited_set[si])
        mv: dict[str, int] = defaultdict(int)
        for j, name in enumerate(REASONS):
            if per_set[si, j] and REASON_CAUSE[name] != Cause.EXPOSED_COMM:
                mv[REASON_CAUSE[name]] += int(per_set[si, j])
        moves[key] = dict(mv)
    return moves, waited


def _late_ranks(
    match: CollectiveMatch,
    sy: _Sync,
    rw: _Rows,
    o_w: npt.NDArray[np.int64],
    med_row: npt.NDArray[np.int64],
) -> dict[int, LateRank]:
    """The late members: arrival after the median member, its reasons, and how long it made the
    others wait."""
    inst, first, count = match.inst, match.first, match.count
    valid = rw.key >= 0
    wait = sy.wait
    lateness = np.where(valid & sy.sync[inst], wait[med_row[inst]] - wait, 0).astype(np.int64)
    # only where the others' waiting was lost time: a wait hidden under compute costs nothing
    exposed_inst = np.maximum.reduceat(np.where(valid, rw.wall, 0), sy.safe_first) > 0
    is_late = (lateness > LATE_TOL_NS) & exposed_inst[inst]
    # how long it made the others wait: the members that arrived before it wait for it at least
    # (their wait - its own wait); a sum of suffixes of the waits sorted within each instance
    ws = wait[o_w]
    cum = np.cumsum(ws)
    pos = np.empty(len(inst), np.int64)
    pos[o_w] = np.arange(len(inst))
    last_pos = (first + count - 1)[inst]
    made_all = (cum[last_pos] - cum[pos]) - (last_pos - pos) * wait
    rows = np.flatnonzero(is_late)
    reasons = _alloc(lateness[rows], (rw.comps[rows] - rw.comps[med_row[inst[rows]]]).astype(np.float64))
    reasons[:, REASONS.index("idle")] += lateness[rows] - reasons.sum(axis=1)
    made = made_all[rows]
    if rows.size == 0:
        return {}
    # the late rows grouped by rank with one sort (a mask per rank would scan them once per rank)
    ranks_late = match.rank[rows]
    o = np.argsort(ranks_late, kind="stable")
    uniq, cut = np.unique(ranks_late[o], return_index=True)
    n_late = np.diff(np.r_[cut, rows.size])
    lat_sum = np.add.reduceat(lateness[rows][o], cut)
    made_sum = np.add.reduceat(made[o], cut)
    reasons_sum = np.add.reduceat(reasons[o], cut, axis=0)
    # each rank's distinct groups: the distinct (rank, group) pairs, a slice per rank
    pairs = np.unique(np.stack([ranks_late, match.group[inst[rows]]], axis=1).astype(np.int64), axis=0)
    g_cut = [*np.searchsorted(pairs[:, 0], uniq, "left").tolist(), len(pairs)]
    late: dict[int, LateRank] = {}
    for i, r in enumerate(uniq.tolist()):
        lr = LateRank(int(r), int(n_late[i]), int(lat_sum[i]), int(made_sum[i]))
        lr.reasons_ns = {name: int(reasons_sum[i, j]) for j, name in enumerate(REASONS)}
        lr.groups = set(pairs[g_cut[i] : g_cut[i + 1], 1].tolist())
        late[int(r)] = lr
    return late


def _step_gain(
    sets: list[RankSets], sy: _Sync, rw: _Rows, inst: npt.NDArray[np.int64], med_row: npt.NDArray[np.int64]
) -> dict[int, int]:
    """Step time saved with every member on time: an instance would end when its median member
    arrives, so each rank saves its own exposed wait up to the median member's; a rank saves the
    sum over its instances (a wait inherited from an earlier instance is not counted twice: the
    late rank itself did not wait in the later one), and the step what its most delayed rank
    saves (groups that run side by side do not add up)."""
    valid = rw.key >= 0
    med_wall = np.where(valid[med_row] & sy.sync, rw.wall[med_row], 0)
    saved = np.minimum(rw.wall, med_wall[inst])
    per_set_gain = np.zeros(len(sets), np.int64)
    np.add.at(per_set_gain, rw.key[valid], saved[valid])
    step_of_set = np.array([rs.step for rs in sets], np.int64)
    g = np.zeros(int(step_of_set.max()) + 1, np.int64)
    np.maximum.at(g, step_of_set, per_set_gain)
    return {int(k): int(g[k]) for k in np.flatnonzero(g > 0)}


def apply_moves(causes: dict[str, int], moves: dict[str, int]) -> dict[str, int]:
    """``causes`` with the waits moved out of ``exposed_comm`` (never more than it holds), so the
    total is unchanged."""
    total = sum(moves.values())
    have = causes.get("exposed_comm", 0)
    if total <= 0 or have <= 0:
        return causes
    take = _alloc(np.array([min(total, have)], np.int64), np.array([[float(v) for v in moves.values()]]))[0]
    out = dict(causes)
    out["exposed_comm"] = have - int(take.sum())
    for k, ns in zip(moves, take, strict=True):
        out[k] = out.get(k, 0) + int(ns)
    return out


__all__ = [
    "REASONS",
    "CollectiveWaits",
    "LateRank",
    "RankSets",
    "apply_moves",
    "collective_waits",
]
