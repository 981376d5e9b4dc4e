"""Per-rank action orders of the pipeline schedules the simulator knows.

Every function returns, for each pipeline rank, the ordered list of blocks that rank executes in
one step, as :class:`Action` tuples ``(stage, op, mb)`` where ``stage`` is the virtual stage,
``op`` one of :data:`F` (forward), :data:`B` (full backward: input grad + weight grad),
:data:`I` (input-grad backward only) and :data:`W` (weight-grad backward), ``mb`` the
micro-batch. The orders follow ``torch.distributed.pipelining`` (the ``pipeline_order`` of its
schedule classes, without the ``None`` timing padding that only aligns its dry-run view):

* ``gpipe``: all forwards, then all backwards.
* ``1f1b``: ``P-1-r`` warm-up forwards, then alternating F/B, then the cool-down backwards
  (Megatron's non-interleaved schedule; PyTorch's ``Schedule1F1B``).
* ``interleaved_1f1b``: ``ScheduleInterleaved1F1B`` (Megatron's interleaved schedule when
  ``M % P == 0``): stage ``s`` on rank ``s % P``, micro-batches grouped in rounds of
  ``M // max(1, M // P)``, warm-up ``(v-1)*round + 2*(P-1-r)`` forwards.
* ``zero_bubble``: ``ScheduleInterleavedZeroBubble`` — ZB-H1 for ``v = 1`` (the zero-bubble
  paper's handcrafted H1): backward split into I and W, rank ``r`` defers its W blocks by ``r``
  steady-state steps so they fill the cool-down.
* ``zbv``: ``ScheduleZBVZeroBubble`` — V placement (rank ``r`` runs stages ``r`` and
  ``2P-1-r``), two chunks per rank.
* ``dualpipev``: ``ScheduleDualPipeV`` — V placement; its overlapped ``F&B`` pairs are run one
  after the other (forward first), which is the order a single stream executes them in, so the
  simulated times are an upper bound of what true overlap gives.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

from ppdiag.model.schedule import Schedule

F = 0  # forward
B = 1  # full backward (input grad + weight grad)
I = 2  # input-grad backward only  # noqa: E741 - the schedule literature's name
W = 3  # weight-grad backward

OP_NAMES = {F: "F", B: "B", I: "I", W: "W"}

#: The schedules the simulator has a model of (looped BFS it predicts as interleaved 1F1B).
SCHEDULES: tuple[Schedule, ...] = (
    Schedule.GPIPE,
    Schedule.ONE_F_ONE_B,
    Schedule.INTERLEAVED_1F1B,
    Schedule.ZERO_BUBBLE,
    Schedule.ZBV,
    Schedule.DUALPIPEV,
)


class Action(NamedTuple):
    """One block of work on a rank: virtual stage, op (F/B/I/W) and micro-batch."""

    stage: int
    op: int
    mb: int


def canonical_schedule(name: str) -> str:
    """The canonical name of a schedule the simulator models (aliases resolved by
    :func:`ppdiag.model.schedule.parse_schedule`); ValueError if unknown or not simulated."""
    from ppdiag.model.schedule import parse_schedule

    sched = parse_schedule(name).value
    if sched not in SCHEDULES:
        raise ValueError(f"schedule {sched!r} has no simulator model; simulated: {', '.join(SCHEDULES)}")
    return sched


def uses_v_placement(schedule: str) -> bool:
    """True for schedules that place two chunks per rank in a V (rank r: stages r and 2P-1-r)."""
    return canonical_schedule(schedule) in ("zbv", "dualpipev")


def splits_backward(schedule: str) -> bool:
    """True for schedules that run the weight-gradient part as separate W blocks."""
    return canonical_schedule(schedule) in ("zero_bubble", "zbv", "dualpipev")


def stage_to_rank(schedule: str, pp: int, virtual: int) -> list[int]:
    """Pipeline rank of every virtual stage: looped (``s % P``) or V-shaped placement."""
    n = pp * virtual
    if uses_v_placement(schedule):
        out = []
        rank = 0
        for s in range(n):
            out.append(rank)
            if (s + 1) % pp == 0:
                continue  # stay on the border rank so the V turns around
            rank += 1 if (s // pp) % 2 == 0 else -1
        return out
    return [s % pp for s in range(n)]


def default_virtual(schedule: str, virtual: int) -> int:
    """Chunks per rank a schedule runs: V schedules always 2 (``virtual`` 1 means "default"),
    others what was asked. ValueError for a V schedule asked for another count."""
    if uses_v_placement(schedule):
        if virtual not in (1, 2):
            raise ValueError(f"{canonical_schedule(schedule)} runs exactly 2 chunks per rank (virtual=2)")
        return 2
    return virtual


def rank_orders(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> list[list[Action]]:
    """The ordered blocks of every pipeline rank for one step of ``schedule``.

    Raises ValueError for impossible combinations (e.g. ``zbv`` without 2 chunks, interleaved
    with ``M`` not a multiple of its number of rounds).
    """
    # the what-if simulates the same shape many times (calibration, causes): build each once
    return [list(o) for o in _rank_orders(canonical_schedule(schedule), pp, microbatches, virtual)]


@functools.lru_cache(maxsize=32)
def _rank_orders(sched: str, pp: int, microbatches: int, virtual: int) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(o) for o in _build_orders(sched, pp, microbatches, virtual))


def _build_orders(sched: str, pp: int, microbatches: int, virtual: int) -> list[list[Action]]:
    if pp < 1 or microbatches < 1 or virtual < 1:
        raise ValueError("pp, microbatches and virtual must be >= 1")
    if sched == "gpipe":
        _need_v1(sched, virtual)
        return [_gpipe(microbatches, r) for r in range(pp)]
    if sched == "1f1b":
        _need_v1(sched, virtual)
        return [_one_f_one_b(pp, microbatches, r) for r in range(pp)]
    if sched == "interleaved_1f1b":
        return [_interleaved(pp, microbatches, virtual, r, zero_bubble=False) for r in range(pp)]
    if sched == "zero_bubble":
        return [_interleaved(pp, microbatches, virtual, r, zero_bubble=True) for r in range(pp)]
    if virtual != 2:
        raise ValueError(f"{sched} needs exactly 2 chunks per rank (virtual=2), got {virtual}")
    if sched == "zbv":
        return [_zbv(pp, microbatches, r) for r in range(pp)]
    if microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs at least 2*pp = {2 * pp} micro-batches, got {microbatches}")
    return [_dualpipev(pp, microbatches, r) for r in range(pp)]


def _need_v1(sched: str, virtual: int) -> None:
    if virtual != 1:
        raise ValueError(f"{sched} runs one stage per rank (virtual=1), got virtual={virtual}")


def _gpipe(m: int, r: int) -> list[Action]:
    return [Action(r, F, i) for i in range(m)] + [Action(r, B, i) for i in range(m)]


def _one_f_one_b(p: int, m: int, r: int) -> list[Action]:
    warm = min(p - 1 - r, m)
    out = [Action(r, F, i) for i in range(warm)]
    for i in range(m - warm):
        out.append(Action(r, F, warm + i))
        out.append(Action(r, B, i))
    out.extend(Action(r, B, i) for i in range(m - warm, m))
    return out


def _interleaved(p: int, m: int, v: int, r: int, zero_bubble: bool) -> list[Action]:
    rounds = max(1, m // p)
    per_round = m // rounds
    if m % rounds != 0:
        raise ValueError(
            f"interleaved schedules need the micro-batch count ({m}) to be a multiple of the "
            f"number of rounds ({rounds})"
        )
    factor = 1 if zero_bubble else 2
    warm = min((v - 1) * per_round + factor * (p - 1 - r), m * v)
    total = m * v
    steady = total - warm

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % v) * p + r

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warm) // per_round) % v) * p + r

    return _one_f_one_b_ops(warm, steady, warm, fwd_stage, bwd_stage, r if zero_bubble else -1)


def _one_f_one_b_ops(
    warm: int,
    steady: int,
    cool: int,
    fwd_stage: Callable[[int], int],
    bwd_stage: Callable[[int], int],
    w_delay: int,
) -> list[Action]:
    """Port of torch's ``_get_1f1b_rank_ops``; ``w_delay >= 0`` enables the zero-bubble W split."""
    zb = w_delay >= 0
    f_mb: dict[int, int] = defaultdict(int)
    b_mb: dict[int, int] = defaultdict(int)
    w_mb: dict[int, int] = defaultdict(int)
    out: list[Action] = []
    bwd_ops: list[int] = []
    w_count = 0
    bop = I if zb else B

    def add_w() -> None:
        nonlocal w_count
        s = bwd_stage(bwd_ops[w_count])
        out.append(Action(s, W, w_mb[s]))
        w_mb[s] += 1
        w_count += 1

    for op in range(warm + steady + cool):
        if op < warm + steady:
            s = fwd_stage(op)
            out.append(Action(s, F, f_mb[s]))
            f_mb[s] += 1
        if op >= warm:
            s = bwd_stage(op)
            out.append(Action(s, bop, b_mb[s]))
            b_mb[s] += 1
            bwd_ops.append(op)
            if zb and op - warm >= w_delay:
                add_w()
    while zb and w_count < len(bwd_ops):
        add_w()
    return out


def _zbv(p: int, m: int, r: int) -> list[Action]:
    """Port of ``ScheduleZBVZeroBubble._calculate_single_rank_operations``."""
    n_micro = max(2 * p - 1, m)
    s0, s1 = r, 2 * p - 1 - r
    out: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - r) - 1):
        out.append(Action(s0, F, f0))
        f0 += 1
    for _ in range(r):
        out.append(Action(s1, F, f1))
        f1 += 1
        out.append(Action(s0, F, f0))
        f0 += 1
    for _ in range(p - r):
        out.append(Action(s1, F, f1))
        f1 += 1
        out.append(Action(s1, I, b1))
        out.append(Action(s1, W, b1))
        b1 += 1
    while f1 < f0 or f0 < n_micro:
        if f0 < n_micro:
            out.append(Action(s0, F, f0))
            f0 += 1
        out.append(Action(s0, I, b0))
        out.append(Action(s0, W, b0))
        b0 += 1
        out.append(Action(s1, F, f1))
        f1 += 1
        out.append(Action(s1, I, b1))
        out.append(Action(s1, W, b1))
        b1 += 1
    w0, w1 = b0, b1
    for _ in range(r):
        out.append(Action(s0, I, b0))
        b0 += 1
        out.append(Action(s1, I, b1))
        b1 += 1
    for _ in range(p - r):
        out.append(Action(s0, I, b0))
        b0 += 1
        out.append(Action(s0, W, w0))
        w0 += 1
    while w1 < b1:
        out.append(Action(s1, W, w1))
        w1 += 1
    while w0 < b0:
        out.append(Action(s0, W, w0))
        w0 += 1
    # torch pads short runs up to 2P-1 micro-batches and then drops the extra ones
    return [a for a in out if a.mb < m]


def _dualpipev(p: int, m: int, r: int) -> list[Action]:
    """Port of ``ScheduleDualPipeV._calculate_single_rank_operations`` (F&B pairs run F then B)."""
    s0, s1 = r, 2 * p - 1 - r
    counters: dict[tuple[int, int], int] = defaultdict(int)
    wq: list[tuple[int, int]] = []
    out: list[Action] = []

    def add(stage: int, op: int) -> None:
        key = (stage, I) if op in (B, I) else (stage, op)
        mb = counters[key]
        out.append(Action(stage, op, mb))
        counters[key] = mb + 1
        if op == I:
            wq.append((stage, mb))

    def add_w() -> None:
        if wq:
            stage, mb = wq.pop(0)
            out.append(Action(stage, W, mb))

    def overlap(f_stage: int, b_stage: int) -> None:
        add(f_stage, F)
        add(b_stage, B)

    for _ in range((p - r - 1) * 2):
        add(s0, F)
    for _ in range(r + 1):
        add(s0, F)
        add(s1, F)
    for _ in range(p - r - 1):
        add(s1, I)
        add_w()
        add(s1, F)
    for i in range(m - 2 * p + r + 1):
        if i == 0 and r == p - 1:
            add(s0, F)
            add(s1, B)
        else:
            overlap(s0, s1)
        overlap(s1, s0)
    for _ in range(p - r - 1):
        add(s1, B)
        overlap(s1, s0)
    zb = False
    step6 = r + 1
    for i in range(step6):
        if i == step6 // 2 and r % 2 == 1:
            zb = True
        add(s1, I if zb else B)
        if i == step6 // 2 and r % 2 == 0:
            zb = True
        add(s0, I if zb else B)
    for _ in range(p - r - 1):
        add_w()
        add(s0, I if zb else B)
    for _ in range(r + 1):
        add_w()
    while wq:
        add_w()
    return out
