"""The per-rank columnar timeline every parser produces and every later layer reads.

One rank is one :class:`RankTimeline`: metadata plus two column tables of numpy arrays,
``intervals`` (device work: kernels, copies, comm, or CPU ops for CPU-only runs) and ``ranges``
(host annotations: steps, pipeline labels, comm issue ops). No Python object per event is kept.
Times are int64 nanoseconds on the rank's own clock; ``clock_offset_ns`` maps them onto the run's
common clock: ``aligned = t + clock_offset_ns``. A parser leaves it 0 and nothing changes a parsed
timeline: the pipeline layer fits the offsets and holds them in its result, with a view of the run
whose ranks carry them (``Pipeline.aligned``, ppdiag/pipeline/aligned.py) for the later layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I16 = npt.NDArray[np.int16]
I8 = npt.NDArray[np.int8]


class Kind(IntEnum):
    """What a device interval is."""

    COMPUTE = 0
    P2P = 1
    COLLECTIVE = 2
    MEMCPY = 3
    MEMSET = 4
    SYNC = 5


KIND_NAMES = {k: k.name.lower() for k in Kind}
COMM_KINDS = (Kind.P2P, Kind.COLLECTIVE)


class Phase(IntEnum):
    """Training phase of an interval or label."""

    UNKNOWN = 0
    FWD = 1
    BWD = 2
    WGRAD = 3
    OPTIM = 4
    OTHER = 5


PHASE_NAMES = {p: p.name.lower() for p in Phase}


class Direction(IntEnum):
    """Direction of a point-to-point transfer, seen from this rank."""

    NONE = 0
    SEND = 1
    RECV = 2
    BOTH = 3  # one grouped SendRecv kernel that carries both


class RangeKind(IntEnum):
    """What a host range (annotation / CPU op kept for later layers) means."""

    STEP = 0  # ProfilerStep#N or an iteration NVTX range; ``num`` = N
    LABEL = 1  # pipeline label: PP:<s>F<mb>, Forward <mb>, Backward <mb>, NVTX forward/backward
    COMM_OP = 2  # host op that issued communication (c10d::send, record_param_comms, nccl:*, gloo:*)
    OTHER = 3  # other kept annotation (optimizer step, data loading, user ranges)
    MODULE = 4  # a model block / layer range (for per-block costs)


T = TypeVar("T", bound="ColumnTable")
# numpy's own dtype object of each column type (see ColumnTable.__post_init__)
_OWN = {t: np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.float64, np.bool_)}


class ColumnTable:
    """Behaviour shared by the column tables: every column a numpy array of the same length,
    named in ``COLUMNS`` with its dtype in ``DTYPES`` and its fill value in ``DEFAULTS``."""

    COLUMNS: ClassVar[tuple[str, ...]]
    DTYPES: ClassVar[Any]
    DEFAULTS: ClassVar[Any]
    REQUIRED: ClassVar[tuple[str, ...]] = ("start", "end")

    def __post_init__(self) -> None:
        # Columns unpickled from a parse worker carry an equal but distinct dtype object, and numpy's
        # ufunc.at (np.add.at, np.minimum.at over a step's or a group's rows) only takes its fast
        # loop for the canonical one: 30x slower on those arrays. A view with the canonical dtype
        # (no copy) is identical data.
        for c in self.COLUMNS:
            a = getattr(self, c, None)
            if not isinstance(a, np.ndarray) or a.dtype is _OWN.get(self.DTYPES[c]):
                continue  # the common case: one identity test
            dt = np.dtype(a.dtype.str) if a.dtype.kind in "biuf" else a.dtype
            if a.dtype is not dt:
                setattr(self, c, a.view(dt))

    def __setstate__(self, state: dict[str, Any]) -> None:
        # unpickling (a parse worker's result) restores the fields without __init__
        self.__dict__.update(state)
        self.__post_init__()

    def __len__(self) -> int:
        return int(getattr(self, self.COLUMNS[0]).shape[0])

    @classmethod
    def empty(cls: type[T]) -> T:
        return cls.from_columns(0, {c: [] for c in cls.REQUIRED})

    @classmethod
    def from_columns(cls: type[T], n: int, cols: dict[str, Any]) -> T:
        """Build from a dict of array-likes; missing columns get their default value."""
        out: dict[str, Any] = {}
        for c in cls.COLUMNS:
            dt = cls.DTYPES[c]
            if c in cols and cols[c] is not None:
                arr = np.asarray(cols[c], dtype=dt)
                if arr.shape != (n,):
                    raise ValueError(f"{cls.__name__}.{c} has shape {arr.shape}, expected ({n},)")
            elif c in cls.DEFAULTS:
                arr = np.full(n, cls.DEFAULTS[c], dtype=dt)
            else:
                raise ValueError(f"{cls.__name__}.{c} is required")
            out[c] = arr
        return cls(**out)

    def take(self: T, idx: Any) -> T:
        """Rows selected by an index array or boolean mask, as a new table."""
        return type(self)(**{c: getattr(self, c)[idx] for c in self.COLUMNS})

    @classmethod
    def concat(cls: type[T], parts: list[T]) -> T:
        """The rows of all ``parts`` in order."""
        if not parts:
            return cls.empty()
        return cls(**{c: np.concatenate([getattr(p, c) for p in parts]) for c in cls.COLUMNS})


@dataclass
class Intervals(ColumnTable):
    """Column table of device intervals; all arrays have the same length.

    ``stream`` is the GPU stream (CPU thread id for CPU-only runs); ``name`` indexes
    :attr:`RankTimeline.names`; ``mb``/``chunk``/``peer``/``seq``/``group`` use -1 for unknown;
    ``launch`` is the host time the work was enqueued, -1 when unknown; ``bytes`` -1 when unknown.
    ``group`` indexes :attr:`RankTimeline.process_groups`.
    """

    start: I64
    end: I64
    stream: I64
    kind: I8
    name: I32
    phase: I8
    mb: I32
    chunk: I16
    peer: I32
    direction: I8
    bytes: I64
    launch: I64
    seq: I64
    group: I32

    COLUMNS = (
        "start",
        "end",
        "stream",
        "kind",
        "name",
        "phase",
        "mb",
        "chunk",
        "peer",
        "direction",
        "bytes",
        "launch",
        "seq",
        "group",
    )
    DTYPES: ClassVar[Any] = {
        "start": np.int64,
        "end": np.int64,
        "stream": np.int64,
        "kind": np.int8,
        "name": np.int32,
        "phase": np.int8,
        "mb": np.int32,
        "chunk": np.int16,
        "peer": np.int32,
        "direction": np.int8,
        "bytes": np.int64,
        "launch": np.int64,
        "seq": np.int64,
        "group": np.int32,
    }
    DEFAULTS: ClassVar[Any] = {
        "stream": 0,
        "kind": 0,
        "name": 0,
        "phase": 0,
        "mb": -1,
        "chunk": -1,
        "peer": -1,
        "direction": 0,
        "bytes": -1,
        "launch": -1,
        "seq": -1,
        "group": -1,
    }

    def sorted(self) -> Intervals:
        """Rows ordered by (start, end)."""
        order = np.lexsort((self.end, self.start))
        return self.take(order)


@dataclass
class Ranges(ColumnTable):
    """Column table of host ranges (annotations and comm-issue ops) kept for later layers.

    ``num`` is the step number for STEP ranges, ``mb`` / ``stage`` / ``phase`` describe a pipeline
    LABEL (``PP:<stage><action><mb>``, ``Forward <mb>``); ``peer`` / ``direction`` / ``bytes`` /
    ``seq`` / ``group`` describe a COMM_OP. ``tid`` is the host thread.
    """

    start: I64
    end: I64
    kind: I8
    name: I32
    tid: I64
    num: I64
    stage: I32
    mb: I32
    phase: I8
    peer: I32
    direction: I8
    bytes: I64
    seq: I64
    group: I32

    COLUMNS = (
        "start",
        "end",
        "kind",
        "name",
        "tid",
        "num",
        "stage",
        "mb",
        "phase",
        "peer",
        "direction",
        "bytes",
        "seq",
        "group",
    )
    DTYPES: ClassVar[Any] = {
        "start": np.int64,
        "end": np.int64,
        "kind": np.int8,
        "name": np.int32,
        "tid": np.int64,
        "num": np.int64,
        "stage": np.int32,
        "mb": np.int32,
        "phase": np.int8,
        "peer": np.int32,
        "direction": np.int8,
        "bytes": np.int64,
        "seq": np.int64,
        "group": np.int32,
    }
    DEFAULTS: ClassVar[Any] = {
        "kind": 3,
        "name": 0,
        "tid": 0,
        "num": -1,
        "stage": -1,
        "mb": -1,
        "phase": 0,
        "peer": -1,
        "direction": 0,
        "bytes": -1,
        "seq": -1,
        "group": -1,
    }

    def of_kind(self, kind: RangeKind) -> Ranges:
        return self.take(self.kind == int(kind))


@dataclass
class ProcessGroup:
    """A process group as the trace describes it (``pg_config``)."""

    name: str
    desc: str
    ranks: list[int]
    backend: str = ""


@dataclass
class RankTimeline:
    """Everything ppdiag keeps about one rank after parsing."""

    rank: int
    source: str
    format: str  # "kineto" | "nsys"
    names: list[str]
    intervals: Intervals
    ranges: Ranges
    world_size: int | None = None
    backend: str | None = None
    device: str | None = None
    cpu_only: bool = False
    process_groups: list[ProcessGroup] = field(default_factory=list)
    clock_offset_ns: int = 0  # 0 as parsed; set only on the pipeline's aligned view
    rank_source: str = "distributedInfo"  # how the rank was decided
    events_total: int = 0
    events_lost: int = 0
    # events kept with an altered field (a negative dur read as zero) or dropped for a bad one
    events_damaged: int = 0
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # the rank's clock domain (its host) and the standard error of its offset against the
    # reference host (docs/clocks.md): set, like the offset, only on the aligned view
    clock_domain: str = ""
    clock_se_ns: int = 0

    def name_of(self, idx: int) -> str:
        return self.names[idx] if 0 <= idx < len(self.names) else "?"

    def clock_margin_ns(self, other: RankTimeline) -> int:
        """How far a time of this rank and one of ``other`` may be off against each other on the
        aligned clock, typically: 0 within one clock domain (one host reads one clock), else the
        two offsets' standard errors in quadrature. A comparison across hosts that decides
        something (which came first) counts a difference within this as too close to tell."""
        if self.clock_domain == other.clock_domain:
            return 0
        return round(math.hypot(self.clock_se_ns, other.clock_se_ns))


class NameTable:
    """Interns strings to int32 ids while a parser runs (one table per rank)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {"": 0}
        self.names: list[str] = [""]

    def id(self, s: str) -> int:
        i = self._ids.get(s)
        if i is None:
            i = len(self.names)
            self._ids[s] = i
            self.names.append(s)
        return i
