"""PP004: transfers between stages arrive late although the producer was ready."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ppdiag.report_types import Cause, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, faster, finding, fix_gain_ms, mean_cause_ms, noise_of, r3
from ppdiag.rules.noise import shared_share


class CommWaitRule:
    """What it detects:
    A stage waited for data that its neighbour had already produced: the time from the producer's
    block end to the consumer's release is far above the run's normal transfer latency. The rule
    names the sending rank of the slow links.

    Why it matters:
    Every late transfer stalls the consumer and, through it, the rest of the pipeline. It usually
    means the pipeline traffic crosses a slow link (TCP fallback instead of InfiniBand/RoCE, a
    congested or misconfigured NIC, PCIe instead of NVLink) or the send was posted late.

    How to fix:
    Check the NCCL transport (NCCL_DEBUG=INFO: look for NET/Socket instead of NET/IB, and for
    P2P/IPC within a node); place pipeline stages inside a node and data parallelism across nodes;
    avoid interleaved schedules (v times more transfers) on slow links; batch sends and receives.

    Example:
    Rank 1's sends reach rank 2 8 ms after rank 1 finished each block while other links take
    0.1 ms: rank 2 and everything after it waits 8 ms per micro-batch.
    """

    code = "PP004"
    name = "comm-wait"
    cause = Cause.COMM_WAIT
    summary = "p2p/NCCL waits with the peer ready: slow or late transfers between stages."

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        if ctx.pipeline.topology.pp <= 1 or not ctx.step_ms:
            return []
        cw = mean_cause_ms(ctx, Cause.COMM_WAIT)
        # the fix removes the late transfers: its gain is what-if's "no comm wait" row
        gain = fix_gain_ms(ctx, "no_comm_wait")
        if not faster(gain) or 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        normal = ctx.attribution.normal_latency_ns
        per_link = _late_wait_per_link(ctx, normal)
        top = max(per_link.values(), default=0.0)
        slow = {k: v for k, v in per_link.items() if top > 0 and v >= 0.5 * top}
        senders = _slow_senders(per_link)
        link_ev = {f"{a}->{b}": r3(v / 1e6) for (a, b), v in sorted(slow.items())}
        # On an oversubscribed host every link is late alike, and a link is late by up to what a
        # descheduled process costs (the late-launch time every rank shows per step); only a link
        # that stands out of both is a fault.
        nm = noise_of(ctx)
        top_ms = top / 1e6
        descheduled = min(nm.contention_ms / top_ms, 1.0) if top_ms > 0 else 0.0
        noise = nm.noise_ms(gain, max(shared_share(list(per_link.values())), descheduled))
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                "transfers of rank(s) " + ", ".join(map(str, senders)) + " arrive late "
                f"({top / 1e6:.1f} ms per step of waiting on the slowest link)"
                if senders
                else "stage-to-stage transfers arrive late",
                gain,
                {
                    "comm_wait_ms": r3(cw),
                    "normal_latency_ms": r3(normal / 1e6),
                    "late_wait_ms_per_step_by_link": link_ev,
                    # achieved bandwidth of the links (ppdiag/pipeline/links.py): below any RDMA class
                    "tcp_fallback_suspected": [
                        f"{x.src}->{x.dst}: {x.gbps_median:.2f} GB/s inter-node"
                        for x in ctx.report.links or []
                        if x.tcp_fallback_suspected
                    ],
                },
                [
                    "check the NCCL transport of these links: NCCL_DEBUG=INFO (NET/Socket means TCP "
                    "fallback; expect NET/IB or P2P/NVLink), NIC and GPU affinity",
                    "keep pipeline stages within a node (NVLink) and put data parallelism across nodes",
                    "avoid interleaved schedules on slow links: they send v times more activations",
                ],
                ranks=senders,
                noise_ms=noise,
                fix="no_comm_wait",
            )
        ]


def _late_wait_per_link(ctx: RuleContext, normal: int) -> dict[tuple[int, int], float]:
    """Per link (producer, consumer): how long (ns per step) consumers waited on transfers that
    took longer than the run's ``normal`` latency."""
    waited: dict[tuple[int, int], list[int]] = defaultdict(list)
    for prod, cons, tau, wait in ctx.attribution.edges:
        waited[(prod, cons)].append(min(max(tau - normal, 0), wait))
    return {
        k: float(np.sum(v)) / max(len(ctx.steps) / max(len(ctx.report.ranks), 1), 1)
        for k, v in waited.items()
    }


def _slow_senders(per_link: dict[tuple[int, int], float]) -> list[int]:
    """The ranks that the late links point at.

    A slow rank makes every link it touches slow, in both directions; its neighbours share only
    one of those links each. The producer side of a link weighs a little more, so a slow first or
    last stage is still told apart from its neighbour.
    """
    score: dict[int, float] = defaultdict(float)
    for (a, b), v in per_link.items():
        score[a] += 1.25 * v
        score[b] += v
    best = max(score.values(), default=0.0)
    return sorted(r for r, v in score.items() if best > 0 and v >= 0.8 * best)


register(CommWaitRule())
