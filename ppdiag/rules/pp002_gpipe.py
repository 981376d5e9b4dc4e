"""PP002: GPipe-style schedule (all forwards, then all backwards)."""

from __future__ import annotations

from ppdiag.diagnosis import Finding
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import finding
from ppdiag.rules.pp001_bubble import doubling_gain_ms


class GpipeRule:
    """What it detects:
    Every stage runs all forward micro-batches before any backward (GPipe / fill-drain order).

    Why it matters:
    GPipe keeps the activations of all M micro-batches alive until the backward starts; 1F1B has
    the same bubble but holds at most P micro-batches per stage. The memory it frees is what lets
    M grow, and a larger M is what shrinks the bubble.

    How to fix:
    Switch to 1F1B (Schedule1F1B, Megatron's default non-interleaved schedule), then raise M with
    the memory it frees; consider interleaved or zero-bubble schedules next.

    Example:
    P=4, M=4 GPipe: bubble 3/7 = 43%; 1F1B with M=16 (affordable in memory): 3/19 = 16%.
    """

    code = "PP002"
    name = "gpipe-schedule"
    cause = "bubble"
    summary = "GPipe-style schedule: same bubble as 1F1B but far more activation memory."

    def check(self, ctx: RuleContext) -> list[Finding]:
        pipe = ctx.pipeline
        if pipe.schedule != "gpipe" or pipe.topology.pp <= 1:
            return []
        m, p = pipe.microbatches or 0, pipe.topology.pp
        gain = doubling_gain_ms(ctx)
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"GPipe schedule: every stage holds the activations of all {m} micro-batches",
                gain,
                {
                    "schedule": "gpipe",
                    "microbatches": m,
                    "pp": p,
                    "activations_in_flight_gpipe": m,
                    "activations_in_flight_1f1b": min(m, p),
                },
                [
                    "switch to 1F1B (torch.distributed.pipelining.Schedule1F1B): same bubble, at most "
                    f"{min(m, p)} micro-batches in flight per stage instead of {m}",
                    "spend the freed activation memory on more micro-batches (M) to shrink the bubble",
                ],
                stages=list(range(p)),
                sev="medium" if 100 * gain / max(ctx.step_ms, 1e-9) < 10 else "high",
            )
        ]


register(GpipeRule())
