"""Step windows per rank, on the rank's own clock.

GPU work lags the host, so a device step is bounded by the work *launched* inside the host's
``ProfilerStep#N`` range: it starts at the first device interval launched in step N, or earlier at
the host's step start when the device was idle by then (the host time before the first kernel is
the step's), and ends where step N+1 starts (the last step ends with its last interval). Runs
whose intervals carry no launch times (CPU-only, or old traces) use the host ranges directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.model import RangeKind, RankTimeline


@dataclass
class LocalStep:
    """One step window of one rank on its own clock."""

    number: int
    start: int
    end: int


def host_steps(tl: RankTimeline) -> list[tuple[int, int, int]]:
    """``(number, start, end)`` of the rank's step annotations, outermost only, in time order."""
    r = tl.ranges
    mask = r.kind == int(RangeKind.STEP)
    if not mask.any():
        return []
    s, e, n = r.start[mask], r.end[mask], r.num[mask]
    order = np.argsort(s, kind="stable")
    out: list[tuple[int, int, int]] = []
    last_end = -(2**62)
    for i in order:
        si, ei = int(s[i]), int(e[i])
        if si < last_end:  # nested or duplicated step range
            continue
        out.append((int(n[i]), si, ei))
        last_end = ei
    return out


def _reach_at(ends: npt.NDArray[np.int64], q: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``np.maximum.accumulate(ends)[q]``: the running maximum read only where asked (a step's
    first kernel, a few hundred places among hundreds of thousands of intervals), from the maxima
    of the slices between those places."""
    if q.size == 0:
        return np.zeros(0, np.int64)
    at = np.unique(q)
    seg = np.maximum.reduceat(ends[: int(at[-1]) + 1], np.r_[0, at[:-1] + 1])
    return np.maximum.accumulate(seg)[np.searchsorted(at, q)]


def step_windows(tl: RankTimeline) -> tuple[list[LocalStep], list[str]]:
    """Step windows of one rank, plus warnings about how they were found."""
    iv = tl.intervals
    warnings: list[str] = []
    hs = host_steps(tl)
    if len(iv) == 0:
        return [], ["no device activity"]
    if not hs:
        warnings.append("no ProfilerStep annotations: the whole trace is analyzed as one window")
        return [LocalStep(-1, int(iv.start.min()), int(iv.end.max()))], warnings
    use_launch = (not tl.cpu_only) and bool(np.mean(iv.launch >= 0) > 0.5)
    starts = np.array([h[1] for h in hs], dtype=np.int64)
    ends = np.array([h[2] for h in hs], dtype=np.int64)
    if not use_launch:
        return [LocalStep(n, s, e) for n, s, e in hs if e > s], warnings
    t = np.where(iv.launch >= 0, iv.launch, iv.start)
    k = np.searchsorted(starts, t, side="right") - 1
    inside = (k >= 0) & (t < ends[np.maximum(k, 0)])
    out: list[LocalStep] = []
    first_start = np.full(len(hs), -1, dtype=np.int64)
    last_end = np.full(len(hs), -1, dtype=np.int64)
    if inside.any():
        kk = k[inside]
        st = iv.start[inside]
        en = iv.end[inside]
        big = np.iinfo(np.int64).max
        fs = np.full(len(hs), big, dtype=np.int64)
        np.minimum.at(fs, kk, st)
        le = np.full(len(hs), -1, dtype=np.int64)
        np.maximum.at(le, kk, en)
        first_start = np.where(fs == big, -1, fs)
        last_end = le
    # A step starts at its host start when the device is idle by then: the host time before the
    # first kernel (a data loader, a sync, Python) belongs to the step, so it is seen and charged.
    # Device work still running from earlier steps keeps the start at that work's end, and the
    # start never moves past the step's first kernel.
    order = np.argsort(iv.start, kind="stable")
    st_sorted = iv.start[order]
    pos = np.searchsorted(st_sorted, first_start, side="left")
    busy_until = np.where(pos > 0, _reach_at(iv.end[order], np.maximum(pos - 1, 0)), np.iinfo(np.int64).min)
    start = np.minimum(first_start, np.maximum(starts, busy_until))
    valid = np.flatnonzero(first_start >= 0)
    for j, i in enumerate(valid.tolist()):
        s = int(start[i])
        # a step ends where the next step with device work starts (the last with its last work)
        e = int(start[valid[j + 1]]) if j + 1 < valid.size else int(last_end[i])
        e = max(e, s)
        if e > s:
            out.append(LocalStep(hs[i][0], s, e))
    if not out:
        warnings.append("no device work launched inside the step annotations: using host step ranges")
        return [LocalStep(n, s, e) for n, s, e in hs if e > s], warnings
    return out, warnings


def select_steps(steps: list[LocalStep], spec: str | None) -> list[LocalStep]:
    """Apply a ``--steps`` selection: ``a:b`` keeps step numbers ``a <= N <= b`` (either bound may be
    empty), ``5,6`` keeps those numbers. Windows without a step number are selected by position."""
    if not spec:
        return steps
    spec = spec.strip()
    numbered = all(s.number >= 0 for s in steps)
    keys = [s.number if numbered else i for i, s in enumerate(steps)]
    if ":" in spec:
        a, _, b = spec.partition(":")
        lo = int(a) if a.strip() else -(2**62)
        hi = int(b) if b.strip() else 2**62
        return [s for s, k in zip(steps, keys, strict=False) if lo <= k <= hi]
    wanted = {int(x) for x in spec.split(",") if x.strip()}
    return [s for s, k in zip(steps, keys, strict=False) if k in wanted]
