"""Synthetic runs without a pipeline (pp = 1) whose collectives wait for late ranks, with their truth.

:func:`make_collective_run` describes a data/expert-parallel GPU job the way a recommendation or
MoE model runs it: per step, on every rank, a forward compute block, an all-to-all (the embedding
or expert exchange), a dense block, a second all-to-all, a backward block, the data-parallel
gradient all-reduce and the optimizer. All collectives of one step belong to the world group and
block their rank's compute stream; an instance ends on every member at the last member's arrival
plus its transfer time, exactly as a blocking NCCL collective does.

Ranks can be late: ``late_ms[r]`` is the time rank ``r``'s host spends in its data loader at the
start of every step before it issues anything (the GPU is idle, nothing is queued), and
``slow[r]`` multiplies rank ``r``'s compute (a slow GPU). The host issues everything else well
ahead of the GPU, so no other starvation occurs.

Truth (``SynthRun.truth``, computed from these parameters by re-simulating the step, never by the
analyzer), per rank and step, on the rank's ``ProfilerStep`` window:

* ``lost = window - compute``; ``exposed_comm`` = the transfers of the collectives;
* ``host`` = the rank's own idle before its first kernel (data loader, launch latency) and after
  its optimizer (the loop reaching the next step);
* the wait in each collective (``last arrival - own arrival``) is charged to the last arriver's
  excess over the waiting rank since the previous collective (or the step start): a later start
  of the stretch or a longer host idle → ``host``, a longer compute → ``imbalance``; split in
  proportion when both apply (DESIGN.md §5, the late rank's root cause);
* ``stragglers``: per late rank, its arrival after the median member's per step (``late_ms``);
* ``gain_ms_per_step``: the step time saved with every rank on time (a re-simulation without
  ``late_ms`` and ``slow``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ppdiag.model.timeline import Direction, Kind, NameTable, Phase, ProcessGroup
from ppdiag.synth.run import HostCat, StreamInfo, StreamRole, SynthRank, SynthRun
from ppdiag.synth.scenario import _EPOCH_NS, _coll_host, _comm_kw, _ns, _RankBuilder

US = 1_000
MS = 1_000_000
SCHEMA = "ppdiag-synth-collectives/1"
_STREAM_COMPUTE = 7
_STREAM_COLL = 13
_A2A = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
_KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
_GEMM = "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"
CAUSES = ("imbalance", "exposed_comm", "host")


@dataclass
class CollectiveParams:
    """Knobs of a pp = 1 collective run (ms unless named otherwise)."""

    world: int = 8
    steps: int = 3
    first_step: int = 10
    fwd_ms: float = 2.0
    dense_ms: float = 3.0
    bwd_ms: float = 4.0
    optimizer_ms: float = 0.5
    a2a_ms: float = 0.4
    allreduce_ms: float = 1.0
    late_ms: dict[int, float] = field(default_factory=dict)
    slow: dict[int, float] = field(default_factory=dict)
    launch_latency_us: float = 5.0
    issue_us: float = 10.0
    loop_us: float = 60.0  # host time from the optimizer's end to the next step's first launch
    clock_skew_ms: float = 3.0
    seed: int = 0
    kernels_per_block: int = 3
    device_name: str = "NVIDIA H100 80GB HBM3"
    gpus_per_node: int = 8

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["late_ms"] = {str(k): v for k, v in self.late_ms.items()}
        d["slow"] = {str(k): v for k, v in self.slow.items()}
        return d


# the step, in order: (what, phase or collective name, cost field)
_PLAN: tuple[tuple[str, str, str], ...] = (
    ("compute", "fwd", "fwd_ms"),
    ("coll", "all_to_all", "a2a_ms"),
    ("compute", "fwd", "dense_ms"),
    ("coll", "all_to_all", "a2a_ms"),
    ("compute", "bwd", "bwd_ms"),
    ("coll", "allreduce", "allreduce_ms"),
    ("compute", "optim", "optimizer_ms"),
)
_PHASE = {"fwd": Phase.FWD, "bwd": Phase.BWD, "optim": Phase.OPTIM}


def _validate(prm: CollectiveParams) -> None:
    if prm.world < 2 or prm.steps < 1 or prm.kernels_per_block < 1:
        raise ValueError("a collective run needs world >= 2, steps >= 1 and kernels_per_block >= 1")
    for what, m in (("late_ms", prm.late_ms), ("slow", prm.slow)):
        bad = [r for r in m if not 0 <= r < prm.world]
        if bad:
            raise ValueError(f"{what}: ranks {bad} outside 0..{prm.world - 1}")
    if any(v < 0 for v in prm.late_ms.values()) or any(v <= 0 for v in prm.slow.values()):
        raise ValueError("late_ms must be >= 0 and slow factors > 0")


def make_collective_run(**kwargs: Any) -> SynthRun:
    """Simulate the run described by :class:`CollectiveParams` fields and return what its profiler
    would record, with ``truth`` filled. Raises ValueError for impossible setups."""
    prm = CollectiveParams(**kwargs)
    _validate(prm)
    rng = np.random.default_rng(prm.seed)
    n, lat, issue = prm.world, round(prm.launch_latency_us * US), round(prm.issue_us * US)
    skew = _ns(prm.clock_skew_ms)
    skews = [int(rng.integers(-skew, skew + 1)) if skew else 0 for _ in range(n)]
    late = np.array([_ns(prm.late_ms.get(r, 0.0)) for r in range(n)], np.int64)
    factor = np.array([prm.slow.get(r, 1.0) for r in range(n)])
    names = NameTable()
    group = ProcessGroup("0", "default_pg", list(range(n)), "cuda:nccl")
    builders = [_RankBuilder(names, 4000 + 97 * r) for r in range(n)]
    seq = [0] * n
    t_step = np.full(n, 2 * MS, np.int64)  # each rank's ProfilerStep start (true clock)
    windows = np.zeros((n, prm.steps, 2), np.int64)
    truth_steps: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    stragglers = np.zeros(n, np.int64)
    for k in range(prm.steps):
        num = prm.first_step + k
        causes = np.zeros((n, len(CAUSES)), np.int64)
        compute = np.zeros(n, np.int64)
        # host: data loader, then every launch `issue` apart, far ahead of the GPU
        h = t_step + late + 20 * US
        for r in range(n):
            if late[r] > 2 * US:
                builders[r].host(
                    int(t_step[r]) + US,
                    int(t_step[r] + late[r]) - US,
                    "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                    HostCat.ANNOTATION,
                    builders[r].pid,
                    step=k,
                )
        gpu_free = np.zeros(n, np.int64)  # end of the last compute-stream work
        seg_start = t_step.copy()  # start of the stretch since the last sync point
        seg_host = np.zeros(n, np.int64)
        seg_comp = np.zeros(n, np.int64)
        first = True
        for what, label, cost in _PLAN:
            base = _ns(getattr(prm, cost))
            if what == "compute":
                durs = np.round(base * factor).astype(np.int64)
                for r in range(n):
                    parts = _parts(int(durs[r]), prm.kernels_per_block, rng)
                    t = int(max(gpu_free[r], h[r] + lat))
                    if first:
                        seg_host[r] += t - int(t_step[r])  # idle before the first kernel: host
                    for j, d in enumerate(parts):
                        launch = int(h[r]) + j * issue
                        t = max(t, launch + lat)
                        ext = builders[r].host(
                            launch - 2 * US,
                            launch + 5 * US,
                            "aten::mm",
                            HostCat.CPU_OP,
                            builders[r].pid,
                            step=k,
                        )
                        corr = builders[r].api(
                            launch, launch + 4 * US, "cudaLaunchKernel", builders[r].pid, ext
                        )
                        builders[r].kernel(
                            t,
                            t + d,
                            _STREAM_COMPUTE,
                            Kind.COMPUTE,
                            _GEMM if j % 2 == 0 else _KERNEL,
                            corr,
                            launch,
                            ext,
                            step=k,
                            phase=int(_PHASE[label]),
                        )
                        t += d
                    h[r] += len(parts) * issue
                    gpu_free[r] = t
                    seg_comp[r] += int(durs[r])
                    compute[r] += int(durs[r])
                first = False
                continue
            # a blocking collective: arrival on each rank, common end
            xfer = base
            arrive = np.zeros(n, np.int64)
            launches = np.zeros(n, np.int64)
            for r in range(n):
                seq[r] += 1
                launches[r] = int(h[r]) + 6 * US
                arrive[r] = max(int(gpu_free[r]), int(launches[r]) + lat)
            end = int(arrive.max()) + xfer
            for r in range(n):
                b = builders[r]
                nel = 4_194_304 if label == "all_to_all" else 25_165_824
                comm = _comm_kw(b, label, -1, Direction.NONE, nel * 2, nel, "BFloat16", seq[r], 0)
                op = "c10d::alltoall_base_" if label == "all_to_all" else "c10d::allreduce_"
                title = "nccl:all_to_all" if label == "all_to_all" else "nccl:all_reduce"
                e2 = _coll_host(b, int(h[r]), op, title, b.pid, k, comm)
                corr = b.api(
                    int(launches[r]), int(launches[r]) + 4 * US, "cuLaunchKernelEx", b.pid, e2, driver=True
                )
                b.kernel(
                    int(arrive[r]),
                    end,
                    _STREAM_COLL,
                    Kind.COLLECTIVE,
                    _A2A if label == "all_to_all" else _ALLREDUCE,
                    corr,
                    int(launches[r]),
                    e2,
                    step=k,
                    **comm,
                )
                h[r] += 14 * US
            # truth of this instance: transfer, own host idle, waits charged to the last arriver
            causes[:, CAUSES.index("exposed_comm")] += xfer
            last = int(np.argmax(arrive))
            d_start = np.maximum(seg_start[last] - seg_start, 0)
            d_host = np.maximum(seg_host[last] - seg_host, 0)
            d_comp = np.maximum(seg_comp[last] - seg_comp, 0)
            wait = end - xfer - arrive
            tot = d_start + d_host + d_comp
            comp_share = np.where(tot > 0, wait * d_comp // np.maximum(tot, 1), 0)
            causes[:, CAUSES.index("imbalance")] += comp_share
            causes[:, CAUSES.index("host")] += wait - comp_share
            # lateness of each rank against the median member (clock-free: from the waits)
            stragglers += np.maximum(int(np.sort(wait)[n // 2]) - wait, 0)
            causes[:, CAUSES.index("host")] += seg_host
            gpu_free[:] = end
            seg_start[:] = end
            seg_host[:] = 0
            seg_comp[:] = 0
        # the optimizer ends the step; the loop reaches the next step's first launch
        opt_end = gpu_free.copy()
        t_next = opt_end + round(prm.loop_us * US)
        for r in range(n):
            b = builders[r]
            ext = b.host(int(h[r]), int(opt_end[r]) + 3 * US, "aten::item", HostCat.CPU_OP, b.pid, step=k)
            b.api(int(h[r]) + US, int(opt_end[r]) + 2 * US, "cudaStreamSynchronize", b.pid, ext)
            b.host(
                int(t_step[r]),
                int(t_next[r]),
                f"ProfilerStep#{num}",
                HostCat.ANNOTATION,
                b.pid,
                num=num,
                step=k,
            )
            windows[r, k] = (t_step[r], t_next[r])
            window = int(t_next[r] - t_step[r])
            causes[r, CAUSES.index("host")] += int(t_next[r] - opt_end[r])
            lost = window - int(compute[r])
            if int(causes[r].sum()) != lost:
                raise AssertionError(f"rank {r} step {k}: truth causes {causes[r].sum()} != lost {lost}")
            truth_steps[r].append(
                {
                    "step": num,
                    "window_ms": window / MS,
                    "compute_ms": int(compute[r]) / MS,
                    "lost_ms": lost / MS,
                    "causes_ms": {c: int(causes[r, j]) / MS for j, c in enumerate(CAUSES)},
                }
            )
        t_step = t_next
    ranks: list[SynthRank] = []
    for r in range(n):
        gpu, rt, host = builders[r].tables()
        ranks.append(
            SynthRank(
                rank=r,
                world_size=n,
                pp_rank=0,
                dp_rank=r,
                stages=[0],
                process_groups=[group],
                pp_group=-1,
                dp_group=0,
                device_index=r % prm.gpus_per_node,
                device_name=prm.device_name,
                host_name=f"node{r // prm.gpus_per_node:02d}",
                pid=builders[r].pid,
                tid=builders[r].pid,
                clock_skew_ns=skews[r],
                streams=[
                    StreamInfo(_STREAM_COMPUTE, StreamRole.COMPUTE),
                    StreamInfo(_STREAM_COLL, StreamRole.COLLECTIVE, group=0),
                ],
                gpu=gpu,
                runtime=rt,
                host=host,
                step_windows=windows[r].copy(),
                step_numbers=[prm.first_step + k for k in range(prm.steps)],
            )
        )
    run = SynthRun(
        names=names.names,
        ranks=ranks,
        epoch_ns=_EPOCH_NS + 1_000 * (prm.seed % 1_000_000),
        schedule="none",
        pp=1,
        dp=n,
        virtual=1,
        microbatches=1,
        stage_to_rank=[0],
        steps=prm.steps,
        config=prm.to_json(),
    )
    run.truth = _truth(prm, truth_steps, stragglers, skews)
    # the step time the run would save with every rank on time: a re-simulation without them
    if prm.late_ms or prm.slow:
        on_time = make_collective_run(**{**asdict(prm), "late_ms": {}, "slow": {}})
        late_step = float(np.mean([r["step_ms"] for r in run.truth["ranks"].values()]))
        on_time_step = float(np.mean([r["step_ms"] for r in on_time.truth["ranks"].values()]))
        run.truth["gain_ms_per_step"] = late_step - on_time_step
    else:
        run.truth["gain_ms_per_step"] = 0.0
    return run


def _parts(total: int, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` integer kernel durations that add up to ``total``."""
    if total <= 0:
        return []
    w = rng.uniform(0.5, 1.5, n)
    parts = [int(x) for x in np.floor(total * w / w.sum())]
    parts[-1] += total - sum(parts)
    return [p for p in parts if p > 0]


def _truth(
    prm: CollectiveParams, steps: list[list[dict[str, Any]]], late: np.ndarray, skews: list[int]
) -> dict[str, Any]:
    ranks: dict[str, Any] = {}
    for r, st in enumerate(steps):
        m = len(st)
        ranks[str(r)] = {
            "rank": r,
            "clock_skew_ns": skews[r],
            "step_ms": sum(s["window_ms"] for s in st) / m,
            "compute_ms": sum(s["compute_ms"] for s in st) / m,
            "lost_ms": sum(s["lost_ms"] for s in st) / m,
            "causes_ms": {c: sum(s["causes_ms"][c] for s in st) / m for c in CAUSES},
            "steps": st,
        }
    return {
        "schema": SCHEMA,
        "pp": 1,
        "schedule": "none",
        "world_size": prm.world,
        "steps": prm.steps,
        "step_numbers": [prm.first_step + k for k in range(prm.steps)],
        "causes": list(CAUSES),
        "stragglers": {str(r): int(v) / prm.steps / MS for r, v in enumerate(late) if v > 0},
        "clock_offset_ns": {str(r): -s for r, s in enumerate(skews)},
        "config": prm.to_json(),
        "ranks": ranks,
    }


__all__ = ["CollectiveParams", "make_collective_run"]
