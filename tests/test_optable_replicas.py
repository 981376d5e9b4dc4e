"""An op table mapped one batch of DP replicas per task (in this process, a local pool, a Dask
cluster) and reduced: the ranks, and so the report, must be byte for byte those of the
whole-table parse, warnings included (their counts are summed over the replicas)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from ppdiag.api import Options, diagnose
from ppdiag.errors import InputError
from ppdiag.parsers import ParseOptions, cache, loader
from ppdiag.parsers.detect import TraceFile
from ppdiag.parsers.optable import OpTableParser
from ppdiag.parsers.optable_replicas import (
    inline_mapper,
    parse_by_replica,
    plan_table,
    pool_mapper,
    replica_batches,
)
from ppdiag.reports.json_report import dumps
from ppsynth.optable import OpTableParams, simulate_optable

HAVE_DASK = importlib.util.find_spec("distributed") is not None


def _table(tmp: Path, name: str, tp: int = 1, shuffle: bool = False) -> Path:
    """pp 4 x dp 6 (24 ranks), three sampled steps, a slow worker; with rows the reader warns
    about spread over several replicas (unknown optypes, negative durations, a bad rank), so the
    merged counts are tested, not one replica's."""
    df, _ = simulate_optable(
        OpTableParams(pp=4, dp=6, microbatches=8, steps=(2, 5, 6), slow_worker=(3, 2, 1.4), tp=tp, mb_cv=0.1)
    )
    df = df.reset_index(drop=True)
    # extra rows: unknown optypes in three replicas, a row with a bad rank
    extra = pd.concat([df[df["dp_rank"] == dp].iloc[[7]] for dp in (1, 4, 5, 2)])
    extra["optype"] = ["zeta-op", "alpha-op", "zeta-op", "gc"]
    extra["rank"] = extra["rank"].where(extra["optype"] != "gc", -1)
    df = pd.concat([df, extra], ignore_index=True)
    for dp, dur in ((0, -2e-5), (3, -7e-5)):
        df.loc[df.index[(df["dp_rank"] == dp) & (df["optype"] == "optimizer")][:1], "duration"] = dur
    if shuffle:  # rows of every replica in every row group: the filter reads them all
        df = df.sample(frac=1.0, random_state=1).reset_index(drop=True)
    else:  # sorted by replica in small row groups: a task reads only its own
        df = df.sort_values("dp_rank", kind="stable").reset_index(drop=True)
    path = tmp / name
    df["start_ts"] = df["start_ts"].astype(np.float32)
    df["duration"] = df["duration"].astype(np.float32)
    df.to_parquet(path, index=False, row_group_size=2000)
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _table(tmp_path_factory.mktemp("replicas"), "ops.parquet")


def _whole(path: Path) -> bytes:
    data = cache.encode_ranks(OpTableParser().parse(path, ParseOptions()))
    assert data is not None
    return data


@pytest.mark.parametrize(("tp", "shuffle"), [(1, False), (2, True)])
def test_replica_map_is_the_whole_parse(tmp_path: Path, tp: int, shuffle: bool) -> None:
    path = _table(tmp_path, "t.parquet", tp, shuffle)
    whole = OpTableParser().parse(path, ParseOptions())
    warned = whole[0].warnings
    assert any("2 ops with a negative duration" in w for w in warned)
    assert any("3 ops of unknown optype kept as 'other': alpha-op (1), zeta-op (2)" in w for w in warned)
    assert any("1 ops with a negative rank or stage dropped" in w for w in warned)
    assert tp == 1 or any("tensor-parallel size 2" in w for w in warned)
    for workers in (1, 3):
        got = parse_by_replica(path, inline_mapper, workers)
        assert cache.encode_ranks(got) == _whole(path)
        for a, b in zip(whole, got, strict=True):
            assert a.process_groups == b.process_groups and a.source == b.source
        # the reducer shares one world group, as the whole-table parse does
        assert got[0].process_groups[-1].ranks is got[-1].process_groups[-1].ranks


def test_plan_is_small_and_names_every_replica(table: Path) -> None:
    plan = plan_table(table)
    assert plan.replicas == (0, 1, 2, 3, 4, 5)
    assert plan.rank.size == 24  # one row per rank, not per op
    assert [len(b) for b in replica_batches(plan.replicas, 1)] == [1] * 6
    assert sum(len(b) for b in replica_batches(tuple(range(1000)), 2)) == 1000


def test_plan_refuses_a_table_without_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pd.DataFrame({"dp_rank": [0], "stage": [0]}).to_parquet(path)
    with pytest.raises(InputError, match="lacks the required column"):
        plan_table(path)


def _by_replica(monkeypatch: pytest.MonkeyPatch, mapper: Any) -> None:
    """The loader's parse of a one-table run replaced by the replica map through ``mapper``."""

    def parse_files(files: list[TraceFile], *_: Any, **__: Any) -> list[tuple[TraceFile, Any]]:
        assert len(files) == 1
        return [(files[0], parse_by_replica(files[0].path, mapper, 2))]

    monkeypatch.setattr(loader, "parse_files", parse_files)


def test_report_from_a_local_pool_is_byte_identical(table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = dumps(diagnose([table], Options(progress=False, jobs=1)).result)
    _by_replica(monkeypatch, pool_mapper(2))
    got = dumps(diagnose([table], Options(progress=False)).result)
    assert got == want
    assert '"PP009"' in want  # the slow worker, a cross-replica fact, is found either way


@pytest.mark.slow  # a LocalCluster of two processes: ~10 s here
@pytest.mark.skipif(not HAVE_DASK, reason="dask[distributed] not installed (pip install 'ppdiag[dask]')")
def test_report_from_a_local_cluster_is_byte_identical(table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed import LocalCluster

    from ppdiag.parsers import optable_replicas

    reduced: list[int] = []
    reduce = optable_replicas.reduce_replicas

    def spy(plan: Any, digests: Any) -> Any:
        out = reduce(plan, digests)
        reduced.append(len(out))
        return out

    monkeypatch.setattr(optable_replicas, "reduce_replicas", spy)
    want = dumps(diagnose([table], Options(progress=False, jobs=1)).result)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as cluster:
        got = dumps(diagnose([table], Options(progress=False, scheduler=cluster.scheduler_address)).result)
    assert reduced == [24]  # the table went a replica batch per task, not as one file
    assert got == want


def test_a_maps_input_error_reaches_the_reducer(table: Path, tmp_path: Path) -> None:
    """A column only the map reads (not the plan) that is not numeric: the worker's InputError
    comes back as data (its __init__ does not survive pickling) and is raised by the reduce."""
    df = pd.read_parquet(table)
    df["mb_id"] = "x"
    path = tmp_path / "bad.parquet"
    df.to_parquet(path, index=False)
    for mapper in (inline_mapper, pool_mapper(2)):
        with pytest.raises(InputError, match="non-numeric values") as e:
            parse_by_replica(path, mapper, 2)
        assert e.value.path is not None and e.value.path.endswith("bad.parquet")
