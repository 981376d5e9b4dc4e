"""PP011: copies (memcpy / memset) dominate the window with nothing computing beside them."""

from __future__ import annotations

import numpy as np

from ppdiag.facts import step_share_text
from ppdiag.model import Kind
from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import MIN_PCT, finding, mean_cause_ms, r3, replay_gain_ms

# Copies are the dominant loss from this share of the lost time on (else they are a minor cause
# and only reported when they cost more than MIN_PCT of the step).
DOMINANT_SHARE = 0.5


class CopiesEvidence(Evidence, frozen=True):
    """PP011's evidence: the exposed copy time, its share of the lost time, per rank and by name."""

    exposed_copy_ms: float
    share_of_lost: float | None
    exposed_copy_ms_per_rank: dict[str, float]
    copy_ms_by_name: dict[str, float]  # copy name -> ms per rank and step, the largest first


class CopiesRule:
    """What it detects:
    Device time spent in memcpy / memset with no compute kernel and no communication beside it
    (the `exposed_copy` cause): pageable host-to-device loads, weights copied in every step,
    activation offload traffic that is not overlapped with compute.

    Why it matters:
    A copy with nothing beside it is time the GPU does no useful work. Pageable host memory is
    copied through a staging buffer at a fraction of the link bandwidth and serializes with the
    host; a copy on the compute stream blocks the kernels queued behind it.

    How to fix:
    Allocate the host tensors in pinned memory (`pin_memory=True` in the DataLoader,
    `tensor.pin_memory()`), copy with `non_blocking=True` on a side stream so the load overlaps
    with the previous step's compute, and load or move the weights to the device once instead of
    in every step.

    Example:
    A 2-GPU window with 22 ms of kernels and 920 ms of pageable host-to-device copies: the copies
    are 95 % of the step, the kernels 2 %. Pinned memory and one load before the loop remove most
    of the 920 ms.
    """

    code = "PP011"
    name = "exposed-copies"
    cause = Cause.EXPOSED_COPY
    summary = "Copies (memcpy/memset) dominate the window with nothing computing beside them."
    evidence = CopiesEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        if not ctx.step_ms:
            return []
        copy = mean_cause_ms(ctx, Cause.EXPOSED_COPY)
        lost = sum(ctx.report.summary.lost_ms.values())
        # the replay's gain when it ran (a real zero stays zero); without a replay nothing runs
        # beside an exposed copy, so removing it shortens the step by its own time
        replayed = {"measured", "gain_copy"} <= ctx.attribution.step_replay_ns.keys()
        gain = replay_gain_ms(ctx, "gain_copy") if replayed else copy
        if copy <= 0 or 100 * max(copy, gain) / ctx.step_ms < MIN_PCT:
            return []
        per_rank = {r.rank: r.exposed_copy_ms for r in ctx.report.ranks if r.exposed_copy_ms > 0}
        top = max(per_rank.values(), default=0.0)
        ranks = sorted(r for r, v in per_rank.items() if v >= 0.5 * top) if top > 0 else []
        kinds = _copy_kinds(ctx)
        dominant = lost > 0 and copy >= DOMINANT_SHARE * lost
        what = "the dominant loss" if dominant else "a loss"
        return [
            finding(
                ctx,
                self.code,
                self.cause,
                f"copies with nothing beside them are {what}: {copy:.1f} ms per step "
                f"({step_share_text(ctx.report.summary, 'exposed_copy')})",
                gain,
                CopiesEvidence(
                    exposed_copy_ms=r3(copy),
                    share_of_lost=r3(copy / lost) if lost > 0 else None,
                    exposed_copy_ms_per_rank={str(r): r3(v) for r, v in sorted(per_rank.items())},
                    copy_ms_by_name=kinds,
                ),
                _fixes(kinds),
                ranks=ranks,
            )
        ]


def _fixes(kinds: dict[str, float]) -> list[str]:
    """The fixes, the one that fits the copies seen first: pinned memory when pageable copies
    dominate, else loading once and overlapping."""
    pinned = (
        "allocate the host tensors in pinned memory (DataLoader(pin_memory=True), tensor.pin_memory()): "
        "pageable copies go through a staging buffer at a fraction of the link bandwidth"
    )
    overlap = (
        "overlap the loads with compute: copy with non_blocking=True on a side stream and prefetch "
        "the next batch"
    )
    once = "load or move the weights to the device once, before the training loop, not in every step"
    total = sum(kinds.values())
    pageable = sum(v for k, v in kinds.items() if "pageable" in k.lower())
    if total > 0 and pageable >= 0.5 * total:
        return [pinned, overlap, once]
    return [once, overlap, pinned]


def _copy_kinds(ctx: RuleContext, limit: int = 6) -> dict[str, float]:
    """Total copy time per copy name (``Memcpy HtoD (Pageable -> Device)`` ...) over the traced
    ranks, in ms per rank and analyzed step (the whole trace, not only the windows), the largest
    first."""
    out: dict[str, float] = {}
    n_steps = max(len(ctx.steps), 1)
    for tl in ctx.run.ranks:
        iv = tl.intervals
        m = np.isin(iv.kind, (int(Kind.MEMCPY), int(Kind.MEMSET)))
        if not m.any():
            continue
        names, inv = np.unique(iv.name[m], return_inverse=True)
        dur = np.bincount(inv, weights=(iv.end[m] - iv.start[m]).astype(np.float64))
        for nm, d in zip(names.tolist(), dur.tolist(), strict=True):
            key = tl.name_of(int(nm))
            out[key] = out.get(key, 0.0) + d / 1e6
    top = sorted(out.items(), key=lambda kv: -kv[1])[:limit]
    return {k: r3(v / n_steps) for k, v in top}


register(CopiesRule())
