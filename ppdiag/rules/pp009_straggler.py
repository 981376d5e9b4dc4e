"""PP009: a straggler: the ranks the others wait for in collectives (and p2p without a pipeline)."""

from __future__ import annotations

import msgspec

from ppdiag.attribution.collective_waits import REASON_CAUSE, CollectiveWaits, LateRank
from ppdiag.report_types import Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, finding, r3
from ppdiag.rules.pp010_mb_variance import slow_worker_gain_ms, slow_workers

# a rank is named when it arrives this late per step (ms), at least
MIN_LATE_MS = 0.05
# ... and waits itself for others no more than this share of the others' waiting for it
MAX_OWN_WAIT = 0.5
# what the user can do about each reason the late rank gives
_REASON_TEXT = {
    "late_start": "starts its step late (CPU, data loading, the previous step)",
    "host_stall": "its host stalls before the collective (nothing queued on the device)",
    "compute": "computes longer than the others (a slow GPU, thermals, clocks)",
    "idle": "idles with work queued (no evidence of why)",
    "comm": "spends longer in other communication first",
}


class LateRankEvidence(msgspec.Struct, frozen=True):
    """One root straggler of PP009 (``evidence.late_ranks{}``, docs/json.md "Finding evidence")."""

    late_ms_per_step: float
    made_others_wait_ms_per_step: float
    late_instances_per_step: float
    reasons_ms_per_step: dict[str, float]  # late_start, host_stall, compute, idle, comm
    groups: list[list[int]]


class StragglerEvidence(Evidence, frozen=True):
    """PP009's evidence (docs/json.md "Finding evidence")."""

    late_ranks: dict[str, LateRankEvidence]
    followers: dict[str, float]
    main_reason: str
    slow_workers_vs_stage_peers: dict[str, float]
    waited_ms_per_step: float
    collective_instances: int
    sync_instances: int


class StragglerRule:
    """What it detects:
    Ranks that the other members of a collective (data-parallel all-reduce, tensor- or
    expert-parallel all-to-all, any process group) wait for: a blocking collective ends together on
    all members, so every member that arrived earlier spins until the last one comes. The finding
    names the late ranks (never the waiting ones), how late each was per step, how long it made
    the others wait, and why it was late: a late start of its step (CPU, data loading, the previous
    step), a host stall before the collective, or a longer compute. Without a pipeline, send/recv
    pairs count the same way (a receive spinning for a late sender), except the transfers of a
    pipeline that was rejected because its order could not be read: there a receive waits for the
    block its sender computes, a dependency, not a late peer. A rank that was late only
    because it waited for a named rank elsewhere first (its pipeline, its tensor-parallel peer) is
    listed as a follower, not named. With data-parallel replicas of a pipeline, a rank late because
    it computes longer is named only when its blocks cost well more than the same stage's in the
    other replicas (a slow worker: bad GPU, throttling, a noisy host); a replica that merely drew
    the longer micro-batches of a step is PP010's. A slow worker's gain is the step replayed from
    the blocks with that rank at its stage peers' cost.

    Why it matters:
    One slow worker sets the pace of the whole group: the others' waiting looks like exposed
    communication, and overlap fixes will not win it back. In a pipeline, a data-parallel
    all-reduce that waits for one replica slows every replica.

    How to fix:
    Look at the named node, not at the model split: check its GPU (clocks, thermals, ECC errors,
    `nvidia-smi -q`), its host (CPU affinity, other processes, NUMA), its data loading (workers,
    storage, preprocessing on that rank), and replace the node if it stays slow. A rebalance of
    layers does not help a rank that is slower than its peers for the same work.

    Example:
    8-rank recommendation model: ranks 2, 6 and 7 start each step 7 ms after the others (their
    data loader is late). Every other rank waits 7 ms in the first all-to-all; PP009 names ranks
    2, 6, 7 with 7 ms lateness per step, reason "late step start", gain 7 ms per step.
    """

    code = "PP009"
    name = "straggler"
    # shown by `ppdiag rules`; each finding carries the late ranks' own root cause (host, imbalance ...)
    cause = None  # each finding carries the late ranks' own root cause
    cause_note = "late rank's cause"
    summary = "Straggler: ranks the others wait for in collectives (late step, host stall, slow compute)."
    evidence = StragglerEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        cw = ctx.attribution.collective_waits
        if cw is None or not cw.late or not ctx.step_ms:
            return []
        steps = max(cw.n_steps, 1)
        per_rank = _late_ranks(cw, steps)
        gain = sum(cw.gain_ns.values()) / steps / 1e6
        if not per_rank or 100 * gain / ctx.step_ms < MIN_PCT:
            return []
        roots, inherited, slow, replicated = _roots(ctx, cw, per_rank)
        if not roots:
            return []
        if replicated and all(r in slow for r in roots):
            # the gain of the fix (that node at its peers' speed), replayed from the blocks
            replayed = slow_worker_gain_ms(ctx, sorted(roots))
            if replayed is not None:
                gain = max(replayed, 0.0)
        followers = {r: per_rank[r][0] for r in sorted(inherited)}
        reasons: dict[str, float] = dict.fromkeys(_REASON_TEXT, 0.0)
        for _, _, lr in roots.values():
            for k, v in lr.reasons_ns.items():
                reasons[k] += v
        main = max(reasons, key=lambda k: reasons[k])
        ranks = sorted(roots, key=lambda r: (-roots[r][0], r))
        worst = roots[ranks[0]][0]
        title = (
            f"straggler: rank(s) {', '.join(map(str, ranks))} arrive late at collectives / transfers "
            f"({worst:.1f} ms per step; the others wait {cw.total_waited_ns / steps / 1e6:.1f} ms per step "
            f"in all): {_REASON_TEXT[main]}"
        )
        evidence = _evidence(cw, steps, roots, followers, main, slow)
        fixes = [
            "inspect the named node(s): GPU clocks and thermals, ECC errors (nvidia-smi -q), other processes "
            "on the host, CPU affinity / NUMA",
            "check the data loading of the named rank(s): loader workers, storage, per-rank preprocessing",
            "replace the node if it stays slower than its peers for the same work (not a layer rebalance)",
        ]
        if main == "compute":
            fixes.insert(0, "compare the named rank's kernel times with its peers': a slow or throttled GPU")
        return [finding(ctx, self.code, REASON_CAUSE[main], title, gain, evidence, fixes, ranks=ranks)]


#: A late rank: (lateness ms per step, others' wait it made ms per step, its record).
_Late = dict[int, tuple[float, float, LateRank]]


def _late_ranks(cw: CollectiveWaits, steps: int) -> _Late:
    """Ranks late by at least :data:`MIN_LATE_MS` per step that made someone wait."""
    out: _Late = {}
    for r, lr in sorted(cw.late.items()):
        late_ms = lr.lateness_ns / steps / 1e6
        made_ms = lr.made_wait_ns / steps / 1e6
        if late_ms >= MIN_LATE_MS and made_ms > 0:
            out[r] = (late_ms, made_ms, lr)
    return out


def _roots(
    ctx: RuleContext, cw: CollectiveWaits, per_rank: _Late
) -> tuple[_Late, set[int], dict[int, float], bool]:
    """(the root late ranks, the followers, the slow workers, whether the pipeline is replicated).

    A rank late only because it waited for a late rank in another collective first follows that
    rank; the roots are late for their own reasons (late start, host, compute, idle) and make the
    others wait far longer than they wait for them: ranks that take turns waiting for each other
    (a ping-pong exchange) are the exchange's dependencies, not stragglers."""
    waited: dict[int, int] = {}
    for (r, _), ns in cw.waited.items():
        waited[r] = waited.get(r, 0) + ns
    inherited = {r for r, v in per_rank.items() if v[2].reasons_ns.get("comm", 0) > 0.5 * v[2].lateness_ns}
    roots = {
        r: v
        for r, v in per_rank.items()
        if r not in inherited and waited.get(r, 0) <= MAX_OWN_WAIT * v[2].made_wait_ns
    }
    # replicated pipelines: a rank late because it computes longer counts only when its blocks
    # cost well more than the same stage's in the other replicas (a slow worker); a replica that
    # drew the longer micro-batches of a step is late too, and that is PP010's
    slow = slow_workers(ctx)
    replicated = ctx.pipeline.topology.pp > 1 and len(ctx.pipeline.topology.pipelines) > 1
    if replicated:
        roots = {
            r: v
            for r, v in roots.items()
            if r in slow or v[2].reasons_ns.get("compute", 0) < 0.5 * v[2].lateness_ns
        }
    return roots, inherited, slow, replicated


def _evidence(
    cw: CollectiveWaits,
    steps: int,
    roots: _Late,
    followers: dict[int, float],
    main: str,
    slow: dict[int, float],
) -> StragglerEvidence:
    return StragglerEvidence(
        late_ranks={
            str(r): LateRankEvidence(
                late_ms_per_step=r3(late),
                made_others_wait_ms_per_step=r3(made),
                late_instances_per_step=r3(lr.instances / steps),
                reasons_ms_per_step={k: r3(v / steps / 1e6) for k, v in lr.reasons_ns.items()},
                groups=[list(cw.groups[g]) for g in sorted(lr.groups)],
            )
            for r, (late, made, lr) in sorted(roots.items())
        },
        followers={str(r): r3(v) for r, v in sorted(followers.items())},
        main_reason=main,
        slow_workers_vs_stage_peers={str(r): r3(x) for r, x in sorted(slow.items())},
        waited_ms_per_step=r3(cw.total_waited_ns / steps / 1e6),
        collective_instances=cw.instances,
        sync_instances=cw.syncs,
    )


register(StragglerRule())
