"""Faults a synthetic run can carry, each with its size and the cause it is the root of.

Ranks in faults are **pipeline ranks** (the position in the pipeline group, 0 = first stage's
rank). With data parallelism (``dp > 1``) every replica carries the same faults, so the
replicas stay in lock-step and the data-parallel collectives never add waits of their own; the
exception is :class:`LateReplica`, which makes one replica late so that the others wait for it in
the data-parallel all-reduce.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SlowStage:
    """Virtual stage ``stage`` computes ``factor`` times slower (all its F, B and W blocks)."""

    stage: int
    factor: float
    cause = "imbalance"


@dataclass(frozen=True)
class SlowLink:
    """Every transfer *sent* by pipeline rank ``rank`` arrives ``delay_ms`` later and/or takes
    ``factor`` times the normal transfer time (a degraded link or a TCP fallback)."""

    rank: int
    delay_ms: float = 0.0
    factor: float = 1.0
    cause = "comm_wait"


@dataclass(frozen=True)
class HostStall:
    """The host of pipeline rank ``rank`` issues every block ``delay_ms`` after its GPU went idle
    (a host sync plus slow Python per micro-batch): the GPU is starved."""

    rank: int
    delay_ms: float
    cause = "host"


@dataclass(frozen=True)
class ExposedAllReduce:
    """The data-parallel gradient all-reduce runs after the last backward with nothing to
    overlap, taking ``ms`` (needs ``dp >= 2``)."""

    ms: float
    cause = "exposed_comm"


@dataclass(frozen=True)
class CommOnCompute:
    """Pipeline p2p runs on the compute stream of ``ranks`` (all ranks when None): sends block the
    next block for the transfer and receives cannot be posted ahead (missing overlap)."""

    ranks: tuple[int, ...] | None = None
    cause = "exposed_comm"


@dataclass(frozen=True)
class SlowStep:
    """One slow step (jitter): at the start of step ``step`` (0-based within the recording) the
    host of ``rank`` (every rank when None) spends ``delay_ms`` before issuing anything, e.g. a
    data-loader hiccup."""

    step: int
    delay_ms: float
    rank: int | None = None
    cause = "host"


@dataclass(frozen=True)
class LateReplica:
    """Every rank of data-parallel replica ``dp_rank`` starts each step ``delay_ms`` late (its data
    loader), so the other replicas wait that long in the data-parallel gradient all-reduce at the
    step's end (needs ``dp >= 2`` and an :class:`ExposedAllReduce`: a blocking all-reduce after the
    last backward). Root cause: the late replica's host."""

    dp_rank: int
    delay_ms: float
    cause = "host"


@dataclass(frozen=True)
class SlowWorker:
    """One worker is slower than the same stage in the other replicas: the ranks of pipeline rank
    ``pp_rank`` in replica ``dp_rank`` compute ``factor`` times slower (a throttled GPU). Its own
    pipeline waits for it (imbalance inside the replica) and the other replicas wait for that
    pipeline in the data-parallel all-reduce (needs ``dp >= 2`` and an :class:`ExposedAllReduce`).
    Root cause: the slow worker's compute (imbalance); the finding is PP009, not PP003."""

    pp_rank: int
    dp_rank: int
    factor: float
    cause = "imbalance"


Fault = (
    SlowStage | SlowLink | HostStall | ExposedAllReduce | CommOnCompute | SlowStep | LateReplica | SlowWorker
)

# the order faults are added in when the truth is computed by differences of simulations
FAULT_ORDER: tuple[type, ...] = (SlowLink, CommOnCompute, ExposedAllReduce, HostStall, SlowStep)


def fault_json(f: Fault) -> dict[str, Any]:
    """A fault as a JSON object: its type, parameters and root cause."""
    d = asdict(f)
    if isinstance(f, CommOnCompute) and f.ranks is not None:
        d["ranks"] = list(f.ranks)
    return {"type": type(f).__name__, **d, "cause": f.cause}
