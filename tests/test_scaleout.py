"""Scale-out: the map step (parse one file -> digest) on a Dask cluster or the local pool, the
reduce on digests only, and traces read through fsspec URLs. The reduce must give the same
report wherever the map ran."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from ppdiag.api import Options, diagnose
from ppdiag.errors import InputError
from ppdiag.parsers import ParseOptions, cache
from ppdiag.parsers.digest import map_file
from ppdiag.parsers.loader import find_traces, load_run, parse_one
from ppdiag.parsers.urls import url_of
from ppdiag.report_types import Report
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

HAVE_DASK = importlib.util.find_spec("distributed") is not None


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 pipeline replicas x P=4, M=4, a 1.5x stage: 8 Kineto traces with clock skews."""
    d = tmp_path_factory.mktemp("scale_run")
    write_kineto(make_scenario(steps=2, pp=4, microbatches=4, dp=2, faults=[F.SlowStage(2, 1.5)]), d)
    return d


def _report(paths: list[str], **kw: Any) -> Report:
    return diagnose(paths, Options(progress=False, **kw)).result


def test_digest_round_trip(run_dir: Path) -> None:
    files, _ = find_traces([run_dir])
    f = files[0]
    d = map_file(str(f.path), f.format, ParseOptions(), use_cache=False)
    assert d.payload is not None and not d.error_message
    direct = parse_one(str(f.path), f.format, ParseOptions(), True, None).ranks
    assert direct is not None
    got = d.ranks()
    assert [r.rank for r in got] == [r.rank for r in direct]
    for a, b in zip(got, direct, strict=True):
        for col in ("start", "end", "kind", "stream", "phase", "launch"):
            assert (getattr(a.intervals, col) == getattr(b.intervals, col)).all()
        assert a.names == b.names and a.meta == b.meta and a.source == b.source
    # compact: the digest is far smaller than the raw JSON it came from
    import gzip

    raw = len(gzip.decompress(f.path.read_bytes()))
    assert d.nbytes < raw / 2


def test_digest_carries_the_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "k", "ts": "soon"')
    d = map_file(str(bad), "kineto", ParseOptions(), use_cache=False)
    if d.error_message:
        with pytest.raises(InputError) as e:
            d.ranks()
        assert "\n" not in e.value.message


def test_file_url_is_the_local_run(run_dir: Path) -> None:
    assert url_of(f"file://{run_dir}") == f"file:///{str(run_dir).lstrip('/')}"
    assert url_of(run_dir) is None
    # typer hands URLs over as Path, which folds the '//': still recognised
    assert url_of(Path("s3://bucket/run/rank0.json")) == "s3://bucket/run/rank0.json"
    assert _report([f"file://{run_dir}"], jobs=1) == _report([str(run_dir)], jobs=1)


def test_object_store_url_read_where_it_lies(run_dir: Path) -> None:
    # fsspec's in-memory filesystem stands in for s3:// or gs:// (same code path: listed, sniffed
    # and streamed through fsspec, no local path)
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for p in sorted(run_dir.iterdir()):
        fs.pipe(f"/scale_run/{p.name}", p.read_bytes())
    try:
        files, _ = find_traces(["memory://scale_run"])
        assert len(files) == 8 and {f.format for f in files} == {"kineto"}
        got = _report(["memory://scale_run"], jobs=1)
        want = _report([str(run_dir)], jobs=1)
        assert got.findings == want.findings and got.ranks == want.ranks
        assert got.summary == want.summary
        with pytest.raises(InputError) as e:
            find_traces(["memory://scale_run_absent"])
        assert "no such file" in e.value.message
    finally:
        fs.rm("/scale_run", recursive=True)


def test_scheduler_without_dask_is_one_clear_error(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(InputError) as e:
        load_run([run_dir], progress=False, scheduler="tcp://127.0.0.1:8786")
    assert "ppdiag[dask]" in e.value.message and "\n" not in e.value.message


def test_scheduler_env_and_cli(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ppdiag.cli import app

    monkeypatch.setitem(sys.modules, "distributed", None)
    # the CLI sets the variable for the whole process: recorded here so that it is removed after
    monkeypatch.setenv("PPDIAG_DASK_SCHEDULER", "")
    res = CliRunner().invoke(app, ["analyze", str(run_dir), "--scheduler", "tcp://127.0.0.1:8786", "-q"])
    assert res.exit_code == 2 and "ppdiag[dask]" in res.output and "Traceback" not in res.output
    monkeypatch.setenv("PPDIAG_DASK_SCHEDULER", "tcp://127.0.0.1:8786")
    with pytest.raises(InputError):
        load_run([run_dir], progress=False)


@pytest.mark.skipif(not HAVE_DASK, reason="dask[distributed] not installed (pip install 'ppdiag[dask]')")
def test_unreachable_scheduler(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdiag.parsers import scaleout

    monkeypatch.setattr(scaleout, "CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(InputError) as e:
        load_run([run_dir], progress=False, scheduler="tcp://127.0.0.1:9")
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in e.value.message


@pytest.mark.skipif(not HAVE_DASK, reason="dask[distributed] not installed (pip install 'ppdiag[dask]')")
def test_local_cluster_equals_local_run(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import LocalCluster

    want = _report([str(run_dir)], jobs=2)  # the local pool, no cache (the suite's default)
    monkeypatch.setenv("PPDIAG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PPDIAG_NO_CACHE", "0")
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as cluster:
        got = _report([str(run_dir)], scheduler=cluster.scheduler_address)
        # the workers filled the parse cache (they inherit PPDIAG_CACHE_DIR): a second map is
        # served from it and the same
        assert cache.info().entries == 8
        again = _report([str(run_dir)], scheduler=cluster.scheduler_address)
        # a bad file on the cluster: the file's own one-line error, as locally
        bad = tmp_path / "badrun"
        bad.mkdir()
        (bad / "rank0.json").write_bytes(b"\x1f\x8b" + b"garbage")
        with pytest.raises(InputError):
            load_run([bad], progress=False, scheduler=cluster.scheduler_address)
    assert got == want and again == want


def test_encoded_ranks_round_trip_and_refuse_foreign_bytes(run_dir: Path) -> None:
    from ppdiag.model import Intervals, Ranges

    files, _ = find_traces([run_dir])
    ranks = parse_one(str(files[0].path), files[0].format, ParseOptions(), True, None).ranks
    assert ranks
    # an empty table too (no ranges at all: zero-length columns at the end of the bytes)
    ranks[0].ranges = Ranges.empty()
    data = cache.encode_ranks(ranks)
    assert data is not None
    back = cache.decode_ranks(data)
    for a, b in zip(back, ranks, strict=True):
        for c in Intervals.COLUMNS:
            x, y = getattr(a.intervals, c), getattr(b.intervals, c)
            assert x.dtype == y.dtype and (x == y).all()
        assert len(a.ranges) == 0 and a.names == b.names and a.process_groups == b.process_groups
    back[0].intervals.start[0] += 1  # decoded arrays are the decoder's own, writable
    with pytest.raises(ValueError):
        cache.decode_ranks(b"PK\x03\x04 not ours")
