"""PP005: communication with no compute beside it although overlap was possible."""

from __future__ import annotations

import numpy as np
from msgspec import UNSET, UnsetType

from ppdiag.facts import step_share_text
from ppdiag.model import Kind, Run
from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import faster, finding, fix_gain_ms, mean_cause_ms, noise_of, r3

MIN_SHARE_PCT = 2.0


class ExposedCommEvidence(Evidence, frozen=True):
    """PP005's evidence: the exposed communication by kind and its worst ranks."""

    exposed_comm_ms: float
    exposed_p2p_ms: float
    exposed_collective_ms: float
    worst_ranks: dict[str, float]  # rank -> its exposed communication (ms per step)
    p2p_peer_unknown_ms: float | UnsetType = UNSET  # p2p whose peer was not matched (when any)


class ExposedCommRule:
    """What it detects:
    Communication transfer time that ran with no compute beside it: p2p transfers on the critical
    path (blocking sends before the next micro-batch, p2p on the compute stream) and collectives
    such as the data-parallel gradient all-reduce or the optimizer's collectives left exposed at
    the end of the step. When the pipeline cannot be rebuilt, p2p kernels whose peer the trace
    does not name are not counted: their time cannot be told apart from waiting for that peer.

    Why it matters:
    Transfers can run on their own stream while the next micro-batch computes; when they do not,
    every byte moved is paid in step time.

    How to fix:
    Issue p2p asynchronously on a separate stream (batch_isend_irecv, Megatron's overlap of p2p
    communication), overlap the gradient reduce with the backward (DDP buckets,
    `--overlap-grad-reduce`, FSDP prefetch), batch small transfers.

    Example:
    A 6 ms gradient all-reduce after the last backward on every rank: 6 ms per step that an
    overlapped reduce hides almost completely.
    """

    code = "PP005"
    name = "exposed-comm"
    cause = Cause.EXPOSED_COMM
    summary = "Communication with no compute beside it although overlap was possible."
    evidence = ExposedCommEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        if not ctx.step_ms:
            return []
        ex = mean_cause_ms(ctx, Cause.EXPOSED_COMM)
        rows = ctx.report.ranks
        p2p = float(np.mean([r.exposed_p2p_ms for r in rows])) if rows else 0.0
        coll = float(np.mean([r.exposed_collective_ms for r in rows])) if rows else 0.0
        fix: str | None = None
        gain: float | None
        unmatched = 0.0
        if ctx.pipeline.topology.pp > 1:
            # the fix overlaps the transfers: its gain is what-if's "overlapped comm" row
            fix = "no_exposed_comm"
            gain = fix_gain_ms(ctx, fix)
        else:
            if _p2p_peers_unknown(ctx.run):
                # no pipeline and p2p kernels whose peer is unknown: their time cannot be told apart
                # from waiting for that peer, so it is not claimed as a missed overlap
                unmatched = min(p2p, ex)
                ex, p2p = ex - unmatched, 0.0
            gain = ex  # one stage: nothing waits for this rank through a schedule, the time is the gain
        share = 100 * ex / ctx.step_ms  # of the mean step, as the title's step_share_text
        if share < MIN_SHARE_PCT or not faster(gain):
            return []
        # CPU ranks sharing a host move p2p data with the same cores that compute: that exposure is
        # contention, not a missed overlap
        noise = noise_of(ctx).noise_ms(gain, p2p / (p2p + coll) if p2p + coll > 0 else 0.0)
        if unmatched > 0:
            # the pipeline could not be rebuilt, so the clocks had no transfers to align on:
            # collectives whose members do not end together were not split into waiting and
            # transfer, and that much of their time may be waiting
            noise += _unsplit_share(ctx) * coll
        worst = sorted(rows, key=lambda r: -r.lost_ms["exposed_comm"])[:4]
        kind = "collectives" if coll >= p2p else "p2p transfers"
        fixes = (
            [
                "overlap the data-parallel gradient reduce with the backward (DDP bucketing, "
                "Megatron --overlap-grad-reduce, FSDP backward prefetch)",
                "move optimizer-step collectives off the critical path or fuse them",
            ]
            if coll >= p2p
            else [
                "issue pipeline p2p asynchronously on its own stream (batch_isend_irecv; Megatron "
                "--overlap-p2p-communication) so the next micro-batch computes during the transfer",
                "do not wait for a send to finish before starting the next micro-batch",
            ]
        )
        fixes.append("batch small transfers (fewer, larger messages)")
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"{step_share_text(ctx.report.summary, 'exposed_comm')} is exposed communication, "
                f"mostly {kind}",
                gain,
                ExposedCommEvidence(
                    exposed_comm_ms=r3(ex),
                    exposed_p2p_ms=r3(p2p),
                    exposed_collective_ms=r3(coll),
                    worst_ranks={str(r.rank): r3(r.lost_ms["exposed_comm"]) for r in worst},
                    p2p_peer_unknown_ms=r3(unmatched) if unmatched > 0 else UNSET,
                ),
                fixes,
                ranks=[r.rank for r in worst],
                noise_ms=noise,
                fix=fix,
            )
        ]


def _unsplit_share(ctx: RuleContext) -> float:
    """The share of matched collective instances that were not split into waiting and transfer."""
    cw = ctx.attribution.collective_waits
    if cw is None or cw.instances <= 0:
        return 0.0
    return max(cw.instances - cw.syncs, 0) / cw.instances


def _p2p_peers_unknown(run: Run) -> bool:
    """Whether any rank has p2p kernels whose peer the trace does not name (and no pipeline
    structure gave them one)."""
    return any(
        bool(((tl.intervals.kind == int(Kind.P2P)) & (tl.intervals.peer < 0)).any()) for tl in run.ranks
    )


register(ExposedCommRule())
