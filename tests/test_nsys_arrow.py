"""The optional ADBC (Arrow) reader of nsys exports gives exactly what the sqlite3 reader gives."""

from __future__ import annotations

import dataclasses
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_TRACES

from ppdiag.model import RankTimeline
from ppdiag.parsers import ParseOptions, nsys_arrow
from ppdiag.parsers.nsys import NsysParser
from ppdiag.parsers.nsys_arrow import ARROW_ENV, ArrowReader
from ppdiag.parsers.nsys_db import int_expr, open_export
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

pytest.importorskip("adbc_driver_manager")
pytest.importorskip("adbc_driver_sqlite")


@pytest.fixture(autouse=True)
def _any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # the files here are small: read them through ADBC all the same, in the driver's default
    # batches (several per table below: a type the first batch did not show comes later)
    monkeypatch.setattr(nsys_arrow, "MIN_FILE_BYTES", 0)
    monkeypatch.setattr(nsys_arrow, "BATCH_ROWS", 1024)


N = 3000  # rows of the hand-built tables: several of the driver's batches
I64 = np.dtype([("a", np.int64), ("b", np.int64)])


def _export(tmp_path: Path, values: list[Any]) -> Path:
    """A minimal file the nsys reader opens, with table T(a, b): ``a`` as given, b = row number."""
    p = tmp_path / "t.sqlite"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    conn.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, [end] INTEGER)")
    conn.execute("CREATE TABLE T (a, b)")
    conn.executemany("INSERT INTO T VALUES (?, ?)", [(v, i) for i, v in enumerate(values)])
    conn.commit()
    conn.close()
    return p


def _sqlite_rows(path: Path, sql: str, dtype: np.dtype[Any]) -> np.ndarray:
    conn = sqlite3.connect(path)
    try:
        return np.fromiter(conn.execute(sql), dtype=dtype)
    finally:
        conn.close()


def test_plain_integer_columns_are_read_by_arrow(tmp_path: Path) -> None:
    values: list[Any] = [i * 7 - 5 for i in range(N)]
    values[10] = 2**62 + 3  # beyond a double's exact integers: must stay exact
    values[11] = -(2**63)
    p = _export(tmp_path, values)
    with closing(open_export(p)) as db:
        assert db.arrow is not None
        got = db.arrow.fetch("SELECT a, b FROM T", I64)
        assert got is not None
        assert got["a"].tolist() == values
        assert got["b"].tolist() == list(range(N))
        np.testing.assert_array_equal(
            db.fetch("SELECT a, b FROM T", I64), _sqlite_rows(p, "SELECT a, b FROM T", I64)
        )


@pytest.mark.parametrize("at", [0, 1, 1023, 1024, 2999])
@pytest.mark.parametrize("odd", [None, 1.5, 3.0, "7", b"\x07", "x"])
def test_null_or_mixed_types_fall_back_to_sqlite3(tmp_path: Path, odd: Any, at: int) -> None:
    # an integer column with one NULL / REAL / TEXT / BLOB value at row `at`: whatever type the
    # driver infers from its first rows, Arrow must not answer, and the fetch is sqlite3's
    values: list[Any] = list(range(N))
    values[at] = odd
    p = _export(tmp_path, values)
    with closing(open_export(p)) as db:
        assert db.arrow is not None
        assert db.arrow.fetch("SELECT a, b FROM T", I64) is None
        # the reader's queries guard their integer columns (int_expr): both readers agree there
        sql = f"SELECT {int_expr('a')}, b FROM T"
        want = _sqlite_rows(p, sql, I64)
        assert want["a"][at] == -1
        np.testing.assert_array_equal(db.fetch(sql, I64), want)
        assert db.arrow.fetch(sql, I64) is not None
        if odd is None:
            with pytest.raises(TypeError):  # what sqlite3 does with a NULL in an int64 field
                db.fetch("SELECT a, b FROM T", I64)


def test_leading_nulls_then_integers(tmp_path: Path) -> None:
    # the driver's first batch is all NULL: it must not guess a type that changes the integers
    values: list[Any] = [None] * 2000 + list(range(N - 2000))
    p = _export(tmp_path, values)
    with closing(open_export(p)) as db:
        assert db.arrow is not None
        assert db.arrow.fetch("SELECT a, b FROM T", I64) is None
        sql = f"SELECT {int_expr('a', '-9')}, b FROM T WHERE a IS NOT NULL OR b < 5"
        np.testing.assert_array_equal(db.fetch(sql, I64), _sqlite_rows(p, sql, I64))


def test_text_columns_and_parameters_stay_with_sqlite3(tmp_path: Path) -> None:
    p = _export(tmp_path, list(range(N)))
    reader = ArrowReader(p)
    try:
        assert reader.fetch("SELECT a, 'x' FROM T", np.dtype([("a", np.int64), ("t", object)])) is None
    finally:
        reader.close()


def test_views_turn_arrow_off(tmp_path: Path) -> None:
    p = _export(tmp_path, list(range(10)))
    conn = sqlite3.connect(p)
    conn.execute("CREATE VIEW V AS SELECT * FROM T")
    conn.commit()
    conn.close()
    with closing(open_export(p)) as db:
        assert db.arrow is None  # a VIEW could hide a query the sqlite3 step budget must bound


def test_small_files_stay_with_sqlite3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _export(tmp_path, list(range(10)))
    monkeypatch.setattr(nsys_arrow, "MIN_FILE_BYTES", p.stat().st_size + 1)
    with closing(open_export(p)) as db:
        assert db.arrow is None  # loading the driver would cost more than it saves


def test_env_turns_arrow_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARROW_ENV, "1")
    with closing(open_export(_export(tmp_path, list(range(10))))) as db:
        assert db.arrow is None


def test_wal_turns_arrow_off(tmp_path: Path) -> None:
    # rows still in the -wal are read by sqlite3 with its locks; ADBC opens the file immutable
    p = _export(tmp_path, list(range(10)))
    writer = sqlite3.connect(p)
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("INSERT INTO T VALUES (99, 99)")
        writer.commit()
        assert (tmp_path / "t.sqlite-wal").stat().st_size > 0
        with closing(open_export(p)) as db:
            assert db.arrow is None
            assert len(db.fetch("SELECT a, b FROM T", I64)) == 11
    finally:
        writer.close()


def _parse_both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[RankTimeline], list[RankTimeline]]:
    monkeypatch.delenv(ARROW_ENV, raising=False)
    db = open_export(path)
    used = db.arrow is not None
    db.close()
    assert used, "the Arrow reader was not used"
    fast = NsysParser().parse(path, ParseOptions())
    monkeypatch.setenv(ARROW_ENV, "1")
    slow = NsysParser().parse(path, ParseOptions())
    return fast, slow


def _equal(a: Any, b: Any, where: str) -> None:
    """Deep equality of parsed values: arrays by dtype and values, dataclasses field by field."""
    assert type(a) is type(b), where
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tolist() == b.tolist(), where  # object arrays too; NaN-free columns
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _equal(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _equal(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _equal(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, where


def _assert_same(fast: list[RankTimeline], slow: list[RankTimeline]) -> None:
    assert fast
    _equal(fast, slow, "ranks")


def test_synthetic_exports_parse_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_scenario("1f1b", pp=3, microbatches=4, dp=2, steps=2, clock_skew_ms=3.0, seed=3)
    for p in write_nsys(run, tmp_path):
        _assert_same(*_parse_both(p, monkeypatch))


@pytest.mark.parametrize(
    "name",
    ["nsysai_h100_fsdp_2gpu.sqlite", "pipit_cloverleaf_nsys2024.sqlite", "pipit_saxpy_mpi_nsys2022.sqlite"],
)
def test_real_exports_parse_the_same(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    p = SHARED_TRACES / "nsys" / name
    if not p.exists():
        pytest.skip(f"shared trace nsys/{name} not available")
    _assert_same(*_parse_both(p, monkeypatch))


def _kernel_export(tmp_path: Path, rows: list[tuple[Any, ...]]) -> Path:
    """A kernel table (start, end, deviceId, streamId, globalPid, correlationId, demangledName)."""
    p = tmp_path / "k.sqlite"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    conn.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, [end] INTEGER, deviceId INTEGER, "
        "streamId INTEGER, globalPid INTEGER, correlationId INTEGER, demangledName INTEGER)"
    )
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return p


def _plain_vs_guarded(path: Path) -> tuple[np.ndarray | None, np.ndarray]:
    """(the kernel rows computed from the plain columns, the guarded query read with sqlite3)."""
    from ppdiag.parsers import nsys_gpu

    with closing(open_export(path)) as db:
        assert db.arrow is not None
        plain = nsys_gpu._plain_rows(db, nsys_gpu.KERNEL, "demangledName")
        sql = nsys_gpu._join_sql(db, nsys_gpu.KERNEL, int_expr("g.demangledName"), [])
        ref = np.fromiter(db.conn.execute(sql), dtype=nsys_gpu._ROW)
    return plain, ref


def test_kernel_columns_computed_in_numpy_match_the_query(tmp_path: Path) -> None:
    # edge values of every expression: a device id with the top bit (packs into the sign bit), a
    # 64-bit stream id, a pid in the high bits, correlation ids below 0 and above 32 bits, a name
    # id above 32 bits, a reversed range (bad code 3), negative times
    edge = [
        (5, 10, 200, 2**40 + 7, (77 << 24) | 5, -3, 2**33 + 9),
        (20, 15, 0, 3, -(2**40), 2**32, 4),
        (-100, -50, 255, 0, 2**62, 2**32 - 1, -1),
        (0, 0, 1, 2**32 - 1, 0, 0, 0),
    ]
    rows = [edge[i % 4] if i < 40 else (i, i + 5, i % 8, i % 3, (i % 4) << 24, i, i % 17) for i in range(N)]
    plain, ref = _plain_vs_guarded(_kernel_export(tmp_path, rows))
    assert plain is not None and plain.dtype == ref.dtype
    assert plain.tolist() == ref.tolist()
    assert (plain["bad"] == 3).sum() == 10  # the reversed row, 10 times among the first 40


@pytest.mark.parametrize("odd", [None, 1.5, "s7", b"\x07"])
def test_kernel_columns_not_all_integers_go_to_the_query(tmp_path: Path, odd: Any) -> None:
    rows = [(i, i + 5, 0, 1, 1 << 24, i, 3) for i in range(N)]
    rows[N - 2] = (N, N + 1, 0, odd, 1 << 24, 1, 3)  # late in the table: past the driver's type guess
    plain, ref = _plain_vs_guarded(_kernel_export(tmp_path, rows))
    assert plain is None and len(ref) == N


@pytest.mark.parametrize("with_api", [False, True])
def test_runtime_rows_through_arrow_match_sqlite3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_api: bool
) -> None:
    # without the API name the query leaves out its constant column; the rows are the same
    from ppdiag.parsers.nsys_gpu import Launches

    run = make_scenario("1f1b", pp=2, microbatches=4, dp=1, steps=2, seed=5)
    p = write_nsys(run, tmp_path)[0]
    got = []
    for off in ("0", "1"):
        monkeypatch.setenv(ARROW_ENV, off)
        with closing(open_export(p)) as db:
            assert (db.arrow is not None) == (off == "0")
            got.append(Launches.read(db, with_api=with_api))
    fast, slow = got
    assert fast is not None and slow is not None and len(fast.keys) > 10
    _equal(fast, slow, "launches")
    assert (fast.api >= 0).all() if with_api else (fast.api == -1).all()
