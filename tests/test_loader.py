"""Run loading: finding trace files, formats, parallel parsing, rank resolution."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TEST_DATA, shared_trace

from ppdiag.errors import InputError
from ppdiag.model import Intervals, Ranges, RankTimeline
from ppdiag.parsers import PARSERS, ParseOptions
from ppdiag.parsers.loader import find_traces, load_run


def cpu_trace(rank: int | None, world: int | None = None, n_ops: int = 3) -> dict[str, Any]:
    dist: dict[str, Any] = {"backend": "gloo"}
    if rank is not None:
        dist["rank"] = rank
    if world is not None:
        dist["world_size"] = world
    ev = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i}",
            "pid": 1,
            "tid": 1,
            "ts": 10.0 * i,
            "dur": 5.0,
            "args": {},
        }
        for i in range(n_ops)
    ]
    return {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": dist, "traceEvents": ev}


def put(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def same_intervals(a: Intervals, b: Intervals) -> bool:
    return all(np.array_equal(getattr(a, c), getattr(b, c)) for c in Intervals.COLUMNS)


def test_gloo_run_dir_serial_and_parallel_agree(shared_traces: Path) -> None:
    d = shared_traces / "kineto" / "gloo_cpu_2rank"
    serial = load_run([d], jobs=1, progress=False)
    parallel = load_run([str(d)], jobs=2, progress=False)
    for run in (serial, parallel):
        assert run.format == "kineto"
        assert [r.rank for r in run.ranks] == [0, 1]
        assert all(r.cpu_only for r in run.ranks)
        assert run.world_size == 2 and not run.warnings
    for a, b in zip(serial.ranks, parallel.ranks, strict=True):
        assert a.source == b.source and a.names == b.names
        assert same_intervals(a.intervals, b.intervals)


def test_sampled_two_of_128(shared_traces: Path) -> None:
    run = load_run([shared_traces / "kineto" / "hta_sampled_2rank"], progress=False)
    assert [r.rank for r in run.ranks] == [0, 1]
    assert "ranks present: [0, 1] of world 128" in run.warnings
    assert all(len(r.intervals) > 0 and not r.cpu_only for r in run.ranks)


def test_single_file_without_rank_is_rank0() -> None:
    run = load_run([shared_trace("kineto/tracelens_h100_single.json.gz")], progress=False)
    (r,) = run.ranks
    assert (r.rank, r.rank_source) == (0, "single file")


def test_real_single_files_keep_their_rank() -> None:
    run = load_run([shared_trace("kineto/hta_2022_format_rank3.json.gz")], progress=False)
    assert [(r.rank, r.rank_source) for r in run.ranks] == [(3, "distributedInfo")]
    assert run.warnings == ["ranks present: [3] of world 8"]


def test_explicit_files_sorted_by_rank(tmp_path: Path) -> None:
    files = [put(tmp_path / f"t{r}.json", cpu_trace(r, 3)) for r in (2, 0, 1)]
    run = load_run(files, jobs=2, progress=False)
    assert [r.rank for r in run.ranks] == [0, 1, 2]
    assert [Path(r.source).name for r in run.ranks] == ["t0.json", "t1.json", "t2.json"]
    assert not run.warnings


def test_directory_skips_non_traces_with_warning(tmp_path: Path) -> None:
    put(tmp_path / "rank0.json", cpu_trace(0, 2))
    put(tmp_path / "rank1.json", cpu_trace(1, 2))
    put(tmp_path / "config.json", {"lr": 0.1})
    (tmp_path / "notes.txt").write_text("not a trace")
    run = load_run([tmp_path], progress=False)
    assert [r.rank for r in run.ranks] == [0, 1]
    assert any("config.json" in w and "skipped" in w for w in run.warnings)
    assert not any("notes.txt" in w for w in run.warnings)


def test_directory_recurses_one_level(tmp_path: Path) -> None:
    for r in (0, 1):
        put(tmp_path / f"node{r}" / f"worker{r}.pt.trace.json", cpu_trace(None))
    run = load_run([tmp_path], progress=False)
    assert [(r.rank, r.rank_source) for r in run.ranks] == [(0, "file name"), (1, "file name")]
    # a deeper level is not searched
    deep = tmp_path / "deep"
    put(deep / "a" / "b" / "rank0.json", cpu_trace(0))
    with pytest.raises(InputError, match="no trace files found"):
        load_run([deep], progress=False)


def test_file_name_ranks_in_a_run(tmp_path: Path) -> None:
    for r in (0, 1, 2, 3):
        put(tmp_path / f"rank-{r}.json", cpu_trace(None))
    run = load_run([tmp_path], progress=False)
    assert [r.rank for r in run.ranks] == [0, 1, 2, 3]


def test_per_file_warnings_are_prefixed(tmp_path: Path) -> None:
    put(tmp_path / "rank0.json", cpu_trace(0, 2, n_ops=50))
    text = json.dumps(cpu_trace(1, 2, n_ops=50), indent=1)
    (tmp_path / "rank1.json").write_text(text[: int(len(text) * 0.6)])  # a crashed writer
    run = load_run([tmp_path], progress=False)
    assert [r.rank for r in run.ranks] == [0, 1]
    assert any(w.startswith("rank1.json: truncated") for w in run.warnings)
    assert 0 < run.ranks[1].events_total < 50


def test_duplicate_ranks(tmp_path: Path) -> None:
    a = put(tmp_path / "a.json", cpu_trace(1, 2))
    b = put(tmp_path / "b.json", cpu_trace(1, 2))
    with pytest.raises(InputError, match="duplicate rank 1") as ei:
        load_run([tmp_path], progress=False)
    assert str(a) in str(ei.value) and str(b) in str(ei.value)


def test_unranked_files_in_multi_file_run(tmp_path: Path) -> None:
    put(tmp_path / "a.json", cpu_trace(0, 2))
    b = put(tmp_path / "trace_b.json", cpu_trace(None))
    c = put(tmp_path / "trace_c.json", cpu_trace(None))
    with pytest.raises(InputError, match="cannot tell the rank of 2 of 3") as ei:
        load_run([tmp_path], progress=False)
    assert str(b) in str(ei.value) and str(c) in str(ei.value)


class _FakeParser:
    """A second format for the mixed-run check (content starts with FAKEFMT)."""

    name = "fakefmt"
    format = "fakefmt"
    suffixes: tuple[str, ...] = (".sqlite",)
    describe = "fakefmt files"
    holds_every_rank = False

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.startswith(b"FAKEFMT")

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        raise AssertionError("not reached")


def test_mixed_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdiag.parsers import load_builtin

    load_builtin()
    monkeypatch.setitem(PARSERS, "fakefmt", _FakeParser())
    k = put(tmp_path / "rank0.json", cpu_trace(0))
    f = tmp_path / "rank1.sqlite"
    f.write_bytes(b"FAKEFMT\x00data")
    with pytest.raises(InputError, match="mixed trace formats") as ei:
        load_run([tmp_path], progress=False)
    assert str(k) in str(ei.value) and str(f) in str(ei.value)


def test_mixed_real_formats(shared_traces: Path) -> None:
    from ppdiag.parsers import load_builtin

    load_builtin()
    if len(PARSERS) < 2:
        pytest.skip("only one parser registered")
    with pytest.raises(InputError, match="mixed trace formats"):
        find_traces([shared_traces])  # kineto/ and nsys/ one level down


def test_child_input_error_is_reraised(tmp_path: Path) -> None:
    put(tmp_path / "rank0.json", cpu_trace(0, 2))
    bad = cpu_trace(1, 2)
    bad["distributedInfo"]["backend"] = "nccl"  # an NCCL run whose GPU activity was not recorded
    b = put(tmp_path / "rank1.json", bad)
    for jobs in (1, 2):
        with pytest.raises(InputError) as ei:
            load_run([tmp_path], jobs=jobs, progress=False)
        assert ei.value.path == str(b)
        assert str(ei.value).startswith(f"{b}: no GPU events")
        assert "\n" not in str(ei.value)


def test_progress_flag_is_harmless(tmp_path: Path) -> None:
    for r in (0, 1):
        put(tmp_path / f"rank{r}.json", cpu_trace(r))
    assert len(load_run([tmp_path], progress=True).ranks) == 2


def test_same_file_twice_counts_once(tmp_path: Path) -> None:
    p = put(tmp_path / "rank0.json", cpu_trace(0))
    run = load_run([p, tmp_path, str(p)], progress=False)
    assert len(run.ranks) == 1


def test_gzip_and_plain_in_one_dir(tmp_path: Path) -> None:
    shutil.copy(TEST_DATA / "gpu_pp_rank0.json", tmp_path / "rank0.json")
    import gzip

    obj = json.loads((TEST_DATA / "gpu_pp_rank0.json").read_text())
    obj["distributedInfo"]["rank"] = 1
    (tmp_path / "rank1.json.gz").write_bytes(gzip.compress(json.dumps(obj).encode()))
    run = load_run([tmp_path], progress=False)
    assert [r.rank for r in run.ranks] == [0, 1]
    a, b = run.ranks[0].intervals, run.ranks[1].intervals
    for col in ("start", "end", "kind", "stream", "launch", "bytes"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col


class _RunLevelParser:
    """A format whose files need a run-level step: each file is one rank named in its text; the
    run-level step sees every rank, sorted, before the run is frozen."""

    name = "runfmt"
    format = "runfmt"
    suffixes: tuple[str, ...] = (".sqlite",)
    describe = "runfmt files"
    holds_every_rank = False

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.startswith(b"RUNFMT")

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        rank = int(path.read_bytes().split()[1])
        iv = Intervals.from_columns(1, {"start": np.array([10]), "end": np.array([20])})
        return [RankTimeline(rank, str(path), "runfmt", [""], iv, Ranges.empty(), world_size=2)]

    def resolve_run(self, ranks: list[RankTimeline]) -> list[str]:
        self.seen.append([r.rank for r in ranks])
        ranks[0].meta["resolved"] = True
        return [f"run-level step saw {len(ranks)} ranks"]


def test_run_level_step_goes_through_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the loader knows no format by name: a registered parser with ``resolve_run`` gets the run's
    # ranks once every file is parsed and ranked, and its warnings are the run's
    from ppdiag.parsers import RunResolver, load_builtin

    load_builtin()
    fake = _RunLevelParser()
    assert isinstance(fake, RunResolver)
    assert isinstance(PARSERS["nsys"], RunResolver)  # NCCL peers across files
    assert not isinstance(PARSERS["kineto"], RunResolver)
    monkeypatch.setitem(PARSERS, "runfmt", fake)
    for r in (1, 0):
        (tmp_path / f"r{r}.json").write_bytes(b"RUNFMT %d\n" % r)
    run = load_run([tmp_path], jobs=1, progress=False)
    assert fake.seen == [[0, 1]]
    assert run.format == "runfmt" and [t.rank for t in run.ranks] == [0, 1]
    assert run.ranks[0].meta["resolved"] is True
    assert "run-level step saw 2 ranks" in run.warnings
