"""PP003: one stage is slower than the others and sets the pipeline's clock."""

from __future__ import annotations

from ppdiag.facts import stage_balance
from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, faster, finding, fix_gain_ms, mean_cause_ms, noise_of, r3


class ImbalanceEvidence(Evidence, frozen=True):
    """PP003's evidence: each stage's block compute and the slowest stage's ratio to the mean."""

    slowest_stage: int
    slowest_ms: float
    mean_ms: float
    ratio: float
    stage_compute_ms: dict[str, float]  # stage -> mean per-step block compute
    stage_replica_ms: dict[str, dict[str, float]]  # stage -> {rank: its block compute}
    imbalance_ms: float  # the run's mean imbalance per step


class ImbalanceRule:
    """What it detects:
    The compute of one stage per step (its forward and backward blocks) is well above the mean over
    stages. With data-parallel replicas, a stage counts as slow only when it is slow in every
    replica (its fastest rank is judged): one rank above its stage peers is a slow worker (PP009).
    In a pipeline the slowest stage sets the pace: every other stage waits for it once per
    micro-batch, and that waiting shows as idle time on the other ranks.

    Why it matters:
    The loss grows with M: each micro-batch adds the slow stage's excess to every other stage's
    idle time. Balanced stages are the cheapest large win after the bubble.

    How to fix:
    Move layers off the slowest stage (split by measured cost per block, not by layer count: the
    first stage carries the embedding, the last the output layer and the loss); use uneven layer
    splits (Megatron `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`,
    torch.distributed.pipelining split points); recompute activations only on stages with slack.

    Example:
    4 stages at 10, 10, 15, 10 ms per micro-batch: stage 2 is 1.36x the mean; ranks 0, 1, 3 idle
    5 ms per micro-batch waiting for it.
    """

    code = "PP003"
    name = "stage-imbalance"
    cause = Cause.IMBALANCE
    summary = "Slowest stage well above the mean stage cost: the other stages wait for it."
    evidence = ImbalanceEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        topo = ctx.pipeline.topology
        if topo.pp <= 1 or not ctx.step_ms:
            return []
        # the one definition of the slowest stage, shared with the report and the gate
        bal = ctx.balance if ctx.balance is not None else stage_balance(ctx.pipeline)
        per_stage = bal.stage_ms
        slow, mean, ratio = bal.slowest, bal.mean_ms, bal.ratio
        if slow is None or mean is None or ratio is None:
            return []
        imb = mean_cause_ms(ctx, Cause.IMBALANCE)
        # the fix is a rebalanced split: its gain is what-if's "rebalanced stages" row
        gain = fix_gain_ms(ctx, "rebalanced")
        if not faster(gain) or 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        excess = (per_stage[slow] - mean) / per_stage[slow]
        # The imbalance is measured on every micro-batch of every step: its own step-to-step spread
        # says how sure it is. The step total's spread (host contention, late transfers) does not
        # make a slower stage's compute less certain.
        nm = noise_of(ctx)
        noise = nm.cause_ms(ctx.steps, ctx.attribution, "imbalance")
        ranks = sorted(r for r, s in topo.stage_of.items() if s == slow)
        prev_s, next_s = slow - 1, slow + 1
        where = " and ".join(f"stage {x}" for x in (prev_s, next_s) if 0 <= x < topo.pp) or "other stages"
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"stage {slow} is {ratio:.2f}x the mean stage compute; the other stages wait for it",
                gain,
                ImbalanceEvidence(
                    slowest_stage=slow,
                    slowest_ms=r3(per_stage[slow]),
                    mean_ms=r3(mean),
                    ratio=r3(ratio),
                    stage_compute_ms={str(k): r3(v) for k, v in per_stage.items()},
                    # the spread across replicas: a stage is judged by its fastest replica
                    stage_replica_ms={
                        str(k): {str(r): r3(x) for r, x in v.items()} for k, v in bal.replica_ms.items()
                    },
                    imbalance_ms=r3(imb),
                ),
                [
                    f"move about {excess * 100:.0f}% of stage {slow}'s compute to {where} "
                    "(split layers by measured cost, not by count)",
                    "check for extra work on that stage: embedding/output layer, loss, activation "
                    "recomputation, uneven sequence lengths",
                    "ppdiag whatif RUN_DIR --rebalance proposes a split from per-block costs",
                ],
                stages=[slow],
                ranks=ranks,
                noise_ms=noise,
                fix="rebalanced",
            )
        ]


register(ImbalanceRule())
