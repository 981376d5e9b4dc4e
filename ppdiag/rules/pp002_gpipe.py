"""PP002: GPipe-style schedule (all forwards, then all backwards)."""

from __future__ import annotations

from ppdiag.model.schedule import Schedule
from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import faster, finding, fix_gain_ms, noise_of, r3, severity


class GpipeEvidence(Evidence, frozen=True):
    """PP002's evidence: the micro-batches each schedule holds in flight, and the fix's gain."""

    schedule: Schedule
    microbatches: int
    pp: int
    activations_in_flight_gpipe: int
    activations_in_flight_1f1b: int
    activation_vs_gpipe_1f1b: float | None  # measured activation memory: 1F1B's / GPipe's
    predicted_gain_ms: float | None  # the what-if fix's gain before it is clamped at 0


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
    cause = Cause.BUBBLE
    summary = "GPipe-style schedule: same bubble as 1F1B but far more activation memory."
    evidence = GpipeEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        pipe = ctx.pipeline
        if pipe.schedule != "gpipe" or pipe.topology.pp <= 1:
            return []
        m, p = pipe.microbatches or 0, pipe.topology.pp
        # The fix is 1F1B, and with the activation memory it frees, more micro-batches: its gain is
        # what-if's "1F1B, M x 2" row. Memory is the point of the switch (1F1B alone has the same
        # bubble), so it is offered unless what-if predicts it slower beyond the noise; a prediction
        # within the noise gains nothing.
        noise = noise_of(ctx).base_ms()
        g_x2 = fix_gain_ms(ctx, "1f1b_microbatches_x2")
        g_1 = fix_gain_ms(ctx, "1f1b")
        if g_1 is not None and g_1 < -noise and (g_x2 is None or g_x2 < -noise):
            return []
        fix = "1f1b_microbatches_x2" if faster(g_x2) else "1f1b"
        gain = fix_gain_ms(ctx, fix)
        act = _activation_share(ctx, m, p)
        gain_out = None if gain is None else max(gain, 0.0)
        sev = _severity(ctx, gain_out, noise, act)
        fixes = [
            "switch to 1F1B (torch.distributed.pipelining.Schedule1F1B): same bubble, at most "
            f"{min(m, p)} micro-batches in flight per stage instead of {m}"
        ]
        if faster(g_x2):
            fixes.append(
                f"spend the freed activation memory on more micro-batches (M={2 * m}) to shrink the "
                f"bubble (what-if: {g_x2:.1f} ms per step faster)"
            )
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"GPipe schedule: every stage holds the activations of all {m} micro-batches",
                gain_out,
                GpipeEvidence(
                    schedule=Schedule.GPIPE,
                    microbatches=m,
                    pp=p,
                    activations_in_flight_gpipe=m,
                    activations_in_flight_1f1b=min(m, p),
                    activation_vs_gpipe_1f1b=None if act is None else r3(act),
                    predicted_gain_ms=None if gain is None else r3(gain),
                ),
                fixes,
                stages=list(range(p)),
                sev=sev,
                noise_ms=noise,
                fix=fix,
            )
        ]


def _activation_share(ctx: RuleContext, m: int, p: int) -> float | None:
    """Activations 1F1B holds against GPipe: what-if's figure, else min(M, P) / M (1F1B holds at
    most P micro-batches, GPipe all M)."""
    row = ctx.predictions.rows.get("1f1b") if ctx.predictions is not None else None
    act = row.activation_vs_measured if row else None
    if act is None and m:
        act = min(m, p) / m
    return act


def _severity(ctx: RuleContext, gain: float | None, noise: float, act: float | None) -> str:
    """By the gain beyond the noise; at least medium when 1F1B frees a quarter of the activations
    (the memory it frees is worth it on its own)."""
    pct = 100 * gain / ctx.step_ms if gain is not None and ctx.step_ms else None
    sev = severity(pct, 100 * noise / ctx.step_ms if ctx.step_ms else 0.0)
    if sev == "low" and act is not None and act <= 0.75:
        sev = "medium"
    return sev


register(GpipeRule())
