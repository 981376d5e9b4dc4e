"""Per-event checks of a decoded trace: kind codes, GPU ``B``/``E`` pairs read as complete
events, and unusable times dropped or altered, each counted in one warning."""

from __future__ import annotations

import math
import operator
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.parsers.kineto_schema import _CAT, _MAX_DUR_US, _MAX_US, F64A, K_KERNEL, K_OTHER, K_SYNC, _col


def _event_codes(evs: list[Any]) -> npt.NDArray[np.int8]:
    """The kind code of every event: its category's code for complete (``X``) events, else
    K_OTHER. Vectorised over the event list; a category that is not a string (lenient traces)
    takes the per-event path, where such an event is of no known kind."""
    n = len(evs)
    try:
        codes = np.fromiter(map(_CAT.get, _col(evs, "cat"), repeat(K_OTHER)), dtype=np.int8, count=n)
    except TypeError:
        return np.fromiter(
            (_CAT.get(e.cat, K_OTHER) if e.ph == "X" and isinstance(e.cat, str) else K_OTHER for e in evs),
            dtype=np.int8,
            count=n,
        )
    is_x = np.fromiter(map(operator.eq, _col(evs, "ph"), repeat("X")), dtype=bool, count=n)
    codes[~is_x] = K_OTHER
    return codes


def _read_begin_end(evs: list[Any], codes: npt.NDArray[np.int8]) -> list[str]:
    """GPU events written as ``B``/``E`` pairs instead of complete ``X`` events: pair them per
    (pid, tid) in time order and read each pair as one complete event; count what is left.

    Only GPU categories are looked at (host B/E events are not used by the analysis)."""
    gpu_cats = {c for c, k in _CAT.items() if K_KERNEL <= k <= K_SYNC}
    idx = [i for i, e in enumerate(evs) if e.ph != "X" and isinstance(e.cat, str) and e.cat in gpu_cats]
    if not idx:
        return []
    begin: dict[tuple[Any, Any], list[int]] = {}
    paired = unmatched = other = 0
    order = sorted(idx, key=lambda i: (_num_or_nan(evs[i].ts), 0 if evs[i].ph == "E" else 1))
    for i in order:
        e = evs[i]
        key = (e.pid, e.tid)
        if e.ph == "B":
            begin.setdefault(key, []).append(i)
        elif e.ph == "E":
            stack = begin.get(key)
            if not stack:
                unmatched += 1
                continue
            bi = stack.pop()
            b = evs[bi]
            t0, t1 = _num_or_nan(b.ts), _num_or_nan(e.ts)
            if not (math.isfinite(t0) and math.isfinite(t1)) or t1 < t0:
                unmatched += 1
                continue
            b.ph, b.dur = "X", t1 - t0
            codes[bi] = _CAT[b.cat]
            paired += 1
        else:
            other += 1
    unmatched += sum(len(v) for v in begin.values())
    out = []
    if paired:
        out.append(f"{paired} GPU events written as B/E pairs read as complete events")
    if unmatched or other:
        out.append(
            f"dropped {unmatched + other} GPU events that are not complete (ph X) events "
            f"({unmatched} unpaired B/E, {other} with another ph)"
        )
    return out


def _num_array(vals: list[Any]) -> tuple[F64A, npt.NDArray[np.bool_]]:
    """float64 values and a mask of the entries that are real numbers (not null, text or bool)."""
    ok = np.fromiter((type(v) is float or type(v) is int for v in vals), dtype=bool, count=len(vals))
    if ok.all():
        return np.asarray(vals, dtype=np.float64), ok
    return np.asarray([v if k else 0.0 for v, k in zip(vals, ok, strict=True)], dtype=np.float64), ok


def _num_or_nan(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def _drop_bad_times(evs: list[Any], codes: npt.NDArray[np.int8], base: int, unseen: int = 0) -> list[str]:
    """Drop (code ``K_OTHER``) the used events whose ``ts``/``dur`` are unusable and count them:
    ts missing / null / text / bool / not finite, ts beyond int64 ns, dur over a week. Negative
    or non-numeric durations are kept as zero-length events, and counted too. ``unseen``: used
    events with usable times that sliced decoding dropped before (they count in the totals)."""
    used = np.flatnonzero(codes != K_OTHER)
    if not len(used):
        return []
    total = len(used) + unseen
    ts, ts_ok = _num_array([evs[i].ts for i in used])
    dur, dur_ok = _num_array([evs[i].dur for i in used])
    no_ts = ~ts_ok | ~np.isfinite(ts)
    lim = _MAX_US - abs(base) / 1000.0
    far = ~no_ts & (np.abs(ts) >= lim)
    bad_dur = ~dur_ok | ~np.isfinite(dur)
    neg = ~bad_dur & (dur < 0)
    huge = ~bad_dur & (dur > _MAX_DUR_US)
    drop = no_ts | far | huge
    n = int(drop.sum())
    zero = (neg | bad_dur) & ~drop
    out = []
    if n:
        codes[used[drop]] = K_OTHER
        parts = [
            (int(no_ts.sum()), "ts missing, null, text or not finite"),
            (int(far.sum()), "ts out of range"),
            (int(huge.sum()), "dur over a week"),
        ]
        why = ", ".join(f"{k} {w}" for k, w in parts if k)
        out.append(f"dropped {n} of {total} events with unusable times ({why})")
    if zero.any():
        # kept at their start with zero length (what the parse does with them), but said
        parts = [
            (int((neg & ~drop).sum()), "a negative dur"),
            (int((bad_dur & ~drop).sum()), "no numeric dur"),
        ]
        why = ", ".join(f"{k} with {w}" for k, w in parts if k)
        out.append(f"{int(zero.sum())} of {total} events read as zero-length ({why})")
    return out
