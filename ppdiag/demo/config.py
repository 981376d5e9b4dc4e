"""What a demo run records: the configuration, its validation and the pipeline layout it implies.

Nothing here imports torch, so the CLI can validate flags and describe a run before any process
starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ppdiag.errors import InputError
from ppdiag.model.schedule import parse_schedule

#: Schedule name → ``torch.distributed.pipelining`` class name.
SCHEDULE_CLASSES: dict[str, str] = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "looped_bfs": "ScheduleLoopedBFS",
    "zero_bubble": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
#: Schedules that hold one stage per rank.
SINGLE_STAGE = frozenset({"gpipe", "1f1b"})
#: Schedules that place stages ``r`` and ``2P-1-r`` on rank ``r`` (V shape).
V_SHAPED = frozenset({"zbv", "dualpipev"})
#: Schedules that split the backward into input-grad (I) and weight-grad (W) blocks.
SPLIT_BACKWARD = frozenset({"zero_bubble", "zbv", "dualpipev"})
COMPUTE_MODES = ("sleep", "real")

#: Profiler schedule of every run: ``wait`` steps, then ``warmup`` steps, then ``steps`` recorded.
PROFILER_WAIT = 1
PROFILER_WARMUP = 1


def canonical_schedule(name: str) -> str:
    """The canonical schedule name for ``name`` (case, ``-`` and a few aliases tolerated)."""
    try:
        key = parse_schedule(name).value
    except ValueError:
        key = None
    if key not in SCHEDULE_CLASSES:
        raise InputError(
            None, f"demo: unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_CLASSES)}"
        )
    return key


@dataclass
class DemoConfig:
    """One demo run: a small model trained with pipeline parallelism on CPU processes over gloo.

    Costs (``sleep`` mode): every stage holds ``layers_per_stage`` identical blocks by default and one
    micro-batch costs ``fwd_ms`` forward and ``bwd_ms`` backward per *default-sized* stage, i.e. each
    block costs ``fwd_ms / layers_per_stage`` and ``bwd_ms / layers_per_stage``; a stage given more
    blocks through ``stage_layers`` costs proportionally more. ``wgrad_fraction`` of the backward is
    weight-gradient work, which zero-bubble schedules run as separate W blocks.

    ``layer_factors`` (optional, one value per layer of the whole model in model order, i.e.
    ``sum(layers())`` values) multiplies each layer's work: a model whose layers differ in cost, so a
    split by measured cost can be recorded and compared with a split by layer count.

    Faults: ``slow_stage`` runs ``slow_factor``× the work of the others; ``comm_delay_rank``'s sends
    reach their peers ``comm_delay_ms`` late (its own compute is not blocked; with
    ``comm_delay_sync`` each send call blocks the rank until its data leaves); ``host_stall_rank``
    stalls the host for ``host_stall_ms`` with no work before each micro-batch forward. Faults act on
    every step after the first one (which initialises the pipeline).
    """

    schedule: str = "1f1b"
    pp: int = 4
    microbatches: int = 8
    steps: int = 3
    compute: str = "sleep"
    fwd_ms: float = 4.0
    bwd_ms: float = 8.0
    wgrad_fraction: float = 0.5
    layers_per_stage: int = 2
    stage_layers: list[int] | None = None
    layer_factors: list[float] | None = None
    hidden: int = 64
    batch: int | None = None  # global batch rows; None = 8 rows per micro-batch
    slow_stage: int | None = None
    slow_factor: float = 1.0
    comm_delay_ms: float = 0.0
    comm_delay_rank: int | None = None
    comm_delay_sync: bool = False
    host_stall_ms: float = 0.0
    host_stall_rank: int | None = None
    timeout_s: float = 120.0
    seed: int = 0
    record_shapes: bool = False  # torch.profiler's default: no Concrete Inputs (no p2p peers on host ops)

    # ---- derived layout -------------------------------------------------------------------

    @property
    def stages_per_rank(self) -> int:
        """Virtual stages per rank: 1 for GPipe/1F1B, 2 for the looped, zero-bubble and V schedules."""
        return 1 if canonical_schedule(self.schedule) in SINGLE_STAGE else 2

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def total_iterations(self) -> int:
        """Training iterations each rank runs: profiler wait + warmup + the recorded steps."""
        return PROFILER_WAIT + PROFILER_WARMUP + self.steps

    @property
    def rows(self) -> int:
        """Global batch rows."""
        return self.batch if self.batch is not None else 8 * self.microbatches

    def stage_to_rank(self) -> list[int]:
        """Rank of every stage: ``s % P``, or the V shape (stages ``r`` and ``2P-1-r`` on rank ``r``)."""
        p, n = self.pp, self.num_stages
        if canonical_schedule(self.schedule) in V_SHAPED:
            return [s if s < p else n - 1 - s for s in range(n)]
        return [s % p for s in range(n)]

    def stages_of_rank(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.stage_to_rank()) if r == rank]

    def layers(self) -> list[int]:
        """Blocks per stage."""
        if self.stage_layers is not None:
            return list(self.stage_layers)
        return [self.layers_per_stage] * self.num_stages

    def stage_factor(self, stage: int) -> float:
        """Work multiplier of a stage (the slow-stage fault)."""
        return self.slow_factor if self.slow_stage is not None and stage == self.slow_stage else 1.0

    def layer_factor(self, stage: int, index: int) -> float:
        """Work multiplier of the ``index``-th layer of ``stage`` from ``layer_factors`` (1 without)."""
        if self.layer_factors is None:
            return 1.0
        return float(self.layer_factors[sum(self.layers()[:stage]) + index])

    def real_repeats(self, stage: int) -> int:
        """In ``real`` mode a slow stage repeats each block's matmul this many times."""
        return max(1, round(self.stage_factor(stage)))

    def stage_costs_ms(self) -> list[dict[str, float]]:
        """Per stage, the nominal sleep-mode cost of one micro-batch: fwd, bwd (= bwd_input + wgrad)."""
        out = []
        for s, n in enumerate(self.layers()):
            work = sum(self.layer_factor(s, i) for i in range(n))
            scale = work / self.layers_per_stage * self.stage_factor(s)
            bwd = self.bwd_ms * scale
            out.append(
                {
                    "fwd": self.fwd_ms * scale,
                    "bwd": bwd,
                    "bwd_input": bwd * (1.0 - self.wgrad_fraction),
                    "wgrad": bwd * self.wgrad_fraction,
                }
            )
        return out

    def faults(self) -> list[dict[str, Any]]:
        """The injected faults, as recorded in the ground truth."""
        out: list[dict[str, Any]] = []
        s2r = self.stage_to_rank()
        if self.slow_stage is not None and self.slow_factor != 1.0:
            eff = self.slow_factor if self.compute == "sleep" else float(self.real_repeats(self.slow_stage))
            out.append(
                {"kind": "slow_stage", "stage": self.slow_stage, "rank": s2r[self.slow_stage], "factor": eff}
            )
        if self.comm_delay_rank is not None and self.comm_delay_ms > 0:
            out.append(
                {
                    "kind": "comm_delay",
                    "rank": self.comm_delay_rank,
                    "delay_ms": self.comm_delay_ms,
                    "sync": self.comm_delay_sync,
                    "peers": self.neighbours(self.comm_delay_rank),
                }
            )
        if self.host_stall_rank is not None and self.host_stall_ms > 0:
            out.append({"kind": "host_stall", "rank": self.host_stall_rank, "stall_ms": self.host_stall_ms})
        return out

    def neighbours(self, rank: int) -> list[int]:
        """Ranks that exchange activations or gradients with ``rank``."""
        s2r = self.stage_to_rank()
        peers = set()
        for s, r in enumerate(s2r):
            if r != rank:
                continue
            for t in (s - 1, s + 1):
                if 0 <= t < len(s2r) and s2r[t] != rank:
                    peers.add(s2r[t])
        return sorted(peers)

    # ---- validation -----------------------------------------------------------------------

    def validated(self) -> DemoConfig:
        """A copy with a canonical schedule name; raises :class:`InputError` naming the bad setting."""
        cfg = dataclasses.replace(self, schedule=canonical_schedule(self.schedule))
        cfg.stage_layers = list(self.stage_layers) if self.stage_layers is not None else None
        cfg.layer_factors = list(self.layer_factors) if self.layer_factors is not None else None
        _check_sizes(cfg)
        _check_layers(cfg)
        _check_batch_and_faults(cfg)
        self._check_schedule_constraints(cfg, _bad)
        return cfg

    @staticmethod
    def _check_schedule_constraints(cfg: DemoConfig, bad: Callable[[str], InputError]) -> None:
        # The schedule classes reject these in the ranks; catching them here gives a clear message
        # before any process starts.
        m, p, n = cfg.microbatches, cfg.pp, cfg.num_stages
        if cfg.schedule == "1f1b" and m < p:
            raise bad(f"1f1b needs microbatches >= pp ({p}), got {m}")
        if cfg.schedule in ("interleaved_1f1b", "zero_bubble"):
            rounds = max(1, m // p)
            if m % rounds:
                raise bad(
                    f"{cfg.schedule} needs microbatches to be a multiple of the number of rounds "
                    f"max(1, M // pp) = {rounds}, got {m}"
                )
        if cfg.schedule == "dualpipev" and m < n:
            raise bad(f"dualpipev needs microbatches >= the number of stages ({n}), got {m}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DemoConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InputError(None, f"demo: unknown config keys {', '.join(unknown)}")
        return cls(**d)


def _bad(msg: str) -> InputError:
    return InputError(None, f"demo: {msg}")


def _check_sizes(cfg: DemoConfig) -> None:
    """The run's counts and the per-block costs."""
    if not 2 <= cfg.pp <= 64:
        raise _bad(f"pp must be between 2 and 64 processes, got {cfg.pp}")
    if cfg.microbatches < 1:
        raise _bad(f"microbatches must be >= 1, got {cfg.microbatches}")
    if cfg.steps < 1:
        raise _bad(f"steps must be >= 1, got {cfg.steps}")
    if cfg.compute not in COMPUTE_MODES:
        raise _bad(f"compute must be one of {', '.join(COMPUTE_MODES)}, got {cfg.compute!r}")
    for name in ("fwd_ms", "bwd_ms", "comm_delay_ms", "host_stall_ms"):
        v = getattr(cfg, name)
        if not (math.isfinite(v) and v >= 0):
            raise _bad(f"{name} must be a finite number >= 0, got {v}")
    if not 0.0 <= cfg.wgrad_fraction <= 1.0:
        raise _bad(f"wgrad_fraction must be in [0, 1], got {cfg.wgrad_fraction}")
    if cfg.layers_per_stage < 1:
        raise _bad(f"layers_per_stage must be >= 1, got {cfg.layers_per_stage}")


def _check_layers(cfg: DemoConfig) -> None:
    """The layers per stage and the per-layer cost factors, when given."""
    if cfg.stage_layers is not None:
        if len(cfg.stage_layers) != cfg.num_stages:
            raise _bad(
                f"stage_layers has {len(cfg.stage_layers)} entries but the {cfg.schedule} "
                f"schedule on {cfg.pp} ranks has {cfg.num_stages} stages"
            )
        if any(n < 1 for n in cfg.stage_layers):
            raise _bad(f"every stage needs at least one layer, got stage_layers={cfg.stage_layers}")
    if cfg.layer_factors is not None:
        n_layers = sum(cfg.layers())
        if len(cfg.layer_factors) != n_layers:
            raise _bad(
                f"layer_factors has {len(cfg.layer_factors)} entries but the model has {n_layers} layers"
            )
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in cfg.layer_factors):
            raise _bad(f"layer_factors must be finite numbers > 0, got {cfg.layer_factors}")


def _check_batch_and_faults(cfg: DemoConfig) -> None:
    """The model width, the batch split and the injected faults' stage and ranks."""
    if cfg.hidden < 1:
        raise _bad(f"hidden must be >= 1, got {cfg.hidden}")
    if cfg.rows < cfg.microbatches or cfg.rows % cfg.microbatches:
        raise _bad(f"batch ({cfg.rows}) must be a positive multiple of microbatches ({cfg.microbatches})")
    if cfg.slow_stage is not None and not 0 <= cfg.slow_stage < cfg.num_stages:
        raise _bad(f"slow_stage {cfg.slow_stage} is not a stage (0..{cfg.num_stages - 1})")
    if not (math.isfinite(cfg.slow_factor) and cfg.slow_factor > 0):
        raise _bad(f"slow_factor must be > 0, got {cfg.slow_factor}")
    for name in ("comm_delay_rank", "host_stall_rank"):
        r = getattr(cfg, name)
        if r is not None and not 0 <= r < cfg.pp:
            raise _bad(f"{name} {r} is not a rank (0..{cfg.pp - 1})")
    if not (math.isfinite(cfg.timeout_s) and cfg.timeout_s > 0):
        raise _bad(f"timeout_s must be > 0, got {cfg.timeout_s}")
