"""The rank-step accounting and the per-gap cause tables mapped a batch of DP replicas per task (in
this process, a local pool, a Dask cluster): the report must be byte for byte the one of the
in-process analysis, and every gap table the same in value and order, on op tables of several
pp x dp shapes with a slow worker (one slow replica) and a heavy stage."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, _default_map, _replica_groups, analyze_run, load
from ppdiag.diagnosis import GapTable
from ppdiag.model import Run
from ppdiag.parsers.scaleout import BatchTask, ReplicaMap, inline_map, pool_map, replica_groups
from ppdiag.reports.json_report import dumps
from ppsynth.optable import OpTableParams, simulate_optable

HAVE_DASK = importlib.util.find_spec("distributed") is not None

# (pp, dp, slow worker (dp_rank, stage, factor), heavy stage (stage, factor))
SHAPES = [
    (2, 3, (1, 0, 1.5), None),
    (4, 5, (3, 2, 1.4), (1, 1.3)),
    (3, 8, (6, 1, 1.6), (2, 1.25)),
]


def _run(tmp: Path, pp: int, dp: int, slow: Any, heavy: Any) -> Run:
    df, _ = simulate_optable(
        OpTableParams(pp=pp, dp=dp, microbatches=6, steps=(2, 5, 6), slow_worker=slow, heavy_stage=heavy)
    )
    path = tmp / f"ops-{pp}x{dp}.parquet"
    df = df.sort_values("dp_rank", kind="stable").reset_index(drop=True)
    df.to_parquet(path, index=False, row_group_size=2000)
    return load([path], Options(progress=False, jobs=1))


def _counting(inner: ReplicaMap, calls: list[int]) -> ReplicaMap:
    """``inner``, recording the number of replica groups of each call."""

    def run(task: BatchTask, groups: Sequence[Sequence[Any]]) -> list[Any]:
        calls.append(len(groups))
        return inner(task, groups)

    return run


_IN_PROCESS: dict[int, Analyzed] = {}  # by id of the fixture's run: its in-process analysis


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"pp{s[0]}xdp{s[1]}")
def shaped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, str]:
    pp, dp, slow, heavy = request.param
    run = _run(tmp_path_factory.mktemp("amap"), pp, dp, slow, heavy)
    diag = analyze_run(run, Options(progress=False))
    _IN_PROCESS[id(run)] = diag
    return run, dumps(diag.result)


def _same_tables(got: dict[int, GapTable], want: dict[int, GapTable]) -> None:
    """The same ranks in the same order, every column the same values and dtype."""
    assert list(got) == list(want)
    for r, w in want.items():
        for f in dataclasses.fields(w):
            x, y = getattr(got[r], f.name), getattr(w, f.name)
            assert x.dtype == y.dtype and np.array_equal(x, y), (r, f.name)


def _same_gaps(got: Analyzed, want: Analyzed) -> None:
    """The gap tables as painted and as blamed, as in the in-process analysis."""
    a = got.context.attribution if got.context is not None else None
    b = want.context.attribution if want.context is not None else None
    assert a is not None and b is not None
    assert sum(len(g) for g in want.gaps.values()) > 0
    _same_tables(a.gaps, b.gaps)
    _same_tables(got.gaps, want.gaps)


@pytest.mark.parametrize("workers", [1, 3])
def test_mapped_in_this_process_is_byte_identical(shaped: tuple[Run, str], workers: int) -> None:
    run, want = shaped
    calls: list[int] = []
    diag = analyze_run(run, Options(progress=False), replica_map=_counting(inline_map(workers), calls))
    assert dumps(diag.result) == want
    _same_gaps(diag, _IN_PROCESS[id(run)])
    pp = len(run.ranks) // len({tl.meta["dp_rank"] for tl in run.ranks})
    # one group per replica, mapped twice: the accounting, then the gap tables
    assert calls == [len(run.ranks) // pp] * 2
    assert '"PP009"' in want  # the slow worker, a cross-replica fact, is found either way


def test_mapped_in_a_local_pool_is_byte_identical(shaped: tuple[Run, str]) -> None:
    run, want = shaped
    diag = analyze_run(run, Options(progress=False), replica_map=pool_map(2))
    assert dumps(diag.result) == want
    _same_gaps(diag, _IN_PROCESS[id(run)])


def test_a_map_that_mixes_gap_tables_changes_them(shaped: tuple[Run, str]) -> None:
    """The gap tables' comparison can fail: a map that hands two ranks of the paint each other's
    tables gives other tables (the report's JSON does not hold them)."""
    from ppdiag.attribution.paint_map import paint_batch

    def swapped(task: BatchTask, groups: Sequence[Sequence[Any]]) -> list[Any]:
        out = inline_map()(task, groups)
        if task is paint_batch:
            out[0], out[-1] = out[-1], out[0]
        return out

    run, _ = shaped
    with pytest.raises(AssertionError):
        _same_gaps(analyze_run(run, Options(progress=False), replica_map=swapped), _IN_PROCESS[id(run)])


def test_a_map_that_mixes_ranks_changes_the_report(shaped: tuple[Run, str]) -> None:
    """The comparison can fail: a map that hands the first two ranks each other's steps (same
    count, wrong owner) gives another report."""

    def swapped(task: BatchTask, groups: Sequence[Sequence[Any]]) -> list[Any]:
        out = inline_map()(task, groups)
        out[0], out[1] = out[1], out[0]
        return out

    run, want = shaped
    assert dumps(analyze_run(run, Options(progress=False), replica_map=swapped).result) != want


def test_replica_groups_follow_the_pipelines() -> None:
    # ranks 0..5 in rank order; pipelines [0, 3], [1, 4]; rank 2 and 5 in none, rank 4 listed twice
    assert _replica_groups([0, 1, 2, 3, 4, 5], [[0, 3], [1, 4], [4]]) == [[0, 3], [1, 4], [2, 5]]
    # 40 replicas on 2 workers: 8 tasks per worker at most 16 replicas each -> 3 per task
    got = replica_groups(40, 2)
    assert got[0] == (0, 3) and got[-1] == (39, 40) and sum(b - a for a, b in got) == 40
    assert replica_groups(1000, 1) == [(a, min(a + 16, 1000)) for a in range(0, 1000, 16)]


def test_default_map_only_for_an_op_table_with_a_scheduler(
    shaped: tuple[Run, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run, _ = shaped
    monkeypatch.delenv("PPDIAG_DASK_SCHEDULER", raising=False)
    assert _default_map(run, Options()) is None
    assert _default_map(run, Options(scheduler="tcp://127.0.0.1:1")) is not None  # no connection yet
    monkeypatch.setenv("PPDIAG_DASK_SCHEDULER", "tcp://127.0.0.1:1")
    assert _default_map(run, Options()) is not None
    other = dataclasses.replace(
        run, ranks=[dataclasses.replace(run.ranks[0], format="kineto"), *run.ranks[1:]]
    )
    assert _default_map(other, Options()) is None  # trace files: the parse map only


@pytest.mark.slow  # a LocalCluster of two processes: ~10 s here
@pytest.mark.skipif(not HAVE_DASK, reason="dask[distributed] not installed (pip install 'ppdiag[dask]')")
def test_mapped_on_a_local_cluster_is_byte_identical(tmp_path: Path) -> None:
    from distributed import LocalCluster

    run = _run(tmp_path, 4, 5, (3, 2, 1.4), (1, 1.3))
    one = analyze_run(run, Options(progress=False))
    want = dumps(one.result)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as cluster:
        opts = Options(progress=False, scheduler=cluster.scheduler_address)
        mapped = _default_map(run, opts)
        assert mapped is not None
        calls: list[int] = []
        diag = analyze_run(run, opts, replica_map=_counting(mapped, calls))
    assert calls == [5, 5]
    assert dumps(diag.result) == want
    _same_gaps(diag, one)
    assert np.array_equal(np.sort([tl.rank for tl in run.ranks]), [tl.rank for tl in run.ranks])


def test_packed_steps_are_the_steps(shaped: tuple[Run, str]) -> None:
    """What a task sends back, unpacked: every field of every rank step equal to the in-process
    one, the blocks the reducer's own objects, ``wait_set`` the same object as ``sets.p2p``."""
    from ppdiag.api import _step_specs
    from ppdiag.attribution.rank_steps import pack_steps, rank_steps, shippable, unpack_steps
    from ppdiag.pipeline import PipelineOptions, rebuild

    run, _ = shaped
    pipe = rebuild(run, PipelineOptions())
    for tl, specs in _step_specs(pipe.aligned, pipe, None):
        want = rank_steps(tl, specs)
        got = unpack_steps(pack_steps(rank_steps(*shippable(tl, specs))), specs)
        assert len(got) == len(want) == len(specs) > 0
        for g, w, spec in zip(got, want, specs, strict=True):
            assert (g.rank, g.step, g.number, g.w0, g.w1, g.acct) == (
                w.rank,
                w.step,
                w.number,
                w.w0,
                w.w1,
                w.acct,
            )
            assert g.blocks is spec.blocks and g.wait_set is g.sets.p2p
            for a, b in zip(_sets(g), _sets(w), strict=True):
                assert a[0].dtype == b[0].dtype == np.int64
                assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    # a set that is not int64 travels as it is
    tl, specs = _step_specs(pipe.aligned, pipe, None)[0]
    odd = rank_steps(tl, specs)
    odd[0].host_set = (odd[0].host_set[0].astype(np.int32), odd[0].host_set[1].astype(np.int32))
    assert pack_steps(odd) is odd


def _sets(s: Any) -> list[Any]:
    w = s.sets
    return [w.compute, w.p2p, w.collective, w.gaps, w.copy, s.host_set, s.wait_set, s.p2p_host]


def _step(rank: int, compute: list[tuple[int, int]], gaps: list[tuple[int, int]]) -> Any:
    """One analyzed step of ``rank`` in the window [0, 10 ms): its compute and its lost time, all
    of it idle with host evidence (ns)."""
    from ppdiag.attribution.accounting import Account, WindowSets
    from ppdiag.attribution.rank_step import RankStep
    from ppdiag.model import intervals as ivs
    from ppdiag.pipeline.blocks import Blocks

    def iset(xs: list[tuple[int, int]]) -> Any:
        return (np.array([a for a, _ in xs], np.int64), np.array([b for _, b in xs], np.int64))

    lost = sum(b - a for a, b in gaps)
    e = ivs.empty
    sets = WindowSets(iset(compute), e(), e(), iset(gaps), e())
    acct = Account(10_000_000, 10_000_000 - lost, 0, 0, lost, 0)
    return RankStep(rank, 0, 1, 0, 10_000_000, sets, acct, Blocks.empty(), iset(gaps), e(), e())


@pytest.mark.parametrize("groups", [[[0], [1], [2]], [[2], [0, 1]], [[1, 2, 0]]])
def test_mapped_gap_tables_keep_the_order_of_one_process(groups: list[list[int]]) -> None:
    """Rank 0 lost nothing, rank 1 lost 2 ms (4-6 ms, host), rank 2 lost 1 ms (0-1 ms, host). One
    process lists the ranks with pieces first, in the order of the steps, then the others:
    {1: [4, 6) ms, 2: [0, 1) ms, 0: nothing}, whatever the replicas and the order of the tasks."""
    from ppdiag.attribution.paint import paint
    from ppdiag.attribution.paint_map import MappedSteps, paint_replicas
    from ppdiag.attribution.rank_steps import pack_steps

    steps = [
        _step(0, [(0, 10_000_000)], []),
        _step(1, [(0, 4_000_000), (6_000_000, 10_000_000)], [(4_000_000, 6_000_000)]),
        _step(2, [(1_000_000, 10_000_000)], [(0, 1_000_000)]),
    ]
    causes = {(rs.rank, 0): {"host": rs.acct.lost} for rs in steps}
    want = paint(steps, causes)
    assert list(want) == [1, 2, 0]
    assert want[1].start.tolist() == [4_000_000] and want[1].end.tolist() == [6_000_000]
    assert want[2].end.tolist() == [1_000_000] and len(want[0]) == 0
    mapped = MappedSteps([pack_steps([rs]) for rs in steps], groups)
    _same_tables(paint_replicas(inline_map(), mapped, steps, causes), want)
    # steps that are not the ones the map computed are painted in this process
    fewer = MappedSteps(mapped.packed[:2], [[0, 1]])
    _same_tables(paint_replicas(inline_map(), fewer, steps, causes), want)


# the op-table scenarios of the suite (test_optable.py, the goldens' op table), tp 2 besides
SUITE = {
    "default": OpTableParams(),
    "slow": OpTableParams(slow_worker=(1, 2, 1.3)),
    "heavy": OpTableParams(heavy_stage=(3, 1.4)),
    "variance": OpTableParams(mb_cv=0.3),
    "pp4dp2": OpTableParams(slow_worker=(0, 1, 1.3), mb_cv=0.2, seed=4),
    "pp3dp3": OpTableParams(pp=3, dp=3, microbatches=6, slow_worker=(2, 0, 1.25), mb_cv=0.15, seed=11),
    "pp2dp4-heavy": OpTableParams(pp=2, dp=4, microbatches=12, heavy_stage=(1, 1.3), mb_cv=0.25, seed=7),
    "tp2": OpTableParams(tp=2, slow_worker=(1, 1, 1.3)),
}


@pytest.mark.parametrize("name", list(SUITE))
def test_suite_op_tables_mapped_are_identical(name: str, tmp_path: Path) -> None:
    """Each op-table scenario of the suite, the accounting and the gap tables mapped (two workers'
    batches in this process): the report byte for byte, every gap table the same."""
    df, _ = simulate_optable(SUITE[name])
    path = tmp_path / "ops.parquet"
    df.to_parquet(path, index=False)
    run = load([path], Options(progress=False, jobs=1))
    want = analyze_run(run, Options(progress=False))
    calls: list[int] = []
    got = analyze_run(run, Options(progress=False), replica_map=_counting(inline_map(2), calls))
    assert len(calls) == 2
    assert dumps(got.result) == dumps(want.result)
    _same_gaps(got, want)
