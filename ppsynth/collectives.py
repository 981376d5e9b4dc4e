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
  proportion when both apply (docs/json.md "Time accounting", the late rank's root cause);
* ``stragglers``: per late rank, its arrival after the median member's per step (``late_ms``);
* ``gain_ms_per_step``: the step time saved with every rank on time (a re-simulation without
  ``late_ms`` and ``slow``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Direction, Kind, NameTable, Phase, ProcessGroup
from ppsynth.builder import RankBuilder, coll_host, comm_kw
from ppsynth.run import HostCat, StreamInfo, StreamRole, SynthRank, SynthRun
from ppsynth.scenario_params import EPOCH_NS, ns

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


@dataclass
class _Sim:
    """The state of a collective run being simulated, one array entry per rank."""

    prm: CollectiveParams
    rng: np.random.Generator
    builders: list[RankBuilder]
    late: npt.NDArray[np.int64]
    factor: npt.NDArray[np.float64]
    seq: list[int]
    stragglers: npt.NDArray[np.int64]
    # per step
    k: int = 0
    h: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))  # host time
    gpu_free: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    seg_start: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    seg_host: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    seg_comp: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    causes: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    compute: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def n(self) -> int:
        return self.prm.world


def make_collective_run(**kwargs: Any) -> SynthRun:
    """Simulate the run described by :class:`CollectiveParams` fields and return what its profiler
    would record, with ``truth`` filled. Raises ValueError for impossible setups."""
    prm = CollectiveParams(**kwargs)
    _validate(prm)
    rng = np.random.default_rng(prm.seed)
    n = prm.world
    skew = ns(prm.clock_skew_ms)
    skews = [int(rng.integers(-skew, skew + 1)) if skew else 0 for _ in range(n)]
    # the ranks of one host (node{r // gpus_per_node}) read one clock: its first rank's
    gpn = max(prm.gpus_per_node, 1)
    skews = [skews[r - r % gpn] for r in range(n)]
    names = NameTable()
    sim = _Sim(
        prm,
        rng,
        [RankBuilder(names, 4000 + 97 * r) for r in range(n)],
        np.array([ns(prm.late_ms.get(r, 0.0)) for r in range(n)], np.int64),
        np.array([prm.slow.get(r, 1.0) for r in range(n)]),
        [0] * n,
        np.zeros(n, np.int64),
    )
    t_step = np.full(n, 2 * MS, np.int64)  # each rank's ProfilerStep start (true clock)
    windows = np.zeros((n, prm.steps, 2), np.int64)
    truth_steps: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for k in range(prm.steps):
        _start_step(sim, k, t_step)
        first = True
        for what, label, cost in _PLAN:
            base = ns(getattr(prm, cost))
            if what == "compute":
                _compute(sim, label, base, t_step if first else None)
                first = False
            else:
                _collective(sim, label, base)
        t_step = _end_step(sim, t_step, windows, truth_steps)
    run = SynthRun(
        names=names.names,
        ranks=[_rank(prm, r, sim.builders[r], skews[r], windows[r]) for r in range(n)],
        epoch_ns=EPOCH_NS + 1_000 * (prm.seed % 1_000_000),
        schedule="none",
        pp=1,
        dp=n,
        virtual=1,
        microbatches=1,
        stage_to_rank=[0],
        steps=prm.steps,
        config=prm.to_json(),
    )
    run.truth = _truth(prm, truth_steps, sim.stragglers, skews)
    # the step time the run would save with every rank on time: a re-simulation without them
    if prm.late_ms or prm.slow:
        on_time = make_collective_run(**{**asdict(prm), "late_ms": {}, "slow": {}})
        late_step = float(np.mean([r["step_ms"] for r in run.truth["ranks"].values()]))
        on_time_step = float(np.mean([r["step_ms"] for r in on_time.truth["ranks"].values()]))
        run.truth["gain_ms_per_step"] = late_step - on_time_step
    else:
        run.truth["gain_ms_per_step"] = 0.0
    return run


def _start_step(sim: _Sim, k: int, t_step: npt.NDArray[np.int64]) -> None:
    """Reset the per-step state; the data loader of a late rank opens its step."""
    n = sim.n
    sim.k = k
    sim.causes = np.zeros((n, len(CAUSES)), np.int64)
    sim.compute = np.zeros(n, np.int64)
    # host: data loader, then every launch `issue` apart, far ahead of the GPU
    sim.h = t_step + sim.late + 20 * US
    for r in range(n):
        if sim.late[r] > 2 * US:
            b = sim.builders[r]
            b.host(
                int(t_step[r]) + US,
                int(t_step[r] + sim.late[r]) - US,
                "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                HostCat.ANNOTATION,
                b.pid,
                step=k,
            )
    sim.gpu_free = np.zeros(n, np.int64)  # end of the last compute-stream work
    sim.seg_start = t_step.copy()  # start of the stretch since the last sync point
    sim.seg_host = np.zeros(n, np.int64)
    sim.seg_comp = np.zeros(n, np.int64)


def _compute(sim: _Sim, label: str, base: int, t_step: npt.NDArray[np.int64] | None) -> None:
    """One compute block per rank (``base`` scaled by the rank's slowness), launched kernel by
    kernel; ``t_step`` on the step's first block: the idle before its first kernel is host time."""
    prm, k = sim.prm, sim.k
    lat, issue = round(prm.launch_latency_us * US), round(prm.issue_us * US)
    durs = np.round(base * sim.factor).astype(np.int64)
    for r in range(sim.n):
        b = sim.builders[r]
        parts = _parts(int(durs[r]), prm.kernels_per_block, sim.rng)
        t = int(max(sim.gpu_free[r], sim.h[r] + lat))
        if t_step is not None:
            sim.seg_host[r] += t - int(t_step[r])
        for j, d in enumerate(parts):
            launch = int(sim.h[r]) + j * issue
            t = max(t, launch + lat)
            ext = b.host(launch - 2 * US, launch + 5 * US, "aten::mm", HostCat.CPU_OP, b.pid, step=k)
            corr = b.api(launch, launch + 4 * US, "cudaLaunchKernel", b.pid, ext)
            kname = _GEMM if j % 2 == 0 else _KERNEL
            ph = int(_PHASE[label])
            b.kernel(t, t + d, _STREAM_COMPUTE, Kind.COMPUTE, kname, corr, launch, ext, step=k, phase=ph)
            t += d
        sim.h[r] += len(parts) * issue
        sim.gpu_free[r] = t
        sim.seg_comp[r] += int(durs[r])
        sim.compute[r] += int(durs[r])


def _collective(sim: _Sim, label: str, xfer: int) -> None:
    """A blocking collective: arrival on each rank, a common end ``xfer`` after the last arrival."""
    n, k = sim.n, sim.k
    lat = round(sim.prm.launch_latency_us * US)
    arrive = np.zeros(n, np.int64)
    launches = np.zeros(n, np.int64)
    for r in range(n):
        sim.seq[r] += 1
        launches[r] = int(sim.h[r]) + 6 * US
        arrive[r] = max(int(sim.gpu_free[r]), int(launches[r]) + lat)
    end = int(arrive.max()) + xfer
    a2a = label == "all_to_all"
    for r in range(n):
        b = sim.builders[r]
        nel = 4_194_304 if a2a else 25_165_824
        comm = comm_kw(b, label, -1, Direction.NONE, nel * 2, nel, "BFloat16", sim.seq[r], 0)
        op = "c10d::alltoall_base_" if a2a else "c10d::allreduce_"
        title = "nccl:all_to_all" if a2a else "nccl:all_reduce"
        e2 = coll_host(b, int(sim.h[r]), op, title, b.pid, k, comm)
        launch = int(launches[r])
        corr = b.api(launch, launch + 4 * US, "cuLaunchKernelEx", b.pid, e2, driver=True)
        kname = _A2A if a2a else _ALLREDUCE
        b.kernel(int(arrive[r]), end, _STREAM_COLL, Kind.COLLECTIVE, kname, corr, launch, e2, step=k, **comm)
        sim.h[r] += 14 * US
    _charge_waits(sim, arrive, end, xfer)


def _charge_waits(sim: _Sim, arrive: npt.NDArray[np.int64], end: int, xfer: int) -> None:
    """Truth of one collective: the transfer, each rank's own host idle, and the waits charged to
    the last arriver's reason to be late (its extra compute or host time since the last sync)."""
    causes = sim.causes
    causes[:, CAUSES.index("exposed_comm")] += xfer
    last = int(np.argmax(arrive))
    d_start = np.maximum(sim.seg_start[last] - sim.seg_start, 0)
    d_host = np.maximum(sim.seg_host[last] - sim.seg_host, 0)
    d_comp = np.maximum(sim.seg_comp[last] - sim.seg_comp, 0)
    wait = end - xfer - arrive
    tot = d_start + d_host + d_comp
    comp_share = np.where(tot > 0, wait * d_comp // np.maximum(tot, 1), 0)
    causes[:, CAUSES.index("imbalance")] += comp_share
    causes[:, CAUSES.index("host")] += wait - comp_share
    # lateness of each rank against the median member (clock-free: from the waits)
    sim.stragglers += np.maximum(int(np.sort(wait)[sim.n // 2]) - wait, 0)
    causes[:, CAUSES.index("host")] += sim.seg_host
    sim.gpu_free[:] = end
    sim.seg_start[:] = end
    sim.seg_host[:] = 0
    sim.seg_comp[:] = 0


def _end_step(
    sim: _Sim,
    t_step: npt.NDArray[np.int64],
    windows: npt.NDArray[np.int64],
    truth_steps: list[list[dict[str, Any]]],
) -> npt.NDArray[np.int64]:
    """The optimizer ends the step and the loop reaches the next step's first launch: the step
    annotation, the window and the truth of the step; returns the next step's starts."""
    prm, k = sim.prm, sim.k
    num = prm.first_step + k
    opt_end = sim.gpu_free.copy()
    t_next = opt_end + round(prm.loop_us * US)
    for r in range(sim.n):
        b = sim.builders[r]
        h = int(sim.h[r])
        ext = b.host(h, int(opt_end[r]) + 3 * US, "aten::item", HostCat.CPU_OP, b.pid, step=k)
        b.api(h + US, int(opt_end[r]) + 2 * US, "cudaStreamSynchronize", b.pid, ext)
        b.host(
            int(t_step[r]), int(t_next[r]), f"ProfilerStep#{num}", HostCat.ANNOTATION, b.pid, num=num, step=k
        )
        windows[r, k] = (t_step[r], t_next[r])
        window = int(t_next[r] - t_step[r])
        sim.causes[r, CAUSES.index("host")] += int(t_next[r] - opt_end[r])
        lost = window - int(sim.compute[r])
        if int(sim.causes[r].sum()) != lost:
            raise AssertionError(f"rank {r} step {k}: truth causes {sim.causes[r].sum()} != lost {lost}")
        truth_steps[r].append(
            {
                "step": num,
                "window_ms": window / MS,
                "compute_ms": int(sim.compute[r]) / MS,
                "lost_ms": lost / MS,
                "causes_ms": {c: int(sim.causes[r, j]) / MS for j, c in enumerate(CAUSES)},
            }
        )
    return t_next


def _rank(
    prm: CollectiveParams, r: int, b: RankBuilder, skew: int, windows: npt.NDArray[np.int64]
) -> SynthRank:
    """Rank ``r`` of the run, with its tables."""
    gpu, rt, host = b.tables()
    return SynthRank(
        rank=r,
        world_size=prm.world,
        pp_rank=0,
        dp_rank=r,
        stages=[0],
        process_groups=[ProcessGroup("0", "default_pg", list(range(prm.world)), "cuda:nccl")],
        pp_group=-1,
        dp_group=0,
        device_index=r % prm.gpus_per_node,
        device_name=prm.device_name,
        host_name=f"node{r // prm.gpus_per_node:02d}",
        pid=b.pid,
        tid=b.pid,
        clock_skew_ns=skew,
        streams=[
            StreamInfo(_STREAM_COMPUTE, StreamRole.COMPUTE),
            StreamInfo(_STREAM_COLL, StreamRole.COLLECTIVE, group=0),
        ],
        gpu=gpu,
        runtime=rt,
        host=host,
        step_windows=windows.copy(),
        step_numbers=[prm.first_step + k for k in range(prm.steps)],
    )


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
