"""PP004: transfers between stages arrive late although the producer was ready."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ppdiag.attribution.link_latency import sum_per_link
from ppdiag.diagnosis import Finding
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, faster, finding, fix_gain_ms, mean_cause_ms, noise_of, r3
from ppdiag.rules.noise import shared_share


class CommWaitRule:
    """What it detects:
    A stage waited for data that its neighbour had already produced: the time from the producer's
    block end to the consumer's release is far above the run's normal transfer latency, and the
    link is slower than the run's other links by more than their spread (every link late alike is
    jitter or a loaded host, not a slow link). The rule names the sending rank of the slow links.

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
        # the fix removes the late transfers: its gain is what-if's "no comm wait" row
        gain = fix_gain_ms(ctx, "no_comm_wait")
        if not faster(gain) or 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        # only a link slower than the run's other links by more than the noise is a fault: every
        # link late alike (jitter, a loaded host) is not
        links = ctx.attribution.links
        slow = links.slow()
        if not slow:
            return []
        normal = ctx.attribution.normal_latency_ns
        per_link = _late_wait_per_link(ctx, normal)
        slow_wait = {k: per_link.get(k, 0.0) for k in slow}
        top = max(slow_wait.values(), default=0.0)
        senders = _slow_senders(slow_wait)
        link_ev = {f"{a}->{b}": r3(v / 1e6) for (a, b), v in sorted(slow_wait.items()) if v >= 0.5 * top}
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                "transfers of rank(s) " + ", ".join(map(str, senders)) + " arrive late "
                f"({top / 1e6:.1f} ms per step of waiting on the slowest link)"
                if senders and top > 0
                else "stage-to-stage transfers arrive late",
                gain,
                {
                    "comm_wait_ms": r3(cw),
                    "normal_latency_ms": r3(normal / 1e6),
                    "late_wait_ms_per_step_by_link": link_ev,
                    "link_normal_ms": {
                        f"{a}->{b}": r3(x.normal_ns / 1e6) for (a, b), x in sorted(links.links.items())
                    },
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
                noise_ms=_link_noise_ms(ctx, gain, slow, per_link, top / 1e6),
                fix="no_comm_wait",
            )
        ]


def _steps(ctx: RuleContext) -> float:
    return max(len(ctx.steps) / max(len(ctx.report.ranks), 1), 1)


def _link_noise_ms(
    ctx: RuleContext,
    gain: float,
    slow: dict[tuple[int, int], float],
    per_link: dict[tuple[int, int], float],
    top_ms: float,
) -> float:
    """The noise of the fix's gain, judged against the links' spread rather than the step's: the
    share of the gain that the links' shared lateness explains (what every link shows: the slow
    links' lateness beyond the others' is the fault), plus the noise of that lateness beyond the
    others' (``Z`` standard errors per transfer, over a step's transfers, in quadrature). On an
    oversubscribed CPU host a link is late by up to what a descheduled process costs: that share
    of the gain is noise as well."""
    links = ctx.attribution.links
    n_steps = _steps(ctx)
    late_all = sum(x.late_ns * x.n for x in links.links.values())
    beyond = sum(slow[k] * links.links[k].n for k in slow)
    shared = 1.0 - min(beyond / late_all, 1.0) if late_all > 0 else 0.0
    spread_ms = math.hypot(*(links.noise_ns(k) * links.links[k].n for k in slow)) / n_steps / 1e6
    nm = noise_of(ctx)
    descheduled = min(nm.contention_ms / top_ms, 1.0) if top_ms > 0 else 0.0
    contention = nm.noise_ms(gain, max(shared_share(list(per_link.values())), descheduled)) - nm.base_ms()
    return shared * gain + spread_ms + contention


def _late_wait_per_link(ctx: RuleContext, normal: int) -> dict[tuple[int, int], float]:
    """Per link (producer, consumer): how long (ns per step) consumers waited on transfers that
    took longer than the run's ``normal`` latency."""
    e = np.array(ctx.attribution.edges, np.int64).reshape(-1, 4)
    late = np.minimum(np.maximum(e[:, 2] - normal, 0), e[:, 3]).astype(np.float64)
    return {k: v / _steps(ctx) for k, v in sum_per_link(late, e[:, :2]).items()}


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
