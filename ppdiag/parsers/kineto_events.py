"""Per-event checks of a decoded trace: kind codes, GPU ``B``/``E`` pairs read as complete
events, and unusable times dropped or altered, each counted in one warning. All work on the
columns of :class:`~ppdiag.parsers.kineto_table.Events`."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.parsers.kineto_schema import _MAX_DUR_US, _MAX_US, K_KERNEL, K_OTHER, K_SYNC
from ppdiag.parsers.kineto_table import PH_B, PH_E, PH_X, Events


def _event_codes(ev: Events) -> npt.NDArray[np.int8]:
    """The kind code of every event: its category's code for complete (``X``) events, else
    K_OTHER (a category that is not a string is of no known kind)."""
    return np.where(ev.ph == PH_X, ev.cat, np.int8(K_OTHER)).astype(np.int8)


def _read_begin_end(ev: Events, codes: npt.NDArray[np.int8]) -> tuple[list[str], int]:
    """GPU events written as ``B``/``E`` pairs instead of complete ``X`` events: pair them per
    (pid, tid) in time order and read each pair as one complete event; count what is left.
    Returns the warnings and how many GPU events were dropped.

    Only GPU categories are looked at (host B/E events are not used by the analysis). The pairing
    walks only those events (a stack per thread; traces have none or few of them)."""
    idx = np.flatnonzero((ev.ph != PH_X) & (ev.cat >= K_KERNEL) & (ev.cat <= K_SYNC))
    if not len(idx):
        return [], 0
    t = np.where(ev.ts_ok[idx], ev.ts[idx], np.nan)
    ph = ev.ph[idx]
    order = np.lexsort((ph != PH_E, t))  # by time, an end before a begin at the same time
    begin: dict[tuple[int, int], list[int]] = {}
    paired = unmatched = other = 0
    rows, ts, phs = idx[order].tolist(), t[order].tolist(), ph[order].tolist()
    pids, tids = ev.pid[idx[order]].tolist(), ev.tid[idx[order]].tolist()
    when = dict(zip(rows, ts, strict=True))
    for i, t1, p, key in zip(rows, ts, phs, zip(pids, tids, strict=True), strict=True):
        if p == PH_B:
            begin.setdefault(key, []).append(i)
        elif p == PH_E:
            stack = begin.get(key)
            if not stack:
                unmatched += 1
                continue
            bi = stack.pop()
            t0 = when[bi]
            if not (np.isfinite(t0) and np.isfinite(t1)) or t1 < t0:
                unmatched += 1
                continue
            ev.ph[bi], ev.dur[bi], ev.dur_ok[bi] = PH_X, t1 - t0, True
            codes[bi] = ev.cat[bi]
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
    return out, unmatched + other


def _drop_bad_times(
    ev: Events, codes: npt.NDArray[np.int8], base: int, unseen: int = 0
) -> tuple[list[str], int]:
    """Drop (code ``K_OTHER``) the used events whose ``ts``/``dur`` are unusable and count them:
    ts missing / null / text / bool / not finite, ts beyond int64 ns, dur over a week. Negative
    or non-numeric durations are kept as zero-length events, and counted too. ``unseen``: used
    events with usable times that sliced decoding dropped before (they count in the totals).
    Returns the warnings and how many events were dropped or altered."""
    used = np.flatnonzero(codes != K_OTHER)
    if not len(used):
        return [], 0
    total = len(used) + unseen
    ts, dur = ev.ts[used], ev.dur[used]
    no_ts = ~ev.ts_ok[used]
    lim = _MAX_US - abs(base) / 1000.0
    far = ~no_ts & (np.abs(ts) >= lim)
    bad_dur = ~ev.dur_ok[used]
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
    return out, n + int(zero.sum())
