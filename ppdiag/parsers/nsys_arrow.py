"""Optional Arrow reader for the big integer SELECTs of an Nsight Systems export.

Python's :mod:`sqlite3` makes one Python object per value it returns, which is most of the cost of
reading a large export (SQLite's own scan is a small part). Where the ``adbc-driver-sqlite``
package (Apache Arrow ADBC) and pyarrow are installed, :class:`ArrowReader` runs a query through
ADBC instead and gets whole Arrow columns back, with no Python object per value.

The result must be the one :mod:`sqlite3` gives, or not be used: ADBC's SQLite driver infers a
column's type from its first rows, so a later NULL, REAL or TEXT value in an integer column can
fail the query or change the column's type. The reader therefore only answers queries whose
columns all arrive as int64 without NULLs; anything else (an error, another type, a NULL) returns
None and the caller reads the query with :mod:`sqlite3`. Text columns are never read here: the
driver does not tell TEXT from BLOB values within one column, where :mod:`sqlite3` gives ``str``
and ``bytes``.

Set ``PPDIAG_NO_ADBC=1`` to always read with :mod:`sqlite3`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ARROW_ENV = "PPDIAG_NO_ADBC"  # "1": read every query with sqlite3
#: Exports smaller than this are read with sqlite3 alone: importing pyarrow costs ~0.16 s CPU per
#: parse process and ADBC saves ~0.45 s on a 65 MB export's kernel and runtime queries (measured),
#: so below about 25 MB the import would cost more than it saves.
MIN_FILE_BYTES = 32 << 20

_MODULES: tuple[Any, Any, Any] | bool | None = False  # False: not tried yet; None: not installed


def _modules() -> tuple[Any, Any, Any] | None:
    """(adbc_driver_manager, adbc_driver_sqlite, pyarrow), or None when one is missing or the
    reader is turned off."""
    global _MODULES
    if os.environ.get(ARROW_ENV, "") == "1":
        return None
    if _MODULES is False:
        try:
            # the driver manager's low-level API, not its DB-API module: that one imports pandas
            # and pyarrow.dataset (~0.4 s CPU per parse process); pyarrow alone is ~0.1 s
            mods = [
                importlib.import_module(m) for m in ("adbc_driver_manager", "adbc_driver_sqlite", "pyarrow")
            ]
            _MODULES = (mods[0], mods[1], mods[2])
        except Exception:  # not installed, or a broken install: the sqlite3 path is always there
            _MODULES = None
    return _MODULES if isinstance(_MODULES, tuple) else None


def wanted(size: int) -> bool:
    """Whether an export of ``size`` bytes is worth reading through ADBC in this process."""
    return size >= MIN_FILE_BYTES and _modules() is not None


def _int64_values(chunks: list[Any]) -> npt.NDArray[np.int64]:
    """The values of int64 Arrow chunks without NULLs, from their data buffers (pyarrow's own
    ``to_numpy`` imports pandas, ~0.3 s per parse process)."""
    parts = [
        np.frombuffer(c.buffers()[1], dtype=np.int64, count=len(c), offset=c.offset * 8)
        for c in chunks
        if len(c)
    ]
    if not parts:
        return np.empty(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


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

    def fetch(self, sql: str, dtype: np.dtype[Any]) -> npt.NDArray[Any] | None:
        """Rows of ``sql`` as a structured array of int64 fields, or None where ADBC cannot give
        exactly what :mod:`sqlite3` would (the caller then reads the query with sqlite3)."""
        names = dtype.names
        mods = _modules()
        if self._broken or mods is None or not names or any(dtype[n] != np.int64 for n in names):
            return None
        manager, driver, pa = mods
        try:
            if self._conn is None:
                self._db = driver.connect(self.uri)
                self._conn = manager.AdbcConnection(self._db)
            stmt = manager.AdbcStatement(self._conn)
            try:
                stmt.set_sql_query(sql)
                stream, _ = stmt.execute_query()
                table = pa.RecordBatchReader.from_stream(stream).read_all()
            finally:
                stmt.close()
        except Exception:  # type inference across batches, a driver error: sqlite3 reads it instead
            if self._conn is None:
                self._broken = True
            return None
        if table.num_columns != len(names):
            return None
        out = np.empty(table.num_rows, dtype=dtype)
        for name, col in zip(names, table.columns, strict=True):
            # int64 without NULLs is exactly what sqlite3 gives for INTEGER values; a column the
            # driver typed otherwise (its first rows NULL or REAL) is not taken
            if col.type != pa.int64() or col.null_count:
                return None
            out[name] = _int64_values(col.chunks)
        return out

    def close(self) -> None:
        for handle in (self._conn, self._db):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        self._conn = self._db = None
