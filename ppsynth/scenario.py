"""Synthetic pipeline runs with injected faults and their ground truth per cause.

:func:`make_scenario` simulates every step of a pipeline-parallel job (:mod:`ppdiag.simulate`),
turns the simulated blocks into what a Megatron-style GPU rank records — a blocking NCCL receive
before every block that needs a neighbour's data, several compute kernels per block launched ahead
by the host, the send after the block, an optimizer phase and a pipeline-wide gradient-norm
all-reduce at the end of every step — and returns a format-neutral :class:`SynthRun`.

Ground truth (the product's definitions, docs/json.md "Time accounting"). For rank ``r`` and one
step window ``W`` (``ProfilerStep#N``, identical on all ranks on the true clock):

* ``lost_r = W - compute_r``, where ``compute_r`` is the union of the rank's compute blocks (each
  F/B/W block and the optimizer, from its first kernel's start to its last kernel's end). The
  few-µs gaps between the kernels *inside* a block are reported separately as ``kernel_gaps``;
  ``lost_r`` measured on kernels alone is ``lost_r + kernel_gaps``.
* ``bubble_r = min(idle_r(S0), idle_r(S1))`` where ``S0`` simulates every stage at the mean stage
  costs with no faults, normal p2p links (``p2p_ms``) and nothing else, and ``S1`` the measured
  (faulted) stage costs with the same normal links: the schedule's warm-up / cool-down waits,
  including the normal latency of the transfers that fill and drain the pipe.
* ``imbalance_r = idle_r(S1) - bubble_r``.
* Every further ingredient is added one at a time, in the order of docs/json.md "Time accounting",
  and its cause gets the growth of ``lost_r``: slow links → ``comm_wait``; the host model (launch latency,
  per-block issue time, limited run-ahead, the host waiting for the gradient norm before the
  optimizer and for the step end), host stalls and slow steps → ``host``; the step-end all-reduce
  transfer, p2p on the compute stream and an exposed data-parallel all-reduce → ``exposed_comm``.
  For a single non-compute fault this is exactly "lost time in the full simulation minus lost
  time in the simulation without that fault"; with several, interactions go to the one added
  later. Waits propagate: a neighbour that waits because rank ``R`` was late gets ``R``'s root
  cause, because the difference is taken on every rank.

The five causes add up to ``lost_r`` exactly (a telescoping sum of simulations; simulated times
are integers in ns). ``groundtruth.json`` (:func:`groundtruth_json`) records the config, stage
map, schedule, M, faults, clock skews, the step times and the per-rank truth in ms per step.

Model details a reader of the traces may want:

* the host issues block ``i`` at the simulator's ``issue`` time and needs
  ``launch_latency_us`` before the GPU can start it; it runs at most ``host_lookahead`` blocks
  ahead of the GPU.
* a receive is a ``c10d::recv_`` → ``record_param_comms`` → ``nccl:recv a<-b`` → ``cuLaunchKernelEx``
  chain; its ``ncclDevKernel_SendRecv`` kernel runs on an NCCL stream of that peer, starts when the
  host posted it, spins until the peer's data arrives and ends when the transfer ends; the compute
  stream waits for it (``cudaStreamWaitEvent``).
* a send starts when its block ends and ends when the receiver has the data (NCCL send and receive
  finish together). Each remote stage boundary has its own NCCL stream per direction (PyTorch keeps
  one per peer pair; separating the directions keeps a send from queueing in front of the next
  receive, which real jobs avoid by batching the two into one grouped call).
* backward kernels are launched from the autograd thread (``tid = pid + 2``), everything else from
  the main thread (``tid = pid``).
* replicas carry the same faults except :class:`~ppsynth.faults.LateReplica` (one replica
  starts every step late; the others wait for it in the data-parallel all-reduce: ``host``) and
  :class:`~ppsynth.faults.SlowWorker` (one rank computes slower than its stage in the other
  replicas: its replica is simulated on its own, the replicas meet in the data-parallel
  all-reduce, and the truth is taken on the coupled idles: see
  :func:`ppsynth.scenario_truth.coupled_truth`);
* with ``dp > 1`` the global rank of pipeline rank ``p`` in replica ``d`` is ``p * dp + d``
  (Megatron's default order, tp = 1); the gradient all-reduce of each replica group runs under the
  last backward block (overlapped) unless :class:`~ppsynth.faults.ExposedAllReduce` is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ppdiag.model.timeline import NameTable
from ppdiag.simulate.schedules import canonical_schedule, default_virtual, stage_to_rank
from ppsynth.builder import RankBuilder
from ppsynth.faults import Fault, LateReplica, SlowStage, SlowWorker
from ppsynth.run import GpuOps, HostRanges, StreamInfo, StreamRole, SynthRank, SynthRun
from ppsynth.scenario_emit import RankSlot, SeqState, StepSpan, emit_step
from ppsynth.scenario_params import (
    EPOCH_NS,
    MS,
    STREAM_COMPUTE,
    STREAM_DP,
    STREAM_P2P0,
    STREAM_PP_COLL,
    TRUTH_CAUSES,
    ScenarioParams,
    Topo,
    ns,
    topology,
    validate,
)
from ppsynth.scenario_truth import (
    GROUNDTRUTH_SCHEMA,
    Ladder,
    coupled_tails,
    groundtruth,
    groundtruth_json,
    ladder,
    write_groundtruth,
)

__all__ = [
    "GROUNDTRUTH_SCHEMA",
    "TRUTH_CAUSES",
    "ScenarioParams",
    "build",
    "groundtruth_json",
    "make_scenario",
    "write_groundtruth",
]

# per step, the tail coupled across replicas: (all-reduce end per pipeline rank, sync end, optimizer
# start, optimizer end per pipeline rank, step time), see coupled_tails
_Tails = list[tuple[list[int], int, int, list[int], int]]


@dataclass(frozen=True)
class _Timing:
    """Where the steps lie on the true clock and what moves them: ``starts[k]`` is step ``k``'s start
    (``starts[k + 1]`` its end); a late replica ``late_rep`` starts every step ``late_ns`` late."""

    starts: list[int]
    tails: _Tails | None
    late_ns: int
    late_rep: int


def make_scenario(
    schedule: str = "1f1b",
    pp: int = 4,
    microbatches: int = 8,
    fwd_ms: float | Sequence[float] = 1.0,
    bwd_ms: float | Sequence[float] = 2.0,
    faults: Sequence[Fault] = (),
    steps: int = 3,
    clock_skew_ms: float = 5.0,
    seed: int = 0,
    **kwargs: Any,
) -> SynthRun:
    """Simulate a pipeline job with ``faults`` and describe what its profiler would record.

    Extra keyword arguments are :class:`ScenarioParams` fields (``virtual``, ``dp``,
    ``wgrad_ms``, ``p2p_ms``, ``annotations``, ...). Raises ValueError for impossible setups.
    """
    prm = ScenarioParams(
        schedule=canonical_schedule(schedule),
        pp=pp,
        microbatches=microbatches,
        fwd_ms=fwd_ms,
        bwd_ms=bwd_ms,
        faults=tuple(faults),
        steps=steps,
        clock_skew_ms=clock_skew_ms,
        seed=seed,
        **kwargs,
    )
    return build(prm)


def build(prm: ScenarioParams) -> SynthRun:
    """Build the :class:`SynthRun` (traces + truth) of ``prm``."""
    validate(prm)
    sched = canonical_schedule(prm.schedule)
    v = default_virtual(sched, prm.virtual)
    s2r = stage_to_rank(sched, prm.pp, v)
    topo = topology(prm.pp, prm.dp, s2r)
    rng = np.random.default_rng(prm.seed)
    world = prm.pp * prm.dp
    skew_max = ns(prm.clock_skew_ms)
    skews = [int(rng.integers(-skew_max, skew_max + 1)) if skew_max > 0 else 0 for _ in range(world)]
    # the ranks of one host (node{g // gpus_per_node}) read one clock: its first rank's
    gpn = max(prm.gpus_per_node, 1)
    skews = [skews[g - g % gpn] for g in range(world)]
    ladders = [ladder(prm, k) for k in range(prm.steps)]
    by_rep, tails = _replicas(prm, s2r, ladders)
    timing = _step_timing(prm, ladders, tails)
    names = NameTable()
    ranks = [
        _build_rank(prm, topo, names, p, d, by_rep[d], timing, skews[topo.glob(p, d)], rng)
        for p in range(prm.pp)
        for d in range(prm.dp)
    ]
    ranks.sort(key=lambda r: r.rank)
    run = SynthRun(
        names=names.names,
        ranks=ranks,
        epoch_ns=EPOCH_NS + 1_000 * (prm.seed % 1_000_000),
        schedule=sched,
        pp=prm.pp,
        dp=prm.dp,
        virtual=v,
        microbatches=prm.microbatches,
        stage_to_rank=s2r,
        steps=prm.steps,
        config=prm.to_json(),
    )
    run.truth = groundtruth(prm, run, ladders, timing.starts, topo, by_rep)
    return run


def _replicas(
    prm: ScenarioParams, s2r: list[int], ladders: list[Ladder]
) -> tuple[dict[int, list[Ladder]], _Tails | None]:
    """The ladders of every replica, and the coupled step tails when replicas differ.

    A slow worker: its replica is simulated with its stages slower; the replicas then meet in the
    data-parallel all-reduce of every pipeline rank (see :func:`coupled_tails`)."""
    by_rep = {d: ladders for d in range(prm.dp)}
    for f in prm.faults:
        if isinstance(f, SlowWorker):
            slow = [SlowStage(st, f.factor) for st in range(len(s2r)) if s2r[st] == f.pp_rank]
            prm_d = replace(prm, faults=tuple(prm.faults) + tuple(slow))
            by_rep[f.dp_rank] = [ladder(prm_d, k) for k in range(prm.steps)]
    tails = coupled_tails(prm, by_rep) if any(by_rep[d] is not ladders for d in by_rep) else None
    return by_rep, tails


def _step_timing(prm: ScenarioParams, ladders: list[Ladder], tails: _Tails | None) -> _Timing:
    """Step starts on the true clock; a late replica delays every step of the whole job by its
    lateness (the others wait for it)."""
    late_ns = sum(ns(f.delay_ms) for f in prm.faults if isinstance(f, LateReplica))
    late_rep = next((f.dp_rank for f in prm.faults if isinstance(f, LateReplica)), -1)
    starts = [2 * MS]
    for k, lad in enumerate(ladders):
        step_ns = round(lad.full.step_ns) if tails is None else tails[k][4]
        starts.append(starts[-1] + step_ns + late_ns)
    return _Timing(starts, tails, late_ns, late_rep)


def _boundaries(p: int, s2r: list[int]) -> list[tuple[int, int]]:
    """The remote stage boundaries of pipeline rank ``p``: (boundary, the other pipeline rank)."""
    return [
        (bd, s2r[bd + 1] if s2r[bd] == p else s2r[bd])
        for bd in range(len(s2r) - 1)
        if p in (s2r[bd], s2r[bd + 1]) and s2r[bd] != s2r[bd + 1]
    ]


def _build_rank(
    prm: ScenarioParams,
    topo: Topo,
    names: NameTable,
    p: int,
    d: int,
    lads: list[Ladder],
    timing: _Timing,
    skew: int,
    rng: np.random.Generator,
) -> SynthRank:
    """Emit every step of pipeline rank ``p`` in replica ``d`` and describe the rank."""
    g = topo.glob(p, d)
    pid = 3000 + 131 * g
    b = RankBuilder(names, pid)
    # one NCCL stream per remote stage boundary and direction, so that a transfer never queues
    # behind another boundary's (the simulator serialises transfers per boundary and direction)
    bnds = _boundaries(p, topo.s2r)
    recv_stream = {bd: STREAM_P2P0 + 4 * i for i, (bd, _) in enumerate(bnds)}
    send_stream = {bd: STREAM_P2P0 + 2 + 4 * i for i, (bd, _) in enumerate(bnds)}
    slot = RankSlot(b, p, d, recv_stream, send_stream, SeqState())
    starts, tails = timing.starts, timing.tails
    for k, lad in enumerate(lads):
        late = timing.late_ns if d == timing.late_rep else 0
        emit_step(
            slot,
            prm,
            topo,
            lad.full,
            StepSpan(k, starts[k], starts[k + 1]),
            rng,
            late_ns=late,
            push_ns=timing.late_ns - late,
            tail=None if tails is None else (tails[k][0][p], *tails[k][1:3], tails[k][3][p]),
        )
    gpu, rt, host = b.tables()
    streams = [StreamInfo(STREAM_COMPUTE, StreamRole.COMPUTE)]
    for bd, q in bnds:
        for sid in (recv_stream[bd], send_stream[bd]):
            streams.append(StreamInfo(sid, StreamRole.P2P, peer=topo.glob(q, d), group=topo.pp_group_of[g]))
    streams.append(StreamInfo(STREAM_PP_COLL, StreamRole.COLLECTIVE, group=topo.pp_group_of[g]))
    if prm.dp > 1:
        streams.append(StreamInfo(STREAM_DP, StreamRole.COLLECTIVE, group=topo.dp_group_of[g]))
    my_groups, remap = _local_groups(prm, topo, g, gpu, host, streams)
    return SynthRank(
        rank=g,
        world_size=prm.pp * prm.dp,
        pp_rank=p,
        dp_rank=d,
        stages=[s for s in range(len(topo.s2r)) if topo.s2r[s] == p],
        process_groups=[topo.groups[i] for i in my_groups],
        pp_group=remap[topo.pp_group_of[g]],
        dp_group=remap[topo.dp_group_of[g]] if prm.dp > 1 else -1,
        device_index=g % prm.gpus_per_node,
        device_name=prm.device_name,
        host_name=f"node{g // prm.gpus_per_node:02d}",
        pid=pid,
        tid=pid,
        clock_skew_ns=skew,
        streams=streams,
        gpu=gpu,
        runtime=rt,
        host=host,
        step_windows=np.array([[starts[k], starts[k + 1]] for k in range(prm.steps)], dtype=np.int64),
        step_numbers=[prm.first_step + k for k in range(prm.steps)],
    )


def _local_groups(
    prm: ScenarioParams, topo: Topo, g: int, gpu: GpuOps, host: HostRanges, streams: list[StreamInfo]
) -> tuple[list[int], dict[int, int]]:
    """The job's groups rank ``g`` belongs to, in order; the rank's rows and streams are renumbered
    in place from job-wide to rank-local group indices (as the rank's trace numbers them)."""
    my_groups = [0, topo.pp_group_of[g]] + ([topo.dp_group_of[g]] if prm.dp > 1 else [])
    my_groups.sort()
    remap = {gi: i for i, gi in enumerate(my_groups)}
    lut = np.full(len(topo.groups) + 1, -1, dtype=np.int32)
    for gi, li in remap.items():
        lut[gi] = li
    gpu.group = lut[gpu.group]  # -1 indexes the trailing -1
    host.group = lut[host.group]
    for s in streams:
        s.group = remap.get(s.group, -1) if s.group >= 0 else -1
    return my_groups, remap
