"""Synthetic pipeline runs with injected faults and their ground truth per cause.

:func:`make_scenario` simulates every step of a pipeline-parallel job (:mod:`ppdiag.simulate`),
turns the simulated blocks into what a Megatron-style GPU rank records — a blocking NCCL receive
before every block that needs a neighbour's data, several compute kernels per block launched ahead
by the host, the send after the block, an optimizer phase and a pipeline-wide gradient-norm
all-reduce at the end of every step — and returns a format-neutral :class:`SynthRun`.

Ground truth (the product's definitions, DESIGN.md §5). For rank ``r`` and one step window ``W``
(``ProfilerStep#N``, identical on all ranks on the true clock):

* ``lost_r = W - compute_r``, where ``compute_r`` is the union of the rank's compute blocks (each
  F/B/W block and the optimizer, from its first kernel's start to its last kernel's end). The
  few-µs gaps between the kernels *inside* a block are reported separately as ``kernel_gaps``;
  ``lost_r`` measured on kernels alone is ``lost_r + kernel_gaps``.
* ``bubble_r = min(idle_r(S0), idle_r(S1))`` where ``S0`` simulates every stage at the mean stage
  costs with no faults, normal p2p links (``p2p_ms``) and nothing else, and ``S1`` the measured
  (faulted) stage costs with the same normal links: the schedule's warm-up / cool-down waits,
  including the normal latency of the transfers that fill and drain the pipe.
* ``imbalance_r = idle_r(S1) - bubble_r``.
* Every further ingredient is added one at a time, in the order of DESIGN.md §5, and its cause
  gets the growth of ``lost_r``: slow links → ``comm_wait``; the host model (launch latency,
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
* replicas carry the same faults except :class:`~ppdiag.synth.faults.LateReplica` (one replica
  starts every step late; the others wait for it in the data-parallel all-reduce: ``host``) and
  :class:`~ppdiag.synth.faults.SlowWorker` (one rank computes slower than its stage in the other
  replicas: its replica is simulated on its own, the replicas meet in the data-parallel
  all-reduce, and the truth is taken on the coupled idles: see :func:`_coupled_truth`);
* with ``dp > 1`` the global rank of pipeline rank ``p`` in replica ``d`` is ``p * dp + d``
  (Megatron's default order, tp = 1); the gradient all-reduce of each replica group runs under the
  last backward block (overlapped) unless :class:`~ppdiag.synth.faults.ExposedAllReduce` is set.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ppdiag.model.timeline import Direction, Kind, NameTable, Phase, ProcessGroup
from ppdiag.simulate import SimConfig, SimResult, closed_form_bubble, simulate
from ppdiag.simulate.schedules import canonical_schedule, default_virtual, stage_to_rank
from ppdiag.synth.faults import (
    CommOnCompute,
    ExposedAllReduce,
    Fault,
    HostStall,
    LateReplica,
    SlowLink,
    SlowStage,
    SlowStep,
    SlowWorker,
    fault_json,
)
from ppdiag.synth.run import (
    ApiKind,
    GpuOps,
    HostCat,
    HostRanges,
    RuntimeCalls,
    StreamInfo,
    StreamRole,
    SynthRank,
    SynthRun,
)

TRUTH_CAUSES: tuple[str, ...] = ("bubble", "imbalance", "comm_wait", "exposed_comm", "host")
GROUNDTRUTH_SCHEMA = "ppdiag-synth-groundtruth/1"

US = 1_000
MS = 1_000_000
_EPOCH_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z

_STREAM_COMPUTE = 7
_STREAM_DP = 13
_STREAM_PP_COLL = 15
_STREAM_P2P0 = 17

_FWD_KERNELS: tuple[tuple[str, str], ...] = (
    (
        "aten::native_layer_norm",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
        "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
        "c10::BFloat16*)",
    ),
    ("aten::mm", "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"),
    (
        "aten::_flash_attention_forward",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, "
        "false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
    ),
    ("aten::mm", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NNT"),
    (
        "aten::gelu",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
        "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
        "operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, "
        "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
        "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, "
        "std::array<char*, 2ul>)",
    ),
    (
        "aten::add",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
    ),
)
_BWD_KERNELS: tuple[tuple[str, str], ...] = (
    ("MmBackward0", "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN"),
    (
        "GeluBackward0",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl("
        "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
        "operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, std::array<char*, 3ul> >(int, "
        "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
        "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, "
        "std::array<char*, 3ul>)",
    ),
    (
        "ScaledDotProductFlashAttentionBackward0",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, "
        "8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, "
        "cutlass::bfloat16_t> >, false, false, false, false, false, false, false, false>("
        "pytorch_flash::Flash_bwd_params)",
    ),
    ("MmBackward0", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NTN"),
    (
        "NativeLayerNormBackward0",
        "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>"
        "(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
        "c10::BFloat16*, int)",
    ),
    (
        "AddBackward0",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
    ),
)
_WGRAD_KERNELS: tuple[tuple[str, str], ...] = (
    ("MmBackward0", "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_TNT"),
    ("MmBackward0", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT"),
    (
        "SumBackward1",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<c10::BFloat16, float, float>::operator()(at::TensorIterator&)::{lambda(float, "
        "float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<c10::BFloat16, float, float>::operator()(at::TensorIterator&)::{lambda(float, "
        "float)#1}>, unsigned int, float, 4, 4>)",
    ),
)
_OPTIM_KERNELS: tuple[tuple[str, str], ...] = (
    (
        "aten::_foreach_mul_",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, "
        "std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
        "at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, "
        "float)",
    ),
    (
        "aten::_fused_adamw_",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float const*, "
        "float const*>(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::"
        "(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, "
        "double, double, double, double, double, bool, float const*, float const*)",
    ),
)
_AUTOGRAD_ATEN = {
    "MmBackward0": "aten::mm",
    "GeluBackward0": "aten::gelu_backward",
    "ScaledDotProductFlashAttentionBackward0": "aten::_scaled_dot_product_flash_attention_backward",
    "NativeLayerNormBackward0": "aten::native_layer_norm_backward",
    "AddBackward0": "aten::add_",
    "SumBackward1": "aten::sum",
}
_SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
_ALLREDUCE_BF16 = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
_ALLREDUCE_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@dataclass
class ScenarioParams:
    """Every knob of a synthetic run (times in ms unless the name says µs)."""

    schedule: str = "1f1b"
    pp: int = 4
    microbatches: int = 8
    virtual: int = 1
    dp: int = 1
    fwd_ms: float | Sequence[float] = 1.0
    bwd_ms: float | Sequence[float] = 2.0
    wgrad_ms: float | Sequence[float] = 0.0
    p2p_ms: float = 0.05
    optimizer_ms: float = 1.0
    sync_ms: float = 0.03
    faults: tuple[Fault, ...] = ()
    steps: int = 3
    first_step: int = 5
    clock_skew_ms: float = 5.0
    seed: int = 0
    annotations: str | None = None  # None | "pp" (PP:<stage><op><mb>) | "forward" (Forward <mb>)
    kernels_per_block: tuple[int, int] = (3, 6)
    kernel_gap_us: float = 2.0
    launch_latency_us: float = 30.0
    host_issue_us: float = 80.0
    host_lookahead: int | None = 2
    end_latency_us: float = 20.0
    activation_nelems: int = 8_388_608
    grad_nelems: int = 25_165_824
    device_name: str = "NVIDIA H100 80GB HBM3"
    gpus_per_node: int = 8

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = [fault_json(f) for f in self.faults]
        for k in ("fwd_ms", "bwd_ms", "wgrad_ms"):
            v = d[k]
            d[k] = list(v) if isinstance(v, (list, tuple)) else v
        d["kernels_per_block"] = list(self.kernels_per_block)
        return d


def _ns(ms: float) -> int:
    return round(ms * MS)


def _per_stage(val: float | Sequence[float], n: int, what: str) -> list[int]:
    if isinstance(val, (int, float)):
        return [_ns(float(val))] * n
    vals = [_ns(float(x)) for x in val]
    if len(vals) != n:
        raise ValueError(f"{what}: expected 1 or {n} values (one per virtual stage), got {len(vals)}")
    return vals


@dataclass
class _Ladder:
    """The simulations of one step whose differences give the truth."""

    s0: SimResult
    s1: SimResult
    steps: list[tuple[str, SimResult]] = field(default_factory=list)

    @property
    def full(self) -> SimResult:
        return self.steps[-1][1] if self.steps else self.s1


def _validate(prm: ScenarioParams) -> None:
    if prm.pp < 2:
        raise ValueError("a pipeline scenario needs pp >= 2")
    if prm.dp < 1 or prm.steps < 1 or prm.microbatches < 1:
        raise ValueError("dp, steps and microbatches must be >= 1")
    if prm.annotations not in (None, "pp", "forward"):
        raise ValueError(f"annotations must be None, 'pp' or 'forward', got {prm.annotations!r}")
    lo, hi = prm.kernels_per_block
    if not 1 <= lo <= hi <= 6:
        raise ValueError("kernels_per_block must satisfy 1 <= lo <= hi <= 6")
    n_st = prm.pp * default_virtual(prm.schedule, prm.virtual)
    for f in prm.faults:
        if isinstance(f, SlowStage) and not 0 <= f.stage < n_st:
            raise ValueError(f"SlowStage: stage {f.stage} outside 0..{n_st - 1}")
        if isinstance(f, (SlowLink, HostStall)) and not 0 <= f.rank < prm.pp:
            raise ValueError(f"{type(f).__name__}: pipeline rank {f.rank} outside 0..{prm.pp - 1}")
        if isinstance(f, ExposedAllReduce) and prm.dp < 2:
            raise ValueError("ExposedAllReduce needs data parallelism (dp >= 2)")
        if isinstance(f, SlowStep) and not 0 <= f.step < prm.steps:
            raise ValueError(f"SlowStep: step {f.step} outside 0..{prm.steps - 1}")
        if isinstance(f, SlowStep) and f.rank is not None and not 0 <= f.rank < prm.pp:
            raise ValueError(f"SlowStep: pipeline rank {f.rank} outside 0..{prm.pp - 1}")
        if isinstance(f, LateReplica) and (
            prm.dp < 2
            or not 0 <= f.dp_rank < prm.dp
            or f.delay_ms < 0
            or not any(isinstance(x, ExposedAllReduce) for x in prm.faults)
        ):
            raise ValueError("LateReplica needs dp >= 2, a replica in 0..dp-1, delay >= 0, ExposedAllReduce")
        if isinstance(f, SlowWorker) and (
            prm.dp < 2
            or not 0 <= f.dp_rank < prm.dp
            or not 0 <= f.pp_rank < prm.pp
            or f.factor <= 0
            or not any(isinstance(x, ExposedAllReduce) for x in prm.faults)
            or any(isinstance(x, LateReplica) for x in prm.faults)
        ):
            raise ValueError("SlowWorker needs dp >= 2, factor > 0, ExposedAllReduce (no LateReplica)")
        if isinstance(f, CommOnCompute) and f.ranks is not None and any(not 0 <= r < prm.pp for r in f.ranks):
            raise ValueError(f"CommOnCompute: ranks must be within 0..{prm.pp - 1}")


def _ladder(prm: ScenarioParams, step: int) -> _Ladder:
    """S0, S1 and the cumulative simulations of one step, each tagged with its cause."""
    sched = canonical_schedule(prm.schedule)
    v = default_virtual(sched, prm.virtual)
    n_st = prm.pp * v
    fwd = _per_stage(prm.fwd_ms, n_st, "fwd_ms")
    bwd = _per_stage(prm.bwd_ms, n_st, "bwd_ms")
    wgr = _per_stage(prm.wgrad_ms, n_st, "wgrad_ms")
    for f in prm.faults:
        if isinstance(f, SlowStage):
            fwd[f.stage] = round(fwd[f.stage] * f.factor)
            bwd[f.stage] = round(bwd[f.stage] * f.factor)
            wgr[f.stage] = round(wgr[f.stage] * f.factor)
    opt = _ns(prm.optimizer_ms)
    pure = SimConfig(sched, prm.pp, prm.microbatches, v, fwd_ns=fwd, bwd_ns=bwd, wgrad_ns=wgr, optim_ns=opt)

    def mean(xs: list[int]) -> list[int]:
        return [round(sum(xs) / len(xs))] * len(xs)

    # the schedule with normal links: the normal p2p transfer time that fills and drains the pipe
    # is part of the bubble (DESIGN.md §5)
    p2p = _ns(prm.p2p_ms)
    pure = pure.replace(p2p_ns=p2p)
    s0 = simulate(pure.replace(fwd_ns=mean(fwd), bwd_ns=mean(bwd), wgrad_ns=mean(wgr)))
    s1 = simulate(pure)
    lad = _Ladder(s0, s1)
    # then, in the order of DESIGN.md §5: slow links, host, exposed communication
    link = [0] * prm.pp
    for f in prm.faults:
        if isinstance(f, SlowLink):
            link[f.rank] += _ns(f.delay_ms) + round(p2p * (f.factor - 1.0))
    cfg = pure
    if any(link):
        cfg = cfg.replace(link_delay_ns=list(link))
        lad.steps.append(("comm_wait", simulate(cfg)))
    cfg = cfg.replace(
        launch_latency_ns=round(prm.launch_latency_us * US),
        host_issue_ns=round(prm.host_issue_us * US),
        host_lookahead=prm.host_lookahead,
        end_latency_ns=round(prm.end_latency_us * US),
        sync_ns=0,
    )
    lad.steps.append(("host", simulate(cfg)))
    stall = [0] * prm.pp
    for f in prm.faults:
        if isinstance(f, HostStall):
            stall[f.rank] = max(stall[f.rank], _ns(f.delay_ms))
    if any(stall):
        cfg = cfg.replace(host_stall_ns=list(stall))
        lad.steps.append(("host", simulate(cfg)))
    sdelay = [0] * prm.pp
    for f in prm.faults:
        if isinstance(f, SlowStep) and f.step == step:
            for r in range(prm.pp) if f.rank is None else [f.rank]:
                sdelay[r] += _ns(f.delay_ms)
    if any(sdelay):
        cfg = cfg.replace(start_delay_ns=list(sdelay))
        lad.steps.append(("host", simulate(cfg)))
    cfg = cfg.replace(sync_ns=_ns(prm.sync_ms))
    lad.steps.append(("exposed_comm", simulate(cfg)))
    on_comp = [False] * prm.pp
    for f in prm.faults:
        if isinstance(f, CommOnCompute):
            for r in f.ranks if f.ranks is not None else range(prm.pp):
                on_comp[r] = True
    if any(on_comp):
        cfg = cfg.replace(comm_on_compute=list(on_comp))
        lad.steps.append(("exposed_comm", simulate(cfg)))
    tail = 0
    for f in prm.faults:
        if isinstance(f, ExposedAllReduce):
            tail += _ns(f.ms)
    if tail:
        cfg = cfg.replace(tail_comm_ns=tail)
        lad.steps.append(("exposed_comm", simulate(cfg)))
    return lad


def _coupled_tails(
    prm: ScenarioParams, by_rep: dict[int, list[_Ladder]]
) -> list[tuple[list[int], int, int, list[int], int]]:
    """Per step, the tail of replicas that meet in the data-parallel all-reduce of each pipeline
    rank: (all-reduce end per pipeline rank, sync end, optimizer start, optimizer end per pipeline
    rank, step time), in ns from the step start. The all-reduce of pipeline rank ``p`` ends when
    its last replica arrives plus the transfer; the gradient-norm sync, the optimizer and the step
    end follow as in the simulator (:func:`ppdiag.simulate.simulate`)."""
    out = []
    for k in range(prm.steps):
        res = [by_rep[d][k].full for d in range(prm.dp)]
        r0 = res[0]
        xfer = r0.tail_end_ns - r0.last_end_ns
        ar_end = np.max([r.last_end_ns for r in res], axis=0) + xfer
        sync_end = float(ar_end.max()) + float(r0.sync_end_ns[0] - r0.tail_end_ns.max())
        opt_start = sync_end + float(r0.optim_start_ns[0] - r0.sync_end_ns[0])
        opt_end = opt_start + np.max([r.optim_end_ns - r.optim_start_ns for r in res], axis=0)
        step = float(opt_end.max()) + float(r0.step_ns - r0.optim_end_ns.max())
        ends = [round(x) for x in ar_end]
        out.append((ends, round(sync_end), round(opt_start), [round(x) for x in opt_end], round(step)))
    return out


def _coupled_truth(by_rep: dict[int, list[_Ladder]], steps: int) -> dict[int, list[dict[str, np.ndarray]]]:
    """Truth per replica and step when replicas differ (a slow worker) and meet in the
    data-parallel all-reduce: every replica's step lasts as long as the slowest replica's, so a
    rank's idle in each simulation of the ladder is its own idle plus the time its replica waits
    for the slowest one. The differences are taken on these coupled idles, as in :func:`_truth_of`;
    the balanced simulation spreads the work of every replica evenly (one mean over all of them).
    """
    reps = sorted(by_rep)
    out: dict[int, list[dict[str, np.ndarray]]] = {d: [] for d in reps}
    for k in range(steps):
        lads = {d: by_rep[d][k] for d in reps}

        def coupled(res: dict[int, SimResult]) -> dict[int, np.ndarray]:
            top = max(r.step_ns for r in res.values())
            return {d: r.per_rank_idle_ns + (top - r.step_ns) for d, r in res.items()}

        cfgs = [lads[d].s1.config for d in reps]
        mean = {
            name: [round(float(v.mean()))] * v.shape[1]
            for name in ("fwd_ns", "bwd_ns", "wgrad_ns")
            for v in [np.array([getattr(c, name) for c in cfgs], dtype=np.float64)]
        }
        s0 = simulate(cfgs[0].replace(**mean))
        i0 = {d: s0.per_rank_idle_ns for d in reps}  # the same balanced pipeline everywhere
        i1 = coupled({d: lads[d].s1 for d in reps})
        causes = {d: {c: np.zeros_like(i1[d]) for c in TRUTH_CAUSES} for d in reps}
        prev = i1
        for d in reps:
            causes[d]["bubble"] = np.minimum(i0[d], i1[d])
            causes[d]["imbalance"] = i1[d] - causes[d]["bubble"]
        for j, (cause, _) in enumerate(lads[reps[0]].steps):
            cur = coupled({d: lads[d].steps[j][1] for d in reps})
            for d in reps:
                causes[d][cause] = causes[d][cause] + (cur[d] - prev[d])
            prev = cur
        for d in reps:
            out[d].append(causes[d])
    return out


def _truth_of(lad: _Ladder) -> dict[str, np.ndarray]:
    """Per pipeline rank, ns of each cause in one step (they add up to the full sim's idle)."""
    i0, i1 = lad.s0.per_rank_idle_ns, lad.s1.per_rank_idle_ns
    out = {c: np.zeros_like(i1) for c in TRUTH_CAUSES}
    out["bubble"] = np.minimum(i0, i1)
    out["imbalance"] = i1 - out["bubble"]
    prev = i1
    for cause, res in lad.steps:
        cur = res.per_rank_idle_ns
        out[cause] = out[cause] + (cur - prev)
        prev = cur
    return out


class _RankBuilder:
    """Accumulates one rank's tables column by column (no per-event objects)."""

    def __init__(self, names: NameTable, pid: int) -> None:
        self.names = names
        self.pid = pid
        self.g: dict[str, list[int]] = {c: [] for c in GpuOps.COLUMNS}
        self.rt: dict[str, list[int]] = {c: [] for c in RuntimeCalls.COLUMNS}
        self.h: dict[str, list[int]] = {c: [] for c in HostRanges.COLUMNS}
        self.corr = 1000 + (pid % 97) * 10
        self.ext = 1
        self.stream_end: dict[int, int] = {}

    def host(self, start: int, end: int, name: str, cat: HostCat, tid: int, **kw: int) -> int:
        ext = self.ext
        self.ext += 1
        row = dict(HostRanges.DEFAULTS)
        row.update(start=start, end=end, name=self.names.id(name), cat=int(cat), tid=tid, ext_id=ext)
        row.update(kw)
        for c in HostRanges.COLUMNS:
            self.h[c].append(int(row[c]))
        return ext

    def api(self, start: int, end: int, name: str, tid: int, ext: int, driver: bool = False) -> int:
        self.corr += 1
        row = {
            "start": start,
            "end": end,
            "name": self.names.id(name),
            "correlation": self.corr,
            "ext_id": ext,
            "tid": tid,
            "api": int(ApiKind.DRIVER if driver else ApiKind.RUNTIME),
        }
        for c in RuntimeCalls.COLUMNS:
            self.rt[c].append(int(row[c]))
        return self.corr

    def kernel(
        self,
        start: int,
        end: int,
        stream: int,
        kind: Kind,
        name: str,
        corr: int,
        launch: int,
        ext: int,
        **kw: int,
    ) -> None:
        if launch > start:
            raise AssertionError(f"kernel {name[:40]} starts at {start} before its launch at {launch}")
        if end < start:
            raise AssertionError(f"kernel {name[:40]} ends before it starts ({start} > {end})")
        row = dict(GpuOps.DEFAULTS)
        row.update(
            start=start,
            end=end,
            stream=stream,
            kind=int(kind),
            name=self.names.id(name),
            correlation=corr,
            launch=launch,
            ext_id=ext,
        )
        row.update(kw)
        for c in GpuOps.COLUMNS:
            self.g[c].append(int(row[c]))
        self.stream_end[stream] = max(self.stream_end.get(stream, 0), end)

    def tables(self) -> tuple[GpuOps, RuntimeCalls, HostRanges]:
        g = GpuOps.from_columns(len(self.g["start"]), self.g).sorted()
        rt = RuntimeCalls.from_columns(len(self.rt["start"]), self.rt).sorted()
        h = HostRanges.from_columns(len(self.h["start"]), self.h)
        # parents before children at equal starts: sort by start, then longer first
        order = np.lexsort((-(h.end - h.start), h.start))
        return g, rt, h.take(order)


@dataclass
class _Topo:
    pp: int
    dp: int
    s2r: list[int]
    groups: list[ProcessGroup]
    pp_group_of: dict[int, int]  # global rank -> index of its pp group in groups
    dp_group_of: dict[int, int]

    def glob(self, pp_rank: int, dp_rank: int) -> int:
        return pp_rank * self.dp + dp_rank


def _topology(pp: int, dp: int, s2r: list[int]) -> _Topo:
    world = pp * dp
    groups = [ProcessGroup("0", "default_pg", list(range(world)), "cuda:nccl")]
    dp_of: dict[int, int] = {}
    pp_of: dict[int, int] = {}
    if dp > 1:
        # Megatron builds the data-parallel groups before the pipeline groups
        for p in range(pp):
            ranks = [p * dp + d for d in range(dp)]
            groups.append(ProcessGroup(str(len(groups)), "DATA_PARALLEL_GROUP", ranks, "cuda:nccl"))
            for g in ranks:
                dp_of[g] = len(groups) - 1
    for d in range(dp):
        ranks = [p * dp + d for p in range(pp)]
        groups.append(ProcessGroup(str(len(groups)), "PIPELINE_MODEL_PARALLEL_GROUP", ranks, "cuda:nccl"))
        for g in ranks:
            pp_of[g] = len(groups) - 1
    return _Topo(pp, dp, s2r, groups, pp_of, dp_of)


def _split(total: int, n: int, gap: int, rng: np.random.Generator) -> tuple[list[int], int]:
    """Integer kernel durations summing to ``total - (n-1)*gap`` (fewer kernels when too short)."""
    n = max(1, min(n, total // (40 * US) if total >= 40 * US else 1))
    if n > 1 and total - (n - 1) * gap < n * 10 * US:
        gap = 0
    avail = total - (n - 1) * gap
    w = rng.uniform(0.5, 1.5, n)
    parts = [int(x) for x in np.floor(avail * w / w.sum())]
    parts[-1] += avail - sum(parts)
    return parts, gap


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
    _validate(prm)
    sched = canonical_schedule(prm.schedule)
    v = default_virtual(sched, prm.virtual)
    s2r = stage_to_rank(sched, prm.pp, v)
    topo = _topology(prm.pp, prm.dp, s2r)
    rng = np.random.default_rng(prm.seed)
    world = prm.pp * prm.dp
    skew_max = _ns(prm.clock_skew_ms)
    skews = [int(rng.integers(-skew_max, skew_max + 1)) if skew_max > 0 else 0 for _ in range(world)]

    ladders = [_ladder(prm, k) for k in range(prm.steps)]
    # a slow worker: its replica is simulated with its stages slower; the replicas then meet in the
    # data-parallel all-reduce of every pipeline rank (see _coupled_tails)
    by_rep = {d: ladders for d in range(prm.dp)}
    for f in prm.faults:
        if isinstance(f, SlowWorker):
            slow = [SlowStage(st, f.factor) for st in range(len(s2r)) if s2r[st] == f.pp_rank]
            prm_d = replace(prm, faults=tuple(prm.faults) + tuple(slow))
            by_rep[f.dp_rank] = [_ladder(prm_d, k) for k in range(prm.steps)]
    tails = _coupled_tails(prm, by_rep) if any(by_rep[d] is not ladders for d in by_rep) else None
    t0 = 2 * MS
    # a late replica delays every step of the whole job by its lateness (the others wait for it)
    late_ns = sum(_ns(f.delay_ms) for f in prm.faults if isinstance(f, LateReplica))
    late_rep = next((f.dp_rank for f in prm.faults if isinstance(f, LateReplica)), -1)
    starts = [t0]
    for k, lad in enumerate(ladders):
        step_ns = round(lad.full.step_ns) if tails is None else tails[k][4]
        starts.append(starts[-1] + step_ns + late_ns)

    names = NameTable()
    ranks: list[SynthRank] = []
    for p in range(prm.pp):
        # one NCCL stream per remote stage boundary and direction, so that a transfer never queues
        # behind another boundary's (the simulator serialises transfers per boundary and direction)
        bnds = [
            (bd, s2r[bd + 1] if s2r[bd] == p else s2r[bd])
            for bd in range(len(s2r) - 1)
            if p in (s2r[bd], s2r[bd + 1]) and s2r[bd] != s2r[bd + 1]
        ]
        for d in range(prm.dp):
            g = topo.glob(p, d)
            pid = 3000 + 131 * g
            b = _RankBuilder(names, pid)
            recv_stream = {bd: _STREAM_P2P0 + 4 * i for i, (bd, _) in enumerate(bnds)}
            send_stream = {bd: _STREAM_P2P0 + 2 + 4 * i for i, (bd, _) in enumerate(bnds)}
            state = _SeqState()
            for k, lad in enumerate(by_rep[d]):
                _emit_step(
                    b,
                    prm,
                    topo,
                    lad.full,
                    p,
                    d,
                    k,
                    starts[k],
                    starts[k + 1],
                    recv_stream,
                    send_stream,
                    state,
                    rng,
                    late_ns=late_ns if d == late_rep else 0,
                    push_ns=late_ns if d != late_rep else 0,
                    tail=None if tails is None else (tails[k][0][p], *tails[k][1:3], tails[k][3][p]),
                )
            gpu, rt, host = b.tables()
            streams = [StreamInfo(_STREAM_COMPUTE, StreamRole.COMPUTE)]
            for bd, q in bnds:
                for sid in (recv_stream[bd], send_stream[bd]):
                    streams.append(
                        StreamInfo(sid, StreamRole.P2P, peer=topo.glob(q, d), group=topo.pp_group_of[g])
                    )
            streams.append(StreamInfo(_STREAM_PP_COLL, StreamRole.COLLECTIVE, group=topo.pp_group_of[g]))
            if prm.dp > 1:
                streams.append(StreamInfo(_STREAM_DP, StreamRole.COLLECTIVE, group=topo.dp_group_of[g]))
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
            ranks.append(
                SynthRank(
                    rank=g,
                    world_size=world,
                    pp_rank=p,
                    dp_rank=d,
                    stages=[s for s in range(len(s2r)) if s2r[s] == p],
                    process_groups=[topo.groups[i] for i in my_groups],
                    pp_group=remap[topo.pp_group_of[g]],
                    dp_group=remap[topo.dp_group_of[g]] if prm.dp > 1 else -1,
                    device_index=g % prm.gpus_per_node,
                    device_name=prm.device_name,
                    host_name=f"node{g // prm.gpus_per_node:02d}",
                    pid=pid,
                    tid=pid,
                    clock_skew_ns=skews[g],
                    streams=streams,
                    gpu=gpu,
                    runtime=rt,
                    host=host,
                    step_windows=np.array(
                        [[starts[k], starts[k + 1]] for k in range(prm.steps)], dtype=np.int64
                    ),
                    step_numbers=[prm.first_step + k for k in range(prm.steps)],
                )
            )
    ranks.sort(key=lambda r: r.rank)
    run = SynthRun(
        names=names.names,
        ranks=ranks,
        epoch_ns=_EPOCH_NS + 1_000 * (prm.seed % 1_000_000),
        schedule=sched,
        pp=prm.pp,
        dp=prm.dp,
        virtual=v,
        microbatches=prm.microbatches,
        stage_to_rank=s2r,
        steps=prm.steps,
        config=prm.to_json(),
    )
    run.truth = _groundtruth(prm, run, ladders, starts, topo, by_rep)
    return run


@dataclass
class _SeqState:
    p2p_seq: int = 0
    coll_seq: dict[int, int] = field(default_factory=dict)

    def coll(self, group: int) -> int:
        self.coll_seq[group] = self.coll_seq.get(group, 0) + 1
        return self.coll_seq[group]


_OP_LETTER = {int(Phase.FWD): "F", int(Phase.BWD): "B", int(Phase.WGRAD): "W"}


def _emit_step(
    b: _RankBuilder,
    prm: ScenarioParams,
    topo: _Topo,
    res: SimResult,
    p: int,
    d: int,
    k: int,
    t_start: int,
    t_end: int,
    recv_stream: dict[int, int],
    send_stream: dict[int, int],
    seqs: _SeqState,
    rng: np.random.Generator,
    late_ns: int = 0,
    push_ns: int = 0,
    tail: tuple[int, int, int, int] | None = None,
) -> None:
    """Append one step of pipeline rank ``p`` in replica ``d`` to ``b`` (true clock).

    ``late_ns``: the replica starts its work that late (its data loader); ``push_ns``: the step's
    data-parallel all-reduce ends that much later than the simulation says (it waits for a late
    replica), and everything after it moves with it. ``tail``: the step tail coupled across
    replicas, (all-reduce end, sync end, optimizer start, optimizer end) relative to the step start.
    """
    g = topo.glob(p, d)
    main, bwd_tid = b.pid, b.pid + 2
    pp_gi = topo.pp_group_of[g]
    n_st = len(topo.s2r)
    gap_ns = round(prm.kernel_gap_us * US)
    cfg = res.config
    on_comp = _per_rank_bool(cfg.comm_on_compute, topo.pp)
    step_num = prm.first_step + k
    b.host(t_start, t_end, f"ProfilerStep#{step_num}", HostCat.ANNOTATION, main, num=step_num, step=k)
    sdelay = _per_rank(cfg.start_delay_ns, topo.pp)[p]
    if sdelay > 0:
        b.host(
            t_start + US,
            t_start + round(sdelay) - US,
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            HostCat.ANNOTATION,
            main,
            step=k,
        )
    if late_ns > 2 * US:
        b.host(
            t_start + US,
            t_start + late_ns - US,
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            HostCat.ANNOTATION,
            main,
            step=k,
        )
    t_start += late_ns
    rows = res.rank_rows(p)
    # the consumer row of every block that sends across ranks, for the send's end time
    key_row = {(int(res.stage[i]), int(res.phase[i]), int(res.mb[i])): i for i in range(len(res))}
    send_busy = res.extra["send_busy_ns"]
    host_free = t_start
    elem = prm.activation_nelems
    act_bytes = elem * 2
    stall = _per_rank(cfg.host_stall_ns, topo.pp)[p]
    for n_i, i in enumerate(rows):
        st, ph, mb = int(res.stage[i]), int(res.phase[i]), int(res.mb[i])
        full = bool(res.full[i])
        bs, be = t_start + round(res.start_ns[i]), t_start + round(res.end_ns[i])
        h = t_start + round(res.issue_ns[i])
        if stall > 0 and n_i > 0:
            prev = rows[n_i - 1]
            gpu_idle = t_start + round(res.end_ns[prev] + send_busy[prev])
            if gpu_idle > host_free + 2 * US and gpu_idle + US <= h:
                # the stalled host synchronised with the GPU before its slow Python work
                ext = b.host(host_free + US, gpu_idle + US, "aten::item", HostCat.CPU_OP, main, step=k)
                b.api(host_free + 2 * US, gpu_idle, "cudaStreamSynchronize", main, ext)
        dur = be - bs
        tid = bwd_tid if ph in (Phase.BWD, Phase.WGRAD) else main
        label_kw = {"step": k, "stage": st, "mb": mb, "phase": ph}
        t = h
        # receive of this block's input
        src = int(res.src_rank[i])
        if src >= 0:
            peer_g = topo.glob(src, d)
            peer_local = src
            post = t_start + round(res.post_ns[i])
            ready = t_start + round(res.ready_ns[i])
            xfer = round(res.xfer_ns[i])
            bnd = st - 1 if ph == Phase.FWD else st  # boundary the input crosses
            stream = _STREAM_COMPUTE if on_comp[p] else recv_stream[bnd]
            comm = _comm_kw(
                b, "recv", peer_g, Direction.RECV, act_bytes, elem, "BFloat16", seqs.p2p_seq, pp_gi
            )
            seqs.p2p_seq += 1
            e1 = b.host(t + 1 * US, t + 13 * US, "c10d::recv_", HostCat.CPU_OP, main, step=k, **comm)
            e2 = b.host(t + 2 * US, t + 12 * US, "record_param_comms", HostCat.CPU_OP, main, step=k, **comm)
            b.host(
                t + 3 * US,
                t + 11 * US,
                f"nccl:recv {p}<-{peer_local}",
                HostCat.ANNOTATION,
                main,
                step=k,
                **comm,
            )
            launch = t + 5 * US
            corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", main, e2, driver=True)
            k_start = max(post, b.stream_end.get(stream, 0))
            if k_start > ready - xfer:
                raise AssertionError(
                    f"rank {g}: receive for stage {st} mb {mb} cannot start before its data arrives"
                )
            b.kernel(
                k_start,
                ready,
                stream,
                Kind.P2P,
                _SENDRECV,
                corr,
                launch,
                e2,
                step=k,
                stage=st,
                mb=mb,
                phase=ph,
                **comm,
            )
            del e1
            b.api(t + 13 * US + 200, t + 13 * US + 800, "cudaStreamWaitEvent", main, -1)
            t += 16 * US
        else:
            t += 2 * US
        if dur > 0:
            ops = _FWD_KERNELS if ph == Phase.FWD else (_WGRAD_KERNELS if ph == Phase.WGRAD else _BWD_KERNELS)
            lo, hi = prm.kernels_per_block
            n_k = int(rng.integers(lo, hi + 1))
            if ph == Phase.BWD and full and hi > 1:
                n_k = max(n_k, 2)
            parts, gap = _split(dur, n_k, gap_ns, rng)
            if prm.annotations is not None:
                label = _label(prm.annotations, st, ph, mb, full)
                b.host(
                    h, h + round(prm.host_issue_us * US) - 2 * US, label, HostCat.ANNOTATION, main, **label_kw
                )
            ks = bs
            for j, kd in enumerate(parts):
                launch = t + j * 7 * US
                op, kname = ops[(j + (mb % 2)) % len(ops)]
                if tid == bwd_tid:
                    b.host(
                        launch - 2 * US,
                        launch + 5 * US,
                        f"autograd::engine::evaluate_function: {op}",
                        HostCat.CPU_OP,
                        tid,
                        **label_kw,
                    )
                    ext = b.host(
                        launch - US,
                        launch + 5 * US - 500,
                        _AUTOGRAD_ATEN.get(op, "aten::mm"),
                        HostCat.CPU_OP,
                        tid,
                        **label_kw,
                    )
                else:
                    ext = b.host(launch - 2 * US, launch + 5 * US, op, HostCat.CPU_OP, tid, **label_kw)
                corr = b.api(launch, launch + 4 * US, "cudaLaunchKernel", tid, ext)
                b.kernel(ks, ks + kd, _STREAM_COMPUTE, Kind.COMPUTE, kname, corr, launch, ext, **label_kw)
                ks += kd + gap
            if ks - gap != be:
                raise AssertionError("block kernels do not fill the block")
            t += len(parts) * 7 * US
        # send of this block's output
        cons = _consumer_stage(st, ph, n_st)
        if cons is not None and topo.s2r[cons] != p:
            dst = topo.s2r[cons]
            peer_g = topo.glob(dst, d)
            ck = key_row[(cons, int(Phase.FWD) if ph == Phase.FWD else int(Phase.BWD), mb)]
            recv_ready = t_start + round(res.ready_ns[ck])
            comm = _comm_kw(
                b, "send", peer_g, Direction.SEND, act_bytes, elem, "BFloat16", seqs.p2p_seq, pp_gi
            )
            seqs.p2p_seq += 1
            e1 = b.host(t + 1 * US, t + 13 * US, "c10d::send", HostCat.CPU_OP, main, step=k, **comm)
            e2 = b.host(t + 2 * US, t + 12 * US, "record_param_comms", HostCat.CPU_OP, main, step=k, **comm)
            b.host(t + 3 * US, t + 11 * US, f"nccl:send {p}->{dst}", HostCat.ANNOTATION, main, step=k, **comm)
            b.api(t + 4 * US, t + 5 * US, "cudaStreamWaitEvent", main, e2)
            launch = t + 6 * US
            corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", main, e2, driver=True)
            del e1
            if on_comp[p]:
                sb = round(send_busy[i])
                b.kernel(
                    be,
                    be + sb,
                    _STREAM_COMPUTE,
                    Kind.P2P,
                    _SENDRECV,
                    corr,
                    launch,
                    e2,
                    step=k,
                    stage=st,
                    mb=mb,
                    phase=ph,
                    **comm,
                )
            else:
                stream = send_stream[min(st, cons)]
                k_start = max(be, launch + US, b.stream_end.get(stream, 0))
                xfer = round(res.xfer_ns[ck])
                if k_start > recv_ready - xfer:
                    raise AssertionError(
                        f"rank {g}: send for stage {cons} mb {mb} starts after its transfer should have"
                    )
                b.kernel(
                    k_start,
                    recv_ready,
                    stream,
                    Kind.P2P,
                    _SENDRECV,
                    corr,
                    launch,
                    e2,
                    step=k,
                    stage=st,
                    mb=mb,
                    phase=ph,
                    **comm,
                )
            t += 14 * US
        host_free = t
    # ---- step tail: data-parallel gradient all-reduce, gradient-norm sync, optimizer
    last_end = t_start + round(res.last_end_ns[p])
    tail_end = t_start + round(res.tail_end_ns[p]) + push_ns
    sync_end = t_start + round(res.sync_end_ns[p]) + push_ns
    opt_start = t_start + round(res.optim_start_ns[p]) + push_ns
    opt_end = t_start + round(res.optim_end_ns[p]) + push_ns
    if tail is not None:
        tail_end, sync_end, opt_start, opt_end = (t_start + x for x in tail)
    t = host_free + US
    if prm.dp > 1:
        dp_gi = topo.dp_group_of[g]
        nel = prm.grad_nelems
        comm = _comm_kw(b, "allreduce", -1, Direction.NONE, nel * 2, nel, "BFloat16", seqs.coll(dp_gi), dp_gi)
        e2 = _coll_host(b, t, "c10d::allreduce_", "nccl:all_reduce", main, k, comm)
        launch = t + 6 * US
        corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", main, e2, driver=True)
        if tail_end > last_end:
            b.kernel(
                max(last_end, launch + US),
                tail_end,
                _STREAM_DP,
                Kind.COLLECTIVE,
                _ALLREDUCE_BF16,
                corr,
                launch,
                e2,
                step=k,
                **comm,
            )
        else:
            # overlapped with the last backward (bucketed gradient reduce)
            last_rows = rows[-1] if len(rows) else -1
            ls = t_start + round(res.start_ns[last_rows]) if last_rows >= 0 else last_end
            ks = max(ls, launch + US)
            if last_end - ks >= 20 * US:  # a block too short to hide it: no kernel recorded
                ke = ks + round(0.8 * (last_end - ks))
                b.kernel(
                    ks, ke, _STREAM_DP, Kind.COLLECTIVE, _ALLREDUCE_BF16, corr, launch, e2, step=k, **comm
                )
        t += 14 * US
    comm = _comm_kw(b, "allreduce", -1, Direction.NONE, 4, 1, "Float", seqs.coll(pp_gi), pp_gi)
    e2 = _coll_host(b, t, "c10d::allreduce_", "nccl:all_reduce", main, k, comm)
    launch = t + 6 * US
    corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", main, e2, driver=True)
    ks = max(tail_end, launch + US)
    sync_ns = round(cfg.sync_ns or 0)
    if ks > sync_end - sync_ns:
        raise AssertionError(f"rank {g}: the step-end all-reduce is launched too late")
    b.kernel(ks, sync_end, _STREAM_PP_COLL, Kind.COLLECTIVE, _ALLREDUCE_F32, corr, launch, e2, step=k, **comm)
    t += 14 * US
    # the host needs the gradient norm before the optimizer: it blocks until the all-reduce is done
    ext = b.host(t, sync_end + 4 * US, "aten::item", HostCat.CPU_OP, main, step=k)
    b.api(t + US, sync_end + 3 * US, "cudaStreamSynchronize", main, ext)
    t = sync_end + 5 * US
    n_opt = 2
    parts, gap = _split(opt_end - opt_start, n_opt, gap_ns, rng)
    opt_ext = b.host(
        t,
        t + (len(parts) * 7 + 2) * US,
        "Optimizer.step#AdamW.step",
        HostCat.ANNOTATION,
        main,
        step=k,
        phase=int(Phase.OPTIM),
    )
    del opt_ext
    ks = opt_start
    for j, kd in enumerate(parts):
        launch = t + US + j * 7 * US
        op, kname = _OPTIM_KERNELS[j % len(_OPTIM_KERNELS)]
        ext = b.host(launch - US, launch + 5 * US, op, HostCat.CPU_OP, main, step=k, phase=int(Phase.OPTIM))
        corr = b.api(launch, launch + 4 * US, "cudaLaunchKernel", main, ext)
        b.kernel(
            ks,
            ks + kd,
            _STREAM_COMPUTE,
            Kind.COMPUTE,
            kname,
            corr,
            launch,
            ext,
            step=k,
            phase=int(Phase.OPTIM),
        )
        ks += kd + gap
    t += (len(parts) * 7 + 3) * US
    # the training loop reads the loss: the host waits for the GPU, then calls prof.step()
    if opt_end + 2 * US < t_end:
        ext = b.host(t, opt_end + 3 * US, "aten::item", HostCat.CPU_OP, main, step=k)
        b.api(t + US, opt_end + 2 * US, "cudaStreamSynchronize", main, ext)


def _coll_host(b: _RankBuilder, t: int, op: str, title: str, tid: int, k: int, comm: dict[str, int]) -> int:
    b.host(t + 1 * US, t + 13 * US, op, HostCat.CPU_OP, tid, step=k, **comm)
    e2 = b.host(t + 2 * US, t + 12 * US, "record_param_comms", HostCat.CPU_OP, tid, step=k, **comm)
    b.host(t + 3 * US, t + 11 * US, title, HostCat.ANNOTATION, tid, step=k, **comm)
    b.api(t + 4 * US, t + 5 * US, "cudaStreamWaitEvent", tid, e2)
    return e2


def _comm_kw(
    b: _RankBuilder,
    coll: str,
    peer: int,
    direction: Direction,
    nbytes: int,
    nelems: int,
    dtype: str,
    seq: int,
    group: int,
) -> dict[str, int]:
    return {
        "coll": b.names.id(coll),
        "peer": peer,
        "direction": int(direction),
        "bytes": nbytes,
        "nelems": nelems,
        "dtype": b.names.id(dtype),
        "seq": seq,
        "group": group,
    }


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


def _groundtruth(
    prm: ScenarioParams,
    run: SynthRun,
    ladders: list[_Ladder],
    starts: list[int],
    topo: _Topo,
    by_rep: dict[int, list[_Ladder]] | None = None,
) -> dict[str, Any]:
    """The ground-truth JSON object (see the module docstring for the definitions)."""
    by_rep = by_rep or {d: ladders for d in range(prm.dp)}
    if all(lads is ladders for lads in by_rep.values()):
        truth_of = {d: [_truth_of(lad) for lad in ladders] for d in by_rep}
    else:
        truth_of = _coupled_truth(by_rep, prm.steps)
    gap_ns = _kernel_gaps(run)
    ranks_out: dict[str, Any] = {}
    late_ns = sum(_ns(f.delay_ms) for f in prm.faults if isinstance(f, LateReplica))
    for rk in run.ranks:
        p = rk.pp_rank
        steps_out: list[dict[str, Any]] = []
        for k, lad in enumerate(by_rep[rk.dp_rank]):
            res = lad.full
            window = starts[k + 1] - starts[k]
            compute = float(res.per_rank_busy_ns[p])
            causes = {c: float(truth_of[rk.dp_rank][k][c][p]) / MS for c in TRUTH_CAUSES}
            # a late replica: its ranks idle at the step start, the others wait for it in the
            # data-parallel all-reduce; both are the late replica's host (its data loader)
            causes["host"] += late_ns / MS
            steps_out.append(
                {
                    "step": prm.first_step + k,
                    "window_ms": window / MS,
                    "compute_ms": compute / MS,
                    "lost_ms": (window - compute) / MS,
                    "kernel_gaps_ms": gap_ns[rk.rank][k] / MS,
                    "causes_ms": causes,
                }
            )
        n = len(steps_out)
        ranks_out[str(rk.rank)] = {
            "rank": rk.rank,
            "pp_rank": p,
            "dp_rank": rk.dp_rank,
            "stages": rk.stages,
            "clock_skew_ns": rk.clock_skew_ns,
            "step_ms": sum(s["window_ms"] for s in steps_out) / n,
            "compute_ms": sum(s["compute_ms"] for s in steps_out) / n,
            "lost_ms": sum(s["lost_ms"] for s in steps_out) / n,
            "kernel_gaps_ms": sum(s["kernel_gaps_ms"] for s in steps_out) / n,
            "causes_ms": {c: sum(s["causes_ms"][c] for s in steps_out) / n for c in TRUTH_CAUSES},
            "steps": steps_out,
        }
    blame: dict[str, list[int]] = {}
    faults_out = []
    for f in prm.faults:
        fj = fault_json(f)
        if isinstance(f, SlowStage):
            pr = [topo.s2r[f.stage]]
        elif isinstance(f, (SlowLink, HostStall)):
            pr = [f.rank]
        elif isinstance(f, SlowStep):
            pr = list(range(prm.pp)) if f.rank is None else [f.rank]
        elif isinstance(f, CommOnCompute):
            pr = list(f.ranks) if f.ranks is not None else list(range(prm.pp))
        elif isinstance(f, SlowWorker):
            pr = [f.pp_rank]
        else:
            pr = list(range(prm.pp))
        fj["ranks"] = sorted(topo.glob(q, d) for q in pr for d in range(prm.dp))
        if isinstance(f, LateReplica):  # the late replica's ranks only: the others wait for them
            fj["ranks"] = sorted(topo.glob(q, f.dp_rank) for q in range(prm.pp))
        if isinstance(f, SlowWorker):  # one worker, not its stage in every replica
            fj["ranks"] = [topo.glob(f.pp_rank, f.dp_rank)]
        blame.setdefault(f.cause, [])
        blame[f.cause] = sorted(set(blame[f.cause]) | set(fj["ranks"]))
        faults_out.append(fj)
    s0 = ladders[0].s0
    stage_map = {str(s): [topo.glob(q, d) for d in range(prm.dp)] for s, q in enumerate(topo.s2r)}
    return {
        "schema": GROUNDTRUTH_SCHEMA,
        "schedule": run.schedule,
        "pp": prm.pp,
        "dp": prm.dp,
        "virtual": run.virtual,
        "microbatches": prm.microbatches,
        "world_size": run.world_size,
        "steps": prm.steps,
        "step_numbers": [prm.first_step + k for k in range(prm.steps)],
        "stage_to_pp_rank": list(topo.s2r),
        "stage_map": stage_map,
        "pp_groups": [pg.ranks for pg in topo.groups if pg.desc == "PIPELINE_MODEL_PARALLEL_GROUP"],
        "dp_groups": [pg.ranks for pg in topo.groups if pg.desc == "DATA_PARALLEL_GROUP"],
        "faults": faults_out,
        "blame": blame,
        "clock_skew_ns": {str(r.rank): r.clock_skew_ns for r in run.ranks},
        "clock_offset_ns": {str(r.rank): -r.clock_skew_ns for r in run.ranks},
        "step_windows_ns": [[starts[k], starts[k + 1]] for k in range(prm.steps)],
        "step_ms": [(starts[k + 1] - starts[k]) / MS for k in range(prm.steps)],
        "bubble": {
            "theoretical_ratio": closed_form_bubble(run.schedule, prm.pp, prm.microbatches, run.virtual),
            "balanced_sim_ratio": s0.bubble_ratio,
        },
        "causes": list(TRUTH_CAUSES),
        "definitions": {
            "lost": "step window - union of compute blocks (first to last kernel of each block)",
            "kernel_gaps": "idle gaps between kernels inside a block; lost on kernels = lost + kernel_gaps",
            "bubble": "min(idle with mean stage costs and normal links, "
            "idle with measured stage costs and normal links)",
            "imbalance": "idle with measured stage costs and normal links - bubble",
            "other causes": "growth of lost time when the ingredient is added to the simulation",
        },
        "config": run.config,
        "ranks": ranks_out,
    }


def _kernel_gaps(run: SynthRun) -> dict[int, list[int]]:
    """Per rank and step: ns between the kernels of one block (compute stream, same block)."""
    out: dict[int, list[int]] = {}
    for rk in run.ranks:
        gpu = rk.gpu
        sel = np.flatnonzero(gpu.kind == int(Kind.COMPUTE))
        per = [0] * run.steps
        st, en = gpu.start[sel], gpu.end[sel]
        lab = np.stack([gpu.step[sel], gpu.stage[sel], gpu.mb[sel], gpu.phase[sel]], axis=1)
        for a in range(1, len(sel)):
            if (lab[a] == lab[a - 1]).all():
                per[int(lab[a][0])] += int(st[a] - en[a - 1])
        out[rk.rank] = per
    return out


def groundtruth_json(run: SynthRun) -> dict[str, Any]:
    """The ground truth of ``run`` (what ``groundtruth.json`` holds)."""
    return run.truth


def write_groundtruth(run: SynthRun, out_dir: str | Path) -> Path:
    """Write ``groundtruth.json`` into ``out_dir`` and return its path."""
    path = Path(out_dir) / "groundtruth.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run.truth, indent=1, sort_keys=False))
    return path
