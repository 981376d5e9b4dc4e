"""Optional Arrow reader for the big integer SELECTs of an Nsight Systems export.

Python's :mod:`sqlite3` makes one Python object per value it returns, which is most of the cost of
reading a large export (SQLite's own scan is a small part). Where the ``adbc-driver-sqlite``
package (Apache Arrow ADBC) is installed, :class:`ArrowReader` runs a query through ADBC instead
and gets whole Arrow columns back, with no Python object per value; their buffers are read
through the Arrow C data interface (:mod:`ppdiag.parsers.arrow_c`), without pyarrow.

The result must be the one :mod:`sqlite3` gives, or not be used: ADBC's SQLite driver infers a
column's type from its first rows, so a later NULL, REAL or TEXT value in an integer column can
fail the query or change the column's type. The reader therefore only answers queries whose
columns all arrive as int64 without NULLs; anything else (an error, another type, a NULL) returns
None and the caller reads the query with :mod:`sqlite3`. Text columns are never read here: the
driver does not tell TEXT from BLOB values within one column, where :mod:`sqlite3` gives ``str``
and ``bytes``. A BLOB column is read (:meth:`ArrowReader.fetch_blobs`) only where the query keeps
BLOB values alone (``CASE WHEN typeof(x) = 'blob' THEN x END``): the driver then gives a binary
column whose offsets and bytes are used as they are, with no Python object per value.

Set ``PPDIAG_NO_ADBC=1`` to always read with :mod:`sqlite3`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass
from itertools import compress, repeat
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.parsers.arrow_c import Column, read_stream

ARROW_ENV = "PPDIAG_NO_ADBC"  # "1": read every query with sqlite3
#: Exports smaller than this are read with sqlite3 alone: ADBC saves ~0.45 s CPU on a 65 MB
#: export's kernel and runtime queries (measured), and the first query of a process pays for
#: loading the driver, so small files are left to sqlite3.
MIN_FILE_BYTES = 32 << 20

#: Rows per Arrow batch asked of the driver (its default is 1024): each batch costs a fixed
#: conversion on both sides, ~0.025 s CPU of a 65 MB export's kernel and runtime reads at the
#: default (measured). The driver infers a column's type from its first batch; what it infers is
#: checked either way (see :meth:`ArrowReader.fetch`).
BATCH_ROWS = 16384

_MODULES: tuple[Any, Any] | bool | None = False  # False: not tried yet; None: not installed


def _modules() -> tuple[Any, Any] | None:
    """(adbc_driver_manager, adbc_driver_sqlite), or None when one is missing or the reader is
    turned off."""
    global _MODULES
    if os.environ.get(ARROW_ENV, "") == "1":
        return None
    if _MODULES is False:
        try:
            # the driver manager's low-level API, not its DB-API module: that one imports pandas
            # and pyarrow (~0.4 s CPU per parse process)
            mods = [importlib.import_module(m) for m in ("adbc_driver_manager", "adbc_driver_sqlite")]
            _MODULES = (mods[0], mods[1])
        except Exception:  # not installed, or a broken install: the sqlite3 path is always there
            _MODULES = None
    return _MODULES if isinstance(_MODULES, tuple) else None


def wanted(size: int) -> bool:
    """Whether an export of ``size`` bytes is worth reading through ADBC in this process."""
    return size >= MIN_FILE_BYTES and _modules() is not None


def _int64_values(chunks: list[Any]) -> npt.NDArray[np.int64]:
    """The values of int64 Arrow chunks without NULLs, from their data buffers."""
    parts = [
        np.frombuffer(c.buffers()[1], dtype=np.int64, count=len(c), offset=c.offset * 8)
        for c in chunks
        if len(c)
    ]
    if not parts:
        return np.empty(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


_BYTES = (bytes, bytearray, memoryview)


@dataclass
class Blobs:
    """A column of BLOB values as one byte buffer: value ``i`` is ``data[offsets[i]:offsets[i + 1]]``
    (empty for NULL or a non-BLOB value)."""

    offsets: npt.NDArray[np.int64]  # n + 1 ascending byte offsets into ``data``
    data: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Byte length of each value (0 for NULL or a non-BLOB value)."""
        return np.diff(self.offsets)

    def take(self, keep: npt.NDArray[np.bool_]) -> Blobs:
        """The values where ``keep`` is true, in order."""
        lengths = self.lengths
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])
        # the bytes of the kept values: each byte's value kept or not, from its value's flag
        kept = np.repeat(keep, lengths)
        return Blobs(offsets, self.data[self.offsets[0] : self.offsets[-1]][kept])

    @classmethod
    def from_objects(cls, values: npt.NDArray[Any]) -> Blobs:
        """From an object column as :mod:`sqlite3` returns it (``bytes`` for BLOB values). ``map``
        with the builtins ``isinstance`` and ``len`` walks the rows in C: no Python bytecode runs
        per row."""
        vals = values.tolist()
        is_blob = np.fromiter(map(isinstance, vals, repeat(_BYTES)), dtype=bool, count=len(vals))
        lengths = np.zeros(len(vals), dtype=np.int64)
        kept = list(compress(vals, is_blob))
        lengths[is_blob] = np.fromiter(map(len, kept), dtype=np.int64, count=len(kept))
        offsets = np.zeros(len(vals) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(offsets, np.frombuffer(b"".join(kept), dtype=np.uint8))

    @classmethod
    def from_arrow(cls, chunks: list[Any], large: bool) -> Blobs:
        """From the chunks of an Arrow binary (``large``: large_binary) column; a NULL value is
        empty whatever its offsets say."""
        width = 8 if large else 4
        lengths: list[npt.NDArray[np.int64]] = []
        datas: list[npt.NDArray[np.uint8]] = []
        for c in chunks:
            n = len(c)
            if not n:
                continue
            validity, offs_buf, data_buf = c.buffers()[:3]
            offs = np.frombuffer(offs_buf, dtype=f"<i{width}", count=n + 1, offset=c.offset * width)
            offs = offs.astype(np.int64)
            data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
            data = data[offs[0] : offs[-1]]
            ln = np.diff(offs)
            if c.null_count:
                bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
                valid = bits[c.offset : c.offset + n].astype(bool)
                if not valid.all():  # keep the valid values' bytes only, in order
                    data = data[np.repeat(valid, ln)]
                    ln = np.where(valid, ln, 0)
            lengths.append(ln)
            datas.append(data)
        total = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
        offsets = np.zeros(len(total) + 1, dtype=np.int64)
        np.cumsum(total, out=offsets[1:])
        data = np.concatenate(datas) if len(datas) > 1 else datas[0] if datas else np.empty(0, np.uint8)
        return cls(offsets, data)


class ArrowReader:
    """A lazily opened ADBC connection on one export file, opened immutable like the sqlite3 one.

    Only made for files the sqlite3 reader opened immutable (no ``-wal`` or live ``-journal``) and
    whose schema holds no VIEW: every query then is a plain scan of a table, so the step budget of
    the sqlite3 connection (which ADBC cannot set) has nothing to stop."""

    def __init__(self, path: Path) -> None:
        self.uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
        self._db: Any = None
        self._conn: Any = None
        self._broken = False

    def _table(self, sql: str) -> list[Column] | None:
        """The columns of ``sql``, or None where the driver fails on it."""
        mods = _modules()
        if self._broken or mods is None:
            return None
        manager, driver = mods
        try:
            if self._conn is None:
                self._db = driver.connect(self.uri)
                self._conn = manager.AdbcConnection(self._db)
            stmt = manager.AdbcStatement(self._conn)
            try:
                with contextlib.suppress(Exception):  # a driver without the option: its default
                    stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
                stmt.set_sql_query(sql)
                stream, _ = stmt.execute_query()
                try:
                    return read_stream(stream.address)
                finally:
                    stream.release()
            finally:
                stmt.close()
        except Exception:  # type inference across batches, a driver error: sqlite3 reads it instead
            if self._conn is None:
                self._broken = True
            return None

    @staticmethod
    def _ints(columns: list[Column], dtype: np.dtype[Any]) -> npt.NDArray[Any] | None:
        """``columns`` as a structured array of ``dtype`` (all int64 fields), or None where one is
        not int64 without NULLs."""
        names = dtype.names or ()
        n = sum(len(c) for c in columns[0].chunks) if columns else 0
        out = np.empty(n, dtype=dtype)
        for name, col in zip(names, columns, strict=True):
            # int64 without NULLs is exactly what sqlite3 gives for INTEGER values; a column the
            # driver typed otherwise (its first rows NULL or REAL) is not taken
            if col.format != "l" or any(c.null_count for c in col.chunks):
                return None
            out[name] = _int64_values(col.chunks)
        return out

    @staticmethod
    def _int_dtype(dtype: np.dtype[Any]) -> bool:
        names = dtype.names
        return bool(names) and all(dtype[n] == np.int64 for n in names or ())

    def fetch(self, sql: str, dtype: np.dtype[Any]) -> npt.NDArray[Any] | None:
        """Rows of ``sql`` as a structured array of int64 fields, or None where ADBC cannot give
        exactly what :mod:`sqlite3` would (the caller then reads the query with sqlite3)."""
        if not self._int_dtype(dtype):
            return None
        cols = self._table(sql)
        if cols is None or len(cols) != len(dtype.names or ()):
            return None
        return self._ints(cols, dtype)

    def fetch_blobs(self, sql: str, dtype: np.dtype[Any]) -> tuple[npt.NDArray[Any], Blobs] | None:
        """Rows of ``sql`` whose last column holds BLOB values or NULL (the query must make sure
        of it, e.g. ``CASE WHEN typeof(x) = 'blob' THEN x END``) and whose other columns are the
        int64 fields of ``dtype``; None where ADBC cannot give them exactly."""
        if not self._int_dtype(dtype):
            return None
        cols = self._table(sql)
        if cols is None or len(cols) != len(dtype.names or ()) + 1:
            return None
        blob = cols[-1]
        # a column of NULLs alone may come typed otherwise (int64, null): sqlite3 reads that one
        if blob.format not in ("z", "Z"):
            return None
        ints = self._ints(cols[:-1], dtype)
        if ints is None:
            return None
        return ints, Blobs.from_arrow(blob.chunks, large=blob.format == "Z")

    def close(self) -> None:
        for handle in (self._conn, self._db):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        self._conn = self._db = None
