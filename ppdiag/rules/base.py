"""Shared pieces of the rules: severity from gain, gains from the replay, the Finding builder."""

from __future__ import annotations

from typing import Any

from ppdiag.diagnosis import Finding
from ppdiag.rules import RuleContext

# A finding is worth a user's attention from these shares of the step time on.
HIGH_PCT = 10.0
MEDIUM_PCT = 3.0
MIN_PCT = 1.0


def severity(gain_pct: float) -> str:
    if gain_pct >= HIGH_PCT:
        return "high"
    if gain_pct >= MEDIUM_PCT:
        return "medium"
    return "low"


def replay_gain_ms(ctx: RuleContext, variant: str) -> float:
    """Step time saved by a replay variant (ms per step), 0 when the replay did not run."""
    rs = ctx.attribution.step_replay_ns
    if "measured" not in rs or variant not in rs:
        return 0.0
    return max(rs["measured"] - rs[variant], 0.0) / 1e6


def mean_cause_ms(ctx: RuleContext, cause: str) -> float:
    return float(ctx.report["summary"]["lost_ms"].get(cause) or 0.0)


def finding(
    ctx: RuleContext,
    code: str,
    cause: str | None,
    title: str,
    gain_ms: float,
    evidence: dict[str, Any],
    fixes: list[str],
    stages: list[int] | None = None,
    ranks: list[int] | None = None,
    sev: str | None = None,
) -> Finding:
    step = ctx.step_ms
    pct = 100.0 * gain_ms / step if step else 0.0
    return Finding(
        code=code,
        cause=cause,
        title=title,
        severity=sev or severity(pct),
        stages=stages or [],
        ranks=ranks or [],
        gain_ms=gain_ms,
        gain_pct=pct,
        evidence=evidence,
        fixes=fixes,
    )


def r3(v: float) -> float:
    return round(float(v), 3)
