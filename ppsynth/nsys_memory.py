"""GPU memory events for synthetic nsys exports (``nsys profile --cuda-memory-usage=true``).

:func:`add_memory_table` adds a ``CUDA_GPU_MEMORY_USAGE_EVENTS`` table
(docs/formats/nsys-memory.md) to the exports :func:`ppsynth.nsys.write_nsys` wrote for a run
that :func:`ppsynth.memory.with_memory` asked memory of: the same allocations as the Kineto
``[memory]`` events (weights from the start, each forward block's activations allocated at its end
and freed at its backward's end), as CUDA device allocations (``memKind`` 2) and frees with one
address per block. Times follow each rank's kernels in the file, whatever clock the export was
written on.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ppdiag.model import Kind
from ppsynth.memory import allocations
from ppsynth.nsys_tables import global_pid
from ppsynth.run import SynthRank, SynthRun

TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
# the columns of nsys 2024.x (docs/formats/nsys-memory.md), without the memory-pool ones
DDL = (
    "start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
    "contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL, "
    "bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, "
    "name TEXT, correlationId INTEGER, streamId INTEGER"
)
DEVICE = 2  # ENUM_CUDA_MEM_KIND: CUDA_MEMOPR_MEMORY_KIND_DEVICE
BASE_ADDRESS = 0x7F00_0000_0000
Row = tuple[int, int, int, int, int, int, int, int, int, str | None, int | None, int | None]


def memory_rows(run: SynthRun, rk: SynthRank, offset: int) -> list[Row]:
    """The rank's rows (``offset``: written time minus true time for this rank)."""
    gpid = global_pid(rk.pid)
    out: list[Row] = []
    for t, signed, block in allocations(run, rk):
        op = 0 if signed > 0 else 1  # ENUM_CUDA_DEV_MEM_EVENT_OPER: allocation, deallocation
        addr = BASE_ADDRESS + block * (1 << 32)
        dev = int(rk.device_index)
        out.append((t + offset, gpid, dev, 1, addr, 0, abs(signed), DEVICE, op, None, None, None))
    return out


def _offset(conn: sqlite3.Connection, rk: SynthRank) -> int | None:
    """Written minus true time of the rank's kernels (the writer shifts a rank's times as a whole)."""
    g = rk.gpu
    kern = np.isin(g.kind, (int(Kind.COMPUTE), int(Kind.P2P), int(Kind.COLLECTIVE)))
    row = conn.execute(
        "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid = ?", (global_pid(rk.pid),)
    ).fetchone()
    if row is None or row[0] is None or not kern.any():
        return None
    return int(row[0]) - int(g.start[kern].min())


def add_memory_table(paths: Sequence[Path], run: SynthRun) -> int:
    """Add the memory table to every export of ``run`` in ``paths``; returns the rows written."""
    n = 0
    for path in paths:
        conn = sqlite3.connect(path)
        try:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} ({DDL})")
            for rk in run.ranks:
                off = _offset(conn, rk)
                if off is None:  # the rank's process is in another file
                    continue
                rows = memory_rows(run, rk, off)
                conn.executemany(f"INSERT INTO {TABLE} VALUES ({', '.join('?' * 12)})", rows)
                n += len(rows)
            conn.commit()
        finally:
            conn.close()
    return n
