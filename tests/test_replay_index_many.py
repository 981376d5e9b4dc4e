"""The vectorized wait lookups of the replay index agree with the one-wait-at-a-time ones.

``_P2PIndex.blocking_many`` / ``on_compute_many`` answer every wait of a step in one pass; the
scalar ``blocking`` / ``on_compute_at`` are the reference. Random p2p intervals (overlapping,
nested, touching, ties in cover) and random spans, some empty or outside every interval.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.replay_index import _P2PIndex
from ppdiag.model import Direction, Intervals, Kind, Ranges, RankTimeline

_iv = st.tuples(st.integers(0, 200), st.integers(0, 60), st.integers(0, 3), st.booleans(), st.booleans())


def _index(pieces: list[tuple[int, int, int, bool, bool]]) -> _P2PIndex:
    n = len(pieces)
    start = np.array([p[0] for p in pieces], np.int64)
    kind = np.array([int(Kind.COMPUTE if p[4] and p[3] else Kind.P2P) for p in pieces], np.int64)
    cols = {
        "start": start,
        "end": start + np.array([p[1] for p in pieces], np.int64),
        "kind": kind,
        "peer": np.array([p[2] for p in pieces], np.int64),
        "direction": np.array([int(Direction.SEND if p[3] else Direction.RECV) for p in pieces]),
        # stream 1 runs compute when any compute interval is on it
        "stream": np.array([1 if p[4] else 2 for p in pieces], np.int64),
    }
    iv = Intervals.from_columns(n, cols)
    no_ranges = Ranges.from_columns(0, {"start": [], "end": []})
    tl = RankTimeline(rank=0, source="t", format="optable", names=[""], intervals=iv, ranges=no_ranges)
    return _P2PIndex(tl)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_iv, max_size=25),
    st.lists(st.tuples(st.integers(-10, 270), st.integers(-5, 80)), max_size=15),
    st.integers(0, 10),
)
def test_many_equals_one_at_a_time(
    pieces: list[tuple[int, int, int, bool, bool]], spans: list[tuple[int, int]], tol: int
) -> None:
    idx = _index(pieces)
    lo = np.array([a for a, _ in spans], np.int64)
    hi = lo + np.array([d for _, d in spans], np.int64)
    assert idx.blocking_many(lo, hi, tol) == [
        idx.blocking(a, b, tol) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
    ]
    assert idx.on_compute_many(lo, hi) == [
        idx.on_compute_at(a, b) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
    ]


def test_worked_example() -> None:
    # sends to 5 over [0, 100) and to 3 over [40, 100); the wait [50, 100) is covered 50 by both:
    # the first posted (peer 5) names it; [0, 30) only by the first; [200, 210) by nothing
    idx = _index([(0, 100, 5, True, False), (40, 60, 3, True, False)])
    lo, hi = np.array([50, 0, 200], np.int64), np.array([100, 30, 210], np.int64)
    assert idx.blocking_many(lo, hi) == [
        (5, int(Direction.SEND), 0, 100),
        (5, int(Direction.SEND), 0, 100),
        (-1, 0, 200, 210),
    ]
