"""The parsed run is sound (check_run) and read-only (freeze_run) for every input kind: a later
layer that writes into the parser's arrays fails at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from ppdiag.api import Options, analyze_run, load
from ppdiag.model import Intervals
from ppdiag.model.invariants import LABEL_COLUMNS, check_run, freeze_run
from ppdiag.pipeline.blocks import IntervalLabels
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

DATA = Path(__file__).parent / "data"

#: The label columns of one rank's intervals: phase, micro-batch, virtual stage.
_Labels = tuple[npt.NDArray[np.integer[Any]], ...]


def _labels(x: Intervals | IntervalLabels) -> _Labels:
    return (x.phase, x.mb, x.chunk)


@pytest.fixture(scope="module", params=["kineto", "nsys"])
def run_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp(request.param)
    # one GPU per host: every rank on a clock of its own, for the alignment to move
    run = make_scenario(steps=2, pp=4, microbatches=4, faults=[F.SlowStage(1, 1.3)], gpus_per_node=1)
    (write_kineto if request.param == "kineto" else write_nsys)(run, d)
    return d


def test_parsed_runs_are_sound(run_dir: Path) -> None:
    assert check_run(load([run_dir])) == []


@pytest.mark.parametrize("name", ["gpu_pp_rank0.json", "cpu_gloo_rank0.json"])
def test_demo_traces_are_sound(name: str) -> None:
    assert check_run(load([DATA / name])) == []


def test_parser_arrays_are_read_only(run_dir: Path) -> None:
    run = load([run_dir])
    iv, rg = run.ranks[0].intervals, run.ranks[0].ranges
    with pytest.raises(ValueError, match="read-only"):
        iv.start[0] = 0
    with pytest.raises(ValueError, match="read-only"):
        rg.end[:] = 0
    for c in iv.COLUMNS:
        assert getattr(iv, c).flags.writeable == (c in LABEL_COLUMNS), c


def test_analysis_leaves_the_run_as_parsed(run_dir: Path) -> None:
    """Analysing a parsed run twice gives the same report, and the run's times and clock offsets
    are unchanged: the fitted offsets live on the pipeline result and its aligned view."""
    run = load([run_dir])
    before = [(tl.intervals.start.copy(), tl.intervals.end.copy(), tl.clock_offset_ns) for tl in run.ranks]
    assert all(off == 0 for _, _, off in before)  # a parser sets no offset
    diag = analyze_run(run, Options())
    again = analyze_run(run, Options())
    assert diag.result == again.result
    for (s, e, off), tl in zip(before, run.ranks, strict=True):
        assert np.array_equal(s, tl.intervals.start) and np.array_equal(e, tl.intervals.end)
        assert tl.clock_offset_ns == off
    assert diag.context is not None and diag.context.pipeline is not None
    offsets = diag.context.pipeline.clocks.offsets
    # the synthetic ranks' clocks are skewed: the fit moves some rank, on the view only
    assert any(offsets.values()), offsets
    assert diag.run is not run and diag.run is diag.context.pipeline.aligned
    for tl, view in zip(run.ranks, diag.run.ranks, strict=True):
        assert view.rank == tl.rank and view.clock_offset_ns == offsets.get(tl.rank, 0)
        assert view.intervals.start is tl.intervals.start  # the view shares the parsed times
    assert diag.result.run.clock_offsets_us == {
        str(r): round(offsets.get(r, 0) / 1000, 3) for r in (tl.rank for tl in run.ranks)
    }


def test_check_finds_broken_runs(run_dir: Path) -> None:
    run = load([run_dir])
    tl = run.ranks[0]
    n = len(tl.intervals)
    tl.intervals.end = tl.intervals.start - 1  # every interval ends before it starts
    tl.ranges.name = np.full(len(tl.ranges), len(tl.names) + 5, dtype=np.int32)
    tl.intervals.mb = np.zeros(n + 1, dtype=np.int32)
    problems = check_run(run)
    assert any("intervals.mb has shape" in p for p in problems), problems
    tl.intervals.mb = np.zeros(n, dtype=np.int32)
    problems = check_run(run)
    assert any(f"{n} row(s) end before they start" in p for p in problems), problems
    assert any("ranges: name index outside" in p for p in problems), problems
    run.ranks.append(run.ranks[0])
    assert any("not unique" in p for p in check_run(run))


def test_freeze_is_idempotent(run_dir: Path) -> None:
    run = load([run_dir])
    assert freeze_run(freeze_run(run)) is run


def test_block_labels_are_an_overlay(run_dir: Path) -> None:
    """The pipeline's block labels live on the pipeline result; the parser's label columns stay
    as parsed and read-only, and the aligned view's timelines show the overlay through copies of it."""
    run = load([run_dir])
    parsed = {tl.rank: _labels(tl.intervals) for tl in run.ranks}
    snap = {r: tuple(a.copy() for a in cols) for r, cols in parsed.items()}
    diag = analyze_run(run, Options())
    assert diag.context is not None and diag.context.pipeline is not None
    pipe = diag.context.pipeline
    relabelled = 0
    for tl, view in zip(run.ranks, diag.run.ranks, strict=True):
        lab = pipe.labels[tl.rank]
        now = _labels(tl.intervals)
        assert all(a is b for a, b in zip(now, parsed[tl.rank], strict=True))  # not replaced
        for arr, before, shown, over in zip(
            parsed[tl.rank],
            snap[tl.rank],
            _labels(view.intervals),
            _labels(lab),
            strict=True,
        ):
            assert not arr.flags.writeable and not over.flags.writeable
            assert np.array_equal(arr, before)  # the parsed column is untouched
            assert np.array_equal(shown, over) and shown is not arr
            relabelled += int((over != before).sum())
    # a pipelined run with 4 stages: the blocks relabel the compute (micro-batch numbers at least)
    assert relabelled > 0
