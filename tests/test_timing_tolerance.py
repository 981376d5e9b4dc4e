"""Decisions on measured times must not flip under the input's rounding: the timing tolerance, the
ties it makes, and the diagnosis of an op table whose times are jittered by a few ns."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppdiag.api import Options, diagnose
from ppdiag.attribution.causes import _P2PIndex
from ppdiag.attribution.tolerance import ROUND_NS, timing_tolerance_ns
from ppdiag.model import Direction, Intervals, Kind, Ranges, RankTimeline
from ppdiag.parsers.loader import load_run
from ppdiag.parsers.optable_ranks import resolution_ns as _resolution_ns
from ppsynth.optable import OpTableParams, simulate_optable, write_table

HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None


def _tl(rank: int, meta: dict[str, object], iv: Intervals | None = None) -> RankTimeline:
    return RankTimeline(
        rank=rank,
        source="t",
        format="optable",
        names=[""],
        intervals=iv if iv is not None else Intervals.from_columns(0, {"start": [], "end": []}),
        ranges=Ranges.from_columns(0, {"start": [], "end": []}),
        meta=dict(meta),
    )


def test_tolerance_from_resolution() -> None:
    # no resolution given: the ns rounding of start and duration only
    assert timing_tolerance_ns({0: _tl(0, {})}) == ROUND_NS == 2
    # float32 seconds near 0.09 s are 7.45 ns apart: 2 + ceil(2 * 7.45) = 17 ns; the coarsest rank counts
    tls = {0: _tl(0, {"time_resolution_ns": 7.45}), 1: _tl(1, {"time_resolution_ns": 0.5})}
    assert timing_tolerance_ns(tls) == 17


def test_resolution_of_columns() -> None:
    f32 = np.array([0.001, 0.0895], np.float32)
    # float32 spacing at 0.0895 is 2**-27 s = 7.45 ns
    assert _resolution_ns(f32, 1e9) == pytest.approx(7.45, abs=0.01)
    # float64 seconds: far below a ns
    assert _resolution_ns(f32.astype(np.float64), 1e9) < 1e-6
    # µs floats (Chrome form) at 1e6 µs: spacing 1.2e-10 µs
    assert _resolution_ns(np.array([1e6]), 1e3) < 1e-3
    assert _resolution_ns(np.array([1, 2], np.int64), 1e9) == 0.0


@pytest.mark.skipif(not HAVE_PYARROW, reason="pyarrow not installed (pip install 'ppdiag[parquet]')")
def test_parquet_float32_resolution_in_meta(tmp_path: Path) -> None:
    df, _ = simulate_optable(OpTableParams(pp=2, dp=1, microbatches=2, steps=(1,)))
    a = load_run([write_table(df, tmp_path / "t.parquet")], jobs=1, progress=False)
    b = load_run([write_table(df, tmp_path / "t.csv")], jobs=1, progress=False)
    res_a = a.ranks[0].meta["time_resolution_ns"]
    res_b = b.ranks[0].meta["time_resolution_ns"]
    assert 0.5 < res_a < 10 and res_b < 1e-3


def test_blocking_tie_first_posted() -> None:
    # a wait [100, 1100) held by a receive from rank 3 posted at 100 (covers 998 ns) and a send to
    # rank 5 posted at 101 (covers 999 ns): 1 ns apart is jitter. With no tolerance the longest
    # piece (the send) names the peer; within the tolerance they tie and the first posted does
    iv = Intervals.from_columns(
        2,
        {
            "start": np.array([100, 101]),
            "end": np.array([1098, 1100]),
            "kind": np.full(2, int(Kind.P2P)),
            "peer": np.array([3, 5]),
            "direction": np.array([int(Direction.RECV), int(Direction.SEND)]),
            "stream": np.array([1, 1]),
        },
    )
    idx = _P2PIndex(_tl(4, {}, iv))
    assert idx.blocking(100, 1100, 0)[:2] == (5, int(Direction.SEND))
    assert idx.blocking(100, 1100, 2)[:2] == (3, int(Direction.RECV))
    # a real difference (2 µs) is not a tie
    iv2 = Intervals.from_columns(
        2,
        {
            "start": np.array([100, 2100]),
            "end": np.array([5100, 5100]),
            "kind": np.full(2, int(Kind.P2P)),
            "peer": np.array([5, 3]),
            "direction": np.array([int(Direction.SEND), int(Direction.RECV)]),
            "stream": np.array([1, 1]),
        },
    )
    assert _P2PIndex(_tl(4, {}, iv2)).blocking(100, 5100, 17)[0] == 5


_BASE = OpTableParams(pp=3, dp=2, microbatches=4, steps=(2, 5, 6), slow_worker=(1, 1, 1.3), mb_cv=0.2, seed=3)
#: A run's findings (code, ranks, gain) and each rank's shares.
_Summary = tuple[list[tuple[str, list[int], float | None]], list[dict[str, float]]]
_REF: dict[str, _Summary] = {}


def _summary(path: Path) -> _Summary:
    d = diagnose([path], Options(progress=False, jobs=1))
    return [(f.code, f.ranks, f.gain_ms) for f in d.findings], [r.shares for r in d.result.ranks]


@pytest.mark.skipif(not HAVE_PYARROW, reason="pyarrow not installed (pip install 'ppdiag[parquet]')")
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_ns_jitter_keeps_the_diagnosis(tmp_path: Path, seed: int) -> None:
    # every op's start and duration moved by up to ±1 ns and then stored as float32 seconds (7.45 ns
    # apart at 0.09 s): against the exact run in CSV, the same findings on the same ranks, gains
    # within 1 %, every rank's split within 0.1 % of the step
    df, _ = simulate_optable(_BASE)
    if "ref" not in _REF:
        _REF["ref"] = _summary(write_table(df, tmp_path / "ref.csv"))
    ref_f, ref_s = _REF["ref"]
    rng = np.random.default_rng(seed)
    j = df.copy()
    j["start_ts"] = j["start_ts"] + rng.integers(-1, 2, len(j)) * 1e-9
    j["duration"] = np.maximum(j["duration"] + rng.integers(-1, 2, len(j)) * 1e-9, 0.0)
    got_f, got_s = _summary(write_table(j, tmp_path / f"j{seed}.parquet"))
    assert [(c, r) for c, r, _ in got_f] == [(c, r) for c, r, _ in ref_f]
    for (code, _, ga), (_, _, gb) in zip(ref_f, got_f, strict=True):
        assert (ga is None) == (gb is None)
        if ga is not None and gb is not None:
            assert abs(ga - gb) <= 0.01 * ga, (code, ga, gb)
    for sa, sb in zip(ref_s, got_s, strict=True):
        for k in sa:
            assert abs(sa[k] - sb[k]) <= 0.001, (k, sa[k], sb[k])
