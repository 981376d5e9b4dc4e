"""PP001: the pipeline bubble is large because M is small for P."""

from __future__ import annotations

from ppdiag.facts import step_share_text
from ppdiag.model.schedule import Schedule
from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, faster, finding, fix_gain_ms, mean_cause_ms, r3

# The alternatives PP001 offers beside more micro-batches, each with its what-if fix key.
_ALTERNATIVES = (
    (
        "interleaved_v2",
        "use an interleaved schedule (ScheduleInterleaved1F1B / Megatron virtual-pipeline) with v=2 "
        "if stage-to-stage links are fast",
    ),
    (
        "zero_bubble",
        "use a zero-bubble schedule (ScheduleInterleavedZeroBubble, ZBV) that fills the bubble with "
        "weight-gradient work",
    ),
)


class BubbleEvidence(Evidence, frozen=True):
    """PP001's evidence: the bubble, the shape that makes it, and the alternatives' gains."""

    bubble_ms: float  # mean bubble per step
    bubble_share_pct: float  # of the mean step
    pp: int
    microbatches: int | None
    schedule: Schedule
    theoretical_ratio: float | None  # the schedule's (P-1)/(M+P-1)-style bubble
    measured_ratio: float | None
    alternative_gains_ms: dict[str, float]  # what-if fix -> ms per step it saves


def _predicted(gain: float) -> str:
    return f" (what-if: {gain:.1f} ms per step faster)"


class BubbleRule:
    """What it detects:
    The warm-up and cool-down of the pipeline (the bubble) take a large share of the step because
    the number of micro-batches M is small for the number of stages P: with P stages, every stage
    idles for about (P-1) micro-batch slots per step, so the bubble ratio is (P-1)/(M+P-1) for
    GPipe and 1F1B.

    Why it matters:
    Bubble time is paid on every rank and every step. It is the one loss that more micro-batches
    shrink without any code change.

    How to fix:
    Raise M (more gradient-accumulation micro-batches with a smaller micro-batch size, same global
    batch); with fast stage-to-stage links use an interleaved schedule (v virtual stages per rank
    divide the bubble by v); zero-bubble schedules (ZB-H1, ZBV) fill the bubble with weight-gradient
    work.

    Example:
    P=8, M=8 with 1F1B: bubble 7/15 = 47% of the step. M=32 gives 7/39 = 18%.
    """

    code = "PP001"
    name = "bubble-m-too-small"
    cause = Cause.BUBBLE
    summary = "Pipeline bubble is large: too few micro-batches for the number of stages."
    evidence = BubbleEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        pipe = ctx.pipeline
        if pipe.topology.pp <= 1 or not ctx.step_ms:
            return []
        bubble_ms = mean_cause_ms(ctx, Cause.BUBBLE)
        share = 100 * bubble_ms / ctx.step_ms
        theo = ctx.report.bubble.theoretical_ratio
        # M is "too small" while the schedule itself leaves 10% or more idle (M < ~9(P-1) for 1F1B),
        # or while the measured bubble is that large anyway
        too_small = (theo is not None and theo >= 0.10) or share >= 10.0
        # the finding's fix is more micro-batches: its gain is what-if's M x 2 row; a larger M that
        # what-if predicts to be slower (per-micro-batch overheads) is not offered
        gain = fix_gain_ms(ctx, "microbatches_x2")
        if share < 5.0 or not too_small or not faster(gain):
            return []
        if 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        m, p = pipe.microbatches, pipe.topology.pp
        fixes = [
            f"raise the micro-batches per step from M={m} to M={2 * (m or 1)} or more "
            "(smaller micro-batches, same global batch)" + _predicted(gain)
        ]
        alt: dict[str, float] = {}
        for key, text in _ALTERNATIVES:
            g = fix_gain_ms(ctx, key)
            if faster(g):
                alt[key] = r3(g)
                fixes.append(text + _predicted(g))
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"pipeline bubble takes {step_share_text(ctx.report.summary, 'bubble')} (P={p}, M={m})",
                gain,
                BubbleEvidence(
                    bubble_ms=r3(bubble_ms),
                    bubble_share_pct=r3(share),
                    pp=p,
                    microbatches=m,
                    schedule=pipe.schedule,
                    theoretical_ratio=theo,
                    measured_ratio=ctx.report.bubble.measured_ratio,
                    alternative_gains_ms=alt,
                ),
                fixes,
                stages=list(range(p)),
                fix="microbatches_x2",
            )
        ]


register(BubbleRule())
