"""The replay's nodes (docs/json.md, *Time accounting*), one per analyzed block, held as columns.

The measured pieces of every block are numpy columns, concatenated once from the steps' own
arrays; what resolving the waits and the label edges adds (a few nodes each) is kept by node id.
:class:`_Node` is one node as a record, built on demand for checks and tests that read the graph
a node at a time; the replay itself reads only the columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
# a measured column: int32 where its values allow (see :func:`narrow`), else int64
Col = npt.NDArray[np.int32] | npt.NDArray[np.int64]

# A measured column is held as int32 where every value lies this far inside int32's range (half
# the graph's memory at a thousand ranks is its node columns): the replay adds a few of a node's
# pieces together in the column's own dtype (the local delays a variant keeps, the duration less
# the delays it removes), which must not overflow; sums over many nodes are taken in int64.
NARROW_LIMIT = 2**31 // 16


def fits(lo: int, hi: int) -> bool:
    """Whether values from ``lo`` to ``hi`` may be held in a narrowed (int32) column."""
    return -NARROW_LIMIT < lo <= hi < NARROW_LIMIT


def narrow(a: Col) -> Col:
    """``a`` as int32 where every value lies within :data:`NARROW_LIMIT` of 0, else as it is."""
    if a.size == 0 or fits(int(a.min()), int(a.max())):
        return a.astype(np.int32)
    return a


class ByNode(MutableMapping[int, Any]):
    """A table by node id held as arrays (a mapping by its API): per node whether it has a value
    (``has``) and the value's ``width`` ints (``val``, 0 where none), where a dict of tuples would
    keep Python objects per node (about ten times the memory at a million waits). A value reads
    back as an int (width 1), a tuple of ints, or with ``listed`` a one-item list of such a tuple
    (a node's label edges). Iteration is in node-id order. ``narrowed``: the values are held as
    int32 until one does not fit (as the node columns, see :func:`narrow`), then as int64."""

    def __init__(self, n: int, width: int = 1, listed: bool = False, narrowed: bool = False) -> None:
        self.has = np.zeros(n, np.bool_)
        self.val: Col = np.zeros((n, width), np.int32) if narrowed else np.zeros((n, width), np.int64)
        self.width, self.listed = width, listed

    def _fit(self, lo: int, hi: int) -> None:
        """Widen the values to int64 where ``[lo, hi]`` does not fit a narrowed table."""
        if self.val.dtype != np.int64 and not fits(lo, hi):
            self.val = self.val.astype(np.int64)

    def _row(self, v: Any) -> Any:
        if self.listed:
            if len(v) != 1:
                raise ValueError("a node has one label edge here")
            v = v[0]
        return v

    def __setitem__(self, i: int, v: Any) -> None:
        row = self._row(v)
        items = [int(x) for x in row] if isinstance(row, tuple | list) else [int(row)]
        self._fit(min(items), max(items))
        self.val[i] = row
        self.has[i] = True

    def __getitem__(self, i: int) -> Any:
        if not (0 <= i < self.has.size and self.has[i]):
            raise KeyError(i)
        row: list[int] = self.val[i].tolist()
        if self.width == 1:
            return row[0]
        return [tuple(row)] if self.listed else tuple(row)

    def __delitem__(self, i: int) -> None:
        if not (0 <= i < self.has.size and self.has[i]):
            raise KeyError(i)
        self.has[i] = False
        self.val[i] = 0

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self.has).tolist())

    def __len__(self) -> int:
        return int(self.has.sum())

    def __contains__(self, i: object) -> bool:
        return isinstance(i, int) and 0 <= i < self.has.size and bool(self.has[i])

    def set_many(self, ids: I64, vals: Iterable[npt.NDArray[np.integer[Any]]]) -> None:
        """Set the nodes ``ids`` at once; ``vals``: one array per item of the value (the label
        edges: producer and latency)."""
        cols = [np.asarray(col) for col in vals]
        for col in cols:
            if col.size:
                self._fit(int(col.min()), int(col.max()))
        for k, col in enumerate(cols):
            self.val[ids, k] = col
        self.has[ids] = True

    def ids(self) -> I64:
        """The node ids that have a value, in order."""
        return np.flatnonzero(self.has)

    def column(self, k: int = 0) -> Col:
        """Item ``k`` of every node's value (0 where none), by node id."""
        return self.val[:, k]


# the measured columns of a node, in :class:`_Node`'s order
MEASURED: tuple[str, ...] = (
    "rank",
    "step",
    "idx",
    "span",
    "busy",
    "in_host",
    "in_ux",
    "in_copy",
    "phase",
    "stage",
    "pre",
    "post",
    "pre_host",
    "pre_coll",
    "pre_ux",
    "pre_copy",
)


@dataclass
class _Node:
    """One block in the replay."""

    rank: int
    step: int
    idx: int
    span: int  # measured end - start
    busy: int
    in_host: int  # host-evidence lost inside the block span
    in_ux: int  # other lost inside the block span
    in_copy: int  # exposed copies inside the block span
    phase: int
    stage: int
    pre: int
    post: int
    pre_host: int
    pre_coll: int
    pre_ux: int
    pre_copy: int
    # the observed wait: (producer node, producer's issue delay, transfer after both sides were ready)
    obs: tuple[int, int, int] | None = None
    # how long before the wait began this rank had posted the operation it waits in (under compute)
    lead: int = 0
    # the rank waits for its own send to complete: no data dependency, overlappable (exposed comm)
    send_wait: bool = False
    # exposed copies on the producer between its block's end and the send's issue
    issue_copy: int = 0
    # the part of the issue delay a host-op producer did not stall in (it went on while its send
    # was held on the way): the data arrived late, removed with the late transfers
    issue_held: int = 0
    # the operation it waits in was queued on the compute stream (could not be posted early)
    on_compute: bool = False
    # a wait on an operation the peer issued at a fixed time (before any analyzed block of its
    # own): (issue time, transfer after both sides were ready)
    obs_abs: tuple[int, int] | None = None
    # a wait on a rank that is not traced: its release stays where it was measured
    release: int | None = None
    # a gap under a transfer that the peer issued only after this block began: local time
    false_wait: bool = False
    edges: list[tuple[int, int]] = field(default_factory=list)  # label dependencies: (producer, latency)


@dataclass
class NodeColumns:
    """Every node of the replay: the measured pieces as columns (``cols``, named as in
    :data:`MEASURED`, and ``on_compute``), and by node id what the waits and labels add (see
    :class:`_Node` for each field)."""

    cols: dict[str, Col]
    on_compute: npt.NDArray[np.bool_]
    obs: ByNode = field(init=False)
    obs_abs: dict[int, tuple[int, int]] = field(default_factory=dict)
    release: dict[int, int] = field(default_factory=dict)
    lead: ByNode = field(init=False)
    send_wait: set[int] = field(default_factory=set)
    issue_copy: ByNode = field(init=False)
    issue_held: dict[int, int] = field(default_factory=dict)
    false_wait: set[int] = field(default_factory=set)
    edges: ByNode = field(init=False)

    def __post_init__(self) -> None:
        # the tables with a value at most nodes (a wait, a label edge) are arrays by node
        n = len(self)
        # (the producers and transfers, and the label edges, narrowed; the leads and the copy
        # delays not: a variant puts a far-past constant among the leads)
        self.obs = ByNode(n, 3, narrowed=True)
        self.lead = ByNode(n)
        self.issue_copy = ByNode(n)
        self.edges = ByNode(n, 2, listed=True, narrowed=True)

    @classmethod
    def concat(cls, parts: list[dict[str, I64]], on_compute: list[int]) -> NodeColumns:
        """The columns of the steps' parts one after the other; ``on_compute``: the node ids whose
        wait's operation was queued on a compute stream."""
        cols: dict[str, Col] = {
            c: np.concatenate([p[c] for p in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
            for c in MEASURED
        }
        oc = np.zeros(cols["rank"].size, np.bool_)
        oc[np.asarray(on_compute, np.int64)] = True
        return cls(cols, oc)

    def __len__(self) -> int:
        return int(self.cols["rank"].size)

    def put(self, name: str, i: int, v: int) -> None:
        """Set column ``name`` of node ``i`` to ``v``, widening the column to int64 first where
        ``v`` lies outside what a narrowed column holds (:func:`narrow`)."""
        col = self.cols[name]
        if col.dtype != np.int64 and not fits(v, v):
            col = self.cols[name] = col.astype(np.int64)
        col[i] = v

    def records(self) -> list[_Node]:
        """Every node as a :class:`_Node` (for checks and tests; the replay reads the columns)."""
        lists = [self.cols[c].tolist() for c in MEASURED]
        out = [_Node(*row) for row in zip(*lists, strict=True)]
        for i in np.flatnonzero(self.on_compute).tolist():
            out[i].on_compute = True
        for i, ob in self.obs.items():
            out[i].obs = ob
        for i, ab in self.obs_abs.items():
            out[i].obs_abs = ab
        for i, rel in self.release.items():
            out[i].release = rel
        for i, ld in self.lead.items():
            out[i].lead = ld
        for i in self.send_wait:
            out[i].send_wait = True
        for i, ic in self.issue_copy.items():
            out[i].issue_copy = ic
        for i, ih in self.issue_held.items():
            out[i].issue_held = ih
        for i in self.false_wait:
            out[i].false_wait = True
        for i, eds in self.edges.items():
            out[i].edges = list(eds)
        return out

    def ids(self, by_id: MutableMapping[int, Any] | dict[int, object] | set[int]) -> I64:
        """The node ids of a by-id table, as an index array."""
        return np.fromiter(by_id, np.int64, len(by_id))


__all__ = ["MEASURED", "NARROW_LIMIT", "ByNode", "Col", "NodeColumns", "_Node", "fits", "narrow"]
