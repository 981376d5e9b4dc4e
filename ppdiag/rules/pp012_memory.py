"""PP012: an activation-memory spike: the schedule holds more micro-batches than it needs."""

from __future__ import annotations

from collections.abc import Mapping

from ppdiag.model.memory import MemoryRow
from ppdiag.report_types import Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import finding, r3

#: The peak is "close to capacity" from this share of the device memory on.
NEAR_CAPACITY = 0.9
#: The peak is "far above the steady level" when the median level is below this share of it.
SPIKE_SHARE = 0.8


class MemorySpikeEvidence(Evidence, frozen=True):
    """PP012's evidence: the worst rank's peak, what it holds at the peak and what 1F1B would."""

    peak_allocated_mb: float
    peak_t_ms: float
    capacity_mb: float | None
    steady_allocated_mb: float
    inflight_at_peak: int
    inflight_needed: int  # what 1F1B holds on that stage
    activation_per_mb_mb: float | None
    predicted_peak_mb: dict[str, float]  # schedule -> its predicted peak
    memory_saved_mb: float | None
    memory_source: str  # "measured": the trace's allocator events
    ranks: dict[str, float]  # every spiking rank -> its peak


class MemorySpikeRule:
    """What it detects:
    A rank whose allocator peak (Kineto `profile_memory=True` `[memory]` events, or nsys
    `--cuda-memory-usage=true` CUDA allocations) is close to the device's capacity or far above
    its steady level, at a moment when the schedule holds more micro-batches in flight (forwards
    done whose backward has not ended) than 1F1B needs on that stage (min(P - s, M)).

    Why it matters:
    "Out of memory although memory isn't full": the activations of every micro-batch in flight
    are alive at once for a moment. GPipe holds all M of them, interleaved schedules more than
    1F1B; the spike, not the average, decides whether the step fits.

    How to fix:
    Run 1F1B instead of GPipe, fewer virtual stages, a smaller micro-batch (more of them), or
    activation checkpointing on the stages with the spike. The evidence gives the peak this rank
    would reach under 1F1B and GPipe from its measured activation memory per micro-batch.

    Example:
    GPipe, P=4, M=8: stage 0 peaks at 1800 MiB with 8 micro-batches in flight, its steady level is
    1350 MiB and each micro-batch holds 100 MiB; 1F1B would hold 4 and peak at 1400 MiB.
    """

    code = "PP012"
    name = "activation-spike"
    cause = None
    summary = "Activation-memory spike: the schedule holds more micro-batches in flight than needed."
    evidence = MemorySpikeEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        rows = ctx.report.memory or []
        topo = ctx.pipeline.topology
        m = ctx.pipeline.microbatches
        if topo.pp < 2 or not m:
            return []
        hits = _spikes(rows, topo.stage_of, topo.pp, m)
        if not hits:
            return []
        row, s, held, needed = max(hits, key=lambda h: h[0].peak_allocated_mb)
        pred = dict(row.predicted_peak_mb)
        saved = row.peak_allocated_mb - pred["1f1b"] if "1f1b" in pred else None
        title = (
            f"activation spike on rank {row.rank} (stage {s}): peak {row.peak_allocated_mb:.0f} MiB"
            + (f" of {row.capacity_mb:.0f} MiB" if row.capacity_mb else "")
            + f" with {held} micro-batches in flight where 1F1B holds {needed}"
        )
        evidence = MemorySpikeEvidence(
            peak_allocated_mb=row.peak_allocated_mb,
            peak_t_ms=row.peak_t_ms,
            capacity_mb=row.capacity_mb,
            steady_allocated_mb=row.steady_allocated_mb,
            inflight_at_peak=held,
            inflight_needed=needed,
            activation_per_mb_mb=row.activation_per_mb_mb,
            predicted_peak_mb=pred,
            memory_saved_mb=r3(saved) if saved is not None else None,
            memory_source="measured",
            ranks={str(h[0].rank): h[0].peak_allocated_mb for h in hits},
        )
        fixes = [
            "run 1F1B instead of GPipe (ScheduleGPipe -> Schedule1F1B): it holds min(P - s, M) "
            "micro-batches on stage s" + (f", peak {pred['1f1b']:.0f} MiB here" if "1f1b" in pred else ""),
            "fewer virtual stages (interleaved schedules hold more micro-batches in flight)",
            "a smaller micro-batch (and more of them) to shrink each one's activations",
            "activation checkpointing (torch.utils.checkpoint) on the stages with the spike",
        ]
        ranks = sorted(h[0].rank for h in hits)
        stages = sorted({h[1] for h in hits})
        sev = "high" if any((h[0].peak_of_capacity or 0.0) >= NEAR_CAPACITY for h in hits) else "medium"
        return [finding(ctx, self.code, None, title, None, evidence, fixes, stages, ranks, sev=sev)]


def _spikes(
    rows: list[MemoryRow], stage_of: Mapping[int, int], pp: int, m: int
) -> list[tuple[MemoryRow, int, int, int]]:
    """(row, stage, micro-batches held at the peak, what 1F1B holds) of every rank that holds more
    than it needs at a peak near the device's capacity or far above its steady level."""
    hits = []
    for row in rows:
        s = stage_of.get(row.rank)
        held = row.inflight_at_peak
        if s is None or held is None:
            continue
        needed = min(pp - s, m)
        near = (row.peak_of_capacity or 0.0) >= NEAR_CAPACITY
        spike = row.steady_allocated_mb < SPIKE_SHARE * row.peak_allocated_mb
        if held > needed and (near or spike):
            hits.append((row, s, held, needed))
    return hits


register(MemorySpikeRule())
