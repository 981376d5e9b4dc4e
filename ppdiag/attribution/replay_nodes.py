"""The replay's nodes (docs/json.md, *Time accounting*), one per analyzed block, held as columns.

The measured pieces of every block are numpy columns, concatenated once from the steps' own
arrays; what resolving the waits and the label edges adds (a few nodes each) is kept by node id.
:class:`_Node` is one node as a record, built on demand for checks and tests that read the graph
a node at a time; the replay itself reads only the columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

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

    cols: dict[str, I64]
    on_compute: npt.NDArray[np.bool_]
    obs: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    obs_abs: dict[int, tuple[int, int]] = field(default_factory=dict)
    release: dict[int, int] = field(default_factory=dict)
    lead: dict[int, int] = field(default_factory=dict)
    send_wait: set[int] = field(default_factory=set)
    issue_copy: dict[int, int] = field(default_factory=dict)
    issue_held: dict[int, int] = field(default_factory=dict)
    false_wait: set[int] = field(default_factory=set)
    edges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def concat(cls, parts: list[dict[str, I64]], on_compute: list[int]) -> NodeColumns:
        """The columns of the steps' parts one after the other; ``on_compute``: the node ids whose
        wait's operation was queued on a compute stream."""
        cols = {
            c: np.concatenate([p[c] for p in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
            for c in MEASURED
        }
        oc = np.zeros(cols["rank"].size, np.bool_)
        oc[np.asarray(on_compute, np.int64)] = True
        return cls(cols, oc)

    def __len__(self) -> int:
        return int(self.cols["rank"].size)

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

    def ids(self, by_id: dict[int, object] | set[int]) -> I64:
        """The node ids of a by-id table, as an index array."""
        return np.fromiter(by_id, np.int64, len(by_id))


__all__ = ["MEASURED", "NodeColumns", "_Node"]
