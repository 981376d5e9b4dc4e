"""PP007: step-time jitter."""

from __future__ import annotations

import numpy as np

from ppdiag.report_types import Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import finding, r3
from ppdiag.rules.noise import Z

P95_RATIO = 1.2
# Below this many steps the p95 is the slowest step and the typical steps' spread is a guess: one
# slow step cannot be told from a one-off, so the finding stays low.
SEVERE_MIN_STEPS = 5


class JitterEvidence(Evidence, frozen=True):
    """PP007's evidence: the step time's median and p95, and the slow steps."""

    median_ms: float
    p95_ms: float
    ratio: float  # p95 / median
    slow_steps: list[int]  # ProfilerStep numbers


class JitterRule:
    """What it detects:
    Some steps take much longer than the typical one: the 95th percentile of the step time is well
    above the median.

    Why it matters:
    Slow steps cost throughput directly and make every other measurement noisy; they often come
    from periodic work (checkpoints, evaluation, logging) or a straggler rank.

    How to fix:
    Find the slow steps (listed in the evidence) and what runs in them: checkpointing, evaluation,
    garbage collection, data loader refills, a straggling host; make periodic work asynchronous.

    Example:
    Median step 100 ms, one step in 20 takes 400 ms: p95/median = 1.3 or more.
    """

    code = "PP007"
    name = "step-jitter"
    cause = None
    summary = "Step-time jitter: p95 well above the median."
    evidence = JitterEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        steps = ctx.report.summary.steps_ms
        if len(steps) < 3:
            return []
        med = float(np.median(steps))
        p95 = float(np.percentile(steps, 95))
        if med <= 0 or p95 / med < P95_RATIO:
            return []
        nums = ctx.report.run.steps
        slow = [int(n) for n, v in zip(nums, steps, strict=False) if v > P95_RATIO * med]
        gain = float(np.mean([max(v - med, 0.0) for v in steps]))
        # Slow steps are judged against the spread of the typical ones (robust: the outliers this
        # rule looks for must not widen their own yardstick).
        arr = np.asarray(steps, dtype=np.float64)
        noise = Z * 1.4826 * float(np.median(np.abs(arr - med)))
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"step time jitters: p95 {p95:.1f} ms vs median {med:.1f} ms",
                gain,
                JitterEvidence(median_ms=r3(med), p95_ms=r3(p95), ratio=r3(p95 / med), slow_steps=slow),
                [
                    "look at what runs in the slow steps: checkpoints, evaluation, logging, GC, data refills",
                    "make periodic work asynchronous or move it out of the training step",
                    "compare the slow steps across ranks to find a straggler",
                ],
                noise_ms=noise,
                sev="low" if len(steps) < SEVERE_MIN_STEPS else None,
            )
        ]


register(JitterRule())
