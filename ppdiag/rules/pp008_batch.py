"""PP008: batch arithmetic (global = micro x accumulation x dp; dp = world / (tp x pp); M < 2P)."""

from __future__ import annotations

from ppdiag.diagnosis import Finding
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import finding
from ppdiag.rules.pp001_bubble import doubling_gain_ms
from ppdiag.whatif.batch import check_batch


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

    def check(self, ctx: RuleContext) -> list[Finding]:
        pipe = ctx.pipeline
        opts = ctx.options
        pp = pipe.topology.pp
        if pp <= 1 and not opts.get("global_batch"):
            return []
        bc = check_batch(
            ctx.run.world_size,
            pp,
            int(opts.get("tp") or 1),
            opts.get("micro_batch"),
            opts.get("global_batch"),
            pipe.microbatches,
        )
        if not bc.problems:
            return []
        sev_rank = {"high": 0, "medium": 1, "low": 2}
        sev = min((s for s, _ in bc.problems), key=lambda s: sev_rank[s])
        gain = doubling_gain_ms(ctx) if any("M=" in t for _, t in bc.problems) else 0.0
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                bc.problems[0][1]
                if len(bc.problems) == 1
                else f"{len(bc.problems)} batch-size problems: " + "; ".join(t for _, t in bc.problems[:2]),
                gain,
                {
                    "problems": [t for _, t in bc.problems],
                    **{k: v for k, v in bc.to_json().items() if k != "problems"},
                },
                [
                    "derive the gradient-accumulation steps as global / (micro x dp) and make every "
                    "size divide",
                    f"keep M >= {4 * pp} (4 x pp) micro-batches per step where memory allows",
                ],
                sev=sev,
            )
        ]


register(BatchRule())
