"""Warnings for user overrides that disagree with what the traces show.

A flag such as ``--microbatches``, ``--schedule`` or ``--stage-map`` replaces what the pipeline
rebuild would infer. The override is kept (the user may know better, e.g. for mislabelled traces),
but the inferred value is still computed and compared, so a wrong flag never changes a report
silently.

These lines, with the ``--pp`` one :func:`ppdiag.pipeline.topology.infer_topology` words, are the
only override warnings: the rebuild puts them in ``Pipeline.warnings`` (the report) and in
``Pipeline.overrides``, which the commands repeat on stderr and the gate lists among its warnings.
The schedule is detected here only when ``--schedule`` replaced the detection, and the stages
without the flag only when ``--stage-map`` replaced them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppdiag.pipeline.schedule import detect_schedule, microbatch_count
from ppdiag.pipeline.topology import Topology, infer_topology

if TYPE_CHECKING:
    from ppdiag.model import Run
    from ppdiag.pipeline import PipelineOptions
    from ppdiag.pipeline.blocks import Blocks

# What the schedule detector answers when the blocks do not tell.
_UNDECIDED = ("none", "unknown")


def override_warnings(
    run: Run, opts: PipelineOptions, topo: Topology, blocks: dict[int, Blocks]
) -> list[str]:
    """One line per override (``--stage-map``, ``--schedule``, ``--microbatches``) that differs from
    the value the traces give. ``--pp`` is compared in :func:`infer_topology` itself."""
    out: list[str] = []
    if opts.stage_map:
        inferred = infer_topology(run, None, None)
        if inferred.pp > 1 and inferred.pipelines != topo.pipelines:
            shown = "; ".join(",".join(map(str, line)) for line in inferred.pipelines)
            out.append(
                f"--stage-map {opts.stage_map} disagrees with the trace ({inferred.source}: "
                f"pipelines {shown}); the override is used"
            )
    if topo.pp <= 1 or not any(len(b) for b in blocks.values()):
        return out
    timelines = run.by_rank()
    if opts.schedule:
        detected = detect_schedule(topo, blocks, timelines)
        if detected not in _UNDECIDED and detected != opts.schedule:
            out.append(
                f"--schedule {opts.schedule} disagrees with the trace (its block order is {detected}); "
                "the override is used"
            )
    if opts.microbatches:
        counted = microbatch_count(blocks, topo.virtual, timelines)
        if counted and counted != opts.microbatches:
            out.append(
                f"--microbatches {opts.microbatches} disagrees with the trace ({counted} micro-batches "
                "per step); the override is used"
            )
    return out
