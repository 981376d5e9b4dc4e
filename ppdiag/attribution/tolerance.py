"""How far two measured times may disagree from the input's rounding alone.

Decisions that compare two times (did the peer's block end before it issued the send; had the
late replica finished a block when it reached the collective) must not flip under a few ns of
jitter: the same run read from float32 seconds, float64 seconds or µs floats gives times a few
ns apart, and a flipped decision moves whole blocks between causes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ppdiag.model import RankTimeline

# start and duration are each rounded to the ns: a block end read back can be 1 ns off on either side
ROUND_NS = 2


def timing_tolerance_ns(timelines: Mapping[int, RankTimeline]) -> int:
    """The ns rounding of start and duration, plus the input's own timer resolution
    (``meta["time_resolution_ns"]``, e.g. float32 seconds of op tables) counted for one time's end
    (start + duration) and the other's start."""
    res = max((float(tl.meta.get("time_resolution_ns", 0.0)) for tl in timelines.values()), default=0.0)
    return ROUND_NS + int(np.ceil(2.0 * res))


__all__ = ["ROUND_NS", "timing_tolerance_ns"]
