"""The result cache against inputs that change or are not plain files: a key describes exactly the
bytes the analysis read, or there is no entry."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_TRACES, TEST_DATA
from typer.testing import CliRunner

import ppdiag.api as api
import ppdiag.result_cache as rc
from ppdiag.api import Options
from ppdiag.cli import app

RUN = TEST_DATA / "cuda" / "nccl_1f1b_p2_m8_shapes"


def _ranks(out: Path) -> int:
    return len(json.loads(out.read_text())["ranks"])


def test_a_trace_removed_between_the_key_and_the_parse_is_not_stored(
    tmp_path: Path, cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the key is taken before the parse; rank1's trace leaves the folder in between, so the
    # analysis sees one rank. Stored under the two-rank key, that report would be served once
    # rank1 is back with its own mtime (a rename, rsync -t): a wrong answer
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    aside = tmp_path / "rank1.pt.trace.json.gz"
    k0 = rc.key_of([run], Options())
    assert k0 is not None
    real = api.diagnose

    def moved(*args: Any, **kwargs: Any) -> Any:
        (run / "rank1.pt.trace.json.gz").rename(aside)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "diagnose", moved)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["analyze", str(run), "--json", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert _ranks(out) == 1
    monkeypatch.setattr(api, "diagnose", real)
    aside.rename(run / "rank1.pt.trace.json.gz")
    assert rc.key_of([run], Options()) == k0
    assert rc.get(k0) is None  # nothing was stored under the key of the two-rank folder
    res = CliRunner().invoke(app, ["analyze", str(run), "--json", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert _ranks(out) == 2


@pytest.mark.skipif(not Path("/dev/null").exists() or sys.platform == "win32", reason="POSIX devices")
def test_a_device_is_not_keyed_and_the_loader_words_it(tmp_path: Path, cache_on: Path) -> None:
    # a device or a pipe is no file to hash: /dev/zero would be read for ever, a pipe's bytes
    # would be eaten before the loader reads them. No key; the loader refuses it as it always did
    assert rc.key_of(["/dev/null"], Options()) is None
    res = CliRunner().invoke(app, ["analyze", "/dev/null"])
    assert res.exit_code == 2
    assert "not a regular file" in res.stderr
    assert not cache_on.exists() or not list(cache_on.glob("*" + rc.SUFFIX))


def test_a_fifo_is_not_opened_for_the_key(tmp_path: Path, cache_on: Path) -> None:
    # a named pipe without a writer: opening it to hash would block; it is not keyed (and the
    # loader refuses it before reading)
    fifo = tmp_path / "rank0.json"
    try:
        os.mkfifo(fifo)
    except (AttributeError, OSError):
        pytest.skip("no named pipes here")
    assert rc.key_of([fifo], Options()) is None


NSYS = SHARED_TRACES / "nsys"


@pytest.mark.skipif(not (NSYS / "pipit_saxpy_mpi_nsys2022.sqlite").is_file(), reason="no shared nsys traces")
def test_an_nsys_report_is_keyed_with_the_export_it_is_read_through(tmp_path: Path, cache_on: Path) -> None:
    # rank0.nsys-rep named alone is read through rank0.sqlite beside it (the nsys reader's export
    # cache, fresh while newer than the report; no nsys needed). Another export written over it
    # (re-exported by another nsys, or another run's) changes the analysis, not the report's bytes:
    # the two-rank FSDP export first, then the one-rank saxpy one, which a hit must not hide
    run = tmp_path / "run"
    run.mkdir()
    rep = run / "rank0.nsys-rep"
    rep.write_bytes(b"a report nsys exported to rank0.sqlite")
    os.utime(rep, ns=(10**18, 10**18))  # older than any export copied beside it
    out = tmp_path / "r.json"
    argv = ["analyze", str(rep), "--json", str(out), "--quiet"]
    shutil.copyfile(NSYS / "nsysai_h100_fsdp_2gpu.sqlite", run / "rank0.sqlite")
    k0 = rc.key_of([rep], Options())
    assert k0 is not None
    for _ in range(2):  # a miss, then a hit
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 0, res.output
        assert _ranks(out) == 2
    assert rc.get(k0) is not None
    shutil.copyfile(NSYS / "pipit_saxpy_mpi_nsys2022.sqlite", run / "rank0.sqlite")
    assert rc.key_of([rep], Options()) not in (None, k0)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert _ranks(out) == 1
    # the export is looked for where nsys_cache_dir puts it: there is none there, another key
    assert rc.key_of([rep], Options(nsys_cache_dir=str(tmp_path / "exports"))) not in (None, k0)


@pytest.mark.skipif(not (NSYS / "pipit_saxpy_mpi_nsys2022.sqlite").is_file(), reason="no shared nsys traces")
@pytest.mark.parametrize("side", ["-journal", "-wal"])
def test_an_export_with_a_journal_or_wal_beside_it_is_not_cached(
    tmp_path: Path, cache_on: Path, side: str
) -> None:
    # the nsys reader reads an export with its -wal (rows the file lacks) and warns of a -journal
    # (a write under way): neither cache may serve what the file alone gave
    from ppdiag.parsers import cache as parse_cache

    export = tmp_path / "r.sqlite"
    shutil.copyfile(NSYS / "pipit_saxpy_mpi_nsys2022.sqlite", export)
    out = tmp_path / "r.json"
    argv = ["analyze", str(export), "--json", str(out), "--quiet"]
    assert CliRunner().invoke(app, argv).exit_code == 0
    assert rc.key_of([export], Options()) is not None
    assert parse_cache.entry_key(export, "nsys") is not None
    Path(f"{export}{side}").write_bytes(b"x" * 12)  # no WAL or journal header: no rows read from it
    assert rc.key_of([export], Options()) is None
    assert rc.key_of([tmp_path], Options()) is None
    assert parse_cache.entry_key(export, "nsys") is None
    assert CliRunner().invoke(app, argv).exit_code == 0
    said = "'r.sqlite-journal' exists: another process is writing" in out.read_text()
    assert said == (side == "-journal")


DDP = SHARED_TRACES / "kineto" / "hta_ddp_nccl_rank0.json.gz"


@pytest.mark.skipif(not DDP.is_file(), reason="no shared traces")
def test_the_gzip_inflater_is_keyed(tmp_path: Path, cache_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ISA-L and zlib keep different tails of a cut gzip stream (a byte apart here), which the
    # truncation warning counts: PPDIAG_NO_ISAL=1 after a run with ISA-L is another result
    pytest.importorskip("isal")
    from ppdiag.parsers import kineto_bytes

    cut = tmp_path / "cut.json.gz"
    raw = DDP.read_bytes()
    cut.write_bytes(raw[: len(raw) // 3])

    def run(no_isal: bool, *extra: str) -> str:
        monkeypatch.setenv(kineto_bytes.ISAL_ENV, "1" if no_isal else "0")
        monkeypatch.setattr(kineto_bytes, "_INFLATER", None)  # chosen once per process
        out = tmp_path / "r.json"
        res = CliRunner().invoke(app, ["analyze", str(cut), "--json", str(out), "--quiet", *extra])
        assert res.exit_code == 0, res.output
        return out.read_text()

    with_isal = run(False)
    fresh = run(True, "--no-cache")
    monkeypatch.delenv("PPDIAG_NO_CACHE")  # --no-cache sets it for the parse workers
    if fresh == with_isal:
        pytest.skip("the installed ISA-L and zlib keep the same bytes of this cut")
    assert run(True) == fresh  # neither the result cache nor the parse cache serves ISA-L's parse
