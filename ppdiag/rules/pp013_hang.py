"""PP013: the run stopped or hangs: a rank waits in an operation its partner never joined."""

from __future__ import annotations

from ppdiag.report_types import Evidence, FindingRow, LastOp, Wait
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import finding


class HangEvidence(Evidence, frozen=True):
    """PP013's evidence: the ``hang`` section's waits and the root's last op, as the report has them."""

    status: str  # "hang" or "cut"
    root: int | None
    first: Wait | None
    waits: list[Wait]  # the first 16
    waits_total: int
    root_last_op: LastOp | None
    complete_steps: int
    dropped_steps: list[int]
    events_lost: int


class HangRule:
    """What it detects:
    A trace that ends inside a receive whose sender never sent, a send that no rank received, or
    a collective that some members of its group entered and others never did; also a trace cut in
    the middle of a step. Counting per link and per process group names the waiting rank, the
    peer it waits for and since when; following "waits for" ends at the rank that stopped, with
    its last operation.

    Why it matters:
    A rank that never sends blocks its pipeline neighbours, then theirs, until NCCL's watchdog
    times out ("NCCL timeout", "stuck in recv"). The waiting ranks are not the problem; the rank
    at the end of the chain is. A cut trace's last step is partial, so it is left out of the
    analysis, which uses the complete steps only.

    How to fix:
    Look at what the root rank did after its last operation: a crash or an exception (its log),
    a host-side stall (data loading, a checkpoint, a blocking sync), a mismatched schedule (the
    ranks disagree on the number of micro-batches, or a conditional send), or a link that crawls
    (`NCCL_DEBUG=INFO`: `NET/Socket` instead of `NET/IB`). Set `TORCH_NCCL_ASYNC_ERROR_HANDLING=1`
    and a shorter timeout to fail fast, and `TORCH_NCCL_DUMP_ON_TIMEOUT=1` for the flight recorder.

    Example:
    Rank 2 stops in the middle of step 6: rank 3 waits in recv from rank 2 since t=52.4 ms (step
    6); rank 1 waits in send to rank 2; rank 2's last op was its forward's GEMM ending at 54.3 ms.
    """

    code = "PP013"
    name = "hang"
    cause = None
    summary = "The run stopped or hangs: a rank waits in an operation its partner never joined."
    evidence = HangEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        hang = ctx.report.hang
        if hang is None:
            return []
        root = hang.root
        ranks = sorted({w.rank for w in hang.waits} | ({root} if root is not None else set()))
        if not ranks:
            # traces cut together with nobody waiting: the finding is about every traced rank
            ranks = sorted({int(r) for r in hang.trace_end_ms} or {tl.rank for tl in ctx.run.ranks})
        stage_of = ctx.pipeline.topology.stage_of
        stages = sorted({stage_of[r] for r in ranks if r in stage_of}) if ctx.pipeline.topology.pp > 1 else []
        if hang.status == "hang":
            title = f"the run hangs: {hang.message}"
        else:
            title = f"the trace is cut: {hang.message}"
        # the evidence holds the waits and the last op as the JSON report does
        last = hang.last_ops.get(str(root)) if root is not None else None
        evidence = HangEvidence(
            status=hang.status,
            root=root,
            first=hang.first,
            waits=list(hang.waits[:16]),
            waits_total=len(hang.waits),
            root_last_op=last,
            complete_steps=hang.complete_steps,
            dropped_steps=list(hang.dropped_steps),
            events_lost=hang.events_lost,
        )
        fixes = [
            f"look at what rank {root} did after its last op: its log (crash, exception), a host stall "
            "(data loading, checkpoint, a blocking sync), or a conditional or miscounted send"
            if root is not None
            else "profile a full run: the analysis covers only the complete steps",
            "set TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a shorter NCCL timeout to fail fast, and "
            "TORCH_NCCL_DUMP_ON_TIMEOUT=1 to get the flight recorder's last collectives",
            "NCCL_DEBUG=INFO: a link on NET/Socket instead of NET/IB crawls (TCP fallback)",
        ]
        sev = "high" if hang.status == "hang" else ("medium" if hang.waits else "info")
        return [finding(ctx, self.code, None, title, None, evidence, fixes, stages, ranks, sev=sev)]


register(HangRule())
