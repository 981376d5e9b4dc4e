"""The launch join done in numpy (:class:`ppdiag.parsers.nsys_gpu.Launches`) gives exactly what the
SQL join on (process, correlationId) gives, duplicates, backtrace rows and misses included."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.parsers.nsys_db import NsysDb, int_expr, open_export
from ppdiag.parsers.nsys_gpu import KERNEL, SYNC, Launches, _fetch, _sync_part

PIDS = ((1 << 48) | (11 << 24), (1 << 48) | (12 << 24))
_KERNEL_COLS = "start, end, deviceId, streamId, correlationId, globalPid, demangledName"
_RUNTIME_COLS = "start, end, eventClass, globalTid, correlationId, nameId"


def _write(
    path: Path, kernels: Sequence[tuple[object, ...]], runtime: Sequence[tuple[object, ...]]
) -> NsysDb:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    conn.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(1, "k"), (2, "cudaStreamSynchronize"), (3, "cudaDeviceSynchronize"), (4, "cudaEventSynchronize")],
    )
    conn.execute(f"CREATE TABLE {KERNEL} ({_KERNEL_COLS})")
    conn.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME ({_RUNTIME_COLS})")
    conn.execute(f"CREATE TABLE {SYNC} ({_KERNEL_COLS})")
    conn.executemany(f"INSERT INTO {KERNEL} VALUES (?, ?, ?, ?, ?, ?, ?)", kernels)
    conn.executemany(f"INSERT INTO {SYNC} VALUES (?, ?, ?, ?, ?, ?, ?)", kernels)
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?, ?)", runtime)
    conn.commit()
    conn.close()
    return open_export(path)


def _both(db: NsysDb, same: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
    """Kernel rows by the numpy lookup and by the SQL join; the synchronization rows ``same`` of
    both paths must be equal."""
    name = int_expr("g.demangledName")
    launches = Launches.read(db, with_api=True)
    assert launches is not None and launches.usable
    new, old = _fetch(db, KERNEL, name, [], {}, launches), _fetch(db, KERNEL, name, [], {}, None)
    # the same rows as synchronization rows, named by their call (numpy lookup vs SQL join)
    names_new: list[str] = []
    names_old: list[str] = []
    sync_new = _sync_part(db, names_new, {}, launches)
    sync_old = _sync_part(db, names_old, {}, None)
    assert len(sync_new) == len(sync_old)
    for a, b in zip(sync_new, sync_old, strict=True):
        assert a.keys() == b.keys()
        assert all(np.array_equal(a[k][same], b[k][same]) for k in a)
    assert names_new == names_old
    return new, old


def test_runtime_and_driver_call_earliest_start_first_thread(tmp_path: Path) -> None:
    # kernel corr 7 (pid 11): runtime call at 500 (tid 3), driver call at 520 (tid 3), a backtrace
    # copy at 100 (class 67, ignored) and a call of pid 12 at 50 (another process): launch 500.
    # kernel corr 8: only a call with an unknown start (launch -1, its thread 5 kept).
    # kernel corr 10: calls at 900 (tid 6) and 800 (tid 2): launch 800 from thread 2.
    # kernel corr 9: nothing (launch -1, thread 0). Kernel with NULL correlationId: nothing.
    kernels = [
        (1000, 2000, 0, 7, 7, PIDS[0], 1),
        (3000, 4000, 0, 7, 8, PIDS[0], 1),
        (5000, 6000, 0, 7, 9, PIDS[0], 1),
        (7000, 8000, 0, 7, None, PIDS[0], 1),
        (9000, 9500, 0, 7, 10, PIDS[0], 1),
    ]
    runtime = [
        (520, 530, 1, PIDS[0] | 3, 7, 1),
        (500, 600, 0, PIDS[0] | 3, 7, 1),
        (100, 110, 67, PIDS[0] | 4, 7, 1),
        (50, 60, 0, PIDS[1] | 4, 7, 1),
        (None, 70, 0, PIDS[0] | 5, 8, 1),
        (900, 950, 0, PIDS[0] | 6, 10, 1),
        (800, 850, 1, PIDS[0] | 2, 10, 1),
    ]
    new, old = _both(_write(tmp_path / "t.sqlite", kernels, runtime), slice(0, 4))
    assert new["launch"].tolist() == [500, -1, -1, -1, 800]
    assert (new["nametid"] >> 32).tolist() == [3, 5, 0, 0, 2]
    assert np.array_equal(new[:4], old[:4])
    assert old["launch"][4] == 800


_row = st.tuples(
    st.integers(0, 5),  # correlation id: a small range, so that calls share ids
    st.integers(0, 1),  # process
    st.sampled_from([0, 1, 67]),  # eventClass
    st.one_of(st.none(), st.integers(0, 10_000)),  # start
)


@settings(max_examples=60, deadline=None)
@given(
    kcorr=st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 6)), st.integers(0, 1)), max_size=12),
    calls=st.lists(_row, max_size=20),
)
def test_numpy_join_matches_sql_join(
    tmp_path_factory: object,
    kcorr: list[tuple[int | None, int]],
    calls: list[tuple[int, int, int, int | None]],
) -> None:
    path = tmp_path_factory.mktemp("j") / "t.sqlite"  # type: ignore[attr-defined]
    # distinct kernel starts: the SQL path merges consecutive identical rows it duplicated
    kernels = [(10 * i, 10 * i + 5, 0, 7, c, PIDS[p], 1) for i, (c, p) in enumerate(kcorr)]
    # one thread per process: the SQL join does not say which of two calls' threads it keeps
    runtime = [(s, 0, cl, PIDS[p] | (p + 3), c, 2 + (c + p) % 3) for c, p, cl, s in calls]
    new, old = _both(_write(path, kernels, runtime))
    assert np.array_equal(new, old)
