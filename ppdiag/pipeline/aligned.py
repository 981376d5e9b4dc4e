"""The run as the pipeline sees it: the parsed ranks on the common clock, with the block labels.

The parser's :class:`~ppdiag.model.RankTimeline` s are never changed by the analysis. The pipeline
builds this view instead: each rank a shallow copy that shares the parsed arrays, its
``clock_offset_ns`` set from the clock fit (:attr:`ppdiag.pipeline.clocks.ClockFit.offsets`) and,
once the blocks are labelled, its label columns pointing at the overlay
(:attr:`ppdiag.pipeline.Pipeline.labels`). Every later layer (attribution, rules, what-if, the
reports) reads the view; re-analysing the parsed run starts again from the parsed columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ppdiag.model import Run
from ppdiag.pipeline.blocks import IntervalLabels


def aligned_run(
    run: Run, offsets: Mapping[int, int], labels: Mapping[int, IntervalLabels] | None = None
) -> Run:
    """A view of ``run`` with each rank's clock offset from ``offsets`` (0 when absent) and, where
    ``labels`` has the rank, its interval labels replaced by (writeable copies of) the overlay.
    No array is copied but the label columns; ``run`` is not changed."""
    ranks = []
    for tl in run.ranks:
        iv = tl.intervals
        lab = labels.get(tl.rank) if labels is not None else None
        if lab is not None:
            # copies: readers of the view may annotate them without reaching the overlay
            iv = dataclasses.replace(iv, phase=lab.phase.copy(), mb=lab.mb.copy(), chunk=lab.chunk.copy())
        ranks.append(dataclasses.replace(tl, clock_offset_ns=int(offsets.get(tl.rank, 0)), intervals=iv))
    return dataclasses.replace(
        run, ranks=ranks, warnings=list(run.warnings), skipped=list(run.skipped), doubts=list(run.doubts)
    )
