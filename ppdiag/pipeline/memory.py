"""The ``memory[]`` section: each rank's allocator events read against its pipeline blocks."""

from __future__ import annotations

from ppdiag.model import Run
from ppdiag.model.memory import MemoryRow, memory_row
from ppdiag.pipeline import Pipeline


def memory_section(run: Run, pipe: Pipeline, origin_ns: int) -> list[MemoryRow]:
    """One row per rank with allocator events (:class:`ppdiag.model.memory.MemoryRow`), in rank
    order; empty when no trace has them (then any memory figure, e.g. what-if's, is predicted)."""
    out: list[MemoryRow] = []
    for tl in sorted(run.ranks, key=lambda x: x.rank):
        b = pipe.blocks.get(tl.rank)
        cols = (b.start, b.end, b.phase, b.mb, b.stage) if b is not None and len(b) else None
        topo = pipe.topology
        stage = topo.stage_of.get(tl.rank) if topo.pp > 1 else None
        row = memory_row(tl, origin_ns, cols, stage, topo.pp, pipe.microbatches)
        if row is not None:
            out.append(row)
    return out
