"""The per-gap cause tables painted a batch of DP replicas per task (the replica map of
:mod:`ppdiag.parsers.scaleout`), after the reducer has settled every rank-step's causes.

:func:`~ppdiag.attribution.paint.paint` cuts each rank-step's lost time by that step's own sets
and cause totals alone: the line it lays the steps on keeps a free unit between two steps, so no
piece of one step ever merges with the next, and a batch of ranks paints exactly the pieces the
whole run would. What the reducer must settle first is the causes: the waits in the DP
collectives move them across replicas. A task therefore receives each rank's steps as the
accounting's task sent them back (:class:`~ppdiag.attribution.rank_steps.PackedSteps`, kept by the
reducer, so nothing is packed twice) and its final causes as one small array, and sends back the
rank's gap table. The reducer puts the tables in the order one process gives them: the ranks with
pieces in the order of the steps, then the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.paint import _ORDER, paint
from ppdiag.attribution.rank_step import RankStep
from ppdiag.attribution.rank_steps import PackedSteps, StepWindowSpec, unpack_steps
from ppdiag.diagnosis import GapTable
from ppdiag.parsers.scaleout import ReplicaMap
from ppdiag.pipeline.blocks import Blocks

#: One rank's part of a paint task: its steps (as the accounting's task packed them, or the steps
#: themselves when a set was not int64) and their causes, ``[steps, 7]`` ns in ``_ORDER``.
PaintItem = tuple[PackedSteps | list[RankStep], npt.NDArray[np.int64]]
#: What :func:`~ppdiag.attribution.causes.attribute` calls to paint the gap tables.
Painter = Callable[[list[RankStep], dict[tuple[int, int], dict[str, int]]], dict[int, GapTable]]


def _steps_of(p: PackedSteps | list[RankStep]) -> list[RankStep]:
    """The rank's steps from what the accounting's task sent back (painting reads no blocks)."""
    if isinstance(p, list):
        return p
    bare = Blocks.empty()
    specs = [StepWindowSpec(row[1], row[2], row[3], row[4], bare) for row in p.head.tolist()]
    return unpack_steps(p, specs)


def _n_steps(p: PackedSteps | list[RankStep]) -> int:
    """How many steps of the rank ``p`` holds."""
    return len(p) if isinstance(p, list) else int(p.head.shape[0])


def paint_batch(items: list[PaintItem]) -> list[GapTable | None]:
    """:func:`paint` of the ranks of a task (a few replicas), one table per item (None for a rank
    without analyzed steps, which one process paints no table for either)."""
    steps: list[RankStep] = []
    causes: dict[tuple[int, int], dict[str, int]] = {}
    ranks: list[int | None] = []
    for p, c in items:
        rs = _steps_of(p)
        ranks.append(rs[0].rank if rs else None)
        steps.extend(rs)
        for s, row in zip(rs, c.tolist(), strict=True):
            causes[(s.rank, s.step)] = dict(zip(_ORDER, row, strict=True))
    tables = paint(steps, causes)
    return [None if r is None else tables[r] for r in ranks]


@dataclass(frozen=True)
class MappedSteps:
    """The accounting as the replica map returned it: each rank's packed steps (in the order of
    the analysis's steps) and the replica groups of indices the map was given."""

    packed: list[PackedSteps | list[RankStep]]
    groups: list[list[int]]


def paint_replicas(
    replica_map: ReplicaMap,
    mapped: MappedSteps,
    steps: list[RankStep],
    causes: dict[tuple[int, int], dict[str, int]],
) -> dict[int, GapTable]:
    """:func:`paint` of ``steps`` (the concatenation of ``mapped``'s ranks' steps) on the replica
    map: the same tables, in the same order."""
    n = [_n_steps(p) for p in mapped.packed]
    if sum(n) != len(steps):  # not the steps the map computed: paint them here
        return paint(steps, causes)
    rows = np.array([[causes[(rs.rank, rs.step)].get(k, 0) for k in _ORDER] for rs in steps], np.int64)
    rows = rows.reshape(len(steps), len(_ORDER))
    cut = np.zeros(len(n) + 1, np.int64)
    np.cumsum(n, out=cut[1:])
    bounds = cut.tolist()
    items = [[(mapped.packed[i], rows[bounds[i] : bounds[i + 1]]) for i in g] for g in mapped.groups]
    got = replica_map(paint_batch, items)
    by_index = dict(zip((i for g in mapped.groups for i in g), got, strict=True))
    # (rank, table) in the order of the steps; one process puts the ranks with pieces first
    pairs = [(steps[bounds[i]].rank, t) for i in range(len(mapped.packed)) if (t := by_index[i]) is not None]
    return dict([x for x in pairs if len(x[1])] + [x for x in pairs if not len(x[1])])


def painter_on(replica_map: ReplicaMap, mapped: MappedSteps) -> Painter:
    """The painter :func:`~ppdiag.attribution.causes.attribute` calls: :func:`paint_replicas` on
    ``replica_map`` with the steps the accounting's map returned."""

    def run(steps: list[RankStep], causes: dict[tuple[int, int], dict[str, int]]) -> dict[int, GapTable]:
        return paint_replicas(replica_map, mapped, steps, causes)

    return run


__all__ = ["MappedSteps", "PaintItem", "Painter", "paint_batch", "paint_replicas", "painter_on"]
