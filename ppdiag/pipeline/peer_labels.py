"""Point-to-point partners from the pipeline labels a trace carries (step 0 of
:mod:`ppdiag.pipeline.peers`).

A transfer inside torch.distributed.pipelining's ``PP:<s>SEND_F<mb>`` range, or inside or next to
a labelled forward / input-gradient block, belongs to stage ``s``: a forward send goes to the rank
holding ``s + 1``, a forward receive comes from ``s - 1``, and the reverse for the backward. The
labels are host ranges, so a device kernel is placed among them by its launch (the host issues
receive, block, send in program order; the GPU may run them blocks later), and a weight-gradient
block (split backward) neither sends nor receives.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Phase, RangeKind, Ranges, RankTimeline, Run
from ppdiag.pipeline.clocks import P2POps
from ppdiag.pipeline.peer_links import HOW_LABELS

_RECV_SLACK_NS = 1_000_000  # a receive is posted this close before the block that consumes it


def _from_labels(run: Run, ops: dict[int, P2POps]) -> int:
    """Peers of unknown ops from the pipeline stage the trace's labels put them in.

    A transfer inside a labelled comm range (torch.distributed.pipelining's ``PP:<s>SEND_F<mb>``,
    ``PP:<s>RECV_B<mb>``) or, failing that, next to a labelled compute block (a send after the
    block that produced it, a receive before the block that consumes it) belongs to stage ``s``
    and phase F or B: a forward send goes to the rank holding ``s + 1``, a forward receive comes
    from ``s - 1``, and the reverse for the backward. Stages held by no or by several ranks decide
    nothing. Returns the ops decided.
    """
    owner: dict[int, set[int]] = {}
    for tl in run.ranks:
        rg = tl.ranges
        m = (rg.stage >= 0) & np.isin(rg.kind, (int(RangeKind.LABEL), int(RangeKind.COMM_OP)))
        for st in np.unique(rg.stage[m]):
            owner.setdefault(int(st), set()).add(tl.rank)
    if len(owner) < 2:
        return 0
    n_st = max(owner) + 1
    rank_of = np.full(n_st + 2, -1, np.int64)  # index stage + 1 (stage -1 and n_st map to -1)
    for st, rs in owner.items():
        if len(rs) == 1:
            rank_of[st + 1] = next(iter(rs))
    decided = 0
    tls = run.by_rank()
    for r, v in ops.items():
        t_r = tls.get(r)
        unk = np.flatnonzero((v.peer < 0) & (v.direction > 0))
        if t_r is None or unk.size == 0:
            continue
        rg = t_r.ranges
        # the labels are host ranges: a device kernel is placed among them by its launch (the host
        # issues receive, block, send in program order; the GPU may run them much later)
        t_op, t_end = _host_times(t_r, v, unk)
        stage = np.full(unk.size, -1, np.int64)
        phase = np.zeros(unk.size, np.int64)
        send = (v.direction[unk] == int(Direction.SEND)) | (v.direction[unk] == int(Direction.BOTH))
        # 1. labelled comm ranges around the op, of the same direction
        cm = np.flatnonzero((rg.kind == int(RangeKind.COMM_OP)) & (rg.stage >= 0) & (rg.direction > 0))
        if cm.size:
            cm = cm[np.argsort(rg.start[cm], kind="stable")]
            j = np.searchsorted(rg.start[cm], t_op, side="right") - 1
            jc = np.clip(j, 0, None)
            ok = (j >= 0) & (t_op <= rg.end[cm][jc]) & (rg.direction[cm][jc] == v.direction[unk])
            stage[ok] = rg.stage[cm][jc[ok]]
            phase[ok] = rg.phase[cm][jc[ok]]
        # 2. labelled compute blocks: the block issuing the op, the producer of a send, the
        # consumer of a receive
        rest = stage < 0
        if rest.any():
            _by_blocks(rg, t_op, t_end, send, rest, stage, phase)
        fwd = phase == int(Phase.FWD)
        # forward: send downstream, receive from upstream; backward the reverse
        step = np.where(fwd == send, 1, -1)
        known = (stage >= 0) & (phase > 0)
        tgt = np.where(known, np.clip(stage + step, -1, n_st), -1)
        peer = rank_of[tgt + 1]
        ok = known & (peer >= 0) & (peer != r)
        v.peer[unk[ok]] = peer[ok].astype(np.int32)
        v.how[unk[ok]] = HOW_LABELS
        v.conf[unk[ok]] = 1.0
        decided += int(ok.sum())
    return decided


def _by_blocks(
    rg: Ranges,
    t_op: npt.NDArray[np.int64],
    t_end: npt.NDArray[np.int64],
    send: npt.NDArray[np.bool_],
    rest: npt.NDArray[np.bool_],
    stage: npt.NDArray[np.int64],
    phase: npt.NDArray[np.int64],
) -> None:
    """Stage and phase (written into ``stage`` / ``phase`` where ``rest``) of each op from the
    labelled forward and input-gradient blocks on the host: the block whose range holds the op's
    issue (its own input or output), else the last block that ended before a send and the first
    that starts after a receive. A weight-gradient block (split backward) neither sends nor
    receives: the transfers around it belong to the blocks before and after it."""
    fb = np.isin(rg.phase, (int(Phase.FWD), int(Phase.BWD)))
    lm = np.flatnonzero((rg.kind == int(RangeKind.LABEL)) & (rg.stage >= 0) & fb)
    if not lm.size:
        return
    by_end = lm[np.argsort(rg.end[lm], kind="stable")]
    by_start = lm[np.argsort(rg.start[lm], kind="stable")]
    ji = np.searchsorted(rg.start[by_start], t_op, side="right") - 1
    ji_c = np.clip(ji, 0, None)
    inside = rest & (ji >= 0) & (t_op < rg.end[by_start[ji_c]])
    js = np.searchsorted(rg.end[by_end], t_op, side="right") - 1
    jr = np.searchsorted(rg.start[by_start], t_end, side="left")
    ok_s = rest & ~inside & send & (js >= 0)
    ok_r = rest & ~inside & ~send & (jr < by_start.size)
    jr_c = np.clip(jr, 0, by_start.size - 1)
    for ok, rows in ((inside, by_start[ji_c]), (ok_s, by_end[js]), (ok_r, by_start[jr_c])):
        stage[ok] = rg.stage[rows[ok]]
        phase[ok] = rg.phase[rows[ok]]


def _host_times(
    tl: RankTimeline, v: P2POps, unk: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per op of ``unk``, the host time that places it among the label ranges (a device
    kernel's launch, a host op's start) and the earliest start of the block that may consume it
    (the kernel's launch; a host receive's end less the slack of its wait)."""
    start, cut = v.start[unk], v.end[unk] - _RECV_SLACK_NS
    if v.table != "intervals" or not v.device:
        return start, cut
    idx = v.index[unk]
    launch = np.where(idx >= 0, tl.intervals.launch[np.clip(idx, 0, None)], -1)
    has = launch >= 0
    return np.where(has, launch, start), np.where(has, launch, cut)
