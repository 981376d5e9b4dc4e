"""The report's sections of time and place (``docs/json.md``): each step's critical path
(``critical_path[]``), how a run stopped (``hang``), the pipeline links (``links[]``) and each
rank's top compute kernels (``kernels[]``), and the report's vocabulary of causes (:class:`Cause`).

Part of :mod:`ppdiag.report_types`, which re-exports every name here: import them from there.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import UNSET, UnsetType

from ppdiag.compat import StrEnum


class Cause(StrEnum):
    """The primary cause of a piece of lost time: a key of ``lost_ms`` (docs/json.md). Member order
    is the report order; a gap table stores a cause as its :attr:`code`, its position in it."""

    BUBBLE = "bubble"
    IMBALANCE = "imbalance"
    COMM_WAIT = "comm_wait"
    EXPOSED_COMM = "exposed_comm"
    HOST = "host"
    EXPOSED_COPY = "exposed_copy"
    UNEXPLAINED = "unexplained"

    @property
    def code(self) -> int:
        """The cause's position in the report order (how a gap table's ``cause`` column holds it)."""
        return _CAUSE_CODES[self]

    @classmethod
    def of(cls, code: int) -> Cause:
        """The cause a gap table's ``cause`` column holds as ``code``."""
        return _CAUSE_BY_CODE[int(code)]


_CAUSE_BY_CODE: tuple[Cause, ...] = tuple(Cause)
_CAUSE_CODES: dict[Cause, int] = {c: i for i, c in enumerate(_CAUSE_BY_CODE)}


class PathPiece(msgspec.Struct, frozen=True):
    """One piece of a step's critical path (``critical_path[].pieces[]``).

    ``kind``: ``block`` (a micro-batch block's compute), ``transfer`` (a matched p2p transfer
    from ``peer`` to ``rank``), ``gap`` (lost time on ``rank``, with its ``cause``) or ``other``
    (compute outside the blocks). ``t_ms`` is the piece's start after the path's start. A block
    is one piece; the short gaps inside it stay in its ``lost_ms`` (and in ``by_stage``).
    """

    kind: str
    rank: int
    stage: int | None
    t_ms: float
    dur_ms: float
    phase: str | None = None
    mb: int | None = None
    virtual_stage: int | None = None
    peer: int | None = None
    cause: str | None = None
    lost_ms: dict[str, float] | None = None  # blocks: the lost time inside the block, by cause


class StageShare(msgspec.Struct, frozen=True):
    """Time on the path per stage (``critical_path[].by_stage[]``): the stage's block compute,
    the transfers into it, compute outside blocks, and the lost time on its ranks by cause (ms)."""

    stage: int | None
    ms: dict[str, float]


class CriticalStep(msgspec.Struct, frozen=True):
    """The critical path of one step (``critical_path[]``)."""

    step: int  # ProfilerStep number, or the analyzed step index when unnumbered
    index: int  # analyzed step index
    start_ns: int  # aligned clock
    length_ms: float
    end_rank: int
    start_rank: int
    pieces: list[PathPiece]
    by_stage: list[StageShare]


#: The categories of time on the critical path (``by_stage[].ms`` keys): a block's compute, the
#: transfers into a stage, compute outside blocks, then the lost time by cause.
PATH_CATEGORIES: tuple[str, ...] = ("compute", "transfer", "other", *Cause)


def path_by_stage(paths: Sequence[CriticalStep]) -> list[StageShare]:
    """The stage shares of the critical path: mean ms per step on it, per stage and category
    (:data:`PATH_CATEGORIES`), over ``paths`` (the report's ``critical_path[]``)."""
    if not paths:
        return []
    acc: dict[int | None, dict[str, float]] = {}
    for cs in paths:
        for row in cs.by_stage:
            a = acc.setdefault(row.stage, dict.fromkeys(PATH_CATEGORIES, 0.0))
            for k, v in row.ms.items():
                a[k] += v
    n = len(paths)
    return [
        StageShare(st, {k: v / n for k, v in acc[st].items()})
        for st in sorted(acc, key=lambda x: (x is None, x if x is not None else 0))
    ]


class Wait(msgspec.Struct, frozen=True):
    """One rank inside an operation its partner never joined (``hang.waits[]``).

    ``since_ms`` is when the operation was issued on the run's common clock, ms from the start of
    the run (the first event of any rank); ``waited_ms`` until the rank's trace ends.
    """

    rank: int
    op: str  # "recv" | "send" | "collective"
    name: str  # the operation as the trace names it
    peer: int | None  # the partner rank of a p2p op
    group: str | None  # the process group of a collective
    missing: list[int]  # for a collective: the members that never entered it
    since_ms: float
    waited_ms: float
    open_at_end: bool  # the operation still runs when the rank's trace ends
    step: int | None  # the ProfilerStep number the operation was issued in, when known
    count: int  # operations of this kind on this link/group that were never matched


class LastOp(msgspec.Struct, frozen=True):
    """The last operation a rank's trace shows (``hang.last_ops{}``)."""

    name: str
    kind: str
    start_ms: float
    end_ms: float


class Hang(msgspec.Struct, frozen=True):
    """How the run stopped (``hang``): ``status`` is ``"hang"`` when ranks wait in operations their
    partners never joined and their traces run on, ``"cut"`` when the traces end together in the
    middle of a step. ``root`` is the rank the others wait for (not waiting itself), ``first`` the
    wait on it that began first, ``complete_steps`` the steps every rank completed (the analysis
    uses only those) and ``dropped_steps`` the step numbers left out as partial."""

    status: str
    message: str
    root: int | None
    first: Wait | None
    waits: list[Wait]
    last_ops: dict[str, LastOp]
    trace_end_ms: dict[str, float]
    events_lost: int
    complete_steps: int
    dropped_steps: list[int]


class LinkRow(msgspec.Struct, frozen=True):
    """One pipeline link (``links[]``): bandwidth over the matched transfers, with its spread."""

    src: int
    dst: int
    transfers: int
    bytes_median: float
    gbps_median: float
    gbps_p10: float
    gbps_p90: float
    transfer_ms_median: float
    src_host: str | None
    dst_host: str | None
    scope: str  # "intra-node" | "inter-node" | "unknown"
    likely_class: str  # the slowest class the measured figure fits under
    tcp_fallback_suspected: bool
    slow_vs_median: float | None  # the run's median link over this one (20 = 20x slower)


class Kernel(msgspec.Struct, frozen=True):
    """One of a rank's top compute kernels (``kernels[].top[]``): its time and calls per analyzed
    step, and its share of the rank's compute in those steps (a fraction)."""

    name: str
    ms_per_step: float
    share: float
    calls_per_step: float


class RankKernels(msgspec.Struct, frozen=True):
    """A rank's compute kernels with the most time per analyzed step, most first (``kernels[]``)."""

    rank: int
    top: list[Kernel]


class LayerSplit(msgspec.Struct, frozen=True, kw_only=True):
    """The layer split of a what-if row (``whatif[].split``): the layers each stage holds, and for a
    rebalanced split the slowest stage before and after. A field the scenario has nothing for is
    left out."""

    layers_per_stage: list[int] | UnsetType = UNSET
    ranges: list[tuple[int, int]] | UnsetType = UNSET  # first and last layer of each stage
    names: list[tuple[str, str]] | UnsetType = UNSET  # their names
    source: str  # where the per-layer costs come from
    current_layers_per_stage: list[int] | UnsetType = UNSET
    ideal: bool | UnsetType = UNSET  # no per-layer costs: every stage at the mean cost
    slowest_stage_before: int | UnsetType = UNSET
    slowest_before_ms: float | UnsetType = UNSET
    mean_before_ms: float | UnsetType = UNSET
    stage_ms_before: list[float] | UnsetType = UNSET
    slowest_after_ms: float | UnsetType = UNSET
    stage_ms_after: list[float] | UnsetType = UNSET
