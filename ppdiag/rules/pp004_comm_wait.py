"""PP004: transfers between stages arrive late although the producer was ready."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ppdiag.diagnosis import Finding
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, finding, mean_cause_ms, r3, replay_gain_ms


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
    cause = "comm_wait"
    summary = "p2p/NCCL waits with the peer ready: slow or late transfers between stages."

    def check(self, ctx: RuleContext) -> list[Finding]:
        if ctx.pipeline.topology.pp <= 1 or not ctx.step_ms:
            return []
        cw = mean_cause_ms(ctx, "comm_wait")
        gain = replay_gain_ms(ctx, "gain_comm_wait") or cw
        if 100 * max(cw, gain) / ctx.step_ms < MIN_PCT:
            return []
        normal = ctx.attribution.normal_latency_ns
        links: dict[tuple[int, int], list[int]] = defaultdict(list)
        for prod, cons, tau in ctx.attribution.edges:
            links[(prod, cons)].append(tau)
        excess = {k: float(np.median(v)) - normal for k, v in links.items()}
        slow = {k: v for k, v in excess.items() if v > max(0.5 * max(excess.values(), default=0), 1e5)}
        senders = sorted({k[0] for k in slow})
        link_ev = {f"{a}->{b}": r3(np.median(links[(a, b)]) / 1e6) for a, b in sorted(slow)}
        return [finding(
            ctx, self.code, self.cause,
            "transfers from rank(s) " + ", ".join(map(str, senders)) + " arrive late "
            f"({max(slow.values(), default=0) / 1e6:.2f} ms above the normal latency)"
            if senders else "stage-to-stage transfers arrive late", gain,
            {"comm_wait_ms": r3(cw), "normal_latency_ms": r3(normal / 1e6), "slow_links_ms": link_ev},
            ["check the NCCL transport of these links: NCCL_DEBUG=INFO (NET/Socket means TCP fallback; "
             "expect NET/IB or P2P/NVLink), NIC and GPU affinity",
             "keep pipeline stages within a node (NVLink) and put data parallelism across nodes",
             "avoid interleaved schedules on slow links: they send v times more activations"],
            ranks=senders,
        )]


register(CommWaitRule())
