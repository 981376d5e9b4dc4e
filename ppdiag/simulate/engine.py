"""Discrete-event execution of a pipeline schedule from per-stage costs.

One step of one pipeline is simulated block by block. A block (F, B, I or W of one micro-batch on
one virtual stage) starts when

* its rank's GPU is free (blocks of a rank run in the schedule's order, one at a time),
* its input has arrived: F of stage ``s`` needs F of ``s-1``; B/I of ``s`` needs the backward of
  ``s+1`` (the last stage's backward needs its own F); W needs its own I. When the producer is on
  another rank the data arrives ``p2p`` after the later of the producer's end, the moment the
  receiver posted its receive (NCCL transfers need both sides) and the end of the previous
  transfer over the same stage boundary in the same direction (a link carries one at a time),
* its host has issued it (``launch_latency_ns`` after the host reached the block).

The host of every rank is modelled too, because launch-bound ranks and late receives are real
causes of lost time: the host issues block ``i`` at
``max(host(i-1) + host_issue, start(i - lookahead), end(i-1) + host_stall)`` — it needs time to
issue, may run at most ``lookahead`` blocks ahead of the GPU, and a stalled host (a sync plus slow
Python) only resumes ``host_stall`` after the GPU went idle.

After the last block the step ends with the optional tail every training step has: an exposed
collective per rank (``tail_comm_ns``, e.g. a data-parallel all-reduce left un-overlapped), a
synchronising collective across the pipeline (``sync_ns``: every rank waits for the slowest, then
the transfer), the optimizer (``optim_ns``, launched by the host once the sync result is back),
and the host noticing the end (``end_latency_ns``). All parameters default to 0, which gives the
pure schedule model the bubble formulas talk about.

Costs are in ns (floats are accepted; integers keep every result exact).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Phase
from ppdiag.simulate.schedules import (
    B,
    F,
    I,
    W,
    canonical_schedule,
    default_virtual,
    rank_orders,
    splits_backward,
    stage_to_rank,
)

F64 = npt.NDArray[np.float64]
Num = float | int
PerX = Sequence[float] | Sequence[int] | float | int

_OP_PHASE = {F: int(Phase.FWD), B: int(Phase.BWD), I: int(Phase.BWD), W: int(Phase.WGRAD)}


@dataclass
class SimConfig:
    """What to simulate: a schedule, its shape, per-stage costs and the non-compute delays.

    Per-stage values (``fwd_ns``, ``bwd_ns``, ``wgrad_ns``) take one number or one per virtual
    stage (``pp * virtual`` values, stage order). ``bwd_ns`` is the input-gradient backward;
    ``wgrad_ns`` the weight-gradient part: zero-bubble schedules run it as separate W blocks,
    the others inside B (B costs ``bwd + wgrad``). ``p2p_ns`` is the transfer time of one
    activation/gradient across a stage boundary: one number or one per boundary
    (``pp * virtual - 1`` values; boundary ``s`` sits between stages ``s`` and ``s+1``).
    Per-rank values (``link_delay_ns``, ``host_*``, ``start_delay_ns``, ``comm_on_compute``,
    ``tail_comm_ns``, ``optim_ns``) take one value or one per pipeline rank.

    ``link_delay_ns``: extra time for every transfer *sent* by that rank (slow link).
    ``comm_on_compute``: that rank runs its p2p on the compute stream: a send keeps the GPU busy
    for the transfer after the producing block (treated as buffered: the sender does not wait for
    the receiver), and a receive cannot be posted before the GPU is free.
    ``sync_ns``: None for no step-end synchronisation, else the transfer time of a collective
    all pipeline ranks join after their last block (and tail collective).
    """

    schedule: str
    pp: int
    microbatches: int
    virtual: int = 1
    fwd_ns: PerX = 1.0
    bwd_ns: PerX = 2.0
    wgrad_ns: PerX = 0.0
    p2p_ns: PerX = 0.0
    link_delay_ns: PerX = 0.0
    launch_latency_ns: float = 0.0
    host_issue_ns: PerX = 0.0
    host_lookahead: int | None = None
    host_stall_ns: PerX = 0.0
    start_delay_ns: PerX = 0.0
    comm_on_compute: Sequence[bool] | bool = False
    tail_comm_ns: PerX = 0.0
    sync_ns: float | None = None
    optim_ns: PerX = 0.0
    end_latency_ns: float = 0.0

    def replace(self, **changes: Any) -> SimConfig:
        """A copy with some fields changed."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(changes)
        return SimConfig(**d)


@dataclass
class SimResult:
    """A simulated step: one row per block (columnar, grouped by rank in execution order).

    ``phase`` is :class:`ppdiag.model.Phase` (FWD, BWD, WGRAD); ``full`` marks a backward that
    includes the weight gradient; ``chunk`` the rank-local chunk index of the stage;
    ``issue_ns`` when the host issued the block, ``post_ns`` when its receive was posted
    (-1: none), ``ready_ns`` when its input was available (-1: no input), ``src_rank`` the rank
    that produced the input (-1: none or the same rank), ``xfer_ns`` the transfer time of that
    input. Per-rank step tail: ``last_end_ns`` (end of the last block), ``tail_end_ns`` (after the
    exposed collective), ``sync_end_ns``, ``optim_start_ns``/``optim_end_ns``. ``step_ns`` is the
    step time (all ranks share the step window ``[0, step_ns)``), ``per_rank_busy_ns`` the compute
    per rank (blocks + optimizer), ``per_rank_idle_ns`` the rest of the step, ``bubble_ratio``
    mean idle / step over ranks.
    """

    config: SimConfig
    schedule: str
    virtual: int
    stage_to_rank: list[int]
    rank: npt.NDArray[np.int32]
    stage: npt.NDArray[np.int32]
    chunk: npt.NDArray[np.int32]
    mb: npt.NDArray[np.int32]
    phase: npt.NDArray[np.int8]
    full: npt.NDArray[np.bool_]
    start_ns: F64
    end_ns: F64
    issue_ns: F64
    post_ns: F64
    ready_ns: F64
    src_rank: npt.NDArray[np.int32]
    xfer_ns: F64
    last_end_ns: F64
    tail_end_ns: F64
    sync_end_ns: F64
    optim_start_ns: F64
    optim_end_ns: F64
    step_ns: float
    per_rank_busy_ns: F64
    per_rank_idle_ns: F64
    bubble_ratio: float
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.rank.shape[0])

    @property
    def blocks(self) -> dict[str, npt.NDArray[Any]]:
        """The per-block columns as one dict (rank, stage, chunk, mb, phase, start_ns, end_ns, ...)."""
        return {
            "rank": self.rank,
            "stage": self.stage,
            "chunk": self.chunk,
            "mb": self.mb,
            "phase": self.phase,
            "full": self.full,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "issue_ns": self.issue_ns,
            "post_ns": self.post_ns,
            "ready_ns": self.ready_ns,
            "src_rank": self.src_rank,
            "xfer_ns": self.xfer_ns,
        }

    def rank_rows(self, r: int) -> npt.NDArray[np.intp]:
        """Row indices of rank ``r``'s blocks in execution order."""
        return np.flatnonzero(self.rank == r)

    @property
    def total_idle_ns(self) -> float:
        return float(self.per_rank_idle_ns.sum())


def _per(val: Any, n: int, what: str, kind: type = float) -> list[Any]:
    if isinstance(val, (int, float, bool, np.integer, np.floating, np.bool_)):
        return [kind(val)] * n
    out = [kind(x) for x in val]
    if len(out) != n:
        raise ValueError(f"{what}: expected 1 or {n} values, got {len(out)}")
    return out


@dataclass(frozen=True)
class _Inputs:
    """A config resolved to one value per stage, boundary or rank, plus the block orders."""

    sched: str
    p: int
    m: int
    v: int
    s2r: list[int]
    orders: list[list[Any]]
    fwd: list[float]
    bwd: list[float]
    wgr: list[float]
    p2p: list[float]
    link: list[float]
    issue: list[float]
    stall: list[float]
    sdelay: list[float]
    on_comp: list[bool]
    tail: list[float]
    optim: list[float]
    lat: float
    look: int | None
    split: bool

    @property
    def n_st(self) -> int:
        return self.p * self.v

    def cost(self, stage: int, op: int) -> float:
        """Duration of one block."""
        if op == F:
            return self.fwd[stage]
        if op == B:
            return self.bwd[stage] + self.wgr[stage]
        if op == I:
            return self.bwd[stage] if self.split else self.bwd[stage] + self.wgr[stage]
        return self.wgr[stage]

    def key(self, stage: int, op: int, mb: int) -> int:
        """Key of a block's "done" slot: backward of a stage is one slot whether it ran as B or I."""
        slot = 0 if op == F else (2 if op == W else 1)
        return (stage * 3 + slot) * self.m + mb

    def dep_of(self, a_stage: int, op: int) -> tuple[int, int] | None:
        """(producer stage, producer op) of a block's input, None when it needs none."""
        if op == F:
            return (a_stage - 1, F) if a_stage > 0 else None
        if op == W:
            return (a_stage, I)
        if a_stage == self.n_st - 1:
            return (a_stage, F)
        return (a_stage + 1, I)


def _inputs(cfg: SimConfig) -> _Inputs:
    """Resolve ``cfg`` (ValueError for a wrong number of values or an impossible schedule)."""
    sched = canonical_schedule(cfg.schedule)
    p, m = int(cfg.pp), int(cfg.microbatches)
    v = default_virtual(sched, int(cfg.virtual))
    n_st = p * v
    return _Inputs(
        sched,
        p,
        m,
        v,
        stage_to_rank(sched, p, v),
        rank_orders(sched, p, m, v),
        _per(cfg.fwd_ns, n_st, "fwd_ns"),
        _per(cfg.bwd_ns, n_st, "bwd_ns"),
        _per(cfg.wgrad_ns, n_st, "wgrad_ns"),
        _per(cfg.p2p_ns, max(n_st - 1, 1), "p2p_ns") if n_st > 1 else [0.0],
        _per(cfg.link_delay_ns, p, "link_delay_ns"),
        _per(cfg.host_issue_ns, p, "host_issue_ns"),
        _per(cfg.host_stall_ns, p, "host_stall_ns"),
        _per(cfg.start_delay_ns, p, "start_delay_ns"),
        _per(cfg.comm_on_compute, p, "comm_on_compute", bool),
        _per(cfg.tail_comm_ns, p, "tail_comm_ns"),
        _per(cfg.optim_ns, p, "optim_ns"),
        float(cfg.launch_latency_ns),
        cfg.host_lookahead,
        splits_backward(sched),
    )


# the plans of the schedules simulated lately: what-if simulates one schedule dozens of times
_PLANS: dict[tuple[str, int, int, int, bool], list[list[tuple[int, ...]]]] = {}


def _plan(x: _Inputs) -> list[list[tuple[int, ...]]]:
    """Per rank, per block in its order, what the loop needs that depends only on the schedule
    (``orders`` and ``s2r`` are functions of schedule, P, M and V): (stage, op, done-slot key,
    the input's key or -1, the input's rank, the boundary it crosses or -1, the boundary of the
    output's send or -1)."""
    key = (x.sched, x.p, x.m, x.v, x.split)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    plan = []
    for r in range(x.p):
        rows: list[tuple[int, ...]] = []
        for st, op, mb in x.orders[r]:
            dep = x.dep_of(st, op)
            dkey, src, bnd = -1, r, -1
            if dep is not None:
                dkey, src = x.key(dep[0], dep[1], mb), x.s2r[dep[0]]
                bnd = min(st, dep[0]) if src != r else -1
            cons = _consumer(st, op, x.n_st)
            cb = min(st, cons) if cons is not None and x.s2r[cons] != r else -1
            rows.append((st, op, x.key(st, op, mb), dkey, src, bnd, cb))
        plan.append(rows)
    if len(_PLANS) >= 16:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


class _Run:
    """The state of one simulated step: every block's times, filled rank by rank as inputs arrive."""

    def __init__(self, x: _Inputs) -> None:
        self.x = x
        # Python lists, not arrays: the loop reads and writes one element at a time, and numpy
        # scalar access costs ten times a list's (the results are the same doubles)
        self.end_of: list[float | None] = [None] * (x.n_st * 3 * x.m)
        n_rows = sum(len(o) for o in x.orders)
        self.start = [0.0] * n_rows
        self.end = [0.0] * n_rows
        self.issue = [0.0] * n_rows
        self.post = [-1.0] * n_rows
        self.ready = [-1.0] * n_rows
        self.src = [-1] * n_rows
        self.xfer = [0.0] * n_rows
        self.base = [0] * x.p  # first row of every rank
        for r in range(1, x.p):
            self.base[r] = self.base[r - 1] + len(x.orders[r - 1])
        self.link_free: dict[tuple[int, int], float] = {}  # (boundary, 0 fwd / 1 bwd) -> last transfer end
        self.ptr = [0] * x.p
        self.free = [0.0] * x.p  # GPU (compute stream) free time
        self.host = [0.0] * x.p  # host time when it may issue the next block
        # a block's send on the compute stream keeps its rank busy: the transfer per block
        self.send_busy = [[0.0] * len(x.orders[r]) for r in range(x.p)]

    def run(self) -> None:
        """Run every rank as far as its inputs allow; a rank that waits resumes when the block it
        waits for is done."""
        x = self.x
        plan = _plan(x)
        costs = [[x.cost(st, op) for op in (F, B, I, W)] for st in range(x.n_st)]  # indexed by op (0-3)
        end_of, ptr = self.end_of, self.ptr
        waiters: dict[int, list[int]] = {}
        place = self._placer()
        stack = list(range(x.p - 1, -1, -1))
        while stack:
            r = stack.pop()
            rows = plan[r]
            while ptr[r] < len(rows):
                blk = rows[ptr[r]]
                dkey = blk[3]
                if dkey >= 0 and end_of[dkey] is None:
                    waiters.setdefault(dkey, []).append(r)
                    break
                place(r, ptr[r], blk, costs[blk[0]][blk[1]])
                ptr[r] += 1
                stack.extend(waiters.pop(blk[2], []))
        if any(self.ptr[r] < len(x.orders[r]) for r in range(x.p)):
            stuck = [r for r in range(x.p) if self.ptr[r] < len(x.orders[r])]
            raise ValueError(f"schedule {x.sched} deadlocks on ranks {stuck} (inconsistent orders)")

    def _placer(self) -> Callable[[int, int, tuple[int, ...], float], None]:
        """The function that times block ``i`` of rank ``r`` (its input is there; ``blk`` its row
        of the plan). A closure over the run's lists and the inputs: the loop calls it once per
        block, and local names cost a fraction of attribute reads."""
        x = self.x
        base, host, free, issue = self.base, self.host, self.free, self.issue
        start_l, end_l = self.start, self.end
        post_l, src_l, xfer_l, ready_l, end_of = self.post, self.src, self.xfer, self.ready, self.end_of
        link_free, send_busy = self.link_free, self.send_busy
        x_issue, look, stall, sdelay, lat = x.issue, x.look, x.stall, x.sdelay, x.lat
        on_comp, p2p, link = x.on_comp, x.p2p, x.link

        def place(r: int, i: int, blk: tuple[int, ...], cost: float) -> None:
            _, op, k, dkey, src, bnd, cb = blk
            row = base[r] + i
            # when the host issues it
            h = max(host[r], issue[row - 1] + x_issue[r]) if i > 0 else sdelay[r]
            if look is not None and i >= look:
                h = max(h, start_l[row - look])
            if stall[r] > 0:
                h = max(h, (free[r] if i > 0 else sdelay[r]) + stall[r])
            h = float(h)
            gpu_free = free[r]
            start = max(gpu_free, h + lat)
            if dkey >= 0:
                dep_end = end_of[dkey]
                assert dep_end is not None  # run() places a block only once its input is done
                if src != r:
                    post = h + lat
                    if on_comp[r]:
                        post = max(post, gpu_free)
                    edge = p2p[bnd] + link[src]
                    lk = (bnd, 0 if op == F else 1)
                    ready = max(dep_end, post, link_free.get(lk, 0.0)) + edge
                    link_free[lk] = ready
                    post_l[row] = post
                    src_l[row] = src
                    xfer_l[row] = edge
                else:
                    ready = dep_end
                ready_l[row] = ready
                start = max(start, ready)
            end = start + cost
            start_l[row] = start
            end_l[row] = end
            issue[row] = h
            host[r] = h
            # the send of this block's output on the compute stream (one consumer at most)
            sb = p2p[cb] + link[r] if on_comp[r] and cb >= 0 else 0.0
            send_busy[r][i] = sb
            free[r] = end + sb
            end_of[k] = end

        return place


def simulate(cfg: SimConfig) -> SimResult:
    """Run one step of ``cfg`` and return every block's times plus the per-rank accounting."""
    x = _inputs(cfg)
    run = _Run(x)
    run.run()
    return _result(cfg, x, run)


def _result(cfg: SimConfig, x: _Inputs, run: _Run) -> SimResult:
    """The step tail (exposed collective, sync, optimizer) and the per-rank accounting."""
    p, orders = x.p, x.orders
    last_end = np.array([run.free[r] if orders[r] else 0.0 for r in range(p)])
    tail_end = last_end + np.array(x.tail)
    if cfg.sync_ns is not None:
        sync_end = np.full(p, float(tail_end.max()) + float(cfg.sync_ns))
        optim_start = sync_end + x.lat
    else:
        sync_end = tail_end.copy()
        optim_start = tail_end.copy()
    optim_end = optim_start + np.array(x.optim)
    step = float(optim_end.max()) + float(cfg.end_latency_ns)
    ranks = np.concatenate([np.full(len(orders[r]), r, dtype=np.int32) for r in range(p)])
    acts = [a for o in orders for a in o]
    stage_arr = np.array([a.stage for a in acts], dtype=np.int32)
    op_arr = [a.op for a in acts]
    start_ns, end_ns = np.array(run.start, dtype=np.float64), np.array(run.end, dtype=np.float64)
    busy = np.bincount(ranks, weights=end_ns - start_ns, minlength=p) + np.array(x.optim)
    idle = step - busy
    # a stage's chunk index on its rank: how many lower stages the rank holds (one pass, not a
    # search per stage: linear in the stages)
    held = [0] * p
    chunk_of = [0] * x.n_st
    for s in range(x.n_st):
        chunk_of[s] = held[x.s2r[s]]
        held[x.s2r[s]] += 1
    return SimResult(
        config=cfg,
        schedule=x.sched,
        virtual=x.v,
        stage_to_rank=x.s2r,
        rank=ranks,
        stage=stage_arr,
        chunk=np.array(chunk_of, dtype=np.int32)[stage_arr],
        mb=np.array([a.mb for a in acts], dtype=np.int32),
        phase=np.array([_OP_PHASE[o] for o in op_arr], dtype=np.int8),
        full=np.array([o == B or (o == I and not x.split) for o in op_arr], dtype=np.bool_),
        start_ns=start_ns,
        end_ns=end_ns,
        issue_ns=np.array(run.issue, dtype=np.float64),
        post_ns=np.array(run.post, dtype=np.float64),
        ready_ns=np.array(run.ready, dtype=np.float64),
        src_rank=np.array(run.src, dtype=np.int32),
        xfer_ns=np.array(run.xfer, dtype=np.float64),
        last_end_ns=last_end,
        tail_end_ns=tail_end,
        sync_end_ns=sync_end,
        optim_start_ns=optim_start,
        optim_end_ns=optim_end,
        step_ns=step,
        per_rank_busy_ns=busy,
        per_rank_idle_ns=idle,
        bubble_ratio=float(idle.mean() / step) if step > 0 else 0.0,
        extra={"send_busy_ns": np.concatenate([np.array(s, dtype=float) for s in run.send_busy])},
    )


def _consumer(stage: int, op: int, n_st: int) -> int | None:
    """The stage that consumes a block's output across a boundary (None: none)."""
    if op == F:
        return stage + 1 if stage < n_st - 1 else None
    if op in (B, I):
        return stage - 1 if stage > 0 else None
    return None


def closed_form_bubble(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> float:
    """The textbook bubble ratio (idle / step) with equal stage costs and free communication.

    * GPipe, 1F1B: ``(P-1)/(M+P-1)``.
    * interleaved 1F1B: ``(P-1)/(v*M+P-1)`` (exact when ``M`` is a multiple of ``P``).
    * zero bubble (ZB-H1): with ``T_F = T_B = T_W`` (input-grad and weight-grad halves of the
      backward equal to the forward) the paper's bubble ``(P-1)(T_F+T_B-T_W)`` becomes
      ``(P-1) T`` against ``M*3T`` of work per rank: ``(P-1)/(3M+P-1)`` — a third of 1F1B's.
      For ``v > 1`` (interleaved zero bubble) the same reasoning with chunk costs gives
      ``(P-1)/(3vM+P-1)``.
    * ZBV, DualPipeV (two chunks per rank in a V): with ``T_F = T_B = T_W`` per chunk every rank
      idles ``(P-1) T`` — the start-up ramp of the later ranks, mirrored as the W-filled drain of
      the earlier ones — against ``3*v*M*T`` of work, so ``(P-1)/(3vM+P-1)`` with ``v = 2``: about half
      of ZB-H1's for the same model split in twice as many chunks. DualPipeV's ``F&B`` pairs are
      counted as run back to back (see :mod:`ppdiag.simulate.schedules`); the simulator reproduces
      all of these exactly for equal costs (tests).
    """
    sched = canonical_schedule(schedule)
    p, m = pp, microbatches
    v = default_virtual(sched, virtual)
    if p <= 1:
        return 0.0
    if sched in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if sched == "interleaved_1f1b":
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (3 * v * m + p - 1)
