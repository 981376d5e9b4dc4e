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
from conftest import TEST_DATA
from typer.testing import CliRunner

import ppdiag.api as api
import ppdiag.result_cache as rc
from ppdiag.api import Options
from ppdiag.cli import app

RUN = TEST_DATA / "cuda" / "nccl_1f1b_p2_m8_shapes"


@pytest.fixture
def cache_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("PPDIAG_CACHE_DIR", str(d))
    monkeypatch.delenv("PPDIAG_NO_CACHE", raising=False)
    return d


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
