"""Shared pieces of the rules: gains from the what-if predictions, severity against the noise
model, and the builder of a finding (the report's :class:`~ppdiag.report_types.FindingRow`)."""

from __future__ import annotations

from typing import TypeGuard

import msgspec

from ppdiag.report_types import Cause, Evidence, FindingRow, Severity
from ppdiag.rules import RuleContext
from ppdiag.rules.noise import NoiseModel, build_noise

# A finding is worth a user's attention from these shares of the step time on.
HIGH_PCT = 10.0
MEDIUM_PCT = 3.0
MIN_PCT = 1.0


def severity(gain_pct: float | None, noise_pct: float = 0.0) -> str:
    """``high`` / ``medium`` by the share of the step the gain wins back beyond the noise (what
    stands out of what the run varies by anyway); ``low`` when the gain is unknown, small, or within
    the noise."""
    if gain_pct is None or gain_pct <= noise_pct:
        return "low"
    beyond = gain_pct - noise_pct
    if beyond >= HIGH_PCT:
        return "high"
    if beyond >= MEDIUM_PCT:
        return "medium"
    return "low"


def noise_of(ctx: RuleContext) -> NoiseModel:
    """The run's noise model: the context's (the analysis passes the one it built), else one built
    from the context now (the context is a value: nothing is stored into it)."""
    if ctx.noise is not None:
        return ctx.noise
    return build_noise(ctx.run, ctx.pipeline, ctx.steps, ctx.attribution, ctx.report.summary.steps_ms)


def fix_gain_ms(ctx: RuleContext, key: str) -> float | None:
    """Step time (ms) the what-if predicts the fix ``key`` saves (negative: slower); None when no
    prediction was made (no pipeline, or the model cannot describe the run)."""
    if ctx.predictions is None:
        return None
    return ctx.predictions.gain_ms(key)


def fix_step_ms(ctx: RuleContext, key: str) -> float | None:
    """The what-if row's predicted step (ms) of a fix, for the evidence."""
    if ctx.predictions is None:
        return None
    row = ctx.predictions.rows.get(key)
    return None if row is None else row.step_ms


def faster(gain: float | None) -> TypeGuard[float]:
    """Whether a fix is offered: the what-if predicts it saves time."""
    return gain is not None and gain > 0.0


def replay_gain_ms(ctx: RuleContext, variant: str) -> float:
    """Step time saved by a replay variant of the attribution (ms per step), 0 when the replay did
    not run (check ``ctx.attribution.step_replay_ns`` to tell the two apart). For rules whose fix
    has no what-if scenario; a fix with one takes :func:`fix_gain_ms` (the what-if table's number)."""
    rs = ctx.attribution.step_replay_ns
    if "measured" not in rs or variant not in rs:
        return 0.0
    return max(rs["measured"] - rs[variant], 0.0) / 1e6


def mean_cause_ms(ctx: RuleContext, cause: Cause) -> float:
    """The run's mean lost time of ``cause`` per step (ms, ``summary.lost_ms``)."""
    return ctx.report.summary.lost_ms.get(cause, 0.0)


def finding(
    ctx: RuleContext,
    code: str,
    cause: Cause | None,
    title: str,
    gain_ms: float | None,
    evidence: Evidence,
    fixes: list[str],
    stages: list[int] | None = None,
    ranks: list[int] | None = None,
    sev: str | None = None,
    noise_ms: float | None = None,
    fix: str | None = None,
) -> FindingRow:
    """A finding, built as the report's row (gains rounded as the report shows them), with its gain
    (ms per step, None when not computed), the noise it is judged against (``noise_ms``, default:
    the run's base noise) and the what-if fix its gain comes from. ``evidence`` is the rule's own
    type; it gets the common fields of :class:`~ppdiag.report_types.Evidence`: ``noise_ms``,
    ``steps_used``, ``oversubscribed_host`` on such a host and, with a fix, ``whatif_fix`` and
    ``whatif_step_ms`` (the same numbers as the report's what-if row)."""
    step = ctx.step_ms
    nm = noise_of(ctx)
    noise = nm.base_ms() if noise_ms is None else noise_ms
    pct = 100.0 * gain_ms / step if step and gain_ms is not None else None
    ev = msgspec.structs.replace(evidence, noise_ms=r3(noise), steps_used=nm.steps_used)
    if nm.oversubscribed:
        ev = msgspec.structs.replace(ev, oversubscribed_host=True)
    if fix is not None:
        ev = msgspec.structs.replace(ev, whatif_fix=fix, whatif_step_ms=fix_step_ms(ctx, fix))
    return FindingRow(
        code=code,
        cause=cause,
        title=title,
        severity=Severity(sev or severity(pct, 100.0 * noise / step if step else 0.0)),
        stages=list(stages or []),
        ranks=list(ranks or []),
        gain_ms=None if gain_ms is None else round(gain_ms, 3),
        gain_pct=None if pct is None else round(pct, 2),
        evidence=ev,
        fixes=list(fixes),
    )


def r3(v: float) -> float:
    return round(float(v), 3)
