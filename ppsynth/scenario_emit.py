"""What one synthetic GPU rank records in one step of a pipeline scenario: the emitter.

:func:`emit_step` turns the simulated blocks of one step (:class:`ppdiag.simulate.SimResult`) into
rows of a :class:`~ppsynth.builder.RankBuilder`, block by block: the blocking NCCL receive of
its input (``c10d::recv_`` → ``record_param_comms`` → ``nccl:recv`` → ``cuLaunchKernelEx`` and its
``SendRecv`` kernel), its compute kernels launched ahead by the host, the send of its output, and
then the step tail (data-parallel all-reduce, gradient-norm sync, optimizer, loss read). All times
are on the true clock; the random draws (kernels per block, their split) are made in a fixed order
so a seed always gives the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppdiag.model.timeline import Direction, Kind, Phase
from ppdiag.simulate import SimResult
from ppsynth.builder import RankBuilder, coll_host, comm_kw
from ppsynth.kernels import (
    ALLREDUCE_BF16,
    ALLREDUCE_F32,
    AUTOGRAD_ATEN,
    BWD_KERNELS,
    FWD_KERNELS,
    OPTIM_KERNELS,
    SENDRECV,
    WGRAD_KERNELS,
)
from ppsynth.run import HostCat
from ppsynth.scenario_params import (
    STREAM_COMPUTE,
    STREAM_DP,
    STREAM_PP_COLL,
    US,
    ScenarioParams,
    Topo,
)

_DATALOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


@dataclass
class SeqState:
    """Sequence numbers a rank's communication carries across steps (p2p, and per collective group)."""

    p2p_seq: int = 0
    coll_seq: dict[int, int] = field(default_factory=dict)

    def coll(self, group: int) -> int:
        """The next sequence number of a collective on ``group``."""
        self.coll_seq[group] = self.coll_seq.get(group, 0) + 1
        return self.coll_seq[group]


@dataclass(frozen=True)
class RankSlot:
    """The rank being written: its builder, pipeline rank ``p`` in replica ``d``, its NCCL stream
    per remote stage boundary and direction, and its sequence numbers."""

    b: RankBuilder
    p: int
    d: int
    recv_stream: dict[int, int]
    send_stream: dict[int, int]
    seqs: SeqState


@dataclass(frozen=True)
class StepSpan:
    """Step ``k`` (0-based in the recording) and its window on the true clock."""

    k: int
    start: int
    end: int


@dataclass(frozen=True)
class _Step:
    """Everything the pieces of one step read (derived once per step)."""

    slot: RankSlot
    prm: ScenarioParams
    topo: Topo
    res: SimResult
    k: int
    t0: int  # the step's start on the true clock, after the replica's lateness
    t_end: int  # the step's end (the next step's start)
    g: int  # global rank
    pp_gi: int
    on_comp: bool
    gap_ns: int
    key_row: dict[tuple[int, int, int], int]
    rng: np.random.Generator

    @property
    def b(self) -> RankBuilder:
        return self.slot.b

    @property
    def main(self) -> int:
        return self.slot.b.pid

    @property
    def bwd_tid(self) -> int:
        return self.slot.b.pid + 2

    def at(self, sim_ns: float) -> int:
        """A simulated time of this step on the true clock."""
        return self.t0 + round(sim_ns)


def emit_step(
    slot: RankSlot,
    prm: ScenarioParams,
    topo: Topo,
    res: SimResult,
    span: StepSpan,
    rng: np.random.Generator,
    late_ns: int = 0,
    push_ns: int = 0,
    tail: tuple[int, int, int, int] | None = None,
) -> None:
    """Append one step of pipeline rank ``slot.p`` in replica ``slot.d`` (true clock).

    ``late_ns``: the replica starts its work that late (its data loader); ``push_ns``: the step's
    data-parallel all-reduce ends that much later than the simulation says (it waits for a late
    replica), and everything after it moves with it. ``tail``: the step tail coupled across
    replicas, (all-reduce end, sync end, optimizer start, optimizer end) relative to the step start.
    """
    g = topo.glob(slot.p, slot.d)
    c = _Step(
        slot,
        prm,
        topo,
        res,
        span.k,
        span.start + late_ns,
        span.end,
        g,
        topo.pp_group_of[g],
        _per_rank_bool(res.config.comm_on_compute, topo.pp)[slot.p],
        round(prm.kernel_gap_us * US),
        # the consumer row of every block that sends across ranks, for the send's end time
        {(int(res.stage[i]), int(res.phase[i]), int(res.mb[i])): i for i in range(len(res))},
        rng,
    )
    _emit_head(c, span, late_ns)
    rows = res.rank_rows(slot.p)
    stall = _per_rank(res.config.host_stall_ns, topo.pp)[slot.p]
    host_free = c.t0
    for n_i, i in enumerate(rows):
        if stall > 0 and n_i > 0:
            _emit_stall_sync(c, int(rows[n_i - 1]), host_free, c.at(res.issue_ns[i]))
        host_free = _emit_block(c, int(i))
    _emit_tail(c, rows, host_free, push_ns, tail)


def _emit_head(c: _Step, span: StepSpan, late_ns: int) -> None:
    """The step annotation and the data-loader waits that open the step."""
    b, main, k = c.b, c.main, c.k
    step_num = c.prm.first_step + k
    b.host(span.start, span.end, f"ProfilerStep#{step_num}", HostCat.ANNOTATION, main, num=step_num, step=k)
    sdelay = _per_rank(c.res.config.start_delay_ns, c.topo.pp)[c.slot.p]
    if sdelay > 0:
        b.host(
            span.start + US, span.start + round(sdelay) - US, _DATALOADER, HostCat.ANNOTATION, main, step=k
        )
    if late_ns > 2 * US:
        b.host(span.start + US, span.start + late_ns - US, _DATALOADER, HostCat.ANNOTATION, main, step=k)


def _emit_stall_sync(c: _Step, prev: int, host_free: int, h: int) -> None:
    """A stalled host synchronises with the GPU before its slow Python work."""
    gpu_idle = c.at(c.res.end_ns[prev] + c.res.extra["send_busy_ns"][prev])
    if gpu_idle > host_free + 2 * US and gpu_idle + US <= h:
        ext = c.b.host(host_free + US, gpu_idle + US, "aten::item", HostCat.CPU_OP, c.main, step=c.k)
        c.b.api(host_free + 2 * US, gpu_idle, "cudaStreamSynchronize", c.main, ext)


def _emit_block(c: _Step, i: int) -> int:
    """Receive, kernels and send of block row ``i``; returns the host time after them."""
    res = c.res
    st, ph = int(res.stage[i]), int(res.phase[i])
    bs, be = c.at(res.start_ns[i]), c.at(res.end_ns[i])
    h = c.at(res.issue_ns[i])
    t = h
    if int(res.src_rank[i]) >= 0:
        _emit_recv(c, i, t)
        t += 16 * US
    else:
        t += 2 * US
    if be - bs > 0:
        t = _emit_kernels(c, i, t, h, bs, be)
    cons = _consumer_stage(st, ph, len(c.topo.s2r))
    if cons is not None and c.topo.s2r[cons] != c.slot.p:
        _emit_send(c, i, t, be, cons)
        t += 14 * US
    return t


def _emit_recv(c: _Step, i: int, t: int) -> None:
    """The blocking receive of block ``i``'s input, posted by the host at ``t``."""
    b, res, main, k = c.b, c.res, c.main, c.k
    st, ph, mb = int(res.stage[i]), int(res.phase[i]), int(res.mb[i])
    src = int(res.src_rank[i])
    peer_g = c.topo.glob(src, c.slot.d)
    post, ready = c.at(res.post_ns[i]), c.at(res.ready_ns[i])
    xfer = round(res.xfer_ns[i])
    bnd = st - 1 if ph == Phase.FWD else st  # boundary the input crosses
    stream = STREAM_COMPUTE if c.on_comp else c.slot.recv_stream[bnd]
    comm = _p2p_comm(c, "recv", peer_g, Direction.RECV)
    b.host(t + 1 * US, t + 13 * US, "c10d::recv_", HostCat.CPU_OP, main, step=k, **comm)
    e2 = b.host(t + 2 * US, t + 12 * US, "record_param_comms", HostCat.CPU_OP, main, step=k, **comm)
    title = f"nccl:recv {c.slot.p}<-{src}"
    b.host(t + 3 * US, t + 11 * US, title, HostCat.ANNOTATION, main, step=k, **comm)
    launch = t + 5 * US
    corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", main, e2, driver=True)
    k_start = max(post, b.stream_end.get(stream, 0))
    if k_start > ready - xfer:
        raise AssertionError(
            f"rank {c.g}: receive for stage {st} mb {mb} cannot start before its data arrives"
        )
    lab = {"step": k, "stage": st, "mb": mb, "phase": ph}
    b.kernel(k_start, ready, stream, Kind.P2P, SENDRECV, corr, launch, e2, **lab, **comm)
    b.api(t + 13 * US + 200, t + 13 * US + 800, "cudaStreamWaitEvent", main, -1)


def _p2p_comm(c: _Step, coll: str, peer_g: int, direction: Direction) -> dict[str, int]:
    """The communication columns of the next p2p transfer (one activation or its gradient)."""
    elem = c.prm.activation_nelems
    comm = comm_kw(c.b, coll, peer_g, direction, elem * 2, elem, "BFloat16", c.slot.seqs.p2p_seq, c.pp_gi)
    c.slot.seqs.p2p_seq += 1
    return comm


def _emit_kernels(c: _Step, i: int, t: int, h: int, bs: int, be: int) -> int:
    """The compute kernels of block ``i`` filling ``[bs, be)``, launched from ``t``; returns the host
    time after the launches."""
    b, res, prm = c.b, c.res, c.prm
    st, ph, mb = int(res.stage[i]), int(res.phase[i]), int(res.mb[i])
    full = bool(res.full[i])
    tid = c.bwd_tid if ph in (Phase.BWD, Phase.WGRAD) else c.main
    lab = {"step": c.k, "stage": st, "mb": mb, "phase": ph}
    ops = FWD_KERNELS if ph == Phase.FWD else (WGRAD_KERNELS if ph == Phase.WGRAD else BWD_KERNELS)
    lo, hi = prm.kernels_per_block
    n_k = int(c.rng.integers(lo, hi + 1))
    if ph == Phase.BWD and full and hi > 1:
        n_k = max(n_k, 2)
    parts, gap = split_kernels(be - bs, n_k, c.gap_ns, c.rng)
    if prm.annotations is not None:
        label = _label(prm.annotations, st, ph, mb, full)
        b.host(h, h + round(prm.host_issue_us * US) - 2 * US, label, HostCat.ANNOTATION, c.main, **lab)
    ks = bs
    for j, kd in enumerate(parts):
        launch = t + j * 7 * US
        op, kname = ops[(j + (mb % 2)) % len(ops)]
        if tid == c.bwd_tid:
            fn = f"autograd::engine::evaluate_function: {op}"
            b.host(launch - 2 * US, launch + 5 * US, fn, HostCat.CPU_OP, tid, **lab)
            aten = AUTOGRAD_ATEN.get(op, "aten::mm")
            ext = b.host(launch - US, launch + 5 * US - 500, aten, HostCat.CPU_OP, tid, **lab)
        else:
            ext = b.host(launch - 2 * US, launch + 5 * US, op, HostCat.CPU_OP, tid, **lab)
        corr = b.api(launch, launch + 4 * US, "cudaLaunchKernel", tid, ext)
        b.kernel(ks, ks + kd, STREAM_COMPUTE, Kind.COMPUTE, kname, corr, launch, ext, **lab)
        ks += kd + gap
    if ks - gap != be:
        raise AssertionError("block kernels do not fill the block")
    return t + len(parts) * 7 * US


def _emit_send(c: _Step, i: int, t: int, be: int, cons: int) -> None:
    """The send of block ``i``'s output to stage ``cons``, issued by the host at ``t``."""
    b, res, main, k = c.b, c.res, c.main, c.k
    st, ph, mb = int(res.stage[i]), int(res.phase[i]), int(res.mb[i])
    dst = c.topo.s2r[cons]
    ck = c.key_row[(cons, int(Phase.FWD) if ph == Phase.FWD else int(Phase.BWD), mb)]
    recv_ready = c.at(res.ready_ns[ck])
    comm = _p2p_comm(c, "send", c.topo.glob(dst, c.slot.d), Direction.SEND)
    b.host(t + 1 * US, t + 13 * US, "c10d::send", HostCat.CPU_OP, main, step=k, **comm)
    e2 = b.host(t + 2 * US, t + 12 * US, "record_param_comms", HostCat.CPU_OP, main, step=k, **comm)
    title = f"nccl:send {c.slot.p}->{dst}"
    b.host(t + 3 * US, t + 11 * US, title, HostCat.ANNOTATION, main, step=k, **comm)
    b.api(t + 4 * US, t + 5 * US, "cudaStreamWaitEvent", main, e2)
    launch = t + 6 * US
    corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", main, e2, driver=True)
    lab = {"step": k, "stage": st, "mb": mb, "phase": ph}
    if c.on_comp:
        end, stream, k_start = be + round(res.extra["send_busy_ns"][i]), STREAM_COMPUTE, be
    else:
        stream = c.slot.send_stream[min(st, cons)]
        k_start = max(be, launch + US, b.stream_end.get(stream, 0))
        if k_start > recv_ready - round(res.xfer_ns[ck]):
            raise AssertionError(
                f"rank {c.g}: send for stage {cons} mb {mb} starts after its transfer should have"
            )
        end = recv_ready
    b.kernel(k_start, end, stream, Kind.P2P, SENDRECV, corr, launch, e2, **lab, **comm)


def _emit_tail(
    c: _Step, rows: Any, host_free: int, push_ns: int, tail: tuple[int, int, int, int] | None
) -> None:
    """The step tail: data-parallel gradient all-reduce, gradient-norm sync, optimizer, loss read."""
    res, p = c.res, c.slot.p
    last_end = c.at(res.last_end_ns[p])
    tail_end = c.at(res.tail_end_ns[p]) + push_ns
    sync_end = c.at(res.sync_end_ns[p]) + push_ns
    opt_start = c.at(res.optim_start_ns[p]) + push_ns
    opt_end = c.at(res.optim_end_ns[p]) + push_ns
    if tail is not None:
        tail_end, sync_end, opt_start, opt_end = (c.t0 + x for x in tail)
    t = host_free + US
    if c.prm.dp > 1:
        _emit_dp_allreduce(c, t, rows, last_end, tail_end)
        t += 14 * US
    t = _emit_sync(c, t, tail_end, sync_end)
    t = _emit_optimizer(c, t, opt_start, opt_end)
    # the training loop reads the loss: the host waits for the GPU, then calls prof.step()
    if opt_end + 2 * US < c.t_end:
        ext = c.b.host(t, opt_end + 3 * US, "aten::item", HostCat.CPU_OP, c.main, step=c.k)
        c.b.api(t + US, opt_end + 2 * US, "cudaStreamSynchronize", c.main, ext)


def _emit_dp_allreduce(c: _Step, t: int, rows: Any, last_end: int, tail_end: int) -> None:
    """The data-parallel gradient all-reduce: exposed after the last block when the simulation has
    a tail there, else overlapped with the last backward (bucketed gradient reduce)."""
    b, res = c.b, c.res
    dp_gi = c.topo.dp_group_of[c.g]
    nel = c.prm.grad_nelems
    comm = comm_kw(
        b, "allreduce", -1, Direction.NONE, nel * 2, nel, "BFloat16", c.slot.seqs.coll(dp_gi), dp_gi
    )
    e2 = coll_host(b, t, "c10d::allreduce_", "nccl:all_reduce", c.main, c.k, comm)
    launch = t + 6 * US
    corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", c.main, e2, driver=True)
    if tail_end > last_end:
        ks, ke = max(last_end, launch + US), tail_end
    else:
        # the last block that ran: a zero-length row (no weight-gradient block) hides nothing
        ran = rows[res.end_ns[rows] > res.start_ns[rows]]
        last_row = int(ran[-1]) if len(ran) else -1
        ls = c.at(res.start_ns[last_row]) if last_row >= 0 else last_end
        ks = max(ls, launch + US)
        if last_end - ks < 20 * US:  # a block too short to hide it: no kernel recorded
            return
        ke = ks + round(0.8 * (last_end - ks))
    b.kernel(ks, ke, STREAM_DP, Kind.COLLECTIVE, ALLREDUCE_BF16, corr, launch, e2, step=c.k, **comm)


def _emit_sync(c: _Step, t: int, tail_end: int, sync_end: int) -> int:
    """The pipeline-wide gradient-norm all-reduce and the host blocking on its result; returns the
    host time after it."""
    b, main, k = c.b, c.main, c.k
    comm = comm_kw(b, "allreduce", -1, Direction.NONE, 4, 1, "Float", c.slot.seqs.coll(c.pp_gi), c.pp_gi)
    e2 = coll_host(b, t, "c10d::allreduce_", "nccl:all_reduce", main, k, comm)
    launch = t + 6 * US
    corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", main, e2, driver=True)
    ks = max(tail_end, launch + US)
    if ks > sync_end - round(c.res.config.sync_ns or 0):
        raise AssertionError(f"rank {c.g}: the step-end all-reduce is launched too late")
    b.kernel(ks, sync_end, STREAM_PP_COLL, Kind.COLLECTIVE, ALLREDUCE_F32, corr, launch, e2, step=k, **comm)
    t += 14 * US
    # the host needs the gradient norm before the optimizer: it blocks until the all-reduce is done
    ext = b.host(t, sync_end + 4 * US, "aten::item", HostCat.CPU_OP, main, step=k)
    b.api(t + US, sync_end + 3 * US, "cudaStreamSynchronize", main, ext)
    return sync_end + 5 * US


def _emit_optimizer(c: _Step, t: int, opt_start: int, opt_end: int) -> int:
    """The optimizer step's kernels filling ``[opt_start, opt_end)``; returns the host time after."""
    b, main, k = c.b, c.main, c.k
    optim = int(Phase.OPTIM)
    parts, gap = split_kernels(opt_end - opt_start, 2, c.gap_ns, c.rng)
    title = "Optimizer.step#AdamW.step"
    b.host(t, t + (len(parts) * 7 + 2) * US, title, HostCat.ANNOTATION, main, step=k, phase=optim)
    ks = opt_start
    for j, kd in enumerate(parts):
        launch = t + US + j * 7 * US
        op, kname = OPTIM_KERNELS[j % len(OPTIM_KERNELS)]
        ext = b.host(launch - US, launch + 5 * US, op, HostCat.CPU_OP, main, step=k, phase=optim)
        corr = b.api(launch, launch + 4 * US, "cudaLaunchKernel", main, ext)
        b.kernel(ks, ks + kd, STREAM_COMPUTE, Kind.COMPUTE, kname, corr, launch, ext, step=k, phase=optim)
        ks += kd + gap
    return t + (len(parts) * 7 + 3) * US


def split_kernels(total: int, n: int, gap: int, rng: np.random.Generator) -> tuple[list[int], int]:
    """Integer kernel durations summing to ``total - (n-1)*gap`` (fewer kernels when too short)."""
    n = max(1, min(n, total // (40 * US) if total >= 40 * US else 1))
    if n > 1 and total - (n - 1) * gap < n * 10 * US:
        gap = 0
    avail = total - (n - 1) * gap
    w = rng.uniform(0.5, 1.5, n)
    parts = [int(x) for x in np.floor(avail * w / w.sum())]
    parts[-1] += avail - sum(parts)
    return parts, gap


def _label(style: str, stage: int, phase: int, mb: int, full: bool) -> str:
    if style == "pp":
        letter = "F" if phase == Phase.FWD else ("W" if phase == Phase.WGRAD else ("B" if full else "I"))
        return f"PP:{stage}{letter}{mb}"
    if phase == Phase.FWD:
        return f"Forward {mb}"
    return f"Backward weight {mb}" if phase == Phase.WGRAD else f"Backward {mb}"


def _consumer_stage(stage: int, phase: int, n_st: int) -> int | None:
    if phase == Phase.FWD:
        return stage + 1 if stage < n_st - 1 else None
    if phase == Phase.BWD:
        return stage - 1 if stage > 0 else None
    return None


def _per_rank(val: Any, n: int) -> list[float]:
    if isinstance(val, (int, float)):
        return [float(val)] * n
    return [float(x) for x in val]


def _per_rank_bool(val: Any, n: int) -> list[bool]:
    if isinstance(val, (bool, int)):
        return [bool(val)] * n
    return [bool(x) for x in val]
