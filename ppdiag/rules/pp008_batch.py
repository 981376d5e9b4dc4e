"""PP008: batch arithmetic (global = micro x accumulation x dp; dp = world / (tp x pp); M < 2P)."""

from __future__ import annotations

from ppdiag.report_types import Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import faster, finding, fix_gain_ms, noise_of


def _small_m(text: str) -> bool:
    """Whether a batch problem is "M too small for P" (whose fix is more micro-batches)."""
    return "< 2 × pp" in text or "is smaller than pp" in text


class BatchEvidence(Evidence, frozen=True):
    """PP008's evidence: the problems, then the sizes they come from
    (:class:`ppdiag.whatif.batch.BatchCheck`)."""

    problems: list[str]
    world: int | None
    tp: int
    pp: int
    dp: int | None
    micro_batch: int | None
    global_batch: int | None
    accumulation: int | None  # micro-batches per step per pipeline (M)
    microbatches_seen: int | None


class BatchRule:
    """What it detects:
    Inconsistent or wasteful batch sizes: a world size not divisible by tp x pp, a global batch that
    is not micro-batch x accumulation x dp, a trace whose micro-batch count disagrees with the
    configuration, and M < 2P (the pipeline is mostly bubble). It uses what the trace shows (P, M,
    world size) and the flags --global-batch, --micro-batch and --tp when given.

    Why it matters:
    Wrong arithmetic silently changes the effective batch or leaves ranks idle; M < 2P makes the
    bubble dominate whatever else is tuned.

    How to fix:
    Make the sizes divide; derive gradient-accumulation steps from global / (micro x dp); keep
    M >= 4P where memory allows (smaller micro-batches).

    Example:
    world 64, tp 8, pp 4 -> dp 2; global 512, micro 4 -> M = 64 micro-batches per step.
    """

    code = "PP008"
    name = "batch-arithmetic"
    cause = None
    summary = "Batch arithmetic: global = micro x accumulation x dp, dp = world/(tp x pp), M >= 2P."
    evidence = BatchEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        pp = ctx.pipeline.topology.pp
        bc = ctx.batch  # computed below the rules (ppdiag.api) from the trace and the flags
        if bc is None or (pp <= 1 and not ctx.options.global_batch):
            return []
        problems = list(bc.problems)
        gain: float | None = None
        fixes = ["derive the gradient-accumulation steps as global / (micro x dp) and make every size divide"]
        if any(_small_m(t) for _, t in problems):
            # "M is small for P": its fix is more micro-batches, offered only when what-if predicts
            # M x 2 to be faster (per-micro-batch overheads can make it slower)
            g = fix_gain_ms(ctx, "microbatches_x2")
            if faster(g):
                gain = g
                fixes.append(f"keep M >= {4 * pp} (4 x pp) micro-batches per step where memory allows")
            else:
                problems = [(s, t) for s, t in problems if not _small_m(t)]
        if not problems:
            return []
        noise = noise_of(ctx).base_ms()
        sev = _severity(problems, gain)
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                problems[0][1]
                if len(problems) == 1
                else f"{len(problems)} batch-size problems: " + "; ".join(t for _, t in problems[:2]),
                gain,
                BatchEvidence(
                    problems=[t for _, t in problems],
                    world=bc.world,
                    tp=bc.tp,
                    pp=bc.pp,
                    dp=bc.dp,
                    micro_batch=bc.micro_batch,
                    global_batch=bc.global_batch,
                    accumulation=bc.accumulation,
                    microbatches_seen=bc.microbatches_seen,
                ),
                fixes,
                sev=sev,
                noise_ms=noise,
                fix="microbatches_x2" if gain is not None else None,
            )
        ]


def _severity(problems: list[tuple[str, str]], gain: float | None) -> str | None:
    """The worst problem's, except when "M is small" is all that is left: then the finding is
    judged, as every finding with a gain is, by what more micro-batches win beyond the run's noise
    (None: :func:`~ppdiag.rules.base.finding` grades it). PP001 offers the same fix with the same
    gain, and one report must not call one gain ``medium`` and ``low`` at once."""
    if gain is not None and all(_small_m(t) for _, t in problems):
        return None
    sev_rank = {"high": 0, "medium": 1, "low": 2}
    return min((s for s, _ in problems), key=lambda s: sev_rank[s])


register(BatchRule())
