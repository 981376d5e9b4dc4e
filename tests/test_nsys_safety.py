"""Reading nsys exports safely: committed rows only (WAL, live writers, hot journals), clear errors
for truncated or garbage files, and GPU/NVTX rows with unusable times dropped and counted.

Each test rewrites a synthetic export (``ppsynth.nsys``) with SQL on a copy; expected counts
come from the rows the test itself changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ppdiag.errors import InputError
from ppdiag.model import Kind, RankTimeline
from ppdiag.parsers import ParseOptions
from ppdiag.parsers.loader import find_traces, load_run
from ppdiag.parsers.nsys import NsysParser
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank's export of a small 2-stage run (kernels, NCCL ranges, steps)."""
    run = make_scenario("1f1b", pp=2, microbatches=4, steps=2, clock_skew_ms=0.0, seed=3)
    return write_nsys(run, tmp_path_factory.mktemp("src"))[0]


def _copy(src: Path, d: Path, name: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    dst = d / (name or src.name)
    shutil.copyfile(src, dst)
    return dst


def _parse(p: Path) -> list[RankTimeline]:
    return NsysParser().parse(p, ParseOptions())


def _n_kernels(tl: RankTimeline) -> int:
    return int(np.isin(tl.intervals.kind, (Kind.COMPUTE, Kind.P2P, Kind.COLLECTIVE)).sum())


def _count(p: Path, table: str) -> int:
    conn = sqlite3.connect(f"file:{p}?mode=ro&immutable=1", uri=True)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _one_line_error(p: Path) -> str:
    with pytest.raises(InputError) as ei:
        _parse(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg
    return msg


# --- committed rows only -----------------------------------------------------------------------


def _move_kernels_to_wal(p: Path, keep_in_file: int) -> sqlite3.Connection:
    """Leave ``keep_in_file`` kernels in the main file and commit the rest into a ``-wal`` that is
    not checkpointed; returns the still-open writer (closing it would checkpoint)."""
    conn = sqlite3.connect(p, isolation_level=None)
    rows = conn.execute(f"SELECT * FROM {KERNEL} ORDER BY rowid").fetchall()
    conn.execute(
        f"DELETE FROM {KERNEL} WHERE rowid > (SELECT min(rowid) FROM {KERNEL}) + ?", (keep_in_file - 1,)
    )
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.execute("PRAGMA wal_autocheckpoint=0")
    marks = ", ".join("?" for _ in rows[0])
    conn.executemany(f"INSERT INTO {KERNEL} VALUES ({marks})", rows[keep_in_file:])
    return conn


@pytest.mark.parametrize("keep", [0.5, 0.0], ids=["half-in-wal", "all-in-wal"])
def test_committed_rows_in_the_wal_are_read(export: Path, tmp_path: Path, keep: float) -> None:
    total = _count(export, KERNEL)
    p = _copy(export, tmp_path / "live")
    writer = _move_kernels_to_wal(p, int(total * keep))
    try:
        assert (tmp_path / "live" / f"{p.name}-wal").stat().st_size > 0
        # what an immutable open sees: only the rows already in the main file
        assert _count(p, KERNEL) == int(total * keep)
        tl = _parse(p)[0]
        assert _n_kernels(tl) == total
        # the export copied away with its -wal (no -shm) reads the same
        c = _copy(p, tmp_path / "copied")
        _copy(p.with_name(p.name + "-wal"), tmp_path / "copied")
        assert _n_kernels(_parse(c)[0]) == total
    finally:
        writer.close()


def test_uncommitted_writer_is_not_read(export: Path, tmp_path: Path) -> None:
    total = _count(export, KERNEL)
    p = _copy(export, tmp_path)
    writer = sqlite3.connect(p, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute(f"DELETE FROM {KERNEL} WHERE rowid % 3 = 0")
        assert p.with_name(p.name + "-journal").exists()
        tl = _parse(p)[0]
        assert _n_kernels(tl) == total
        assert any("another process is writing" in w for w in tl.warnings)
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_hot_journal_is_rolled_back_on_a_private_copy(export: Path, tmp_path: Path) -> None:
    total = _count(export, KERNEL)
    p = _copy(export, tmp_path / "w")
    writer = sqlite3.connect(p, isolation_level=None)
    writer.execute("PRAGMA synchronous=OFF")
    writer.execute("PRAGMA cache_size=1")  # the delete spills into the database file itself
    writer.execute("BEGIN")
    writer.execute(f"DELETE FROM {KERNEL} WHERE rowid % 2 = 0")
    # a crash now: the database file holds half-written pages and a hot journal sits next to it
    crashed = _copy(p, tmp_path / "crash")
    _copy(p.with_name(p.name + "-journal"), tmp_path / "crash")
    writer.execute("ROLLBACK")
    writer.close()
    assert _count(crashed, KERNEL) < total  # what an immutable open would read
    assert NsysParser().sniff(crashed, crashed.read_bytes()[:4096])
    before = _digest(crashed)
    tl = _parse(crashed)[0]
    assert _n_kernels(tl) == total
    assert any("hot journal" in w and "rolled back on a private copy" in w for w in tl.warnings)
    assert _digest(crashed) == before and crashed.with_name(crashed.name + "-journal").exists()
    assert not list(tmp_path.glob("ppdiag-nsys-*"))


def test_other_programs_database_with_a_hot_journal_is_not_taken(tmp_path: Path) -> None:
    p = tmp_path / "w" / "app.sqlite"
    p.parent.mkdir()
    conn = sqlite3.connect(p, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")  # no fsync per statement and per spill below
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO users VALUES (?, ?)", [(i, "x" * 200) for i in range(400)])
    conn.execute("COMMIT")
    conn.execute("PRAGMA cache_size=1")
    conn.execute("BEGIN")
    conn.execute("DELETE FROM users WHERE id % 2 = 0")
    crashed = _copy(p, tmp_path / "crash")
    _copy(p.with_name(p.name + "-journal"), tmp_path / "crash")
    conn.execute("ROLLBACK")
    conn.close()
    assert not NsysParser().sniff(crashed, crashed.read_bytes()[:4096])


def test_writer_holding_its_lock_mid_write(export: Path, tmp_path: Path) -> None:
    # the writer has spilled uncommitted pages into the file and holds the exclusive lock
    total = _count(export, KERNEL)
    p = _copy(export, tmp_path / "w")
    writer = sqlite3.connect(p, isolation_level=None)
    try:
        writer.execute("PRAGMA synchronous=OFF")
        writer.execute("PRAGMA cache_size=1")
        writer.execute("BEGIN")
        writer.execute(f"DELETE FROM {KERNEL} WHERE rowid % 2 = 0")
        tl = _parse(p)[0]
        assert _n_kernels(tl) == total
        assert any("could not be locked" in w and "rolled back" in w for w in tl.warnings)
        assert any("another process is writing" in w for w in tl.warnings)
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_clean_wal_mode_export_is_read_without_side_files(export: Path, tmp_path: Path) -> None:
    p = _copy(export, tmp_path)
    conn = sqlite3.connect(p)
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.close()  # the last connection checkpoints and removes the -wal
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]
    assert _n_kernels(_parse(p)[0]) == _count(export, KERNEL)
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]


def test_finished_export_adds_no_side_files(export: Path, tmp_path: Path) -> None:
    p = _copy(export, tmp_path)
    tl = _parse(p)[0]
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]
    assert not any("writing" in w or "journal" in w for w in tl.warnings)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_wal_export_in_a_read_only_directory(export: Path, tmp_path: Path) -> None:
    total = _count(export, KERNEL)
    d = tmp_path / "ro"
    p = _copy(export, d)
    writer = _move_kernels_to_wal(p, total // 2)
    ro = _copy(p, tmp_path / "ro2")
    _copy(p.with_name(p.name + "-wal"), tmp_path / "ro2")
    writer.close()
    os.chmod(tmp_path / "ro2", 0o555)
    try:
        tl = _parse(ro)[0]
        assert _n_kernels(tl) == total
    finally:
        os.chmod(tmp_path / "ro2", 0o755)


def test_wal_export_where_its_index_cannot_be_created(
    export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What SQLite answers for a WAL export with rows in its -wal on read-only storage (no -shm can
    # be made): SQLITE_CANTOPEN. Root ignores permissions, so the answer is played here.
    from ppdiag.parsers import nsys_db

    total = _count(export, KERNEL)
    p = _copy(export, tmp_path / "live")
    writer = _move_kernels_to_wal(p, total // 2)
    real = nsys_db.connect_readonly

    def no_shm(path: Path, *, immutable: bool = False) -> sqlite3.Connection:
        if not immutable and path == p:
            err = sqlite3.OperationalError("unable to open database file")
            err.sqlite_errorcode = 14
            raise err
        return real(path, immutable=immutable)

    monkeypatch.setattr(nsys_db, "connect_readonly", no_shm)
    try:
        tl = _parse(p)[0]
        assert _n_kernels(tl) == total
        assert any("private copy of the export and its -wal" in w for w in tl.warnings)
    finally:
        writer.close()


# --- truncated and garbage files ---------------------------------------------------------------


def test_truncated_export_is_named_truncated(export: Path, tmp_path: Path) -> None:
    data = export.read_bytes()
    for frac, name in ((0.5, "half.sqlite"), (0.01, "head.sqlite")):
        p = tmp_path / name
        p.write_bytes(data[: int(len(data) * frac)])
        assert "truncated" in _one_line_error(p)
    p = tmp_path / "odd.sqlite"
    p.write_bytes(data[: 4096 * 3 + 17])
    assert "truncated" in _one_line_error(p)


def test_garbage_named_sqlite_gets_a_clear_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    (tmp_path / "noise.sqlite").write_bytes(rng.integers(0, 256, 8192, dtype=np.uint8).tobytes())
    assert "not a valid SQLite database" in _one_line_error(tmp_path / "noise.sqlite")
    # the SQLite magic, then noise: a broken database, not "not a recognised trace format"
    magic = b"SQLite format 3\x00" + rng.integers(0, 256, 8192 - 16, dtype=np.uint8).tobytes()
    (tmp_path / "broken.sqlite").write_bytes(magic)
    msg = _one_line_error(tmp_path / "broken.sqlite")
    assert "SQLite database" in msg and "recognised" not in msg
    # a run directory holding it fails on that file, by name
    with pytest.raises(InputError) as ei:
        load_run([tmp_path], progress=False, jobs=1)
    assert "broken.sqlite" in str(ei.value) or "noise.sqlite" in str(ei.value)
    assert "recognised" not in str(ei.value)
    found, _ = find_traces([tmp_path])
    assert {f.format for f in found} == {"nsys"}


def test_cli_exit_2_one_line_for_a_truncated_export(export: Path, tmp_path: Path) -> None:
    p = tmp_path / "cut.sqlite"
    p.write_bytes(export.read_bytes()[: export.stat().st_size // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(p)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "cut.sqlite" in ln]
    assert lines and "truncated" in lines[0]


# --- rows with unusable times ------------------------------------------------------------------


def _loosen(conn: sqlite3.Connection, table: str) -> None:
    """Recreate ``table`` without NOT NULL constraints (same columns, same rows)."""
    conn.execute(f"CREATE TABLE tmp_loose AS SELECT * FROM {table}")
    conn.execute(f"DROP TABLE {table}")
    conn.execute(f"ALTER TABLE tmp_loose RENAME TO {table}")


def test_bad_kernel_and_copy_times_are_dropped_and_counted(export: Path, tmp_path: Path) -> None:
    total = _count(export, KERNEL)
    p = _copy(export, tmp_path)
    conn = sqlite3.connect(p)
    _loosen(conn, KERNEL)
    ids = [r[0] for r in conn.execute(f"SELECT rowid FROM {KERNEL} ORDER BY rowid LIMIT 7")]
    conn.execute(f"UPDATE {KERNEL} SET start = NULL WHERE rowid = ?", (ids[0],))
    conn.execute(f'UPDATE {KERNEL} SET "end" = NULL WHERE rowid = ?', (ids[1],))
    conn.execute(f"UPDATE {KERNEL} SET start = 'abc' WHERE rowid = ?", (ids[2],))
    conn.execute(f"UPDATE {KERNEL} SET \"end\" = x'00ff' WHERE rowid = ?", (ids[3],))
    conn.execute(f"UPDATE {KERNEL} SET start = 1.5 WHERE rowid = ?", (ids[4],))
    conn.execute(f'UPDATE {KERNEL} SET start = "end" + 1000 WHERE rowid = ?', (ids[5],))
    # a launch call with a TEXT start: the kernel stays, its launch becomes unknown
    conn.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 'soon' WHERE correlationId = "
        f"(SELECT correlationId FROM {KERNEL} WHERE rowid = ?)",
        (ids[6],),
    )
    # an NVTX range that ends before it starts, and one with a BLOB start
    conn.execute(
        'UPDATE NVTX_EVENTS SET "end" = start - 1 WHERE rowid = (SELECT min(rowid) FROM NVTX_EVENTS '
        "WHERE eventType = 59)"
    )
    _loosen(conn, "NVTX_EVENTS")
    conn.execute(
        "UPDATE NVTX_EVENTS SET start = x'01' "
        "WHERE rowid = (SELECT max(rowid) FROM NVTX_EVENTS WHERE eventType = 59)"
    )
    conn.commit()
    conn.close()
    tl = _parse(p)[0]
    assert _n_kernels(tl) == total - 6
    w = [x for x in tl.warnings if "GPU row(s) dropped" in x]
    assert w == [
        "6 GPU row(s) dropped (6 kernel): 2 with a NULL start or end, 3 with a TEXT, REAL or BLOB start "
        "or end, 1 ending before they start"
    ]
    assert any(x.startswith("2 NVTX range(s) dropped") for x in tl.warnings)
    assert tl.events_lost == 8
    assert (tl.intervals.launch == -1).sum() >= 1
    # the run still analyzes (no exit 70): the loader and the diagnosis take the rest
    api = pytest.importorskip("ppdiag.api")
    rep = api.analyze_run(load_run([p], progress=False, jobs=1)).result
    assert rep.summary.step_ms > 0


def test_memcpy_rows_with_bad_times(tmp_path: Path) -> None:
    from ppsynth.run import GpuOps, RuntimeCalls

    run = make_scenario("gpipe", pp=2, microbatches=2, steps=1, clock_skew_ms=0.0, seed=2)
    r = run.ranks[0]
    run.names.extend(["Memcpy HtoD (Pinned -> Device)", "cudaMemcpyAsync"])
    t0 = int(r.gpu.start.max()) + 10_000
    corr = int(r.runtime.correlation.max()) + 1
    k = 3
    extra = GpuOps.from_columns(
        k,
        {
            "start": [t0 + 10_000 * i for i in range(k)],
            "end": [t0 + 10_000 * i + 5_000 for i in range(k)],
            "stream": [7] * k,
            "kind": [Kind.MEMCPY] * k,
            "name": [len(run.names) - 2] * k,
            "correlation": [corr + i for i in range(k)],
            "launch": [t0 + 10_000 * i - 3_000 for i in range(k)],
            "bytes": [1 << 20] * k,
        },
    )
    calls = RuntimeCalls.from_columns(
        k,
        {
            "start": [t0 + 10_000 * i - 3_000 for i in range(k)],
            "end": [t0 + 10_000 * i - 2_000 for i in range(k)],
            "name": [len(run.names) - 1] * k,
            "correlation": [corr + i for i in range(k)],
            "tid": [r.tid] * k,
        },
    )
    r.gpu = GpuOps(**{c: np.concatenate([getattr(r.gpu, c), getattr(extra, c)]) for c in GpuOps.COLUMNS})
    r.runtime = RuntimeCalls(
        **{c: np.concatenate([getattr(r.runtime, c), getattr(calls, c)]) for c in RuntimeCalls.COLUMNS}
    )
    p = write_nsys(run, tmp_path)[0]
    conn = sqlite3.connect(p)
    conn.execute(f"UPDATE {MEMCPY} SET start = 'x' WHERE rowid = (SELECT min(rowid) FROM {MEMCPY})")
    conn.execute(f"UPDATE {MEMCPY} SET bytes = 'many' WHERE rowid = (SELECT max(rowid) FROM {MEMCPY})")
    conn.commit()
    conn.close()
    tl = _parse(p)[0]
    m = tl.intervals.kind == Kind.MEMCPY
    assert int(m.sum()) == k - 1
    assert sorted(tl.intervals.bytes[m].tolist()) == [-1, 1 << 20]
    assert any(x.startswith("1 GPU row(s) dropped (1 memcpy)") for x in tl.warnings)


def test_every_kernel_unusable_is_a_clear_error(export: Path, tmp_path: Path) -> None:
    p = _copy(export, tmp_path)
    conn = sqlite3.connect(p)
    conn.execute(f'UPDATE {KERNEL} SET "end" = start - 1')
    for t in (MEMCPY, "CUPTI_ACTIVITY_KIND_MEMSET"):
        conn.execute(f"DROP TABLE IF EXISTS {t}")
    conn.commit()
    conn.close()
    msg = _one_line_error(p)
    assert "no usable GPU activity" in msg and "ending before they start" in msg


VALUES = ("NULL", "'abc'", "x'00ff'", "1.5", "-1", "'12'", "9223372036854775807", "-9223372036854775808")


def _fuzz_columns(export: Path, tmp_path: Path, values_of: Callable[[int], list[str]]) -> None:
    """Every column of every table, a third of its rows set to each of ``values_of(column
    index)``: the reader returns ranks or raises InputError, never anything else (exit 70)."""
    base = _copy(export, tmp_path / "base")
    conn = sqlite3.connect(base)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    cols = [(t, r[1]) for t in sorted(tables) for r in conn.execute(f"PRAGMA table_info({t})")]
    for t in tables:
        _loosen(conn, t)
    conn.commit()
    conn.close()
    outcomes: dict[str, int] = {"ok": 0, "input error": 0}
    p = tmp_path / "m" / base.name
    p.parent.mkdir()
    for i, (t, c) in enumerate(cols):
        for value in values_of(i):
            shutil.copyfile(base, p)
            conn = sqlite3.connect(p)
            conn.execute(f'UPDATE {t} SET "{c}" = {value} WHERE rowid % 3 = 0')
            conn.commit()
            conn.close()
            try:
                tls = _parse(p)
                assert tls and all(len(tl.intervals) > 0 for tl in tls)
                outcomes["ok"] += 1
            except InputError as exc:
                assert "\n" not in str(exc) and str(p) in str(exc), (t, c, value)
                outcomes["input error"] += 1
    assert outcomes["ok"] > outcomes["input error"], outcomes


def test_any_cell_of_any_value_type_gives_a_timeline_or_a_clear_error(export: Path, tmp_path: Path) -> None:
    # one value type per column, rotating (the slow test below tries them all)
    _fuzz_columns(export, tmp_path, lambda i: [VALUES[i % len(VALUES)]])


@pytest.mark.slow
def test_every_value_type_in_every_column(export: Path, tmp_path: Path) -> None:
    _fuzz_columns(export, tmp_path, lambda i: list(VALUES))


def test_invalid_utf8_names_are_replaced_and_counted(export: Path, tmp_path: Path) -> None:
    p = _copy(export, tmp_path)
    conn = sqlite3.connect(p)
    sid = conn.execute(f"SELECT demangledName FROM {KERNEL} LIMIT 1").fetchone()[0]
    name = conn.execute("SELECT value FROM StringIds WHERE id = ?", (sid,)).fetchone()[0]
    conn.execute(
        "UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = ?", (name.encode() + b"\xff\xfe", sid)
    )
    conn.commit()
    conn.close()
    tl = _parse(p)[0]
    assert _n_kernels(tl) == _count(export, KERNEL)
    assert any(n.endswith("\ufffd\ufffd") and n.startswith(name) for n in tl.names)
    assert any("invalid UTF-8" in w for w in tl.warnings)
