"""Low-level access to an Nsight Systems SQLite export: opening, schema discovery, column fetches.

Exports differ between nsys versions (columns move, ``--lazy`` exports omit empty tables), so
every query is built from the columns a table really has (``PRAGMA table_info``) and a missing
table reads as empty. Rows are fetched straight into numpy structured arrays with
:func:`numpy.fromiter`, so no Python object per row outlives the fetch.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppdiag.errors import InputError

SQLITE_MAGIC = b"SQLite format 3\x00"

# Tables whose presence marks a file as an nsys export (StringIds plus one of these).
NSYS_MARKER_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "NVTX_EVENTS",
    "TARGET_INFO_SESSION_START_TIME",
    "META_DATA_EXPORT",
    "EXPORT_META_DATA",
)

# GlobalId layout (NSYS.md §2): bits 0-23 TID, 24-47 PID, 48-55 VM, 56-63 HW.
PID_SHIFT = 24
ID_MASK = 0xFFFFFF


def pid_of(global_id: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """PID field of serialized GlobalIds (globalPid or globalTid)."""
    return (global_id >> PID_SHIFT) & ID_MASK


def factorize(values: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
    """(codes, distinct values) in first-seen order: a hash pass, no sort of the rows."""
    codes, uniq = pd.factorize(values)
    return codes.astype(np.int64, copy=False), np.asarray(uniq)


def quote_ident(name: str) -> str:
    """SQL identifier quoting (column names such as ``end`` and ``offset`` are keywords)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass
class NsysDb:
    """An open export plus what its schema holds."""

    path: Path
    conn: sqlite3.Connection
    tables: set[str]
    _columns: dict[str, list[str]] = field(default_factory=dict)

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` (empty when the table does not exist)."""
        if table not in self.tables:
            return []
        cols = self._columns.get(table)
        if cols is None:
            cols = [r[1] for r in self.conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
            self._columns[table] = cols
        return cols

    def col(self, table: str, name: str, default: str = "NULL", alias: str = "") -> str:
        """SQL expression for ``alias.name`` when the column exists, else ``default``."""
        if name in self.columns(table):
            return f"{alias + '.' if alias else ''}{quote_ident(name)}"
        return default

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def fetch(self, sql: str, dtype: np.dtype[Any], params: Sequence[Any] = ()) -> npt.NDArray[Any]:
        """Rows of ``sql`` as a structured array (every selected value must be non-NULL)."""
        return np.fromiter(self.conn.execute(sql, params), dtype=dtype)

    def count(self, table: str) -> int:
        if table not in self.tables:
            return 0
        return int(self.conn.execute(f"SELECT COUNT(*) FROM {quote_ident(table)}").fetchone()[0])

    def name_values(self, table: str) -> list[tuple[str, str]]:
        """(name, value) rows of a META_DATA_* style table, empty when absent."""
        if not {"name", "value"} <= set(self.columns(table)):
            return []
        rows = self.conn.execute(f"SELECT name, value FROM {quote_ident(table)}").fetchall()
        return [(str(n), "" if v is None else str(v)) for n, v in rows]

    def strings(self, ids: Iterable[int]) -> dict[int, str]:
        """StringIds values for ``ids`` (only those asked for: real exports hold millions)."""
        wanted = sorted({int(i) for i in ids if int(i) >= 0})
        out: dict[int, str] = {}
        if not wanted or not self.has("StringIds"):
            return out
        # One JSON array parameter instead of thousands of bound variables; plain IN lists where
        # the SQLite library lacks JSON support.
        step = 200_000
        try:
            for lo in range(0, len(wanted), step):
                chunk = json.dumps(wanted[lo : lo + step])
                for i, v in self.conn.execute(
                    "SELECT id, value FROM StringIds WHERE id IN (SELECT value FROM json_each(?))", (chunk,)
                ):
                    out[int(i)] = "" if v is None else str(v)
        except sqlite3.OperationalError:
            for lo in range(0, len(wanted), 900):
                part = wanted[lo : lo + 900]
                marks = ", ".join("?" for _ in part)
                for i, v in self.conn.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part):
                    out[int(i)] = "" if v is None else str(v)
        return out

    def close(self) -> None:
        self.conn.close()


def read_head(path: Path, n: int = 16) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read(n)
    except OSError as exc:
        raise InputError(str(path), f"cannot read file: {exc.strerror or exc}") from None


def list_tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def is_nsys_schema(tables: set[str]) -> bool:
    """StringIds plus at least one table only nsys exports have."""
    return "StringIds" in tables and any(t in tables for t in NSYS_MARKER_TABLES)


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open without ever writing: exports often sit on read-only storage.

    ``immutable=1`` also skips locking, which read-only directories and network file systems need.
    """
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    # Real exports hold strings that are not valid UTF-8 (binary names from odd processes).
    conn.text_factory = _decode_text
    return conn


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def open_export(path: Path) -> NsysDb:
    """Open ``path`` as an nsys export or raise :class:`InputError` saying why it is not one."""
    head = read_head(path)
    if not head:
        raise InputError(str(path), "empty file, not an Nsight Systems SQLite export")
    if not head.startswith(SQLITE_MAGIC):
        raise InputError(
            str(path),
            "not an SQLite database (bad header); expected an Nsight Systems "
            "export made with 'nsys export --type sqlite'",
        )
    try:
        conn = connect_readonly(path)
        tables = list_tables(conn)
    except sqlite3.Error as exc:
        raise InputError(str(path), f"corrupt or truncated SQLite database ({exc})") from None
    if not is_nsys_schema(tables):
        conn.close()
        raise InputError(
            str(path), "SQLite database but not an Nsight Systems export (no StringIds / CUPTI / NVTX tables)"
        )
    return NsysDb(path=path, conn=conn, tables=tables)


def sniff_sqlite(path: Path, head: bytes) -> bool:
    """SQLite magic plus nsys tables; never raises."""
    if not head.startswith(SQLITE_MAGIC):
        return False
    try:
        conn = connect_readonly(path)
        try:
            return is_nsys_schema(list_tables(conn))
        finally:
            conn.close()
    except (sqlite3.Error, OSError, ValueError):
        return False
