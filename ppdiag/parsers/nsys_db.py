"""Low-level access to an Nsight Systems SQLite export: opening, schema discovery, column fetches.

Exports differ between nsys versions (columns move, ``--lazy`` exports omit empty tables), so
every query is built from the columns a table really has (``PRAGMA table_info``) and a missing
table reads as empty. Rows are fetched straight into numpy structured arrays with
:func:`numpy.fromiter`, so no Python object per row outlives the fetch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.parsers import nsys_arrow
from ppdiag.parsers.nsys_arrow import ArrowReader

SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_NAME_SUFFIXES = (".sqlite", ".sqlite3")
BUSY_TIMEOUT_S = 2.0  # how long to wait for a committing writer's lock before saying "locked"
# SQLite primary result codes (sqlite3.h)
SQLITE_BUSY, SQLITE_READONLY, SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_NOLCK = 5, 8, 10, 14, 16

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
    """(codes, distinct values) in first-seen order, as ``pandas.factorize`` gives them for values
    without missing ones (pandas is not loaded for this: it costs ~0.5 s per parse process).

    Integers in a range not much wider than their count (string ids, thread numbers): a table
    over the range, no sort of the rows (``np.unique`` with indices was ~0.03 s CPU of a 65 MB
    export's 430 k kernel names). Other numbers: one sort (``np.unique``), then the distinct
    values are put in first-seen order. Objects (names): a hash pass (``dict.fromkeys``), C-level
    iteration over the rows."""
    v = np.asarray(values)
    if v.dtype.kind == "i" and v.ndim == 1 and len(v):
        dense = _factorize_dense(v)
        if dense is not None:
            return dense
    if v.dtype == object:
        rows = v.tolist()
        keys = list(dict.fromkeys(rows))
        index = {k: i for i, k in enumerate(keys)}  # one entry per distinct value
        codes = np.fromiter(map(index.__getitem__, rows), np.int64, len(rows))
        uniq = np.empty(len(keys), dtype=object)
        uniq[:] = keys
        return codes, uniq
    uniq, first, inv = np.unique(v, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank[inv.reshape(-1)], uniq[order]


def _factorize_dense(v: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]] | None:
    """:func:`factorize` of signed integers through a table over their range; None where the
    range is wider than ``2 * len(v) + 65536`` (the table would outweigh the rows)."""
    lo, hi = int(v.min()), int(v.max())
    if hi - lo > 2 * len(v) + 65536:
        return None
    # in [0, hi - lo]: exact in int64 whatever wraps on the way (narrower types would wrap)
    off = (v.astype(np.int64) - np.int64(lo)).astype(np.intp)
    first = np.full(hi - lo + 1, len(v), dtype=np.int64)
    np.minimum.at(first, off, np.arange(len(v), dtype=np.int64))  # each value's first row
    seen = np.flatnonzero(first < len(v))
    distinct = seen[np.argsort(first[seen], kind="stable")]  # in first-seen order
    code = np.empty(hi - lo + 1, dtype=np.int64)
    code[distinct] = np.arange(len(distinct), dtype=np.int64)
    return code[off], (distinct + lo).astype(v.dtype)


def quote_ident(name: str) -> str:
    """SQL identifier quoting (column names such as ``end`` and ``offset`` are keywords)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass
class NsysDb:
    """An open export plus what its schema holds."""

    path: Path
    conn: sqlite3.Connection
    tables: set[str]
    warnings: list[str] = field(default_factory=list)  # file-level facts about how it was opened
    tmpdir: Path | None = None  # private copy read instead of the file (hot journal, -wal), removed on close
    bad_utf8: int = 0  # text values read with invalid UTF-8 replaced (U+FFFD)
    arrow: ArrowReader | None = None  # ADBC reader for big integer queries, where installed and safe
    _columns: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.conn.text_factory = self._decode

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # Real exports hold strings that are not valid UTF-8 (binary names from odd processes):
            # replaced and counted, never a reason to reject the file.
            self.bad_utf8 += 1
            return raw.decode("utf-8", "replace")

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
        """Rows of ``sql`` as a structured array (every selected value must be non-NULL).

        Read through ADBC where :attr:`arrow` is set and gives the same rows (integer columns, a
        plain scan: no bound parameters, no join), else with sqlite3."""
        if self.arrow is not None and not params and " JOIN " not in sql.upper():
            rows = self.arrow.fetch(sql, dtype)
            if rows is not None:
                return rows
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
        if self.arrow is not None:
            self.arrow.close()
        self.conn.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def int_expr(expr: str, default: str = "-1") -> str:
    """``expr`` when it is stored as an integer, else ``default``: a NULL, TEXT, REAL or BLOB in a
    column the reader fetches as int64 must not reach numpy (it would crash the fetch)."""
    return f"(CASE WHEN typeof({expr}) = 'integer' THEN {expr} ELSE {default} END)"


def valid_times(alias: str = "") -> str:
    """SQL condition: integer ``start`` and ``end`` with ``end >= start``."""
    a = f"{alias}." if alias else ""
    return f"typeof({a}start) = 'integer' AND typeof({a}\"end\") = 'integer' AND {a}\"end\" >= {a}start"


def bad_time_code(alias: str = "") -> str:
    """SQL: 0 for rows :func:`valid_times` keeps, else why not (1 NULL, 2 not an integer, 3 end <
    start, 4 an integer start without an end), so that one scan both fetches the rows and counts
    the dropped ones."""
    a = f"{alias}." if alias else ""
    return (
        f"(CASE WHEN {valid_times(alias)} THEN 0 "
        f"WHEN typeof({a}start) = 'integer' AND {a}\"end\" IS NULL THEN 4 "
        f'WHEN {a}start IS NULL OR {a}"end" IS NULL THEN 1 '
        f"WHEN typeof({a}start) != 'integer' OR typeof({a}\"end\") != 'integer' THEN 2 ELSE 3 END)"
    )


@dataclass
class BadTimes:
    """Rows dropped for unusable ``start``/``end`` values, by reason."""

    null: int = 0
    non_integer: int = 0  # TEXT, REAL or BLOB
    reversed: int = 0  # end < start

    @classmethod
    def from_codes(cls, codes: npt.NDArray[np.int64]) -> BadTimes:
        """Counts of the :func:`bad_time_code` values (4 counts as NULL)."""
        c = np.bincount(codes, minlength=5) if len(codes) else np.zeros(5, dtype=np.int64)
        return cls(int(c[1] + c[4]), int(c[2]), int(c[3]))

    @property
    def total(self) -> int:
        return self.null + self.non_integer + self.reversed

    def add(self, other: BadTimes) -> None:
        self.null += other.null
        self.non_integer += other.non_integer
        self.reversed += other.reversed

    def describe(self) -> str:
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.null, "with a NULL start or end"),
                (self.non_integer, "with a TEXT, REAL or BLOB start or end"),
                (self.reversed, "ending before they start"),
            )
            if n
        ]
        return ", ".join(parts)


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


def connect_readonly(path: Path, *, immutable: bool = False) -> sqlite3.Connection:
    """Open without ever writing the user's file.

    Plain ``mode=ro`` takes SQLite's shared lock, reads committed rows that still sit in a ``-wal``
    file and refuses a hot journal; ``immutable=1`` skips all of that and is only safe when no
    ``-wal`` or ``-journal`` file exists (a finished export on read-only or lock-less storage).
    """
    uri = path.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
    # (sniff and open choose immutable only when no -wal or live -journal exists: _side_file)
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
    # Real exports hold strings that are not valid UTF-8 (binary names from odd processes).
    conn.text_factory = _decode_text
    bound_queries(conn, path)
    return conn


#: SQLite virtual-machine steps a file's queries may take in all. The whole parse of a real export
#: takes under one step per byte of the file (0.6 on a 2.2 MB H100 export), so this is hundreds of
#: times what any export needs; a VIEW or trigger that does not end (a recursive query) is stopped
#: there instead of holding a core without limit.
SQL_STEPS_PER_BYTE = 200
SQL_MIN_STEPS = 100_000_000
_SQL_TICK = 100_000  # steps between two calls of the progress handler
SQL_BUDGET_ENV = "PPDIAG_SQL_BUDGET_S"
SQL_STOPPED = "interrupted"  # what sqlite3 says of a query its progress handler stopped


def bound_queries(conn: sqlite3.Connection, path: Path) -> None:
    """Stop every query on ``conn`` once all of them together ran :data:`SQL_STEPS_PER_BYTE` per
    byte of ``path`` (at least :data:`SQL_MIN_STEPS`) or ``$PPDIAG_SQL_BUDGET_S`` seconds; the
    query then raises ``sqlite3.OperationalError('interrupted')``."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    ticks = max(SQL_MIN_STEPS, SQL_STEPS_PER_BYTE * size) // _SQL_TICK
    deadline = math.inf
    raw = os.environ.get(SQL_BUDGET_ENV, "").strip()
    if raw:
        try:
            secs = float(raw)
        except ValueError:
            secs = math.nan
        if not (math.isfinite(secs) and secs > 0):
            raise InputError(None, f"{SQL_BUDGET_ENV}={raw!r}: expected seconds, a number above 0")
        deadline = time.monotonic() + secs
    left = [ticks]

    def tick() -> int:
        left[0] -= 1
        return int(left[0] < 0 or time.monotonic() > deadline)

    conn.set_progress_handler(tick, _SQL_TICK)


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")  # a rollback journal with content (pager.c aJournalMagic)


def _side_file(path: Path, suffix: str) -> Path | None:
    """``path-wal`` with data, or ``path-journal`` holding a journal header; else None.

    An empty ``-wal`` holds no commits, and a journal whose header is zeroed (``PERSIST`` mode)
    or that is empty (``TRUNCATE``) is finished: neither can hold rows the main file lacks.
    """
    side = path.with_name(path.name + suffix)
    try:
        if side.stat().st_size <= 0:
            return None
        if suffix == "-journal":
            with side.open("rb") as fh:
                return side if fh.read(8) == JOURNAL_MAGIC else None
        return side
    except OSError:
        return None


def truncation(path: Path, head: bytes) -> str | None:
    """Why the file is shorter than its header says (``None`` when it is not).

    The header's page count is trusted only when valid (bytes 92-95 equal the change counter) and
    when no ``-wal``/``-journal`` could legitimately hold pages the main file lacks.
    """
    if len(head) < 100:
        return f"truncated SQLite database ({len(head)} bytes, shorter than its 100-byte header)"
    raw_ps = int.from_bytes(head[16:18], "big")
    page_size = 65536 if raw_ps == 1 else raw_ps
    pages = int.from_bytes(head[28:32], "big")
    valid = head[92:96] == head[24:28] and pages > 0
    if page_size < 512 or page_size & (page_size - 1):
        return None
    if _side_file(path, "-wal") or _side_file(path, "-journal"):
        return None
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if valid and size < pages * page_size:
        return (
            f"truncated SQLite database ({size} bytes; its header declares {pages} pages of "
            f"{page_size} bytes = {pages * page_size}); copy or export it again"
        )
    if size % page_size:
        return f"truncated SQLite database ({size} bytes, not a whole number of {page_size}-byte pages)"
    return None


def _errcode(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", -1) or -1) & 0xFF


def _private_copy(path: Path, side: Path | None) -> Path:
    """Copy ``path`` (and its -wal/-journal) into a fresh temp dir; the copy may be written."""
    tmp = Path(tempfile.mkdtemp(prefix="ppdiag-nsys-"))
    try:
        dst = tmp / path.name
        shutil.copyfile(path, dst)
        if side is not None:
            shutil.copyfile(side, tmp / side.name.replace(path.name, dst.name, 1))
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(
            str(path), f"cannot make a private copy to read it safely ({exc.strerror or exc})"
        ) from None
    return dst


def _open_checked(path: Path, head: bytes) -> tuple[sqlite3.Connection, set[str], Path | None, list[str]]:
    """(connection, tables, private temp dir or None, warnings) reading only committed rows."""
    name = path.name
    wal = _side_file(path, "-wal")
    journal = _side_file(path, "-journal")
    warnings: list[str] = []
    conn: sqlite3.Connection | None = None
    side = path.with_name(name + "-journal")
    with contextlib.suppress(OSError):
        if side.stat().st_size > 0:
            # A journal means an open write transaction (or one that stopped): say so. Until its
            # header is written the writer has not touched the database file, so the file holds
            # the committed rows; with a header SQLite itself decides (below).
            warnings.append(
                f"'{side.name}' exists: another process is writing to this export (or stopped while "
                "writing); only its committed rows are read"
            )
    if wal is None and journal is None:
        # Nothing can be mid-write or uncommitted without a -wal or a live journal, so the file is
        # read as immutable: no locks (read-only and lock-less storage) and no -shm/-wal left next
        # to a WAL-mode export.
        try:
            conn = connect_readonly(path, immutable=True)
            return conn, list_tables(conn), None, warnings
        except sqlite3.Error as exc:
            if conn is not None:
                conn.close()
            raise InputError(str(path), _corrupt_message(path, head, exc)) from None
    try:
        conn = connect_readonly(path)
        tables = list_tables(conn)
        return conn, tables, None, warnings
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        code = _errcode(exc)
        if code == SQLITE_READONLY and journal is not None:
            # A hot journal: a writer stopped mid-transaction. SQLite rolls it back on open, which
            # a read-only connection may not do, so it is done on a private copy.
            copy = _private_copy(path, journal)
            warnings[:] = [w for w in warnings if journal.name not in w]
            warnings.append(
                f"hot journal '{journal.name}' (a write to this export was interrupted): its "
                "uncommitted changes were rolled back on a private copy; the file itself is unchanged"
            )
            return _open_copy(path, copy, warnings)
        if code in (SQLITE_CANTOPEN, SQLITE_READONLY) and wal is not None:
            # WAL file but no writable place for its index (read-only directory).
            copy = _private_copy(path, wal)
            warnings.append(
                f"'{wal.name}' holds rows not yet checkpointed and this directory is read-only: "
                "read from a private copy of the export and its -wal"
            )
            return _open_copy(path, copy, warnings)
        if code in (SQLITE_BUSY, SQLITE_NOLCK, SQLITE_IOERR) and journal is not None and wal is None:
            # Locks unavailable (lock-less storage) or held by a writer: its journal's rows are
            # the committed ones, so a private copy rolled back is what a reader would see.
            copy = _private_copy(path, journal)
            warnings.append(
                f"'{name}' could not be locked ({exc}) while '{journal.name}' exists: read from a "
                "private copy with the journal's uncommitted changes rolled back"
            )
            return _open_copy(path, copy, warnings)
        if code == SQLITE_BUSY:
            raise InputError(
                str(path), "the export is locked by a process writing to it; retry when it has finished"
            ) from None
        raise InputError(str(path), _corrupt_message(path, head, exc)) from None


def _open_copy(
    path: Path, copy: Path, warnings: list[str]
) -> tuple[sqlite3.Connection, set[str], Path | None, list[str]]:
    try:
        conn = sqlite3.connect(copy, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        conn.text_factory = _decode_text
        bound_queries(conn, copy)
        tables = list_tables(conn)
        conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error as exc:
        shutil.rmtree(copy.parent, ignore_errors=True)
        raise InputError(str(path), _corrupt_message(path, b"", exc)) from None
    return conn, tables, copy.parent, warnings


def _corrupt_message(path: Path, head: bytes, exc: sqlite3.Error) -> str:
    cut = truncation(path, head) if head else None
    if cut:
        return cut
    return f"not a valid SQLite database: corrupt or truncated ({exc})"


def open_export(path: Path) -> NsysDb:
    """Open ``path`` as an nsys export or raise :class:`InputError` saying why it is not one.

    Only committed rows are read, and the user's files are never written: without a ``-wal`` or a
    live ``-journal`` the file is opened immutable; otherwise with SQLite's locks (committed rows
    in the ``-wal`` are read, a live writer's uncommitted ones are not), and where that cannot work
    (hot journal, read-only directory for the WAL index, locks held or unavailable while a journal
    exists) from a private copy that SQLite brings to its committed state. What happened is in
    ``NsysDb.warnings``. Truncated and garbage files get an error naming the fault.
    """
    head = read_head(path, 100)
    if not head:
        raise InputError(str(path), "empty file, not an Nsight Systems SQLite export")
    if not head.startswith(SQLITE_MAGIC):
        raise InputError(
            str(path),
            "not a valid SQLite database (bad header); expected an Nsight Systems "
            "export made with 'nsys export --type sqlite'",
        )
    cut = truncation(path, head)
    if cut:
        raise InputError(str(path), cut)
    conn, tables, tmp, warnings = _open_checked(path, head)
    if not is_nsys_schema(tables):
        conn.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(
            str(path), "SQLite database but not an Nsight Systems export (no StringIds / CUPTI / NVTX tables)"
        )
    return NsysDb(
        path=path, conn=conn, tables=tables, warnings=warnings, tmpdir=tmp, arrow=_arrow_reader(path, conn)
    )


def _arrow_reader(path: Path, conn: sqlite3.Connection) -> ArrowReader | None:
    """An ADBC reader for an export of at least ``nsys_arrow.MIN_FILE_BYTES`` opened immutable (no
    ``-wal``, no live ``-journal``: what ADBC opens is then what sqlite3 reads) whose schema holds no
    VIEW (which could hide a query the step budget must bound)."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if (
        not nsys_arrow.wanted(size)
        or _side_file(path, "-wal") is not None
        or _side_file(path, "-journal") is not None
    ):
        return None
    try:
        views = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'view'").fetchone()[0]
    except sqlite3.Error:
        return None
    return ArrowReader(path) if views == 0 else None


def sniff_sqlite(path: Path, head: bytes) -> bool:
    """Whether the nsys reader should take this file; never raises.

    SQLite files with nsys tables, and also files it cannot read as SQLite although they say they
    are (a ``.sqlite`` name or the SQLite magic): those are broken exports, and the reader then
    names the file and the fault (bad header, truncated, hot journal) instead of the loader's
    "not a recognised trace format". Readable SQLite databases of other programs are left alone.
    """
    if not head.startswith(SQLITE_MAGIC):
        return path.name.lower().endswith(SQLITE_NAME_SUFFIXES)
    if truncation(path, head):
        return True
    quiet = _side_file(path, "-wal") is None and _side_file(path, "-journal") is None
    for immutable in dict.fromkeys((quiet, True)):
        # A locked or hot-journal database is peeked at immutable: only its table names matter here.
        try:
            conn = connect_readonly(path, immutable=immutable)
            try:
                return is_nsys_schema(list_tables(conn))
            finally:
                conn.close()
        except (sqlite3.Error, OSError, ValueError):
            continue
    return True
