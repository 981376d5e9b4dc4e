"""Many interval sets on one line (model/interval_groups.py) against the per-set algebra of
model/intervals.py: every operation on the line, split back per group, equals the per-set
operation on each group; and the batched rank steps and painting equal the per-step ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import ppdiag.api as api_mod
import ppdiag.attribution.causes as causes_mod
from ppdiag.api import Options, diagnose
from ppdiag.attribution import paint as paint_mod
from ppdiag.attribution import rank_steps as rank_steps_mod
from ppdiag.attribution.rank_step import rank_step
from ppdiag.model import intervals as ivs
from ppdiag.model.interval_groups import Line
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.optable import OpTableParams, simulate_optable, write_table
from ppsynth.scenario import make_scenario

Raw = list[tuple[int, int]]


@st.composite
def _groups(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[Raw], list[Raw]]:
    """1-5 groups, each a window [lo, hi) (any clock; negative and huge offsets too) and two
    lists of raw intervals (unsorted, overlapping, touching, empty or reversed) inside it."""
    n = draw(st.integers(1, 5))
    wins, a, b = [], [], []
    for _ in range(n):
        lo = draw(st.sampled_from([-(10**12), 0, 7, 1_700_000_000_000_000_000]))
        hi = lo + draw(st.integers(1, 60))

        def raw(lo: int = lo, hi: int = hi) -> Raw:
            pts = st.integers(lo, hi)
            return [
                (min(p), max(p)) if draw(st.booleans()) else p
                for p in draw(st.lists(st.tuples(pts, pts), max_size=8))
            ]

        wins.append((lo, hi))
        a.append(raw())
        b.append(raw())
    return wins, a, b


def _on_line(line: Line, raws: list[Raw]) -> ivs.ISet:
    """The groups' raw intervals as one (unmerged) pair of arrays of line positions."""
    g = np.array([i for i, r in enumerate(raws) for _ in r], np.int64)
    s = np.array([x for r in raws for x, _ in r], np.int64)
    e = np.array([y for r in raws for _, y in r], np.int64)
    return line.put(g, s), line.put(g, e)


def _same(got: list[ivs.ISet], want: list[ivs.ISet]) -> None:
    assert len(got) == len(want)
    for (gs, ge), (ws, we) in zip(got, want, strict=True):
        assert gs.tolist() == ws.tolist() and ge.tolist() == we.tolist()


def _per_set(raws: list[Raw]) -> list[ivs.ISet]:
    return [ivs.union([s for s, _ in r], [e for _, e in r]) for r in raws]


@settings(max_examples=300, deadline=None)
@given(_groups())
def test_line_operations_equal_the_per_set_ones(
    case: tuple[list[tuple[int, int]], list[Raw], list[Raw]],
) -> None:
    wins, ra, rb = case
    line = Line.of([lo for lo, _ in wins], [hi for _, hi in wins])
    a = ivs.union(*_on_line(line, ra))
    b = ivs.union(*_on_line(line, rb))
    pa, pb = _per_set(ra), _per_set(rb)
    _same(line.split(a), pa)
    _same(line.split(ivs.subtract(a, b)), [ivs.subtract(x, y) for x, y in zip(pa, pb, strict=True)])
    _same(line.split(ivs.intersect(a, b)), [ivs.intersect(x, y) for x, y in zip(pa, pb, strict=True)])
    _same(
        line.split(line.complement(a)),
        [ivs.complement(x, lo, hi) for x, (lo, hi) in zip(pa, wins, strict=True)],
    )
    assert line.measure(a).tolist() == [ivs.measure(x) for x in pa]
    # clip to the middle of each window
    lo = np.array([w0 + (w1 - w0) // 4 for w0, w1 in wins], np.int64)
    hi = np.array([w1 - (w1 - w0) // 4 for w0, w1 in wins], np.int64)
    _same(
        line.split(line.clip(a, lo, hi)),
        [ivs.clip(x, int(a0), int(a1)) for x, a0, a1 in zip(pa, lo, hi, strict=True)],
    )


def _compare_paint(monkeypatch: object, path: Path) -> int:
    """Analyze ``path`` with the batched painting checked against the per-step one; the number of
    steps painted."""
    seen: list[int] = []
    batched = paint_mod.paint

    def both(steps, causes):  # type: ignore[no-untyped-def]
        got, want = batched(steps, causes), paint_mod.paint_per_step(steps, causes)
        assert list(got) == list(want)
        for r in want:
            for f in dataclasses.fields(want[r]):
                x, y = getattr(got[r], f.name), getattr(want[r], f.name)
                assert x.dtype == y.dtype and x.tolist() == y.tolist(), (r, f.name)
        seen.append(len(steps))
        return got

    monkeypatch.setattr(causes_mod, "paint", both)  # type: ignore[attr-defined]
    diagnose([path], Options(progress=False, jobs=1))
    return sum(seen)


def test_batched_paint_equals_per_step_on_a_pipeline(tmp_path: Path, monkeypatch: object) -> None:
    """P=4 M=4 x DP=2 with a host stall and a slow link, three steps (two analyzed per rank after
    the warm-up one is dropped or three when it is not): every gap table identical."""
    run = make_scenario(
        steps=3, pp=4, dp=2, microbatches=4, faults=[F.HostStall(1, 0.3), F.SlowLink(2, delay_ms=0.4)]
    )
    write_kineto(run, tmp_path)
    assert _compare_paint(monkeypatch, tmp_path) >= 16


def test_batched_paint_equals_per_step_on_an_op_table(tmp_path: Path, monkeypatch: object) -> None:
    df, _ = simulate_optable(OpTableParams(mb_cv=0.3))
    assert _compare_paint(monkeypatch, write_table(df, tmp_path / "ops.csv")) >= 8


def _same_step(a: object, b: object) -> None:
    """Two RankSteps field by field (arrays by value and dtype)."""
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x):
            _same_step(x, y)
        elif isinstance(x, tuple):
            assert all(p.dtype == q.dtype and p.tolist() == q.tolist() for p, q in zip(x, y, strict=True)), (
                f.name
            )
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.tolist() == y.tolist(), f.name
        else:
            assert x == y, f.name


def test_batched_rank_steps_equal_per_step(tmp_path: Path, monkeypatch: object) -> None:
    """Every rank's steps gathered at once equal :func:`rank_step` of each (P=4 M=4 x DP=2, four
    steps, a host stall, a slow link and an exposed all-reduce: host evidence, waits and
    collectives in the windows)."""
    faults: list[F.Fault] = [F.HostStall(1, 0.3), F.SlowLink(2, delay_ms=0.4), F.ExposedAllReduce(1.0)]
    write_kineto(make_scenario(steps=4, pp=4, dp=2, microbatches=4, faults=faults), tmp_path)
    seen: list[int] = []
    batched = rank_steps_mod.rank_steps

    def both(tl, specs):  # type: ignore[no-untyped-def]
        got = batched(tl, specs)
        want = [rank_step(tl, w.step, w.number, w.w0, w.w1, w.blocks) for w in specs]
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _same_step(a, b)
        seen.append(sum(len(rs.blocks) > 0 and rs.host_set[0].size > 0 for rs in got))
        return got

    monkeypatch.setattr(api_mod, "rank_steps", both)  # type: ignore[attr-defined]
    diagnose([tmp_path], Options(progress=False, jobs=1))
    assert len(seen) == 8 and sum(seen) > 0


def test_line_refuses_spans_that_overflow_int64() -> None:
    """Two windows of 2^62 ns cannot lie end to end on one int64 line: the callers then take the
    per-step path."""
    import pytest

    with pytest.raises(OverflowError):
        Line.of([0, 0], [2**62, 2**62])
    assert Line.of([5, 100], [10, 100]).off.tolist() == [0, 6]  # widths 6 and 1


@settings(max_examples=300, deadline=None)
@given(_groups(), st.data())
def test_group_of_sorted_or_not_is_the_binary_search(
    case: tuple[list[tuple[int, int]], list[Raw], list[Raw]], data: st.DataObject
) -> None:
    wins = case[0]
    line = Line.of([lo for lo, _ in wins], [hi for _, hi in wins])
    top = int(line.off[-1] + (line.hi[-1] - line.lo[-1]))
    # offsets themselves among the positions: the group boundaries are where the two ways could part
    pts = data.draw(
        st.lists(st.one_of(st.integers(0, top - 1), st.sampled_from(line.off.tolist())), max_size=30)
    )
    for x in (np.array(pts, np.int64), np.sort(np.array(pts, np.int64))):
        want = (np.searchsorted(line.off, x, side="right") - 1).astype(np.int64)
        got = line.group_of(x)
        assert got.dtype == np.int64
        assert got.tolist() == want.tolist()
