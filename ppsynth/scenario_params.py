"""The knobs of a synthetic pipeline scenario (:class:`ScenarioParams`), their validation, the
clock constants and the process-group layout of the job (:class:`Topo`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ppdiag.model.timeline import ProcessGroup
from ppdiag.simulate.schedules import default_virtual
from ppsynth.faults import (
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

TRUTH_CAUSES: tuple[str, ...] = ("bubble", "imbalance", "comm_wait", "exposed_comm", "host")

US = 1_000
MS = 1_000_000
EPOCH_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z

STREAM_COMPUTE = 7
STREAM_DP = 13
STREAM_PP_COLL = 15
STREAM_P2P0 = 17


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


def ns(ms: float) -> int:
    """Milliseconds as integer ns."""
    return round(ms * MS)


def per_stage(val: float | Sequence[float], n: int, what: str) -> list[int]:
    """One ns value per virtual stage from one number or one per stage (ValueError otherwise)."""
    if isinstance(val, (int, float)):
        return [ns(float(val))] * n
    vals = [ns(float(x)) for x in val]
    if len(vals) != n:
        raise ValueError(f"{what}: expected 1 or {n} values (one per virtual stage), got {len(vals)}")
    return vals


def validate(prm: ScenarioParams) -> None:
    """Raise ValueError for a setup the generator cannot build (bad sizes, faults out of range)."""
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
        # one check per fault kind (the kinds share no base), so the two never both apply
        why = _placement_error(f, prm, n_st) or _replica_error(f, prm)
        if why:
            raise ValueError(why)


def _placement_error(f: Fault, prm: ScenarioParams, n_st: int) -> str | None:
    """Why fault ``f`` names a stage, rank or step the run does not have; None when it fits."""
    if isinstance(f, SlowStage) and not 0 <= f.stage < n_st:
        return f"SlowStage: stage {f.stage} outside 0..{n_st - 1}"
    if isinstance(f, (SlowLink, HostStall)) and not 0 <= f.rank < prm.pp:
        return f"{type(f).__name__}: pipeline rank {f.rank} outside 0..{prm.pp - 1}"
    if isinstance(f, SlowStep) and not 0 <= f.step < prm.steps:
        return f"SlowStep: step {f.step} outside 0..{prm.steps - 1}"
    if isinstance(f, SlowStep) and f.rank is not None and not 0 <= f.rank < prm.pp:
        return f"SlowStep: pipeline rank {f.rank} outside 0..{prm.pp - 1}"
    if isinstance(f, CommOnCompute) and f.ranks is not None and any(not 0 <= r < prm.pp for r in f.ranks):
        return f"CommOnCompute: ranks must be within 0..{prm.pp - 1}"
    return None


def _replica_error(f: Fault, prm: ScenarioParams) -> str | None:
    """Why a data-parallel fault ``f`` cannot be built on this run; None when it can."""
    has_allreduce = any(isinstance(x, ExposedAllReduce) for x in prm.faults)
    if isinstance(f, ExposedAllReduce) and prm.dp < 2:
        return "ExposedAllReduce needs data parallelism (dp >= 2)"
    if isinstance(f, LateReplica) and (
        prm.dp < 2 or not 0 <= f.dp_rank < prm.dp or f.delay_ms < 0 or not has_allreduce
    ):
        return "LateReplica needs dp >= 2, a replica in 0..dp-1, delay >= 0, ExposedAllReduce"
    if isinstance(f, SlowWorker) and (
        prm.dp < 2
        or not 0 <= f.dp_rank < prm.dp
        or not 0 <= f.pp_rank < prm.pp
        or f.factor <= 0
        or not has_allreduce
        or any(isinstance(x, LateReplica) for x in prm.faults)
    ):
        return "SlowWorker needs dp >= 2, factor > 0, ExposedAllReduce (no LateReplica)"
    return None


@dataclass
class Topo:
    """The job's process groups: pipeline and data-parallel group of every global rank."""

    pp: int
    dp: int
    s2r: list[int]
    groups: list[ProcessGroup]
    pp_group_of: dict[int, int]  # global rank -> index of its pp group in groups
    dp_group_of: dict[int, int]

    def glob(self, pp_rank: int, dp_rank: int) -> int:
        """Global rank of pipeline rank ``pp_rank`` in replica ``dp_rank``."""
        return pp_rank * self.dp + dp_rank


def topology(pp: int, dp: int, s2r: list[int]) -> Topo:
    """Megatron's default layout (tp = 1): global rank ``p * dp + d``, DP groups built first."""
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
    return Topo(pp, dp, s2r, groups, pp_of, dp_of)
