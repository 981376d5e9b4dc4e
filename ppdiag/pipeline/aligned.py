"""The run as the pipeline sees it: the parsed ranks on the common clock, with the block labels.

The parser's :class:`~ppdiag.model.RankTimeline` s are never changed by the analysis. The pipeline
builds this view instead: each rank a shallow copy that shares the parsed arrays, its
``clock_offset_ns`` set from the clock fit (:attr:`ppdiag.pipeline.clocks.ClockFit.offsets`), with its
host's clock domain and offset standard error (``clock_domain``, ``clock_se_ns``) and,
once the blocks are labelled, its label columns pointing at the overlay
(:attr:`ppdiag.pipeline.Pipeline.labels`). Every later layer (attribution, rules, what-if, the
reports) reads the view; re-analysing the parsed run starts again from the parsed columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ppdiag.model import Run
from ppdiag.pipeline.blocks import IntervalLabels
from ppdiag.pipeline.clocks import HostClock


def aligned_run(
    run: Run,
    offsets: Mapping[int, int],
    labels: Mapping[int, IntervalLabels] | None = None,
    hosts: Sequence[HostClock] = (),
) -> Run:
    """A view of ``run`` with each rank's clock offset from ``offsets`` (0 when absent), its clock
    domain and the standard error of its offset from ``hosts`` (the fit's host clocks; one domain
    and 0 when absent) and, where ``labels`` has the rank, its interval labels replaced by
    (writeable copies of) the overlay. No array is copied but the label columns; ``run`` is not
    changed."""
    host = {r: c for c in hosts for r in c.ranks}
    ranks = []
    for tl in run.ranks:
        c = host.get(tl.rank)
        iv = tl.intervals
        lab = labels.get(tl.rank) if labels is not None else None
        if lab is not None:
            # copies: readers of the view may annotate them without reaching the overlay
            iv = dataclasses.replace(iv, phase=lab.phase.copy(), mb=lab.mb.copy(), chunk=lab.chunk.copy())
        ranks.append(
            dataclasses.replace(
                tl,
                clock_offset_ns=int(offsets.get(tl.rank, 0)),
                intervals=iv,
                clock_domain=c.host if c is not None else "",
                clock_se_ns=(c.se_ns or 0) if c is not None else 0,
            )
        )
    return dataclasses.replace(
        run, ranks=ranks, warnings=list(run.warnings), skipped=list(run.skipped), doubts=list(run.doubts)
    )
