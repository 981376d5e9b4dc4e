"""Format-neutral description of a synthetic GPU pipeline run.

A :class:`SynthRun` is what a profiler would have seen on every rank of a pipeline-parallel job,
before any file format is chosen: GPU activities (kernels with their streams, launch correlation
and NCCL metadata), host CUDA API calls (launches, event records, stream waits, syncs) and host
ranges (``ProfilerStep#N``, ``c10d::*`` / ``record_param_comms`` ops, ``nccl:send a->b`` titles,
optional pipeline labels, optimizer ranges). Writers (:mod:`ppsynth.kineto`, an Nsight Systems
writer) only translate these tables; they never invent timing.

Conventions every writer relies on:

* Times are int64 nanoseconds on the **true** common clock, relative to ``SynthRun.epoch_ns``
  (a Unix-epoch time in ns). Rank ``r``'s own clock reads ``true + ranks[r].clock_skew_ns``, so a
  writer emits ``epoch_ns + t + clock_skew_ns`` as the absolute local time of ``t``. An aligner
  that recovers the skew should find ``RankTimeline.clock_offset_ns = -clock_skew_ns`` (up to one
  common constant).
* String columns (``name``, ``coll``, ``dtype``) are ids into ``SynthRun.names``; id 0 is ``""``.
* ``peer`` is always a **global** rank; ``group`` indexes ``SynthRank.process_groups``.
* Each GPU activity with ``correlation >= 0`` has exactly one :class:`RuntimeCalls` row with the
  same correlation on the same rank, and that call starts at ``launch <= start``.
* ``ext_id`` links host ranges, runtime calls and GPU activities the way Kineto's
  ``External id`` does: a launch and its kernel carry the id of the innermost CPU op (for NCCL
  kernels: the ``record_param_comms`` op) open on the host at launch time.
* Ground-truth labels (``phase``, ``mb``, ``stage``, ``step``) are filled on every row where they
  apply; writers only export them as annotations when the scenario asks for annotations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import ColumnTable, ProcessGroup

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]

T = TypeVar("T", bound="_Table")


class HostCat(IntEnum):
    """Category of a host range (maps to Kineto ``cat`` / nsys NVTX vs. OS runtime)."""

    CPU_OP = 0  # an ATen / c10d op: ``aten::mm``, ``c10d::send``, ``record_param_comms``
    ANNOTATION = 1  # a ``record_function`` range: ``ProfilerStep#N``, ``nccl:send 0->1``, labels
    PYTHON = 2  # Python-level host work (data loading, host stalls)


class ApiKind(IntEnum):
    """Which CUDA API a host call belongs to."""

    RUNTIME = 0  # cudaLaunchKernel, cudaEventRecord, cudaStreamWaitEvent, cudaStreamSynchronize
    DRIVER = 1  # cuLaunchKernelEx (NCCL >= 2.19 launches through the driver API)


class StreamRole(IntEnum):
    """What a GPU stream is used for."""

    COMPUTE = 0
    P2P = 1  # NCCL stream of one peer pair (PyTorch keeps one communicator per p2p pair)
    COLLECTIVE = 2  # NCCL stream of a process group's collectives


class _Table(ColumnTable):
    """Column table base: numpy arrays of one length, declared in ``COLUMNS`` / ``DTYPES``."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    DTYPES: ClassVar[dict[str, Any]] = {}
    DEFAULTS: ClassVar[dict[str, int]] = {}
    TIME_COLUMNS: ClassVar[tuple[str, ...]] = ("start", "end")
    OPTIONAL_TIMES: ClassVar[tuple[str, ...]] = ()
    start: I64
    end: I64

    @classmethod
    def empty(cls: type[T]) -> T:
        return cls.from_columns(0, {c: np.zeros(0) for c in cls.COLUMNS})

    def sorted(self: T) -> T:
        """Rows ordered by start time (stable)."""
        return self.take(np.argsort(self.start, kind="stable"))

    def shifted(self: T, delta_ns: int) -> T:
        """A copy with every time column moved by ``delta_ns`` (negative markers are kept)."""
        cols = {c: getattr(self, c).copy() for c in self.COLUMNS}
        for c in self.TIME_COLUMNS:
            a = cols[c]
            mask = a >= 0 if c in self.OPTIONAL_TIMES else slice(None)
            a[mask] += delta_ns
        return type(self)(**cols)


@dataclass
class GpuOps(_Table):
    """GPU activities of one rank: kernels, NCCL kernels, memcpys.

    ``kind`` is :class:`ppdiag.model.Kind`; ``launch`` the host start of the launching runtime call
    (-1 when none); ``coll`` the collective name id (``send``, ``recv``, ``allreduce``; 0 = not
    comm); ``direction`` :class:`ppdiag.model.Direction`; ``bytes``/``nelems`` the payload; ``seq``
    the process group's sequence number; ``stage`` the virtual pipeline stage, ``step`` the step
    index (0-based within the recording).
    """

    start: I64
    end: I64
    stream: I64
    kind: I8
    name: I32
    phase: I8
    mb: I32
    stage: I32
    step: I32
    correlation: I64
    launch: I64
    ext_id: I64
    coll: I32
    peer: I32
    direction: I8
    bytes: I64
    nelems: I64
    dtype: I32
    seq: I64
    group: I32

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "start",
        "end",
        "stream",
        "kind",
        "name",
        "phase",
        "mb",
        "stage",
        "step",
        "correlation",
        "launch",
        "ext_id",
        "coll",
        "peer",
        "direction",
        "bytes",
        "nelems",
        "dtype",
        "seq",
        "group",
    )
    DTYPES: ClassVar[dict[str, Any]] = {
        "start": np.int64,
        "end": np.int64,
        "stream": np.int64,
        "kind": np.int8,
        "name": np.int32,
        "phase": np.int8,
        "mb": np.int32,
        "stage": np.int32,
        "step": np.int32,
        "correlation": np.int64,
        "launch": np.int64,
        "ext_id": np.int64,
        "coll": np.int32,
        "peer": np.int32,
        "direction": np.int8,
        "bytes": np.int64,
        "nelems": np.int64,
        "dtype": np.int32,
        "seq": np.int64,
        "group": np.int32,
    }
    DEFAULTS: ClassVar[dict[str, int]] = {
        "kind": 0,
        "phase": 0,
        "mb": -1,
        "stage": -1,
        "step": -1,
        "correlation": -1,
        "launch": -1,
        "ext_id": -1,
        "coll": 0,
        "peer": -1,
        "direction": 0,
        "bytes": -1,
        "nelems": -1,
        "dtype": 0,
        "seq": -1,
        "group": -1,
    }
    TIME_COLUMNS: ClassVar[tuple[str, ...]] = ("start", "end", "launch")
    OPTIONAL_TIMES: ClassVar[tuple[str, ...]] = ("launch",)


@dataclass
class RuntimeCalls(_Table):
    """Host CUDA API calls of one rank (all on the main thread ``tid``).

    ``correlation`` pairs a launch with its GPU activity (CUPTI assigns one to every call; calls
    that launch nothing still get one). ``api`` is :class:`ApiKind`.
    """

    start: I64
    end: I64
    name: I32
    correlation: I64
    ext_id: I64
    tid: I64
    api: I8

    COLUMNS: ClassVar[tuple[str, ...]] = ("start", "end", "name", "correlation", "ext_id", "tid", "api")
    DTYPES: ClassVar[dict[str, Any]] = {
        "start": np.int64,
        "end": np.int64,
        "name": np.int32,
        "correlation": np.int64,
        "ext_id": np.int64,
        "tid": np.int64,
        "api": np.int8,
    }
    DEFAULTS: ClassVar[dict[str, int]] = {"correlation": -1, "ext_id": -1, "tid": 0, "api": 0}


@dataclass
class HostRanges(_Table):
    """Host ranges of one rank: CPU ops and annotations, properly nested per thread.

    ``cat`` is :class:`HostCat`; ``num`` the step number of ``ProfilerStep#N`` (-1 otherwise);
    ``stage``/``mb``/``phase`` label pipeline annotations and the CPU ops of a block; the comm
    columns (``coll``, ``peer``, ``direction``, ``bytes``, ``nelems``, ``dtype``, ``seq``,
    ``group``) describe ``record_param_comms`` ops and are also set on the enclosing ``c10d::*``
    op and the ``nccl:*`` title.
    """

    start: I64
    end: I64
    name: I32
    cat: I8
    tid: I64
    ext_id: I64
    num: I64
    step: I32
    stage: I32
    mb: I32
    phase: I8
    coll: I32
    peer: I32
    direction: I8
    bytes: I64
    nelems: I64
    dtype: I32
    seq: I64
    group: I32

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "start",
        "end",
        "name",
        "cat",
        "tid",
        "ext_id",
        "num",
        "step",
        "stage",
        "mb",
        "phase",
        "coll",
        "peer",
        "direction",
        "bytes",
        "nelems",
        "dtype",
        "seq",
        "group",
    )
    DTYPES: ClassVar[dict[str, Any]] = {
        "start": np.int64,
        "end": np.int64,
        "name": np.int32,
        "cat": np.int8,
        "tid": np.int64,
        "ext_id": np.int64,
        "num": np.int64,
        "step": np.int32,
        "stage": np.int32,
        "mb": np.int32,
        "phase": np.int8,
        "coll": np.int32,
        "peer": np.int32,
        "direction": np.int8,
        "bytes": np.int64,
        "nelems": np.int64,
        "dtype": np.int32,
        "seq": np.int64,
        "group": np.int32,
    }
    DEFAULTS: ClassVar[dict[str, int]] = {
        "cat": 0,
        "tid": 0,
        "ext_id": -1,
        "num": -1,
        "step": -1,
        "stage": -1,
        "mb": -1,
        "phase": 0,
        "coll": 0,
        "peer": -1,
        "direction": 0,
        "bytes": -1,
        "nelems": -1,
        "dtype": 0,
        "seq": -1,
        "group": -1,
    }


@dataclass
class StreamInfo:
    """One GPU stream of a rank and what it carries (``peer`` / ``group`` for NCCL streams)."""

    id: int
    role: StreamRole
    peer: int = -1
    group: int = -1


@dataclass
class SynthRank:
    """Everything one rank's profiler recorded, plus its identity.

    ``stages`` are the virtual pipeline stages this rank runs (one unless interleaved / V);
    ``pp_rank`` its position in its pipeline group, ``dp_rank`` its data-parallel replica index;
    ``process_groups`` are ``pg_config`` entries (index 0 is ``default_pg``); ``pp_group`` /
    ``dp_group`` index into them (``dp_group`` is -1 when there is no data parallelism).
    ``step_windows`` is an (n_steps, 2) array of ``ProfilerStep`` spans on the true clock and
    ``step_numbers`` their ``N``.
    """

    rank: int
    world_size: int
    pp_rank: int
    dp_rank: int
    stages: list[int]
    process_groups: list[ProcessGroup]
    pp_group: int
    dp_group: int
    device_index: int
    device_name: str
    host_name: str
    pid: int
    tid: int
    clock_skew_ns: int
    streams: list[StreamInfo]
    gpu: GpuOps
    runtime: RuntimeCalls
    host: HostRanges
    step_windows: I64
    step_numbers: list[int]
    backend: str = "nccl"
    nccl_version: str = "2.21.5"

    @property
    def compute_stream(self) -> int:
        return next(s.id for s in self.streams if s.role == StreamRole.COMPUTE)


@dataclass
class SynthRun:
    """A whole synthetic run: every rank, the shared string table, the scenario and its truth.

    ``stage_to_rank[s]`` is the pipeline rank (position in the pipeline group) running virtual
    stage ``s``; with ``dp > 1`` the global rank of pipeline rank ``p`` in replica ``d`` is
    ``p * dp + d`` (Megatron's default order with tp = 1). ``truth`` is the ground-truth JSON
    (see :mod:`ppsynth.scenario`); ``config`` the scenario parameters.
    """

    names: list[str]
    ranks: list[SynthRank]
    epoch_ns: int
    schedule: str
    pp: int
    dp: int
    virtual: int
    microbatches: int
    stage_to_rank: list[int]
    steps: int
    config: dict[str, Any] = field(default_factory=dict)
    truth: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def name(self, idx: int) -> str:
        return self.names[idx] if 0 <= idx < len(self.names) else ""
