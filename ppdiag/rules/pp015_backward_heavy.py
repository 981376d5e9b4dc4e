"""PP015: one stage's backward is out of proportion to its forward (activation recomputation, or a
costly backward op) and that excess sets the pipeline's clock."""

from __future__ import annotations

import statistics

from ppdiag.report_types import Cause, Evidence, FindingRow, StageRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, finding, r3

#: A stage's backward / forward ratio counts as out of proportion from this multiple of the other
#: stages' (median) ratio on: recomputing a layer's forward in its backward takes a 2:1 backward to
#: 3:1 (1.5x); timer noise and the embedding / loss layers move the ratio by a few per cent.
RATIO_MIN = 1.25


def _one_to_one(rows: list[StageRow]) -> bool:
    """Whether every stage ran one backward block per forward block and no weight-gradient block:
    then a block's median is a micro-batch's backward on every stage."""
    return all(
        r.wgrad_ms is None and (r.fwd_ms is None or r.bwd_ms is None or r.fwd_ms.n == r.bwd_ms.n)
        for r in rows
    )


def _same_forwards(rows: list[StageRow]) -> bool:
    """Whether every stage ran as many forward blocks per model chunk: one per micro-batch and
    step, as every stage of a pipeline runs them."""
    counts = {r.fwd_ms.n / max(len(r.chunks), 1) for r in rows if r.fwd_ms is not None}
    return len(counts) <= 1


def _block_ms(row: StageRow, one_to_one: bool) -> tuple[float, float] | None:
    """(forward, backward) compute of one micro-batch on a stage (ms), when it has both.

    With one backward block per forward (``one_to_one``), the median blocks: robust to an outlier
    block. Otherwise the backward of a micro-batch is spread over blocks of other shapes: a split
    backward runs an input-gradient and a weight-gradient block where a full one runs one block
    (zero-bubble schedules run both kinds, DualPipeV on some stages more full ones than on
    others), and blocks that run back to back merge. A block's median then compares a full
    backward on one stage with half of one on the next (a balanced DualPipeV run read 1.95x on
    one rank against 1.03x on the others). What every shape keeps is the sum: the stage's whole
    backward compute (both kinds) against its whole forward compute, scaled to the median forward
    block."""
    f, b, w = row.fwd_ms, row.bwd_ms, row.wgrad_ms
    if f is None or b is None or f.p50 <= 0 or b.p50 <= 0:
        return None
    if one_to_one:
        return f.p50, b.p50
    fwd_total = f.mean * f.n
    back_total = b.mean * b.n + (w.mean * w.n if w is not None else 0.0)
    if fwd_total <= 0:
        return None
    return f.p50, f.p50 * back_total / fwd_total


class BackwardHeavyEvidence(Evidence, frozen=True):
    """PP015's evidence: the heavy stage's backward/forward ratio against the other stages'."""

    stage: int
    fwd_ms: float
    bwd_ms: float
    bwd_fwd_ratio: float
    other_stages_ratio: float
    excess_bwd_ms: float  # backward per block beyond the other stages' proportion
    stage_ratios: dict[str, float]
    microbatches: int
    pace_drop_ms: float  # the gain: (M - 1) x this drop of the slowest stage's block


class BackwardHeavyRule:
    """What it detects:
    One stage's backward block is out of proportion to its forward: its backward / forward ratio is
    at least 1.25x the other stages' (a plain layer's backward is about twice its forward on every
    stage), and the excess backward makes it the stage that sets the pipeline's clock. The usual
    reason is activation recomputation (full-layer checkpointing) switched on for that stage, or
    more layers recomputed there; otherwise one costly backward op (a loss or an embedding
    gradient without a fused kernel). The forward alone looks balanced, so splitting layers by
    forward time or by count does not find it. Where a schedule splits the backward (zero-bubble
    schedules, DualPipeV), a stage's backward is its input- and weight-gradient compute together;
    where the blocks do not map onto micro-batches alike on every stage, it says nothing.

    Why it matters:
    The pipeline runs at the pace of its slowest stage once per micro-batch: the excess backward is
    paid M times per step and shows as waiting on every other stage. Recomputation is worth it only
    on a stage with slack; on the slowest stage it costs step time to save memory that the other
    stages may not need.

    How to fix:
    Recompute fewer layers on that stage (Megatron `--recompute-num-layers`,
    `torch.utils.checkpoint` on fewer blocks), or selective recomputation of the attention core
    (`--recompute-granularity selective`) instead of full layers; keep recomputation on the stages
    with slack; if nothing is recomputed, profile that stage's backward kernels.

    Example:
    4 stages, forward 1 ms per micro-batch on every stage, backward 2 ms on stages 0, 1 and 3 and
    3 ms on stage 2 (its forward recomputed): stage 2's ratio is 3.0 against 2.0 elsewhere, its
    block 4 ms against 3 ms; with M=4 the step loses about (M - 1) x 1 = 3 ms to it (the simulator
    measures 2.9 ms).
    """

    code = "PP015"
    name = "backward-heavy-stage"
    cause = Cause.IMBALANCE
    summary = "One stage's backward is out of proportion to its forward (recomputation?) and sets the pace."
    evidence = BackwardHeavyEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        rep = ctx.report
        m = rep.run.microbatches
        plain = _one_to_one(rep.stages)
        if not plain and not _same_forwards(rep.stages):
            # the blocks do not map onto micro-batches alike on every stage (forwards merged with
            # the blocks beside them, or phases read off transfers that a split backward confuses:
            # an unlabelled zero-bubble run read a weight-gradient block as a forward): a ratio of
            # their sums would compare different things, and the stage it named was the wrong one
            return []
        blocks = {
            row.stage: (b, max(len(row.chunks), 1)) for row in rep.stages if (b := _block_ms(row, plain))
        }
        if rep.run.pp < 2 or len(blocks) < 2 or not m or not ctx.step_ms:
            return []
        ratio = {s: b[1] / b[0] for s, (b, _) in blocks.items()}
        heavy = max(ratio, key=lambda s: (ratio[s], -s))
        ref = statistics.median(r for s, r in ratio.items() if s != heavy)
        if ratio[heavy] < RATIO_MIN * ref:
            return []
        (fwd, bwd), chunks = blocks[heavy]
        excess = bwd - ref * fwd  # backward per block beyond the other stages' proportion
        # per micro-batch, every chunk of a rank: the pipeline's clock is the largest of these. Past
        # the first micro-batch each one waits for the slowest stage once: (M - 1) x the clock's
        # drop (the simulator's 1F1B runs lose between M - 1 and M times it)
        cost = {s: sum(b) * k for s, (b, k) in blocks.items()}
        after = {**cost, heavy: cost[heavy] - excess * chunks}
        pace_ms = max(cost.values()) - max(after.values())
        gain = min((m - 1) * pace_ms, sum(rep.summary.lost_ms.values()))
        if 100 * gain / ctx.step_ms < MIN_PCT:
            return []  # the stage has slack: its extra backward costs no step time
        row = next(r for r in rep.stages if r.stage == heavy)
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"stage {heavy}'s backward is {ratio[heavy]:.2f}x its forward where the other stages' "
                f"is {ref:.2f}x: {excess:.2f} ms more backward per micro-batch sets the pipeline's pace",
                gain,
                BackwardHeavyEvidence(
                    stage=heavy,
                    fwd_ms=r3(fwd),
                    bwd_ms=r3(bwd),
                    bwd_fwd_ratio=r3(ratio[heavy]),
                    other_stages_ratio=r3(ref),
                    excess_bwd_ms=r3(excess),
                    stage_ratios={str(s): r3(r) for s, r in sorted(ratio.items())},
                    microbatches=m,
                    pace_drop_ms=r3(pace_ms),
                ),
                [
                    f"if stage {heavy} recomputes activations, recompute fewer layers there (Megatron "
                    "--recompute-num-layers, torch.utils.checkpoint on fewer blocks) or only the "
                    "attention core (--recompute-granularity selective)",
                    "keep recomputation on the stages with slack, not on the one that sets the pace",
                    f"if nothing is recomputed, profile stage {heavy}'s backward kernels (a loss or "
                    "embedding gradient without a fused kernel)",
                ],
                stages=[heavy],
                ranks=sorted(row.ranks),
            )
        ]


register(BackwardHeavyRule())
