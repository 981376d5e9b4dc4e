"""Runs that stop or hang: who waits for whom since when, and which steps are complete.

A hung job's traces (flushed by a watchdog or a crash handler) end with ranks inside operations
that never completed: a receive whose sender never sent, a send no rank received, a collective
that some members entered and others never did. Counting per link (sender -> receiver) and per
process group is enough to see them: on a link the k-th send meets the k-th receive (NCCL and
gloo keep issue order), so receives beyond the sends wait for the sender and sends beyond the
receives wait for the receiver; in a group the members that entered more collectives than the
others wait in the first one the others never entered. Following "waits for" from rank to rank
ends at the rank that is not waiting for anyone: its last operation is where it stopped.

A trace cut in the middle of a step (a profiler stopped early, a truncated file) shows the same
counting mismatches for the operations in flight at the cut, and its last step is partial: the
analysis keeps only the steps every rank completed (:func:`trimmed`, a step of
:func:`ppdiag.pipeline.rebuild`) and the report says so.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, Run
from ppdiag.model.timeline import RankTimeline
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.clocks import P2POps
from ppdiag.pipeline.group_members import MemberUnion
from ppdiag.pipeline.steps import LocalStep
from ppdiag.report_types import Hang, LastOp, Wait

__all__ = ["Hang", "LastOp", "Wait", "detect", "run_origin", "trimmed"]

NS_PER_MS = 1e6
#: A hung rank's trace runs on past its culprit's end by at least this much (a watchdog flushes
#: after its timeout); a cut has every rank end within it.
HANG_MIN_NS = 20_000_000

#: one wait as the finders yield it: rank, op kind, name, peer, group, missing ranks, since (ns),
#: end (ns), open at the trace end, count
_RawWait = tuple[int, str, str, int | None, str | None, list[int], int, int, bool, int]
#: per link (sender, receiver), the indices of one side's ops on it
_Ends = dict[tuple[int, int], npt.NDArray[np.int64]]


def _is_send(d: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    out: npt.NDArray[np.bool_] = (d == int(Direction.SEND)) | (d == int(Direction.BOTH))
    return out


def _is_recv(d: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    out: npt.NDArray[np.bool_] = (d == int(Direction.RECV)) | (d == int(Direction.BOTH))
    return out


def _trace_end(tl: RankTimeline) -> int:
    """The last instant the rank's trace shows (own clock)."""
    ends = [int(tl.intervals.end.max())] if len(tl.intervals) else []
    if len(tl.ranges):
        ends.append(int(tl.ranges.end.max()))
    return max(ends) if ends else 0


def _trace_start(tl: RankTimeline) -> int:
    starts = [int(tl.intervals.start.min())] if len(tl.intervals) else []
    if len(tl.ranges):
        starts.append(int(tl.ranges.start.min()))
    return min(starts) if starts else 0


def _op_name(tl: RankTimeline, o: P2POps, i: int) -> str:
    t = tl.intervals if o.table == "intervals" else tl.ranges
    j = int(o.index[i])
    return tl.name_of(int(t.name[j])) if 0 <= j < len(t) else "?"


def _last_op(tl: RankTimeline, off: int, origin: int) -> LastOp | None:
    iv = tl.intervals
    if not len(iv):
        return None
    i = int(np.argmax(iv.end))
    return LastOp(
        tl.name_of(int(iv.name[i])),
        Kind(int(iv.kind[i])).name.lower(),
        round((int(iv.start[i]) + off - origin) / NS_PER_MS, 4),
        round((int(iv.end[i]) + off - origin) / NS_PER_MS, 4),
    )


def _step_number(windows: list[LocalStep], t: int) -> int | None:
    """The analyzed step (aligned windows) holding aligned time ``t``."""
    for w in windows:  # a rank has a handful of steps
        if w.start <= t < w.end:
            return w.number if w.number >= 0 else None
    return None


def run_origin(run: Run) -> int:
    """The run's first event on the aligned clock (ns): the origin of the report's ``*_t_ms``."""
    return min((_trace_start(tl) + tl.clock_offset_ns for tl in run.ranks), default=0)


def detect(
    run: Run,
    ops: dict[int, P2POps],
    windows: dict[int, list[LocalStep]],
    neighbours: dict[int, tuple[int | None, int | None]] | None = None,
) -> Hang | None:
    """The run's hang or cut (clock offsets already applied to ``run``'s ranks), or None when every
    operation met its partner and no trace lost events. ``neighbours`` (previous, next pipeline
    rank) name the partner of an operation still open at the trace end whose peer is unknown."""
    tls = run.by_rank()
    if not tls:
        return None
    off = {r: tl.clock_offset_ns for r, tl in tls.items()}
    origin = min(_trace_start(tl) + off[r] for r, tl in tls.items())
    end = {r: _trace_end(tl) + off[r] for r, tl in tls.items()}
    tol = max(1_000, int(1e-4 * (max(end.values()) - origin)))
    raw: list[_RawWait] = []
    raw.extend(_p2p_waits(tls, ops, off, end, tol, neighbours or {}))
    raw.extend(_collective_waits(tls, off, end, tol))
    lost = sum(tl.events_lost for tl in tls.values())
    if not raw and not lost:
        return None
    waits = [
        Wait(
            rank=r,
            op=kind,
            name=name,
            peer=peer,
            group=group,
            missing=missing,
            since_ms=round((t - origin) / NS_PER_MS, 4),
            waited_ms=round((end[r] - t) / NS_PER_MS, 4),
            open_at_end=bool(open_),
            step=_step_number(windows.get(r, []), t),
            count=count,
        )
        for r, kind, name, peer, group, missing, t, _, open_, count in raw
    ]
    waits.sort(key=lambda w: (w.since_ms, w.rank))
    first, root = _first_and_root(waits)
    last_ops = {
        str(r): lo for r, tl in sorted(tls.items()) if (lo := _last_op(tl, off[r], origin)) is not None
    }
    # a hang: the waiting ranks' traces run on well past the root's end (a watchdog's timeout)
    hung = root is not None and root in end and max(end[w.rank] for w in waits) - end[root] >= HANG_MIN_NS
    complete, dropped = _complete_steps(windows, end, waits, origin, tol)
    status = "hang" if hung else "cut"
    return Hang(
        status=status,
        message=_message(status, first, root, last_ops, end, origin, lost, complete, dropped),
        root=root,
        first=first,
        waits=waits,
        last_ops=last_ops,
        trace_end_ms={str(r): round((e - origin) / NS_PER_MS, 4) for r, e in sorted(end.items())},
        events_lost=lost,
        complete_steps=complete,
        dropped_steps=dropped,
    )


def _first_and_root(waits: list[Wait]) -> tuple[Wait | None, int | None]:
    """The first wait (by time) on a rank that is not waiting itself, and the rank it waits for:
    where following "waits for" ends. Without one, the earliest wait."""
    waiting = {w.rank for w in waits}
    on = [
        w
        for w in waits
        if (w.peer is not None and w.peer not in waiting) or (w.missing and not set(w.missing) & waiting)
    ]
    first = on[0] if on else (waits[0] if waits else None)
    root = None
    if first is not None:
        root = first.peer if first.peer is not None else (first.missing[0] if first.missing else None)
    return first, root


def _p2p_waits(
    tls: dict[int, RankTimeline],
    ops: dict[int, P2POps],
    off: dict[int, int],
    end: dict[int, int],
    tol: int,
    neighbours: dict[int, tuple[int | None, int | None]],
) -> Iterable[_RawWait]:
    """Per link, the first receive beyond the sends and the first send beyond the receives; then
    each operation open at its rank's trace end whose peer no one could decide (a partner that
    never came leaves nothing to time it against), on the pipeline neighbour whose link is
    balanced without it."""
    sends, recvs = _link_ends(ops)
    yield from _unbalanced_links(tls, ops, off, end, tol, sends, recvs)
    yield from _open_without_peer(tls, ops, off, end, tol, neighbours, sends, recvs)


def _link_ends(ops: dict[int, P2POps]) -> tuple[_Ends, _Ends]:
    """Per link (sender, receiver): the sender's send ops and the receiver's receive ops on it."""
    sends: _Ends = {}
    recvs: _Ends = {}
    for r, o in ops.items():
        if not len(o.start):
            continue
        for peer in np.unique(o.peer[o.peer >= 0]).tolist():
            m = o.peer == peer
            sends[(r, int(peer))] = np.flatnonzero(m & _is_send(o.direction))
            recvs[(int(peer), r)] = np.flatnonzero(m & _is_recv(o.direction))
    return sends, recvs


def _unbalanced_links(
    tls: dict[int, RankTimeline],
    ops: dict[int, P2POps],
    off: dict[int, int],
    end: dict[int, int],
    tol: int,
    sends: _Ends,
    recvs: _Ends,
) -> Iterable[_RawWait]:
    """Per link, the first receive beyond the sends and the first send beyond the receives."""
    empty = np.zeros(0, np.int64)
    for link in sorted(set(sends) | set(recvs)):
        src, dst = link
        s, rv = sends.get(link, empty), recvs.get(link, empty)
        if src not in tls or dst not in tls:
            continue
        for me, peer, mine, theirs, kind in ((dst, src, rv, s, "recv"), (src, dst, s, rv, "send")):
            extra = len(mine) - len(theirs)
            if extra <= 0:
                continue
            o = ops[me]
            i = int(mine[len(theirs)])
            t = int(o.start[i]) + off[me]
            e = int(o.end[mine[-1]]) + off[me]
            yield (me, kind, _op_name(tls[me], o, i), peer, None, [], t, e, e >= end[me] - tol, extra)


def _open_without_peer(
    tls: dict[int, RankTimeline],
    ops: dict[int, P2POps],
    off: dict[int, int],
    end: dict[int, int],
    tol: int,
    neighbours: dict[int, tuple[int | None, int | None]],
    sends: _Ends,
    recvs: _Ends,
) -> Iterable[_RawWait]:
    """Each op open at its rank's trace end whose peer no one could decide, on the pipeline
    neighbour that :func:`_open_partner` names (skipped when none fits)."""
    for r, o in sorted(ops.items()):
        if not len(o.start) or r not in tls:
            continue
        for i in np.flatnonzero((o.peer < 0) & (o.end + off[r] >= end[r] - tol)).tolist():
            recv = bool(_is_recv(o.direction[i : i + 1])[0])
            q = _open_partner(r, recv, tls, end, neighbours, sends, recvs)
            if q is None:
                continue
            t = int(o.start[i]) + off[r]
            e = int(o.end[i]) + off[r]
            yield (r, "recv" if recv else "send", _op_name(tls[r], o, i), q, None, [], t, e, True, 1)


def _open_partner(
    r: int,
    recv: bool,
    tls: dict[int, RankTimeline],
    end: dict[int, int],
    neighbours: dict[int, tuple[int | None, int | None]],
    sends: _Ends,
    recvs: _Ends,
) -> int | None:
    """The partner of rank ``r``'s open op: the neighbour with its op in flight (one more on its
    side of the link than on this one), else the neighbour whose link is balanced without this
    op; between equals, the one whose trace runs on longest."""
    best: tuple[int, int] | None = None
    for q in neighbours.get(r, (None, None)):
        if q is None or q not in tls:
            continue
        link = (q, r) if recv else (r, q)
        ns, nr = len(sends.get(link, ())), len(recvs.get(link, ()))
        diff = ns - nr if recv else nr - ns
        rank_of = 0 if diff == 1 else (1 if diff == 0 else None)
        if rank_of is not None and (best is None or (rank_of, -end[q]) < (best[0], -end[best[1]])):
            best = (rank_of, q)
    return None if best is None else best[1]


def _collective_waits(
    tls: dict[int, RankTimeline], off: dict[int, int], end: dict[int, int], tol: int
) -> Iterable[_RawWait]:
    """Per process group (by name), members that entered collectives others never entered."""
    starts: dict[str, dict[int, npt.NDArray[np.int64]]] = {}
    union = MemberUnion()
    for r, tl in tls.items():
        iv = tl.intervals
        m = iv.kind == int(Kind.COLLECTIVE)
        for gi, pg in enumerate(tl.process_groups):
            if len(pg.ranks) > 1:
                union.add(pg.name, pg.ranks)
            sel = np.flatnonzero(m & (iv.group == gi))
            if len(sel):
                starts.setdefault(pg.name, {})[r] = sel[np.argsort(iv.start[sel], kind="stable")]
    members, traced = union.members, set(tls)
    for name, per in sorted(starts.items()):
        ranks = sorted(members.get(name, set()) & traced or set(per))
        if len(ranks) < 2:
            continue
        counts = {r: len(per.get(r, [])) for r in ranks}
        low = min(counts.values())
        for r in ranks:
            extra = counts[r] - low
            if extra <= 0:
                continue
            iv = tls[r].intervals
            i = int(per[r][low])
            t = int(iv.start[i]) + off[r]
            e = int(iv.end[per[r][-1]]) + off[r]
            missing = [x for x in ranks if counts[x] <= low]
            yield (
                r,
                "collective",
                tls[r].name_of(int(iv.name[i])),
                None,
                name,
                missing,
                t,
                e,
                e >= end[r] - tol,
                extra,
            )


def _complete_steps(
    windows: dict[int, list[LocalStep]], end: dict[int, int], waits: list[Wait], origin: int, tol: int
) -> tuple[int, list[int]]:
    """How many leading steps every rank completed, and the step numbers left out: a step is
    partial on a rank when it reaches the rank's trace end or holds an operation that never met
    its partner."""
    first_wait: dict[int, int] = {}
    for wt in waits:
        t = origin + round(wt.since_ms * NS_PER_MS)
        first_wait[wt.rank] = min(first_wait.get(wt.rank, t), t)
    n_all: list[int] = []
    for r, ws in windows.items():
        limit = min(end.get(r, 0) - tol, first_wait.get(r, 2**62))
        n = 0
        for w in ws:
            if w.end > limit:
                break
            n += 1
        n_all.append(n)
    n = min(n_all, default=0)
    dropped = sorted({w.number for ws in windows.values() for w in ws[n:]})
    return n, dropped


def trimmed(
    windows: dict[int, list[LocalStep]], blocks: dict[int, Blocks], hang: Hang | None
) -> tuple[dict[int, list[LocalStep]], dict[int, Blocks]]:
    """The windows and blocks of the steps every rank completed (blocks index the steps): new
    dicts, the arguments unchanged; the same ones when the run completed (no hang, or none cut)."""
    if hang is None or hang.complete_steps <= 0:
        return windows, blocks
    n = hang.complete_steps
    kept = {r: ws[:n] for r, ws in windows.items()}
    return kept, {r: b.take(b.step < n) if len(b) else b for r, b in blocks.items()}


def _message(
    status: str,
    first: Wait | None,
    root: int | None,
    last_ops: dict[str, LastOp],
    end: dict[int, int],
    origin: int,
    lost: int,
    complete: int,
    dropped: list[int],
) -> str:
    """The one-line account: who waits for whom since when, what the root did last, the cut."""
    parts: list[str] = []
    if first is not None:
        what = {"recv": f"in recv from rank {first.peer}", "send": f"in send to rank {first.peer}"}.get(
            first.op, f"in {first.name} of group {first.group} that rank(s) {first.missing} never entered"
        )
        where = f" (step {first.step})" if first.step is not None else ""
        parts.append(f"rank {first.rank} waits {what} since t={first.since_ms:.3f} ms{where}")
        lo = last_ops.get(str(root)) if root is not None else None
        if lo is not None:
            parts.append(f"rank {root}'s last op was {lo.name} ({lo.kind}) ending at t={lo.end_ms:.3f} ms")
    if status == "cut":
        last = max(end.values()) - origin
        parts.append(f"the traces end at t={last / NS_PER_MS:.3f} ms in the middle of a step")
    if lost:
        parts.append(f"{lost} events lost to truncation")
    if dropped:
        parts.append(f"analysed the {complete} complete step(s); partial step(s) {dropped} left out")
    elif first is not None or lost:
        parts.append(f"analysed the {complete} complete step(s)")
    return "; ".join(parts)
