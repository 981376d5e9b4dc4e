"""Every analyzed step of one rank at once: the window sets, the account and the host evidence of
:func:`~ppdiag.attribution.rank_step.rank_step`, computed for all the rank's windows in one pass
of the interval algebra over a :class:`~ppdiag.model.interval_groups.Line` (one group per step)
instead of one pass per step.

The results are the same canonical sets, so each :class:`RankStep` is identical to the one
:func:`rank_step` builds. CPU-only runs (whose posting calls are read per step) take the per-step
path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.accounting import COMPUTE_KINDS, COPY_KINDS, Account, WindowSets, _any_of, _by_start
from ppdiag.attribution.rank_step import RankStep, _launched, rank_step
from ppdiag.model import Kind, RankTimeline
from ppdiag.model import intervals as ivs
from ppdiag.model.interval_groups import Line, union_of
from ppdiag.pipeline.blocks import Blocks

Arr = npt.NDArray[np.int64]


@dataclass(frozen=True)
class StepWindowSpec:
    """One analyzed step of a rank: its index, number, window (aligned clock) and blocks."""

    step: int
    number: int
    w0: int
    w1: int
    blocks: Blocks


def _ranges(j0: Arr, j1: Arr) -> tuple[Arr, Arr]:
    """The concatenation of ``arange(j0[i], j1[i])`` for every i, and the i of each element."""
    n = np.maximum(j1 - j0, 0)
    grp = np.repeat(np.arange(n.size, dtype=np.int64), n)
    first = np.zeros(n.size, np.int64)
    if n.size > 1:
        np.cumsum(n[:-1], out=first[1:])
    idx = np.arange(int(n.sum()), dtype=np.int64) - first[grp] + j0[grp]
    return idx, grp


def _gathered(tl: RankTimeline, line: Line) -> tuple[Arr, Arr, npt.NDArray[np.int8]]:
    """The rank's intervals reaching into each window, clipped to it, as line positions (sorted by
    group then start) and their kinds."""
    iv = tl.intervals
    off = tl.clock_offset_ns
    order, st, reach = _by_start(iv)
    # binary search on the sorted starts and the running maximum of the ends, for every window
    j0 = np.searchsorted(reach, line.lo - off, side="right").astype(np.int64)
    j1 = np.searchsorted(st, line.hi - off, side="left").astype(np.int64)
    pos, grp = _ranges(j0, j1)
    idx = order[pos]
    s = iv.start[idx] + off
    e = iv.end[idx] + off
    near = (e > line.lo[grp]) & (s < line.hi[grp])
    s, e, k, grp = s[near], e[near], iv.kind[idx][near], grp[near]
    # clipping before the union gives the same set as after it (clip distributes over union), and
    # keeps every position inside its group's span; clipped starts stay sorted within a group
    s = np.maximum(s, line.lo[grp])
    e = np.minimum(e, line.hi[grp])
    return line.put(grp, s), line.put(grp, e), k


def _sets_of(line: Line, s: Arr, e: Arr, k: npt.NDArray[np.int8]) -> WindowSets:
    """:func:`~ppdiag.attribution.accounting.window_sets` of every group, on the line."""
    busy = _any_of(k, COMPUTE_KINDS)
    comp = ivs.union(s[busy], e[busy])
    pm = k == int(Kind.P2P)
    cm = k == int(Kind.COLLECTIVE)
    p2p = ivs.subtract(ivs.union(s[pm], e[pm]), comp)
    coll = ivs.subtract(ivs.subtract(ivs.union(s[cm], e[cm]), comp), p2p)
    cp = _any_of(k, COPY_KINDS)
    copy = ivs.union(s[cp], e[cp])
    if copy[0].size:
        copy = ivs.subtract(ivs.subtract(ivs.subtract(copy, comp), p2p), coll)
    return WindowSets(comp, p2p, coll, line.complement(comp), copy)


def _host_evidence(tl: RankTimeline, line: Line, gaps: ivs.ISet) -> ivs.ISet:
    """:func:`~ppdiag.attribution.rank_step._host_evidence` of every group, on the line."""
    gs, ge = gaps
    st0, la0 = _launched(tl)
    if gs.size == 0 or not st0.size:
        return ivs.empty()
    off = tl.clock_offset_ns
    g = line.group_of(gs)
    ge_t = line.time_of(ge, g)
    nxt = np.searchsorted(st0, ge_t - off, side="left")
    ok = nxt < st0.size
    launch_next = np.where(
        ok, line.put(g, np.clip(la0[np.minimum(nxt, st0.size - 1)] + off, line.lo[g], line.hi[g])), gs
    )
    he = np.minimum(np.maximum(launch_next, gs), ge)
    return ivs.union(gs, he)


def rank_steps(tl: RankTimeline, specs: Sequence[StepWindowSpec]) -> list[RankStep]:
    """:func:`rank_step` of each of ``specs`` (one rank's analyzed steps), all in one pass."""
    if not specs:
        return []
    line = _line_of(specs)
    if tl.cpu_only or line is None:
        return [rank_step(tl, w.step, w.number, w.w0, w.w1, w.blocks) for w in specs]
    sets = _sets_of(line, *_gathered(tl, line))
    # host evidence only on idle time: comm and copies have their own causes
    idle = ivs.subtract(sets.gaps, union_of(sets.p2p, sets.collective, sets.copy))
    host = _host_evidence(tl, line, idle)
    with_p2p = union_of(idle, sets.p2p)
    p2p_host = ivs.intersect(_host_evidence(tl, line, with_p2p), sets.p2p)
    measures = [line.measure(x) for x in (sets.compute, sets.p2p, sets.collective, sets.copy)]
    per = [
        line.split(x) for x in (sets.compute, sets.p2p, sets.collective, sets.gaps, sets.copy, host, p2p_host)
    ]
    out = []
    for i, w in enumerate(specs):
        comp, p2p, coll, gaps, copy, hs, ph = (x[i] for x in per)
        c, p, co, cp = (int(m[i]) for m in measures)
        window = w.w1 - w.w0
        acct = Account(window, c, p, co, window - c - p - co - cp, cp)
        ws = WindowSets(comp, p2p, coll, gaps, copy)
        out.append(RankStep(tl.rank, w.step, w.number, w.w0, w.w1, ws, acct, w.blocks, hs, p2p, ph))
    return out


def _line_of(specs: Sequence[StepWindowSpec]) -> Line | None:
    """The line of the steps' windows; None for an empty window or windows too long for one int64
    line (the per-step path then)."""
    if any(w.w1 <= w.w0 for w in specs):
        return None
    try:
        return Line.of([w.w0 for w in specs], [w.w1 for w in specs])
    except OverflowError:
        return None


#: One rank's part of the replica map of :func:`rank_steps`: its timeline and analyzed steps.
RankItem = tuple[RankTimeline, list[StepWindowSpec]]


def shippable(tl: RankTimeline, specs: list[StepWindowSpec]) -> RankItem:
    """What :func:`rank_steps` reads of a rank, to send to a worker: the timeline without what
    it never reads (its process groups, shared by many ranks; its warnings and metadata) and the
    steps without their blocks (the reducer keeps them and puts them back)."""
    lean = dataclasses.replace(tl, process_groups=[], warnings=[], meta={})
    bare = Blocks.empty()
    return lean, [dataclasses.replace(w, blocks=bare) for w in specs]


@dataclass(frozen=True)
class PackedSteps:
    """One rank's :class:`RankStep` list as a few flat columns, without blocks: what a task of the
    replica map sends back (unpickling a RankStep's sixteen small arrays one by one cost the
    reducer about as much as computing them)."""

    head: Arr  # [steps, 12]: rank, step, number, w0, w1, the account's six fields, wait is p2p
    lens: Arr  # [steps * 8]: sizes of the sets, in the order of _SETS_OF
    starts: Arr
    ends: Arr


def _sets_of_step(s: RankStep) -> tuple[ivs.ISet, ...]:
    w = s.sets
    return (w.compute, w.p2p, w.collective, w.gaps, w.copy, s.host_set, s.wait_set, s.p2p_host)


def pack_steps(steps: list[RankStep]) -> PackedSteps | list[RankStep]:
    """``steps`` packed (:class:`PackedSteps`), or as they are when a set is not int64."""
    sets = [x for st in steps for x in _sets_of_step(st)]
    if any(a.dtype != np.int64 or b.dtype != np.int64 for a, b in sets):
        return steps
    head = np.array(
        [
            (s.rank, s.step, s.number, s.w0, s.w1, *dataclasses.astuple(s.acct), s.wait_set is s.sets.p2p)
            for s in steps
        ],
        dtype=np.int64,
    ).reshape(len(steps), 12)
    lens = np.array([a.size for a, _ in sets], dtype=np.int64)
    z = np.zeros(0, np.int64)
    starts = np.concatenate([a for a, _ in sets]) if sets else z
    ends = np.concatenate([b for _, b in sets]) if sets else z
    return PackedSteps(head, lens, starts, ends)


def unpack_steps(p: PackedSteps | list[RankStep], specs: Sequence[StepWindowSpec]) -> list[RankStep]:
    """The rank's steps from :func:`pack_steps`, with the blocks of their ``specs`` back: the
    values an in-process :func:`rank_steps` returns (each set its own array, ``wait_set`` the
    same object as ``sets.p2p`` where it was)."""
    if isinstance(p, list):
        for s, w in zip(p, specs, strict=True):
            s.blocks = w.blocks
        return p
    cut = np.zeros(p.lens.size + 1, np.int64)
    np.cumsum(p.lens, out=cut[1:])
    bounds = cut.tolist()
    out = []
    for i, (row, w) in enumerate(zip(p.head.tolist(), specs, strict=True)):
        k = 8 * i
        x = [
            (p.starts[bounds[j] : bounds[j + 1]], p.ends[bounds[j] : bounds[j + 1]]) for j in range(k, k + 8)
        ]
        ws = WindowSets(x[0], x[1], x[2], x[3], x[4])
        wait = ws.p2p if row[11] else x[6]
        out.append(
            RankStep(
                row[0], row[1], row[2], row[3], row[4], ws, Account(*row[5:11]), w.blocks, x[5], wait, x[7]
            )
        )
    return out


def rank_steps_batch(items: list[RankItem]) -> list[PackedSteps | list[RankStep]]:
    """:func:`rank_steps` of each item, packed (a task of the replica map: the ranks of a few
    replicas)."""
    return [pack_steps(rank_steps(tl, specs)) for tl, specs in items]


__all__ = [
    "PackedSteps",
    "RankItem",
    "StepWindowSpec",
    "pack_steps",
    "rank_steps",
    "rank_steps_batch",
    "shippable",
    "unpack_steps",
]
