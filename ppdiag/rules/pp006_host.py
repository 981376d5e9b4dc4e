"""PP006: the device starved: work was launched after the gap began."""

from __future__ import annotations

from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, faster, finding, fix_gain_ms, mean_cause_ms, noise_of, r3
from ppdiag.rules.noise import direct_host_ms, shared_share


class HostEvidence(Evidence, frozen=True):
    """PP006's evidence: the host time, each rank's own launch delay, and the ranks that cause it."""

    host_ms: float
    direct_host_ms_per_rank: dict[str, float]
    root_ranks: list[int]
    cpu_only_run: bool


class HostRule:
    """What it detects:
    Idle device time during which the next kernel had not even been launched: the host (Python,
    the data loader, a synchronization, a checkpoint) was late. In a pipeline the other stages then
    wait for the starved one, so their waiting is charged to the same root cause, and the finding
    names the ranks where the starvation starts: their own late launches and, on host ops, the
    calls that only issue a transfer where they take longer than such calls do in the run (a
    send call that blocks its rank).

    Why it matters:
    A host stall on one stage stalls the whole pipeline once per micro-batch.

    How to fix:
    Remove host synchronizations from the step (`.item()`, `.cpu()`, `torch.cuda.synchronize`,
    printing tensors), give the data loader workers and pinned memory, capture the step with CUDA
    graphs, reduce per-micro-batch Python work, check CPU affinity and oversubscription.

    Example:
    Rank 1 spends 5 ms in Python before each micro-batch; ranks 0, 2, 3 wait for it: 5 ms x M per
    step charged to host, with rank 1 named.
    """

    code = "PP006"
    name = "host-bound"
    cause = Cause.HOST
    summary = "Device starved: work launched after the gap began (CPU, Python, data loading, syncs)."
    evidence = HostEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        if not ctx.step_ms:
            return []
        host = mean_cause_ms(ctx, Cause.HOST)
        fix: str | None = None
        gain: float | None
        if ctx.pipeline.topology.pp > 1:
            # the fix removes the stalls: its gain is what-if's "no host stalls" row
            fix = "no_host"
            gain = fix_gain_ms(ctx, fix)
        else:
            gain = host  # one stage: nothing waits for this rank through a schedule
        if not faster(gain) or 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        # each rank's own delay: late launches, and calls that only issued a transfer where they
        # took longer than such calls do in this run (a send call that blocks names its rank,
        # not every rank behind it)
        per_rank = direct_host_ms(ctx.steps, with_calls=True)
        top = max(per_rank.values(), default=0.0)
        # On an oversubscribed host every rank launches late alike; only a rank that stands out is
        # a fault.
        noise = noise_of(ctx).noise_ms(gain, shared_share(list(per_rank.values())))
        roots = sorted(r for r, v in per_rank.items() if top > 0 and v >= 0.5 * top)
        if not roots:
            # no rank launched its work late: the host time is only other ranks' waits, and a
            # finding would name nobody and claim a gain no rank shows (the starved ranks are PP009's)
            return []
        cpu = ctx.report.run.cpu_only
        # the slow issuing calls are named only where they count at the precision printed
        launch = direct_host_ms(ctx.steps)
        calls = max((v - launch.get(r, 0.0) for r, v in per_rank.items() if r in roots), default=0.0)
        how = "with nothing queued" + (
            " or in slow calls that only issue a transfer" if calls >= 0.05 else ""
        )
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"host-bound: the work of rank(s) {', '.join(map(str, roots))} is launched late "
                f"({top:.1f} ms per step {how})",
                gain,
                HostEvidence(
                    host_ms=r3(host),
                    direct_host_ms_per_rank={str(r): r3(v) for r, v in sorted(per_rank.items())},
                    root_ranks=roots,
                    cpu_only_run=bool(cpu),
                ),
                [
                    "remove host synchronizations from the step (.item(), .cpu(), torch.cuda.synchronize, "
                    "printing tensors)",
                    "give the data loader workers and pinned memory; prefetch the next batch",
                    "capture the step with CUDA graphs / reduce per-micro-batch Python work",
                    "check CPU affinity and oversubscription of the host cores",
                ],
                ranks=roots,
                noise_ms=noise,
                fix=fix,
            )
        ]


register(HostRule())
