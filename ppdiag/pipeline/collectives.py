"""Match collective instances across the ranks of a process group.

Every rank of a group calls the same collectives in the same order, so the instances line up:
by the group's sequence number (``Seq``) when every op carries one, else by the order within the
group when every member saw the same number of them, else by time against the member that saw
the most (a blocking collective ends together on all members once the clocks are aligned). A
member without an op for an instance is counted as missing; an op that lands on an instance its
rank already filled is counted as dropped. Several kernels of one rank for one ``Seq`` (a
coalesced or chunked collective) are one instance spanning them.

The result is columnar: one row per (instance, member) on the aligned clock, sorted by instance
then rank, plus one row per instance. Only collectives of groups with two or more traced members
are matched. Everything is sorting and ``searchsorted``; no per-event Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, RankTimeline
from ppdiag.pipeline.group_members import TracedMembers

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

# how an instance was matched
BY_SEQ = 0
BY_ORDER = 1
BY_TIME = 2
# member ends closer than this (or half the transfer) are "together"
SYNC_TOL_NS = 50_000
METHOD_NAMES = ("seq", "order", "time")


@dataclass
class CollectiveMatch:
    """Collective instances matched across ranks (aligned clock, ns).

    Member rows (``rank``, ``start``, ``end``, ``inst``) are sorted by instance, then rank.
    Instance rows: ``group`` indexes :attr:`groups` (the ranks of each process group, or the
    traced ranks that carry group-less collectives), ``method`` is ``BY_SEQ`` / ``BY_ORDER`` /
    ``BY_TIME``, ``first`` / ``count`` locate its member rows, ``expected`` is how many traced
    members the group has. ``shift`` corrects what the run's clock alignment left between the
    members of a group (see :func:`_end_offsets`); it is 0 where the ends already agree.
    """

    inst: I64
    rank: I32
    start: I64
    end: I64
    group: I32
    method: npt.NDArray[np.int8]
    first: I64
    count: I64
    expected: I64
    shift: I64 | None = None  # per member row: ns that put its times on the group's common clock
    groups: list[tuple[int, ...]] = field(default_factory=list)
    missing: int = 0  # member slots without an op
    dropped: int = 0  # ops that fell on an instance their rank already filled
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.group.shape[0])

    def only_groups(self, keep: npt.NDArray[np.bool_]) -> CollectiveMatch:
        """The instances of the groups with ``keep[group]`` true (instances renumbered)."""
        ki = keep[self.group]
        if ki.all():
            return self
        new_id = np.cumsum(ki) - 1
        rows = ki[self.inst]
        count = self.count[ki]
        first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        shift = self.shift[rows] if self.shift is not None else None
        return CollectiveMatch(
            new_id[self.inst[rows]].astype(np.int64),
            self.rank[rows],
            self.start[rows],
            self.end[rows],
            self.group[ki],
            self.method[ki],
            first,
            count,
            self.expected[ki],
            shift,
            self.groups,
            self.missing,
            self.dropped,
            self.warnings,
        )

    @classmethod
    def empty(cls) -> CollectiveMatch:
        z64 = np.zeros(0, np.int64)
        z32 = np.zeros(0, np.int32)
        return cls(z64, z32, z64, z64, z32.copy(), np.zeros(0, np.int8), z64, z64, z64, z64.copy())


def _group_key(tl: RankTimeline, gi: int, traced: TracedMembers) -> tuple[str, tuple[int, ...]] | None:
    """Key of process group ``gi`` of ``tl``: its traced members when the trace lists them, else
    its name (an NCCL communicator id: every member sees the same); None for a group with fewer
    than two traced members, ``("", ())`` when the op names no group."""
    if gi < 0:
        return "", ()
    if gi >= len(tl.process_groups):
        return None
    pg = tl.process_groups[gi]
    if not pg.ranks:
        return (f"name:{pg.name}", ()) if pg.name else None
    ranks, members = traced.of(pg.ranks)
    return ("ranks", ranks) if len(ranks) >= 2 and tl.rank in members else None


def _merge_seq(rank: I32, seq: I64, start: I64, end: I64) -> tuple[I32, I64, I64, I64]:
    """One row per (rank, seq): the span of all its kernels."""
    order = np.lexsort((start, seq, rank))
    rank, seq, start, end = rank[order], seq[order], start[order], end[order]
    new = np.ones(rank.size, dtype=bool)
    new[1:] = (rank[1:] != rank[:-1]) | (seq[1:] != seq[:-1])
    idx = np.flatnonzero(new)
    return rank[idx], seq[idx], np.minimum.reduceat(start, idx), np.maximum.reduceat(end, idx)


def _by_time(rank: I32, start: I64, end: I64, members: tuple[int, ...]) -> tuple[I64, I64, int]:
    """Instance index of each op by its end against the member with the most ops; ops of a rank
    that fall on the same instance keep the closest one. Returns (instance, kept mask, n)."""
    counts = np.bincount(np.searchsorted(np.asarray(members), rank), minlength=len(members))
    ref = members[int(np.argmax(counts))]
    ref_end = np.sort(end[rank == ref])
    n = int(ref_end.size)
    j = np.clip(np.searchsorted(ref_end, end), 1, max(n - 1, 1))
    lo = np.minimum(j - 1, n - 1)
    hi = np.minimum(j, n - 1)
    pick = np.where(np.abs(end - ref_end[lo]) <= np.abs(end - ref_end[hi]), lo, hi)
    dist = np.abs(end - ref_end[pick])
    # within each (rank, instance) keep the op closest to the reference
    order = np.lexsort((dist, pick, rank))
    first = np.ones(order.size, dtype=bool)
    first[1:] = (rank[order][1:] != rank[order][:-1]) | (pick[order][1:] != pick[order][:-1])
    keep = np.zeros(order.size, dtype=bool)
    keep[order[first]] = True
    return pick.astype(np.int64), keep, n


def _synced(start: I64, end: I64, inst: I64, n_inst: int) -> npt.NDArray[np.bool_]:
    """Instances whose members end together: within half the shortest duration (at least 50 µs)."""
    dur = end - start
    big = np.iinfo(np.int64).max
    lo, hi, dmin = np.full(n_inst, big), np.full(n_inst, -big), np.full(n_inst, big)
    np.minimum.at(lo, inst, end)
    np.maximum.at(hi, inst, end)
    np.minimum.at(dmin, inst, dur)
    cnt = np.bincount(inst, minlength=n_inst)
    synced: npt.NDArray[np.bool_] = (cnt >= 2) & (hi - lo <= np.maximum(dmin // 2, SYNC_TOL_NS))
    return synced


def _end_offsets(rank: I32, start: I64, end: I64, inst: I64, n_inst: int, members: tuple[int, ...]) -> I64:
    """Per row, the shift that makes the group's collectives end together when the run's clocks
    left the members apart (traces whose clocks could not be aligned otherwise).

    Each member's offset is the median over instances of its end minus the first member's end. It
    is used only when it turns most instances into ones that end together (at least 80 %, and 20
    points more than before): asynchronous collectives, whose ends differ at random, keep 0.
    """
    zero = np.zeros(rank.size, np.int64)
    if n_inst < 2:
        return zero
    before = _synced(start, end, inst, n_inst)
    if before.mean() >= 0.8:
        return zero
    ref_end = np.full(n_inst, np.iinfo(np.int64).min)
    is_ref = rank == members[0]
    ref_end[inst[is_ref]] = end[is_ref]
    has = ref_end[inst] != np.iinfo(np.int64).min
    off = {m: 0 for m in members}
    for m in members[1:]:  # one median per member (not per event)
        sel = has & (rank == m)
        if sel.any():
            off[m] = int(np.median(end[sel] - ref_end[inst[sel]]))
    lut = np.array([off[m] for m in members], np.int64)
    shift = -lut[np.searchsorted(np.asarray(members), rank)]
    after = _synced(start + shift, end + shift, inst, n_inst)
    if after.mean() >= 0.8 and after.mean() >= before.mean() + 0.2:
        return shift
    return zero


# one rank's ops of one group: (rank, seq, start, end) columns
_Part = tuple[I32, I64, I64, I64]
_GroupKey = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class _Group:
    """One group's member rows matched into instances (``inst`` numbered from 0 in the group)."""

    members: tuple[int, ...]
    rank: I32
    start: I64
    end: I64
    inst: I64
    n_inst: int
    method: int
    shift: I64


def match_collectives(timelines: dict[int, RankTimeline], p2p: bool = False) -> CollectiveMatch:
    """Match the device collectives (or host collectives of CPU-only runs) of every group.

    ``p2p``: also match point-to-point ops, each rank pair as a group of two (a send and its
    receive end together like a collective); ops without a known peer only when exactly two ranks
    have them. Meant for runs without a pipeline: in a pipeline the replay models the transfers.
    """
    parts = _gather(timelines, p2p)
    matched: list[_Group] = []
    dropped = 0
    for key in sorted(parts):
        rank = np.concatenate([p[0] for p in parts[key]])
        members = tuple(sorted({int(x) for x in np.unique(rank)}))
        if len(members) < 2:
            continue
        g, d = _match_group(parts[key], members)
        matched.append(g)
        dropped += d
    if not matched:
        return CollectiveMatch.empty()
    return _assemble(matched, dropped)


def _gather(timelines: dict[int, RankTimeline], p2p: bool) -> dict[_GroupKey, list[_Part]]:
    """Every rank's collectives (and p2p ops with ``p2p``) under their group key, on the aligned
    clock (vectorized per rank and group)."""
    traced = set(timelines)
    traced_members = TracedMembers(traced)
    parts: dict[_GroupKey, list[_Part]] = {}

    def add(key: _GroupKey, r: int, seq: I64, start: I64, end: I64) -> None:
        parts.setdefault(key, []).append((np.full(seq.size, r, np.int32), seq, start, end))

    for r, tl in sorted(timelines.items()):
        iv = tl.intervals
        off = tl.clock_offset_ns
        m = iv.kind == int(Kind.COLLECTIVE)
        grp = iv.group[m]
        for gi in np.unique(grp):
            sel = grp == gi
            key = _group_key(tl, int(gi), traced_members)
            if key is None:
                continue  # a group with one traced member: nothing to match
            add(key, r, iv.seq[m][sel].astype(np.int64), iv.start[m][sel] + off, iv.end[m][sel] + off)
        if not p2p:
            continue
        pm = iv.kind == int(Kind.P2P)
        peer = iv.peer[pm]
        for q in np.unique(peer):
            q = int(q)
            if q >= 0 and (q not in traced or q == r):
                continue
            sel = peer == q
            if q < 0:
                # sends and receives at once, or of unknown direction (a SendRecv kernel no
                # NCCL call explains): not a one-way transfer of some pair
                both = (iv.direction[pm] == int(Direction.BOTH)) | (iv.direction[pm] == int(Direction.NONE))
                for key, m_ in ((("exchange", ()), sel & both), (("p2p", ()), sel & ~both)):
                    if m_.any():
                        add(
                            key,
                            r,
                            np.full(int(m_.sum()), -1, np.int64),
                            iv.start[pm][m_] + off,
                            iv.end[pm][m_] + off,
                        )
                continue
            # p2p sequence numbers are not kept in step on the two sides: match by order
            key = ("pair", (min(r, q), max(r, q)))
            add(key, r, np.full(int(sel.sum()), -1, np.int64), iv.start[pm][sel] + off, iv.end[pm][sel] + off)
    # ops without a group are matched among all ranks that have such ops
    if ("", ()) in parts:
        unknown = tuple(sorted({int(p[0][0]) for p in parts[("", ())]}))
        lost = parts.pop(("", ()))
        if len(unknown) >= 2:
            parts[("ranks", unknown)] = lost + parts.get(("ranks", unknown), [])
    # p2p ops without a peer: a pair only when two ranks have them
    if ("p2p", ()) in parts:
        two = tuple(sorted({int(p[0][0]) for p in parts[("p2p", ())]}))
        lost = parts.pop(("p2p", ()))
        if len(two) == 2:
            parts[("pair", two)] = lost + parts.get(("pair", two), [])
    # grouped send+receive ops without one peer (an all-to-all NCCL ran as grouped send/recv) and
    # p2p kernels of unknown direction and peer: matched among all ranks that have them, like a
    # collective of unknown group
    if ("exchange", ()) in parts:
        xs = parts.pop(("exchange", ()))
        members = tuple(sorted({int(p[0][0]) for p in xs}))
        if len(members) >= 2:
            key = ("pair", members) if len(members) == 2 else ("ranks", members)
            parts[key] = xs + parts.get(key, [])
    return parts


def _match_group(parts: list[_Part], members: tuple[int, ...]) -> tuple[_Group, int]:
    """One group's ops numbered into instances (by sequence number, by order, or by time) and
    their clock shifts; also how many ops were dropped as indistinguishable from a neighbour."""
    rank = np.concatenate([p[0] for p in parts])
    seq = np.concatenate([p[1] for p in parts])
    start = np.concatenate([p[2] for p in parts])
    end = np.concatenate([p[3] for p in parts])
    dropped = 0
    if (seq >= 0).all():
        rank, seq, start, end = _merge_seq(rank, seq, start, end)
        useq, inst = np.unique(seq, return_inverse=True)
        n_inst, method = int(useq.size), BY_SEQ
    else:
        order = np.lexsort((start, rank))
        rank, start, end = rank[order], start[order], end[order]
        counts = np.bincount(np.searchsorted(np.asarray(members), rank), minlength=len(members))
        if (counts == counts[0]).all():
            first = np.concatenate([[0], np.cumsum(counts)[:-1]])
            inst = np.arange(rank.size) - np.repeat(first, counts)
            n_inst, method = int(counts[0]), BY_ORDER
        else:
            inst, keep, n_inst = _by_time(rank, start, end, members)
            dropped += int((~keep).sum())
            rank, start, end, inst = rank[keep], start[keep], end[keep], inst[keep]
            method = BY_TIME
    shift = _end_offsets(rank.astype(np.int32), start, end, np.asarray(inst, np.int64), n_inst, members)
    g = _Group(members, rank.astype(np.int32), start, end, np.asarray(inst, np.int64), n_inst, method, shift)
    return g, dropped


def _assemble(matched: list[_Group], dropped: int) -> CollectiveMatch:
    """The groups' rows as one match: instances numbered across groups, member rows sorted by
    instance then rank, and the warnings about shifted clocks, missing and dropped calls."""
    shifted: dict[int, int] = {}
    missing = 0
    base = 0
    out_inst: list[I64] = []
    for g in matched:
        if g.shift.any():
            u, idx = np.unique(g.rank, return_index=True)  # one shift per member
            for r_, sh in zip(u.tolist(), np.abs(g.shift[idx]).tolist(), strict=True):
                if sh:
                    shifted[r_] = max(shifted.get(r_, 0), sh)
        out_inst.append(g.inst + base)
        missing += g.n_inst * len(g.members) - int(g.rank.size)
        base += g.n_inst
    rank_a = np.concatenate([g.rank for g in matched])
    inst_a = np.concatenate(out_inst)
    order = np.lexsort((rank_a, inst_a))
    rank_a, inst_a = rank_a[order], inst_a[order]
    start_a = np.concatenate([g.start for g in matched])[order]
    end_a = np.concatenate([g.end for g in matched])[order]
    shift_a = np.concatenate([g.shift for g in matched])[order]
    count = np.bincount(inst_a, minlength=base).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    return CollectiveMatch(
        inst_a,
        rank_a,
        start_a,
        end_a,
        np.concatenate([np.full(g.n_inst, gid, np.int32) for gid, g in enumerate(matched)]),
        np.concatenate([np.full(g.n_inst, g.method, np.int8) for g in matched]),
        first,
        count,
        np.concatenate([np.full(g.n_inst, len(g.members), np.int64) for g in matched]),
        shift_a,
        [g.members for g in matched],
        missing,
        dropped,
        _match_warnings(shifted, missing, dropped),
    )


def _match_warnings(shifted: dict[int, int], missing: int, dropped: int) -> list[str]:
    """One line per kind of imperfection in the match (each counted)."""
    warnings: list[str] = []
    if shifted:
        worst = max(shifted.values())
        warnings.append(
            f"collectives of {len(shifted)} ranks end up to {worst / 1e3:.0f} µs apart on the aligned clock; "
            "their waits are split on the offsets the collective ends give (the ends of a blocking "
            "collective agree on every member)"
        )
    if missing:
        warnings.append(
            f"{missing} collective calls expected on a member of their group were not in its trace "
            "(a rank missed them or the trace was cut): those instances are matched on the members present"
        )
    if dropped:
        warnings.append(
            f"{dropped} collective calls could not be told apart from a neighbouring call of the same "
            "rank and group and were left out of the cross-rank matching"
        )
    return warnings


__all__ = ["BY_ORDER", "BY_SEQ", "BY_TIME", "METHOD_NAMES", "CollectiveMatch", "match_collectives"]
