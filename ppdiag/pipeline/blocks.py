"""Micro-batch compute blocks of every rank.

A block is the compute one rank does for one (phase, micro-batch, virtual stage): a forward, a
backward (input gradient), or a weight-gradient block. Blocks come from pipeline labels when the
trace has them (``PP:<s>F<mb>``, ``Forward <mb>``, NVTX ranges), otherwise from the runs of compute
between point-to-point operations: the k-th block of a phase in a step is micro-batch k. Phases
without labels come from the ops themselves (autograd backward ops) or from the direction of the
transfers around the block (a forward receives from the previous stage and sends to the next).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, Phase, RangeKind, RankTimeline
from ppdiag.model.intervals import search_sorted as _search
from ppdiag.model.intervals import sorted_unique, union
from ppdiag.model.timeline import Intervals
from ppdiag.pipeline.steps import LocalStep

PIPE_PHASES = (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD))
# shortest compute-stream gap that a receive completing in it can mark as a block boundary
MIN_CUT_GAP_NS = 5_000


@dataclass
class Blocks:
    """Column table of one rank's blocks on the rank's own clock, in time order."""

    step: npt.NDArray[np.int32]  # index into the rank's analyzed steps
    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    busy: npt.NDArray[np.int64]  # compute union inside the block
    launch: npt.NDArray[np.int64]  # host launch of the block's first interval, -1 unknown
    phase: npt.NDArray[np.int8]
    mb: npt.NDArray[np.int32]
    stage: npt.NDArray[np.int32]  # virtual stage, -1 unknown
    labelled: bool = False

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @classmethod
    def empty(cls) -> Blocks:
        z = np.zeros(0, dtype=np.int64)
        return cls(
            np.zeros(0, np.int32),
            z,
            z.copy(),
            z.copy(),
            z.copy(),
            np.zeros(0, np.int8),
            np.zeros(0, np.int32),
            np.zeros(0, np.int32),
        )

    def take(self, idx: Any) -> Blocks:
        return Blocks(
            self.step[idx],
            self.start[idx],
            self.end[idx],
            self.busy[idx],
            self.launch[idx],
            self.phase[idx],
            self.mb[idx],
            self.stage[idx],
            self.labelled,
        )


class _Comp(NamedTuple):
    """The compute intervals' columns in time order, gathered once: every pass over the compute
    reads them, and on a run of a few hundred thousand kernels each gather costs about a ms."""

    idx: npt.NDArray[np.int64]  # interval indices, sorted by start
    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    launch: npt.NDArray[np.int64]
    phase: npt.NDArray[np.int8]


def _comp_of(iv: Intervals, comp: npt.NDArray[np.int64]) -> _Comp:
    return _Comp(comp, iv.start[comp], iv.end[comp], iv.launch[comp], iv.phase[comp])


def _assign_steps(t: npt.NDArray[np.int64], steps: list[LocalStep]) -> npt.NDArray[np.int32]:
    if not steps:
        return np.full(t.shape, -1, dtype=np.int32)
    ss = np.array([s.start for s in steps], dtype=np.int64)
    se = np.array([s.end for s in steps], dtype=np.int64)
    k = _search(ss, t) - 1
    ok = (k >= 0) & (t < se[np.clip(k, 0, None)])
    return np.where(ok, k, -1).astype(np.int32)


def build_blocks(
    tl: RankTimeline,
    steps: list[LocalStep],
    stage: int,
    prev_rank: int | None,
    next_rank: int | None,
    p2p: tuple[npt.NDArray[np.int32], npt.NDArray[np.int8]] | None = None,
) -> Blocks:
    """Find the rank's blocks (on its own clock); :func:`block_labels` labels its intervals later.

    ``p2p``: the intervals' peer and direction columns with the pipeline's decided peers laid over
    (:func:`ppdiag.pipeline.peers.interval_overlay`); the parser's columns when None.
    """
    iv = tl.intervals
    comp = np.flatnonzero(iv.kind == int(Kind.COMPUTE))
    if comp.size == 0 or not steps:
        return Blocks.empty()
    comp = comp[np.argsort(iv.start[comp], kind="stable")]
    cc = _comp_of(iv, comp)
    key = np.where(cc.launch >= 0, cc.launch, cc.start) if not tl.cpu_only else cc.start
    step_of = _assign_steps(cc.start, steps)
    labels = tl.ranges.take((tl.ranges.kind == int(RangeKind.LABEL)) & np.isin(tl.ranges.phase, PIPE_PHASES))
    labelled = len(labels) > 0
    if labelled:
        order = np.argsort(labels.start, kind="stable")
        labels = labels.take(order)
        li = np.searchsorted(labels.start, key, side="right") - 1
        inside = (li >= 0) & (key < labels.end[np.clip(li, 0, None)])
        group = np.where(inside & (step_of >= 0), li, -1)
        g_phase = labels.phase
        g_mb = labels.mb
        g_stage = labels.stage
    else:
        group, g_phase, g_mb, g_stage = _cut_groups(tl, cc, key, step_of, prev_rank, next_rank, overlay=p2p)
    # Optimizer and other non-pipeline ops never belong to a block.
    group = np.where((cc.phase == int(Phase.OPTIM)) | (cc.phase == int(Phase.OTHER)), -1, group)
    valid = group >= 0
    if not valid.any():
        return Blocks.empty()
    gid, gstep = group[valid], step_of[valid]
    gs, ge, gl = cc.start[valid], cc.end[valid], cc.launch[valid]
    # in start order already (cut groups are runs of it): sorted by group, then start, as it is
    if (gid[1:] < gid[:-1]).any():
        order = np.lexsort((gs, gid))
        gid, gstep, gs, ge, gl = gid[order], gstep[order], gs[order], ge[order], gl[order]
    bounds = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
    ends_b = np.r_[bounds[1:], gid.size]
    b_start = np.minimum.reduceat(gs, bounds)
    b_end = np.maximum.reduceat(ge, bounds)
    b_launch_src = np.where(gl >= 0, gl, np.iinfo(np.int64).max)
    b_launch = np.minimum.reduceat(b_launch_src, bounds)
    b_launch = np.where(b_launch == np.iinfo(np.int64).max, -1, b_launch)
    b_busy = _group_union_measure(gs, ge, bounds, ends_b)
    first_gid = gid[bounds]
    b_step = gstep[bounds].astype(np.int32)
    b_phase = np.asarray(g_phase)[first_gid].astype(np.int8)
    b_mb = np.asarray(g_mb)[first_gid].astype(np.int32)
    b_stage = np.asarray(g_stage)[first_gid].astype(np.int32)
    blocks = Blocks(b_step, b_start, b_end, b_busy, b_launch, b_phase, b_mb, b_stage, labelled)
    blocks = blocks.take(np.argsort(blocks.start, kind="stable"))
    if not labelled:
        blocks = _drop_small(blocks)
    blocks.stage = np.where(blocks.stage < 0, stage, blocks.stage).astype(np.int32)
    if (blocks.mb < 0).any():
        _number_microbatches(blocks)
    return blocks


def _group_union_measure(
    s: npt.NDArray[np.int64],
    e: npt.NDArray[np.int64],
    bounds: npt.NDArray[np.int64],
    ends_b: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Measure of the union of each group's intervals; the groups are the slices
    ``[bounds[j], ends_b[j])`` of ``s``/``e``, each sorted by start.

    Sorted by start, an interval adds what it reaches past the furthest end before it in its group.
    The running maximum is taken over all groups at once: each group's ends are lifted by a
    multiple of the run's span, so that no group's maximum reaches into the next one.
    """
    n = bounds.size
    if n == 0:
        return np.zeros(0, np.int64)
    gi = np.repeat(np.arange(n, dtype=np.int64), ends_b - bounds)
    base = int(s.min())
    span = int(e.max()) - base + 1
    if span * n >= 2**62:  # (the lift would overflow: one union per group)
        out = np.empty(n, dtype=np.int64)
        for j in range(n):
            us, ue = union(s[bounds[j] : ends_b[j]], e[bounds[j] : ends_b[j]])
            out[j] = int((ue - us).sum())
        return out
    lift = gi * span
    reach = np.maximum.accumulate(e - base + lift) - lift + base
    before = np.empty_like(reach)
    before[1:] = reach[:-1]
    before[bounds] = np.iinfo(np.int64).min
    add = np.maximum(e - np.maximum(s, before), 0)
    return np.add.reduceat(add, bounds).astype(np.int64)


def _cut_groups(
    tl: RankTimeline,
    cc: _Comp,
    launch_key: npt.NDArray[np.int64],
    step_of: npt.NDArray[np.int32],
    prev_rank: int | None,
    next_rank: int | None,
    overlay: tuple[npt.NDArray[np.int32], npt.NDArray[np.int8]] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int8], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Groups of compute between point-to-point operations, with their phase. ``launch_key``: each
    interval's host launch, its start where unknown (the start on a CPU-only run)."""
    iv = tl.intervals
    iv_peer, iv_dir = overlay if overlay is not None else (iv.peer, iv.direction)
    p2p = iv.kind == int(Kind.P2P)
    if tl.cpu_only:
        # host ops: a transfer is issued between two blocks
        rg = tl.ranges
        comm_ops = (rg.kind == int(RangeKind.COMM_OP)) & (rg.direction > 0)
        cut_t = [iv.start[p2p], rg.start[comm_ops]]
    else:
        cut_t = _device_cuts(iv, cc, iv_dir)
    cuts = sorted_unique(np.concatenate(cut_t))
    seg = _search(cuts, cc.start)
    if not tl.cpu_only:
        # The host issues each transfer between launching two blocks, so in launch time the
        # issue ops separate blocks the device runs back to back with nothing in between
        # (the first stage's backward blocks when the gradients arrived early).
        rg = tl.ranges
        ops = (rg.kind == int(RangeKind.COMM_OP)) & (rg.direction > 0)
        h_cuts = sorted_unique(rg.start[ops])
        seg = seg * (h_cuts.size + 1) + _search(h_cuts, launch_key)
    # A new group at every cut, at every step boundary, and where the ops' own phase turns from
    # forward to backward or weight-gradient (the last stage runs F and B back to back).
    key = seg * 100000 + np.maximum(step_of, 0)
    ph_ops = cc.phase.astype(np.int64)
    pipe_ph = np.where((ph_ops == int(Phase.BWD)) | (ph_ops == int(Phase.WGRAD)), ph_ops, int(Phase.FWD))
    # carry the last pipeline phase over optimizer/other ops so they do not split a block
    change = np.r_[True, (key[1:] != key[:-1]) | (pipe_ph[1:] != pipe_ph[:-1])]
    group = np.cumsum(change) - 1
    group = np.where(step_of >= 0, group, -1)
    ng = int(group.max()) + 1 if group.size else 0
    phase = _majority_phase(cc, group, ng)
    if not tl.cpu_only and ng:
        # On a GPU the direction of the transfers around a block is the surest sign of its phase
        # (kernels carry a phase only when the launching op said so); ops decide where it is silent.
        vote = _transfer_vote(tl, cc, group, ng, prev_rank, next_rank, iv_peer, iv_dir)
        phase = np.where(vote > 0, int(Phase.FWD), np.where(vote < 0, int(Phase.BWD), phase)).astype(np.int8)
    return group, phase, np.full(ng, -1, np.int32), np.full(ng, -1, np.int32)


def _device_cuts(iv: Intervals, cc: _Comp, iv_dir: npt.NDArray[np.int8]) -> list[npt.NDArray[np.int64]]:
    """The times that separate two blocks of device kernels (the sends' starts, the ends of the
    receives the compute stream idled for)."""
    p2p = iv.kind == int(Kind.P2P)
    # device kernels: receives are posted early and spin beside the compute, so only the moment
    # data arrives (a receive's end) and the moment a block's output leaves (a send's start)
    # separate two blocks
    d = iv_dir
    sends = p2p & ((d == int(Direction.SEND)) | (d == int(Direction.BOTH)) | (d == int(Direction.NONE)))
    recvs = p2p & ((d == int(Direction.RECV)) | (d == int(Direction.BOTH)))
    # a receive that completes while a block computes (posted ahead) delimits nothing: only
    # one the compute stream was idle for does. The compute before it is the last run that began
    # strictly earlier: a run that begins the instant the data lands (the next block, its kernels
    # queued behind the receive) is the one the receive releases, not one it completed inside.
    r_end = iv.end[recvs]
    cs, ce = union(cc.start, cc.end)
    k = _search(cs, r_end, side="left") - 1
    prev_end = np.where(k >= 0, ce[np.clip(k, 0, None)], np.iinfo(np.int64).min)
    next_start = np.where(k + 1 < cs.size, cs[np.clip(k + 1, 0, cs.size - 1)], np.iinfo(np.int64).max)
    idle_gap = (r_end >= prev_end) & (next_start - np.maximum(prev_end, 0) >= MIN_CUT_GAP_NS)
    # a send that starts while a kernel runs was queued behind earlier sends: it does not mark
    # the end of the block that produced it
    s_start = iv.start[sends]
    k_start = cc.start
    k_end_max = np.maximum.accumulate(cc.end) if cc.end.size else cc.end
    j = _search(k_start, s_start, side="left") - 1
    inside = (
        (j >= 0) & (k_end_max[np.clip(j, 0, None)] > s_start) if cc.end.size else np.zeros(s_start.size, bool)
    )
    return [s_start[~inside], r_end[idle_gap]]


def _majority_phase(cc: _Comp, group: npt.NDArray[np.int64], ng: int) -> npt.NDArray[np.int8]:
    """Each group's phase by its ops' time: backward or weight-gradient where that phase holds
    more than half of the group's compute, else forward. ``group`` rises along the compute (each
    group one run of it), -1 outside every group."""
    phase = np.full(ng, int(Phase.FWD), dtype=np.int8)
    valid = group >= 0
    gv = group[valid]
    if gv.size == 0:
        return phase
    runs = np.flatnonzero(np.r_[True, gv[1:] != gv[:-1]])
    dur = (cc.end - cc.start)[valid]
    ph = cc.phase[valid]
    # integer sums per run: exact, as the float sums of whole nanoseconds were, and "more than
    # half" is the same test doubled
    all_t = np.add.reduceat(dur, runs)
    bwd_t = np.add.reduceat(np.where(ph == int(Phase.BWD), dur, 0), runs)
    wg_t = np.add.reduceat(np.where(ph == int(Phase.WGRAD), dur, 0), runs)
    ids = gv[runs]
    phase[ids[2 * bwd_t > all_t]] = int(Phase.BWD)
    phase[ids[2 * wg_t > all_t]] = int(Phase.WGRAD)
    return phase


def _transfer_vote(
    tl: RankTimeline,
    cc: _Comp,
    group: npt.NDArray[np.int64],
    ng: int,
    prev_rank: int | None,
    next_rank: int | None,
    iv_peer: npt.NDArray[np.int32],
    iv_dir: npt.NDArray[np.int8],
) -> npt.NDArray[np.int64]:
    """Per group: > 0 looks like a forward (receives from the previous stage, sends to the next),
    < 0 like a backward (the reverse), 0 when the transfers around it say nothing."""
    iv = tl.intervals
    valid = group >= 0
    g_start = np.full(ng, np.iinfo(np.int64).max, np.int64)
    g_end = np.full(ng, -1, np.int64)
    # the groups are runs of the compute in start order (group ids rise along it): a group's
    # first interval starts it, and its ends reduce over the run
    gv, sv, ev = group[valid], cc.start[valid], cc.end[valid]
    if gv.size:
        runs = np.flatnonzero(np.r_[True, gv[1:] != gv[:-1]])
        g_start[gv[runs]] = sv[runs]
        g_end[gv[runs]] = np.maximum.reduceat(ev, runs)
    m = (iv.kind == int(Kind.P2P)) & (iv_peer >= 0)
    both = iv_dir == int(Direction.BOTH)
    si = np.flatnonzero(m & ((iv_dir == int(Direction.SEND)) | both))
    ri = np.flatnonzero(m & ((iv_dir == int(Direction.RECV)) | both))
    s_t, s_peer = iv.start[si], iv_peer[si]
    r_t, r_peer = iv.end[ri], iv_peer[ri]
    so, ro = np.argsort(s_t), np.argsort(r_t)
    s_t, s_peer, r_t, r_peer = s_t[so], s_peer[so], r_t[ro], r_peer[ro]
    vote = np.zeros(ng, dtype=np.int64)
    # the send that leaves when the block ends, the receive whose data arrived last before it began
    i_after = _search(s_t, g_end, side="left")
    i_before = _search(r_t, g_start) - 1
    # peers here are >= 0, so -2 stands for "no such neighbour"
    nxt = -2 if next_rank is None else next_rank
    prv = -2 if prev_rank is None else prev_rank
    if s_t.size:
        ia = np.minimum(i_after, s_t.size - 1)
        near = (i_after < s_t.size) & (s_t[ia] - g_end < np.maximum(g_end - g_start, 1))
        pa = s_peer[ia]
        vote += np.where(near, np.where(pa == nxt, 1, np.where(pa == prv, -1, 0)), 0)
    if r_t.size:
        pb = r_peer[np.maximum(i_before, 0)]
        vote += np.where(i_before >= 0, np.where(pb == prv, 1, np.where(pb == nxt, -1, 0)), 0)
    return vote


def _drop_small(blocks: Blocks) -> Blocks:
    """Runs of a few tiny ops between transfers (splits, casts, loss seeding) are not blocks."""
    if len(blocks) == 0:
        return blocks
    keep = np.ones(len(blocks), dtype=bool)
    for ph in PIPE_PHASES:
        m = blocks.phase == ph
        if m.sum() >= 2:
            # tiny runs can outnumber real blocks, so compare with the upper part of the distribution;
            # then with the median of the blocks that part keeps: on a busy host a few blocks held
            # many times their cost (late wake-ups) lift the 90th percentile, and real blocks of a
            # sixth of it were dropped as tiny (a GPipe demo run lost 3 of its 32 blocks)
            busy = blocks.busy[m].astype(np.float64)
            ref = float(np.percentile(busy, 90))
            ref = min(ref, float(np.median(busy[busy >= 0.15 * ref])))
            keep &= ~(m & (blocks.busy < 0.15 * ref))
    return blocks.take(keep)


def _number_microbatches(blocks: Blocks) -> None:
    """The k-th block of a phase (and stage) within a step is micro-batch k."""
    key = np.stack(
        [blocks.step.astype(np.int64), blocks.phase.astype(np.int64), blocks.stage.astype(np.int64)]
    )
    order = np.lexsort((blocks.start, key[2], key[1], key[0]))
    k = key[:, order]
    newgrp = np.r_[True, (k[:, 1:] != k[:, :-1]).any(axis=0)]
    pos = np.arange(order.size) - np.maximum.accumulate(np.where(newgrp, np.arange(order.size), 0))
    mb = blocks.mb.copy()
    unknown = mb[order] < 0
    mb[order[unknown]] = pos[unknown]
    blocks.mb = mb.astype(np.int32)


@dataclass(frozen=True)
class IntervalLabels:
    """The pipeline's labels of one rank's intervals, an overlay on the parser's columns: each
    compute interval inside a block carries the block's phase, micro-batch and virtual stage, the
    others what the parser gave. Read-only arrays, one entry per interval (the reports draw them)."""

    phase: npt.NDArray[np.int8]
    mb: npt.NDArray[np.int32]
    chunk: npt.NDArray[np.int16]


def block_labels(tl: RankTimeline, blocks: Blocks, offset: int = 0) -> IntervalLabels:
    """The labels of ``tl``'s intervals with its blocks laid over (copies: the parser's columns
    are not touched). ``offset`` maps the rank's clock to the blocks' clock."""
    iv = tl.intervals
    phase, mb, chunk = iv.phase.copy(), iv.mb.copy(), iv.chunk.copy()
    if len(blocks):
        comp = np.flatnonzero(iv.kind == int(Kind.COMPUTE))
        t = iv.start[comp] + offset
        pos = _search(blocks.start, t) - 1
        ok = (pos >= 0) & (t < blocks.end[np.clip(pos, 0, None)] + 1)
        sel = comp[ok]
        p = pos[ok]
        phase[sel] = blocks.phase[p]
        mb[sel] = blocks.mb[p]
        chunk[sel] = blocks.stage[p].astype(np.int16)
    for a in (phase, mb, chunk):
        a.flags.writeable = False
    return IntervalLabels(phase, mb, chunk)
