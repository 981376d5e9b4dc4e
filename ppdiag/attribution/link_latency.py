"""Each link's normal transfer time, read off the run itself (docs/json.md, "Time accounting", ``bubble``).

A pipeline transfer that took its link's normal time is part of the schedule: the fill and drain
of the pipe pay it even on a perfect run, so it is bubble, and only what a transfer takes beyond
the run's fault-free latency is ``comm_wait``. Both come from the waits the replay resolved, one
transfer time each, grouped by link and direction (producer rank -> consumer rank):

* a link's **normal** time is a low quantile of its transfers (:data:`LINK_Q`): a slow tail, even
  most of the link's transfers, leaves it where the link's undisturbed transfers are;
* the run's **fault-free latency** is the lower quartile of the links' normal times
  (:data:`FREE_Q`): slow links do not set what "normal" is, even where they are most of the links
  (two slow ranks of a 4-stage pipe make 4 of its 6 links slow; P = 2 with one slow direction);
* a link's **spread** is the robust standard deviation of its transfers ((p50 - p10) / 1.2816 for
  a normal spread): what one transfer on it varies by without a fault;
* a link's **lateness** is the time a transfer takes beyond the fault-free latency, as most of its
  transfers take it: the mean of all but the longest :data:`OUTLIERS` of them, with that mean's
  standard error. A process descheduled on a loaded host makes a few transfers very late on any
  link; a slow link makes most of its own transfers late. The same number gates ``PP004`` and gives
  the late time it reports per link (lateness times the transfers). It is not capped at what the
  consumer waited: a held send that a GPipe consumer catches up with under its compute is as late
  as one it waits for, and only the lateness tells the held link from its neighbours. On host ops
  (gloo) it comes from the transfers the consumer waited through whole (it was waiting before the
  producer issued) when the link has :data:`MIN_WHOLE` of them: a consumer that comes to a transfer later
  times only what is left of it, and behind a slow link it does so every time after the first
  transfer of a GPipe phase (it runs as late as the link itself).

A link is slow (``PP004``) only when its lateness stands out of the other links' (their lower
quartile) by more than the noise: :data:`Z` standard errors of the difference, each link's from
the spread of its own transfers, and never less than :data:`FLOOR_SHARE` of the fault-free
latency. A standard error estimated from a few transfers is itself uncertain (a GPipe link whose
consumer waited through 3 of its transfers whole: their spread has 2 degrees of freedom), so
``Z`` is taken at the Student t quantile of the link's own count, at ``Z``'s confidence: 4.5 for
3 transfers, 2.3 for 10, ``Z`` itself for many. On fault-free recorded GPipe runs (P = 4, M = 4)
one link's 3 waited-through transfers, within 30 µs of each other, stood 207 µs out of the others
where the normal ``Z`` allowed 161: a slow link that moving one rank to another host (its offset
placed within its residual) took away or moved to the link back. Every link late alike (a loaded
host, jitter every link shows) is no slow link. A link
between two hosts is timed across their fitted clock offsets: the standard error of that offset
joins the difference's in quadrature (``PP004`` gives it), so a link whose hosts' offset is known
far better than its own transfers vary is judged as it would be on one host.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

LINK_Q = 0.25  # the quantile of a link's transfers that stands for its normal time
FREE_Q = 0.25  # the quantile of the links' normal times that is the run's fault-free latency
REF_Q = 0.25  # the quantile of the other links' lateness a link is compared with
Z = 2.0  # standard errors a link's lateness must stand out by (about 95 % one-sided)
FLOOR_SHARE = 0.1  # and at least this share of the fault-free latency (exact synthetic runs)
FLOOR_NS = 1_000  # ... and at least this (timer resolution of the inputs)
OUTLIERS = 0.2  # the share of a link's transfers, the latest, left out of its lateness
MIN_WHOLE = 2  # transfers timed whole that a link needs for its lateness to come from them alone


@dataclass(frozen=True)
class LinkLatency:
    """One link and direction: its transfers' count and normal time, spread, and lateness."""

    src: int
    dst: int
    n: int
    normal_ns: int  # the LINK_Q quantile of its transfers (an observed transfer time)
    spread_ns: float  # robust standard deviation of one transfer
    late_ns: float  # per transfer beyond the fault-free latency (mean of the OUTLIERS-trimmed)
    late_se_ns: float  # standard error of that mean
    timed: int = 0  # the transfers that lateness came from (0: not known, the normal quantile)

    @property
    def late_sum_ns(self) -> float:
        """The time beyond the fault-free latency on this link, every transfer taken as typical of
        it (its lateness times its transfers)."""
        return self.late_ns * self.n


@dataclass(frozen=True)
class LinkLatencies:
    """The links of a run and its fault-free p2p latency (ns)."""

    links: dict[tuple[int, int], LinkLatency] = field(default_factory=dict)
    fault_free_ns: int = 0

    def reference_ns(self, key: tuple[int, int]) -> tuple[float, float]:
        """The lateness the other links show (their lower quartile: a slow rank makes every link
        it touches late, 4 of the 6 links of a 4-stage pipe) and its standard error (the median of
        theirs): what this link is compared with."""
        return self._references.get(key, (0.0, 0.0))

    @cached_property
    def _references(self) -> dict[tuple[int, int], tuple[float, float]]:
        """:meth:`reference_ns` of every link from one sort of the links' lateness and one of their
        standard errors: leaving one link out shifts the sorted others by one place past it, so
        the lower quartile and the median of the others are read off the whole sorted column (a
        quantile over the others per link is quadratic in the links of a big run)."""
        keys = list(self.links)
        n = len(keys)
        if n < 2:
            return {k: (0.0, 0.0) for k in keys}
        late = np.array([self.links[k].late_ns for k in keys], np.float64)
        se = np.array([self.links[k].late_se_ns for k in keys], np.float64)
        m = n - 1  # the others
        # np.quantile(method="lower") of m values: the floor of the virtual index q (m - 1)
        q_at = int(np.floor(np.float64(REF_Q) * (m - 1)))
        ref_late = _left_out(late, q_at).tolist()
        # the median; of an even count, the mean of the two middle values, as np.median takes it
        mid = _left_out(se, m // 2)
        ref_se = (mid if m % 2 else (_left_out(se, m // 2 - 1) + mid) / 2.0).tolist()
        return {k: (float(a), float(b)) for k, a, b in zip(keys, ref_late, ref_se, strict=True)}

    def noise_ns(self, key: tuple[int, int], clock_se_ns: float = 0.0) -> float:
        """How far a link's mean lateness may stand out of the others' without a fault: ``Z``
        standard errors of the difference (each from its link's spread over its transfers, and
        ``clock_se_ns``, the standard error of the clock offset a link between two hosts is timed
        across: independent errors, in quadrature). A link's standard error estimated from few
        transfers is itself uncertain: ``Z`` is taken at the Student t quantile of its degrees of
        freedom (:func:`t_quantile`), as ``Z`` is for a known spread."""
        own = self.links[key]
        z = t_quantile(Z, own.timed - 1) * math.hypot(own.late_se_ns, self.reference_ns(key)[1], clock_se_ns)
        return max(z, FLOOR_SHARE * self.fault_free_ns, FLOOR_NS)

    def slow(self) -> dict[tuple[int, int], float]:
        """The links slower than the run's other links by more than the noise: per link, how much
        later than the others its transfers arrive (ns per transfer, beyond the reference)."""
        out: dict[tuple[int, int], float] = {}
        for k, x in self.links.items():
            beyond = x.late_ns - self.reference_ns(k)[0]
            if beyond > self.noise_ns(k):
                out[k] = beyond
        return out


def _left_out(values: npt.NDArray[np.float64], at: int) -> npt.NDArray[np.float64]:
    """Per value, the ``at``-th smallest of the other values (that value left out)."""
    order = np.argsort(values, kind="stable")
    pos = np.empty(values.size, np.int64)
    pos[order] = np.arange(values.size)
    ranked = values[order]
    out: npt.NDArray[np.float64] = np.where(pos > at, ranked[at], ranked[min(at + 1, values.size - 1)])
    return out


def link_latencies(
    waits: Iterable[tuple[int, int, int, int]] | npt.NDArray[np.int64],
    whole: Iterable[bool] | npt.NDArray[np.bool_] | None = None,
) -> LinkLatencies:
    """The links of the resolved waits ``(producer, consumer, transfer ns, waited ns)``; ``whole``
    (per wait, optional): whether the wait timed the whole transfer (see :func:`_timed_whole`)."""
    # (the replay graph passes its waits as arrays already)
    w = waits if isinstance(waits, np.ndarray) else np.array(list(waits), np.int64)
    w = w.astype(np.int64, copy=False).reshape(-1, 4)
    if w.shape[0] == 0:
        return LinkLatencies()
    if whole is None:
        wh = np.zeros(w.shape[0], bool)
    else:
        wh = (
            whole.astype(bool)
            if isinstance(whole, np.ndarray)
            else np.fromiter(whole, bool, count=w.shape[0])
        )
    keys, inv = _links_of(w[:, 0], w[:, 1])
    order = np.argsort(inv, kind="stable")
    tau = w[order, 2].astype(np.float64)
    wh = wh[order]
    bounds = np.r_[0, np.cumsum(np.bincount(inv, minlength=len(keys)))]
    spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))
    groups = [tau[a:b] for a, b in spans]
    normal = np.array([np.quantile(g, LINK_Q, method="lower") for g in groups], np.int64)
    lat = int(np.quantile(normal, FREE_Q, method="lower"))
    links: dict[tuple[int, int], LinkLatency] = {}
    for (a, b), g, (lo, hi), nrm in zip(keys.tolist(), groups, spans, normal.tolist(), strict=True):
        p10, p50 = np.percentile(g, [10, 50])
        timed = _timed_whole(g, wh[lo:hi])
        late, se = typical_late(np.maximum(timed - lat, 0.0))
        spread = max(float(p50 - p10), 0.0) / 1.2816
        links[(a, b)] = LinkLatency(a, b, int(g.size), nrm, spread, late, se, int(timed.size))
    return LinkLatencies(links, lat)


def _links_of(
    src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The distinct (src, dst) rows in lexicographic order and each wait's row among them:
    ``np.unique(..., axis=0)`` on one int64 code per row (a row-wise unique sorts the rows as
    records, several times slower on millions of waits)."""
    s0, d0 = int(src.min()), int(dst.min())
    width = int(dst.max()) - d0 + 1
    codes, inv = np.unique((src - s0) * width + (dst - d0), return_inverse=True)
    return np.stack([codes // width + s0, codes % width + d0], axis=1), inv.reshape(-1)


def _timed_whole(tau: npt.NDArray[np.float64], whole: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """The transfers of one link that time how late it is: those whose consumer was already
    waiting when the producer issued (the wait spans the whole transfer), when the link has
    :data:`MIN_WHOLE` of them; else all. A consumer that comes to the transfer later times only
    what is left of it, down to nothing when the data was already there: behind a held link a
    consumer runs that late itself (GPipe: after the first micro-batch of a phase it is never
    ready before the data), and every later transfer would read as on time."""
    if int(whole.sum()) >= MIN_WHOLE:
        return tau[whole]
    return tau


def t_quantile(z: float, dof: int) -> float:
    """The Student t quantile with ``dof`` degrees of freedom at the normal quantile ``z``'s
    probability: how many estimated standard errors a mean of ``dof + 1`` values stands out by at
    the confidence ``z`` standard errors give for a known spread. Exact for one and two degrees of
    freedom, else the Cornish-Fisher expansion in ``1 / dof`` to its third term (Abramowitz and
    Stegun 26.7.5; within 1 % from three degrees of freedom on). ``z`` itself for ``dof`` < 1 (no
    spread to estimate: a standard error of 0) or unknown."""
    if dof < 1:
        return z
    p = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        a = 2.0 * p - 1.0
        return a * math.sqrt(2.0 / (1.0 - a * a))
    n = float(dof)
    g1 = (z**3 + z) / 4.0
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96.0
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384.0
    return z + g1 / n + g2 / n**2 + g3 / n**3


def typical_late(late: npt.NDArray[np.float64]) -> tuple[float, float]:
    """A link's lateness per transfer as most of its transfers show it, and its standard error:
    the mean of all but the longest :data:`OUTLIERS` of ``late`` (a trimmed mean), and the standard
    error of a trimmed mean (Tukey and McLaughlin: the winsorized standard deviation, the left-out
    values counted as the longest kept one, over the kept share times the root of the count). The
    kept values' own spread would understate it: leaving out the longest narrows them."""
    if late.size == 0:
        return 0.0, 0.0
    v = np.sort(late)
    k = max(int(np.ceil(v.size * (1.0 - OUTLIERS))), 1)
    if v.size < 2:
        return float(v[:k].mean()), 0.0
    wins = np.minimum(v, v[k - 1])
    se = float(np.std(wins, ddof=1)) / ((k / v.size) * math.sqrt(v.size))
    return float(v[:k].mean()), se


__all__ = [
    "FLOOR_NS",
    "FLOOR_SHARE",
    "FREE_Q",
    "LINK_Q",
    "MIN_WHOLE",
    "OUTLIERS",
    "REF_Q",
    "LinkLatencies",
    "LinkLatency",
    "Z",
    "link_latencies",
    "t_quantile",
    "typical_late",
]
