"""The noise model behind the findings' severity.

A gain is only worth a user's attention when it stands out of what the run varies by anyway:

* **step-to-step spread**: the standard error of the mean step, ``std(step) / sqrt(n)``, over the
  ``n`` steps used (few steps: a large error);
* **normal latency jitter**: the robust spread of a normal stage-to-stage transfer (from the
  fastest half of the transfers, so slow links do not inflate it), summed in quadrature over the
  transfers on a step's critical path (about ``2 (v M + P - 1)``);
* **host contention**: CPU-only ranks that share a host (the same ``host_name``, or gloo ranks
  with no host recorded) compete for its cores. When every such rank then shows late launches, the
  host is oversubscribed: the late launches and late transfers that they all share are
  contention, not a fault, and only what stands out of them (one rank, one link) counts.

``noise_ms`` of a finding is ``Z * hypot(step error, latency jitter)`` plus, on an oversubscribed
host, the part of the gain that the contention every rank shares explains. A finding whose gain is
within its noise is ``low``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ppdiag.model import intervals as ivs
from ppdiag.report_types import NoiseInfo

if TYPE_CHECKING:
    from ppdiag.attribution.causes import Attribution, RankStep
    from ppdiag.model import Run
    from ppdiag.pipeline import Pipeline

Z = 2.0  # standard errors a gain must exceed (about 95 % one-sided)
# On an oversubscribed host a rank or link stands out of the contention that all share when its
# loss is more than this many times the least affected one's.
STANDOUT_RATIO = 2.0
# Late launches on every rank of at least this share of the step make a shared host oversubscribed.
CONTENTION_MIN_PCT = 1.0
# The first step is a warm-up outlier when it is this much slower than the others' median (relative;
# a warm-up step is slower, never faster) and beyond this many standard deviations of the others.
# 20 % keeps the steps of a busy machine (which spread by 10 % or more) and drops the warm-up that
# would otherwise pass for jitter (PP007 from p95 / median >= 1.2).
WARMUP_REL = 0.20
WARMUP_Z = 3.5


@dataclass
class NoiseModel:
    """What a run varies by without any fault (ms per step unless named otherwise)."""

    steps_used: int
    step_spread_ms: float | None  # sample standard deviation of the step time (None: one step)
    step_error_ms: float  # standard error of the mean step
    latency_jitter_ms: float  # robust standard deviation of one normal transfer
    critical_transfers: int  # transfers on a step's critical path
    shared_host: bool  # CPU-only ranks share a host (sharing_ranks)
    oversubscribed: bool  # ... and every rank sharing a host shows late launches
    contention_ms: float  # late-launch time per step every sharing rank shows (their min)
    first_step_excluded: bool = False

    @property
    def comm_jitter_ms(self) -> float:
        """Per-step spread of the critical path's transfer times from normal jitter alone."""
        return self.latency_jitter_ms * math.sqrt(max(self.critical_transfers, 0))

    def base_ms(self) -> float:
        """The noise every gain has: Z standard errors of the step and of its transfers."""
        return Z * math.hypot(self.step_error_ms, self.comm_jitter_ms)

    def noise_ms(
        self, gain_ms: float | None = None, shared_share: float = 0.0, base_ms: float | None = None
    ) -> float:
        """Noise of one finding: ``base_ms`` (default :meth:`base_ms`), plus ``shared_share`` of its
        gain on an oversubscribed host (the share of the loss that every rank or link shows alike)."""
        extra = 0.0
        if self.oversubscribed and gain_ms is not None and gain_ms > 0:
            extra = min(max(shared_share, 0.0), 1.0) * gain_ms
        return (self.base_ms() if base_ms is None else base_ms) + extra

    def cause_ms(self, steps: Sequence[RankStep], attr: Attribution, cause: str) -> float:
        """The noise of a gain measured as one cause on every step: Z standard errors of that
        cause's per-step loss and of the transfers (the step total's spread, from every other
        delay, does not make it less certain); :meth:`base_ms` with fewer than two steps."""
        err = cause_error_ms(steps, attr, cause)
        return Z * math.hypot(err, self.comm_jitter_ms) if err is not None else self.base_ms()

    def to_report(self) -> NoiseInfo:
        """The report's ``noise`` section."""

        def r(v: float | None) -> float | None:
            return None if v is None else round(float(v), 4)

        return NoiseInfo(
            steps_used=self.steps_used,
            first_step_excluded=self.first_step_excluded,
            step_spread_ms=r(self.step_spread_ms),
            step_error_ms=r(self.step_error_ms),
            latency_jitter_ms=r(self.latency_jitter_ms),
            critical_transfers=self.critical_transfers,
            comm_jitter_ms=r(self.comm_jitter_ms),
            base_noise_ms=r(self.base_ms()),
            shared_host=self.shared_host,
            oversubscribed=self.oversubscribed,
            contention_ms=r(self.contention_ms),
        )


def warmup_outlier(step_ms: Sequence[float]) -> bool:
    """Whether the first of several step times is a warm-up outlier: slower than the others'
    median by :data:`WARMUP_REL` and by :data:`WARMUP_Z` of their standard deviation (robust from
    three others on; with one other step only the relative test applies)."""
    if len(step_ms) < 2:
        return False
    first = float(step_ms[0])
    rest = np.asarray(step_ms[1:], dtype=np.float64)
    med = float(np.median(rest))
    if med <= 0 or first - med <= WARMUP_REL * med:
        return False
    if rest.size >= 3:
        sd = 1.4826 * float(np.median(np.abs(rest - med)))
    elif rest.size == 2:
        sd = float(np.std(rest, ddof=1))
    else:
        return True
    return first - med > WARMUP_Z * sd


def sharing_ranks(run: Run) -> list[int]:
    """The CPU-only ranks that share a host with another rank and so compete for its cores: those
    of a ``host_name`` that two or more ranks record (a run may span hosts, each with several
    ranks, and a rank alone on its host shares nothing), or every rank of a gloo run that records
    no host (the CPU demo and single-host CPU jobs)."""
    ranks = run.ranks
    if len(ranks) < 2 or not all(tl.cpu_only for tl in ranks):
        return []
    names = [str(tl.meta.get("host_name") or "") for tl in ranks]
    if set(names) == {""}:
        return [tl.rank for tl in ranks] if all((tl.backend or "").lower() == "gloo" for tl in ranks) else []
    count = Counter(names)
    return [tl.rank for tl, h in zip(ranks, names, strict=True) if h and count[h] >= 2]


def shared_host(run: Run) -> bool:
    """Whether some CPU-only ranks share a host (:func:`sharing_ranks`)."""
    return bool(sharing_ranks(run))


def direct_host_ms(steps: Sequence[RankStep], with_calls: bool = False) -> dict[int, float]:
    """Per rank: mean per-step time with nothing launched (its own late launches, ms);
    ``with_calls``: and the time its own calls that only issued a transfer (``p2p_host``, the
    replay's host time as well) took beyond what such a call takes in this run (the median of
    every rank's): a send call that blocks its rank is that rank's delay, while calls that a
    loaded host stretches alike are no rank's own (a middle stage makes twice the calls)."""
    typical = 0.0
    if with_calls:
        lengths = [rs.p2p_host[1] - rs.p2p_host[0] for rs in steps]
        every = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        typical = float(np.median(every)) if every.size else 0.0
    acc: dict[int, list[float]] = {}
    for rs in steps:
        own = float(ivs.measure(rs.host_set))
        if with_calls and rs.p2p_host[0].size:
            # p2p pieces, disjoint from the idle host_set
            own += float(np.clip(rs.p2p_host[1] - rs.p2p_host[0] - typical, 0.0, None).sum())
        acc.setdefault(rs.rank, []).append(own)
    return {r: float(np.mean(v)) / 1e6 for r, v in sorted(acc.items()) if v}


def shared_share(values: Sequence[float]) -> float:
    """The share of the largest value that every one shows alike: 1 when every rank or link shows
    about the same loss, small when some stand out. Contention does not hit every rank exactly
    alike (each schedule position hides a different part of it under its waits), so a value counts
    as standing out only beyond :data:`STANDOUT_RATIO` times the smallest: the share is
    ``min(1, STANDOUT_RATIO * smallest / largest)``. The smallest, not the median: a slow rank
    makes every link it touches late (4 of the 6 links of a 4-stage pipe)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return 0.0
    top = float(arr.max())
    return min(STANDOUT_RATIO * max(float(arr.min()), 0.0) / top, 1.0) if top > 0 else 0.0


def latency_jitter_ns(attr: Attribution) -> float:
    """Robust standard deviation of a normal transfer, from the fastest half of the transfers
    ((p50 - p10) / 1.2816 for a normal spread), so that slow links do not count as jitter."""
    if not len(attr.edges):
        return 0.0
    tau = np.asarray(attr.edges, np.int64).reshape(-1, 4)[:, 2].astype(np.float64)
    p10, p50 = np.percentile(tau, [10, 50])
    return max(float(p50 - p10), 0.0) / 1.2816


def build_noise(
    run: Run,
    pipe: Pipeline,
    steps: Sequence[RankStep],
    attr: Attribution,
    step_ms: Sequence[float],
    first_step_excluded: bool = False,
) -> NoiseModel:
    """The noise model of an analyzed run; ``step_ms`` are the step times used."""
    vals = np.asarray(step_ms, dtype=np.float64)
    n = int(vals.size)
    spread = float(np.std(vals, ddof=1)) if n >= 2 else None
    # One step: no spread is known; take a conservative 5 % of the step as its error.
    err = spread / math.sqrt(n) if spread is not None else (0.05 * float(vals[0]) if n else 0.0)
    topo = pipe.topology
    m = pipe.microbatches or 0
    crit = 2 * (topo.virtual * m + topo.pp - 1) if topo.pp > 1 and m else 0
    sharing = sharing_ranks(run)
    shared = bool(sharing)
    host = direct_host_ms(steps)
    # what every rank sharing a host shows alike (a rank alone on its host contends with no one)
    shown = [host[r] for r in sharing if r in host]
    contention = min(shown) if shown else 0.0
    med_step = float(np.median(vals)) if n else 0.0
    over = shared and med_step > 0 and 100 * contention / med_step >= CONTENTION_MIN_PCT
    return NoiseModel(
        steps_used=n,
        step_spread_ms=spread,
        step_error_ms=err,
        latency_jitter_ms=latency_jitter_ns(attr) / 1e6,
        critical_transfers=crit,
        shared_host=shared,
        oversubscribed=bool(over),
        contention_ms=contention,
        first_step_excluded=first_step_excluded,
    )


def cause_error_ms(steps: Sequence[RankStep], attr: Attribution, cause: str) -> float | None:
    """Standard error of the mean per-step loss to ``cause`` (mean over ranks of each step, ms);
    None with fewer than two steps."""
    per: dict[int, list[int]] = {}
    for rs in steps:
        c = attr.causes.get((rs.rank, rs.step))
        if c is not None:
            per.setdefault(rs.step, []).append(int(c.get(cause, 0)))
    vals = np.array([np.mean(v) for v in per.values()], dtype=np.float64) / 1e6
    if vals.size < 2:
        return None
    return float(np.std(vals, ddof=1)) / math.sqrt(vals.size)


def oversubscription_warning(noise: NoiseModel, n_ranks: int) -> str | None:
    """The report line that says a CPU run oversubscribed its host, or None."""
    if not noise.oversubscribed:
        return None
    return (
        f"the {n_ranks} CPU ranks share one host and every rank waits at least "
        f"{noise.contention_ms:.1f} ms per step with nothing launched: the host's cores are likely "
        "oversubscribed (more busy processes than cores; the trace does not record the core count); "
        "late launches and late transfers that all ranks share are treated as contention (their "
        "findings stay low)"
    )
