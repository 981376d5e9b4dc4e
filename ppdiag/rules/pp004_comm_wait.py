"""PP004: transfers between stages arrive late although the producer was ready."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from ppdiag.attribution.link_latency import LinkLatencies, link_latencies
from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, faster, finding, fix_gain_ms, mean_cause_ms, noise_of, r3
from ppdiag.rules.noise import shared_share


class CommWaitEvidence(Evidence, frozen=True):
    """PP004's evidence: the comm wait, the run's normal latency and the slow links' late waits."""

    comm_wait_ms: float
    normal_latency_ms: float  # the run's fault-free p2p latency
    late_wait_ms_per_step_by_link: dict[str, float]  # "src->dst" -> late waits per step
    link_normal_ms: dict[str, float]  # "src->dst" -> the link's normal transfer time
    tcp_fallback_suspected: list[str]  # links whose bandwidth is below any RDMA class


class CommWaitRule:
    """What it detects:
    A stage waited for data that its neighbour had already produced: the time from the producer's
    block end to the consumer's release is far above the run's normal transfer latency (on host
    ops, a send posted after the block while the producer went on counts: the data was held), and
    the link is slower than the run's other links by more than their spread (every link late alike
    is jitter or a loaded host, not a slow link). A link between two hosts is timed across their
    fitted clock offset and must stand out by what that offset is typically off as well (its
    standard error, the placement's own error included); a link that only this keeps from being
    slow names no rank, and the finding is as uncertain as if it were slow. A link is as late as
    most of its transfers are: a process descheduled on a loaded host makes a few transfers very
    late on any link. On host ops, those the consumer was already waiting for when the producer
    issued time the whole transfer and judge the link when it has a few; a consumer that comes
    later times only what is left (behind a slow GPipe link, every transfer after the first of a
    phase). A transfer due while its consumer was held in its own send calls (over 1 ms of them,
    on a rank that holds its sends in the call: half of its send calls or more over 1 ms) times
    no link: the consumer posted no receive meanwhile, and a gloo producer issues its next send
    only once the last one was received, so the wait is that call's, not the link's (counted in
    a warning; timed as the link's, it named a held rank's neighbours). The rule names the
    sending rank of the slow links.

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
    evidence = CommWaitEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        if ctx.pipeline.topology.pp <= 1 or not ctx.step_ms:
            return []
        cw = mean_cause_ms(ctx, Cause.COMM_WAIT)
        # the fix removes the late transfers: its gain is what-if's "no comm wait" row
        gain = fix_gain_ms(ctx, "no_comm_wait")
        if not faster(gain) or 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        # only a link slower than the run's other links by more than the noise is a fault: every
        # link late alike (jitter, a loaded host) is not
        links = _rule_links(ctx)
        judged = links.slow()
        # a link between two clock domains is timed across their fitted offset: it is slow only
        # when it stands out by what that offset is typically off as well (its standard error,
        # the placement's own error included, not one bound's worst case)
        clock_se = _placement_se(ctx)
        slow = {k: v for k, v in judged.items() if v > links.noise_ns(k, clock_se(k))}
        if not slow:
            return []
        normal = ctx.attribution.normal_latency_ns
        # what consumers waited per step on each link beyond the normal latency: the same
        # lateness that judged the link, over the link's transfers
        per_link = {k: x.late_sum_ns / _steps(ctx) for k, x in links.links.items()}
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
                f"({top / 1e6:.1f} ms per step of late transfers on the slowest link)"
                if senders and top > 0
                else "stage-to-stage transfers arrive late",
                gain,
                CommWaitEvidence(
                    comm_wait_ms=r3(cw),
                    normal_latency_ms=r3(normal / 1e6),
                    late_wait_ms_per_step_by_link=link_ev,
                    link_normal_ms={
                        f"{a}->{b}": r3(x.normal_ns / 1e6) for (a, b), x in sorted(links.links.items())
                    },
                    # achieved bandwidth of the links (ppdiag/pipeline/links.py): below any RDMA class
                    tcp_fallback_suspected=[
                        f"{x.src}->{x.dst}: {x.gbps_median:.2f} GB/s inter-node"
                        for x in ctx.report.links or []
                        if x.tcp_fallback_suspected
                    ],
                ),
                [
                    "check the NCCL transport of these links: NCCL_DEBUG=INFO (NET/Socket means TCP "
                    "fallback; expect NET/IB or P2P/NVLink), NIC and GPU affinity",
                    "keep pipeline stages within a node (NVLink) and put data parallelism across nodes",
                    "avoid interleaved schedules on slow links: they send v times more activations",
                ],
                ranks=senders,
                # the links the clocks could not vouch for might be slow after all: the finding
                # is as uncertain as it would be either way (counted slow, the shared lateness
                # and the contention the noise allows differ)
                noise_ms=max(_link_noise_ms(ctx, links, gain, s, per_link, clock_se) for s in (slow, judged)),
                fix="no_comm_wait",
            )
        ]


def _steps(ctx: RuleContext) -> float:
    return max(len(ctx.steps) / max(len(ctx.report.ranks), 1), 1)


def _placement_se(ctx: RuleContext) -> Callable[[tuple[int, int]], float]:
    """Per link, what the clock offset between its two ends is typically off by, all errors
    counted (0 on one host): the hosts' offset standard errors in quadrature (the fit's, which
    count the placement error no number of transfers averages away, measured on the links within
    a host where the clock is known; docs/clocks.md): a link timed across it carries that error
    on every transfer, one sign each way. The ranks are looked up once, not per link."""
    tl = {t.rank: t for t in ctx.run.ranks}
    if len({t.clock_domain for t in tl.values()}) <= 1:
        return lambda link: 0.0

    def se(link: tuple[int, int]) -> float:
        a, b = tl.get(link[0]), tl.get(link[1])
        return float(a.clock_margin_ns(b)) if a is not None and b is not None else 0.0

    return se


def _rule_links(ctx: RuleContext) -> LinkLatencies:
    """The links as PP004 judges them: on host ops (gloo) a send the producer posted after its
    block while it went on counts from the block's end (the data was held on its way), so each
    transfer is timed from there; on devices these are the attribution's links. A wait whose
    consumer was held in its own call meanwhile times no link: the producer's next send and the
    consumer's receive waited for that call (``edge_consumer_held``; a held rank's neighbours
    were named for it)."""
    att = ctx.attribution
    edges, whole = att.edges, att.edge_whole
    n = len(edges)
    held = att.edge_held if len(att.edge_held) == n else np.zeros(n, np.int64)
    own = att.edge_consumer_held if len(att.edge_consumer_held) == n else np.zeros(n, np.bool_)
    if not held.any() and not own.any():
        return att.links
    keep = ~own
    if not held.any():
        # as the attribution's links, without those waits
        return link_latencies(edges[keep], whole[keep] if len(whole) == n else None)
    timed = edges[keep]
    timed[:, 2] += held[keep]
    return link_latencies(timed)


def _link_noise_ms(
    ctx: RuleContext,
    links: LinkLatencies,
    gain: float,
    slow: dict[tuple[int, int], float],
    per_link: dict[tuple[int, int], float],
    clock_se: Callable[[tuple[int, int]], float],
) -> float:
    """The noise of the fix's gain, judged against the links' spread rather than the step's: the
    share of the gain that the links' shared lateness explains (what every link shows: the slow
    links' lateness beyond the others' is the fault), plus the noise of that lateness beyond the
    others' (``Z`` standard errors per transfer, over a step's transfers, in quadrature), taken as
    the same share of the gain as of that lateness (the gain is what the replay wins back, which a
    GPipe phase pays once per held send, not once per transfer). On an
    oversubscribed CPU host a link is late by up to what a descheduled process costs: that share
    of the gain is noise as well."""
    n_steps = _steps(ctx)
    top_ms = max((per_link.get(k, 0.0) for k in slow), default=0.0) / 1e6
    late_all = sum(x.late_ns * x.n for x in links.links.values())
    beyond = sum(slow[k] * links.links[k].n for k in slow)
    shared = 1.0 - min(beyond / late_all, 1.0) if late_all > 0 else 0.0
    # the gain is the replay's, not the late waits' sum (a GPipe phase pays a held send's delay
    # once, not per transfer): it is as uncertain, relatively, as the lateness it comes from
    spread = math.hypot(*(links.noise_ns(k) * links.links[k].n for k in slow))
    # a slow link between two hosts is timed across their offset, which may be off by its
    # standard error on every transfer alike (one sign per direction: it adds up, it does not
    # average out): that much of its late time the clocks cannot vouch for
    clock = sum(clock_se(k) * links.links[k].n for k in slow)
    spread = math.hypot(spread, clock)
    spread_ms = gain * min(spread / beyond, 1.0) if beyond > 0 else spread / n_steps / 1e6
    nm = noise_of(ctx)
    descheduled = min(nm.contention_ms / top_ms, 1.0) if top_ms > 0 else 0.0
    contention = nm.noise_ms(gain, max(shared_share(list(per_link.values())), descheduled)) - nm.base_ms()
    return shared * gain + spread_ms + contention


def _slow_senders(per_link: dict[tuple[int, int], float]) -> list[int]:
    """The ranks that the late links point at.

    A slow rank makes every link it touches slow, in both directions; its neighbours share only
    one of those links each. The producer side of a link weighs a little more, so a slow first or
    last stage is still told apart from its neighbour: a rank is named when its score is within
    that weight of the best, strictly (the receiver of the one slow link scores exactly the best
    over the weight, and is not named with its sender).
    """
    score: dict[int, float] = defaultdict(float)
    for (a, b), v in per_link.items():
        score[a] += 1.25 * v
        score[b] += v
    best = max(score.values(), default=0.0)
    return sorted(r for r, v in score.items() if best > 0 and 1.25 * v > best)


register(CommWaitRule())
