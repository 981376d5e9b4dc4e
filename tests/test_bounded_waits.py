"""Every wait is bounded: a scheduler address that never answers, answers in another protocol or
does not resolve, and an nsys export whose kernel table is an endless recursive VIEW each end in
exit 2 with one line, within the stated bound (measured here, on this machine's load)."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ppdiag.cli import app
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_kineto(make_scenario(pp=2, microbatches=4, steps=2), d)
    return d


def _listener(answer: bytes | None) -> Iterator[int]:
    """A TCP service on 127.0.0.1 that accepts and then says nothing (``answer`` None) or answers
    each request with ``answer`` (an HTTP server waits for the request first)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            conns.append(c)
            if answer is not None:
                c.settimeout(30)
                try:
                    if c.recv(65536):
                        c.sendall(answer)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        for c in conns:
            c.close()
        srv.close()


@pytest.fixture
def silent() -> Iterator[int]:
    yield from _listener(None)


@pytest.fixture
def http() -> Iterator[int]:
    yield from _listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def _invoke(run_dir: Path, address: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, float]:
    monkeypatch.delenv("PPDIAG_DASK_SCHEDULER", raising=False)
    monkeypatch.delenv("PPDIAG_DASK_TIMEOUT", raising=False)
    t0 = time.monotonic()
    res = CliRunner().invoke(
        app,
        ["analyze", str(run_dir), "-q", "--scheduler", address, "--scheduler-timeout", str(TIMEOUT_S)],
    )
    # the flags leave their environment variables behind in this process: restored by monkeypatch
    monkeypatch.delenv("PPDIAG_DASK_SCHEDULER", raising=False)
    monkeypatch.delenv("PPDIAG_DASK_TIMEOUT", raising=False)
    return res.exit_code, res.output, time.monotonic() - t0


def test_silent_listener_ends_within_the_connect_timeout(
    run_dir: Path, silent: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, took = _invoke(run_dir, f"tcp://127.0.0.1:{silent}", monkeypatch)
    assert code == 2, out
    assert took <= TIMEOUT_S + 5, took
    assert "did not answer within 2 s" in out and "Traceback" not in out


def test_http_service_is_not_a_scheduler(run_dir: Path, http: int, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, took = _invoke(run_dir, f"127.0.0.1:{http}", monkeypatch)
    assert code == 2, out
    assert took <= TIMEOUT_S + 5, took
    assert f"Dask scheduler at 127.0.0.1:{http}" in out and "Traceback" not in out
    assert "MemoryError" not in out


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e400", "soon"])
def test_bad_timeout_values_are_refused(run_dir: Path, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PPDIAG_DASK_SCHEDULER", raising=False)
    monkeypatch.setenv("PPDIAG_DASK_TIMEOUT", value)
    res = CliRunner().invoke(app, ["analyze", str(run_dir), "-q", "--scheduler", "tcp://127.0.0.1:9"])
    monkeypatch.delenv("PPDIAG_DASK_SCHEDULER", raising=False)
    assert res.exit_code == 2, res.output
    assert "PPDIAG_DASK_TIMEOUT" in res.output and "Traceback" not in res.output


def test_a_name_that_does_not_resolve_is_one_line(run_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PPDIAG_DASK_TIMEOUT": str(TIMEOUT_S)}
    proc = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(run_dir), "-q", "--scheduler", "notanaddress"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppdiag: error:"), proc.stderr
    assert "notanaddress" in lines[0]


def test_recursive_view_ends_naming_the_file(tmp_path: Path) -> None:
    """An nsys export whose kernel table is a VIEW over an endless recursive query: the query is
    stopped by its budget, and the file named."""
    from ppsynth.nsys import write_nsys

    paths = write_nsys(make_scenario(pp=2, microbatches=2, steps=1), tmp_path)
    db = paths[0]
    with sqlite3.connect(db) as con:
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
        con.execute(
            "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE r(n) AS "
            "(SELECT 1 UNION ALL SELECT n + 1 FROM r) "
            "SELECT n AS start, n + 1 AS end, 0 AS deviceId, 0 AS streamId, 0 AS contextId, "
            "0 AS correlationId, 0 AS shortName, 0 AS demangledName, 0 AS globalPid, "
            "0 AS gridX, 0 AS gridY, 0 AS gridZ, 0 AS blockX, 0 AS blockY, 0 AS blockZ "
            "FROM r WHERE n < 0"
        )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PPDIAG_DASK")},
        "PYTHONPATH": str(ROOT),
        "PPDIAG_NO_CACHE": "1",
        "PPDIAG_SQL_BUDGET_S": "3",
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(db), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and db.name in lines[0], proc.stderr
    assert took < 120, took
