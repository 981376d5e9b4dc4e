"""GPU memory events of an nsys export (``nsys profile --cuda-memory-usage=true``).

nsys writes one ``CUDA_GPU_MEMORY_USAGE_EVENTS`` row per CUDA allocation and free
(docs/formats/nsys-memory.md): ``start`` (ns), ``globalPid``, ``deviceId``, ``bytes``,
``memKind`` (``ENUM_CUDA_MEM_KIND``: 2 device, 3 array, 5 device static live on the GPU; 0
pageable, 1 pinned, 4 / 6 managed, 7 unknown do not) and ``memoryOperationType`` (0 allocation,
1 deallocation). There is no running total: the level on a device is the running sum of the
signed sizes since the capture began (what was allocated before is not seen), and these are
CUDA-level allocations, so with PyTorch's caching allocator they are the segments it reserves,
not the tensors it hands out. The device's capacity is ``TARGET_INFO_GPU.totalMemory``.

:func:`read_memory` reads the rows of every process of the file in one query;
:func:`rank_memory` cuts one process's rows into the ``RankTimeline.meta["memory"]`` form the
Kineto allocator events use (:mod:`ppdiag.parsers.kineto_memory`), with ``source = "cuda"``, so
:mod:`ppdiag.model.memory` reads both alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.parsers.nsys_db import NsysDb, int_expr

I64 = npt.NDArray[np.int64]

TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
#: ``ENUM_CUDA_MEM_KIND`` values whose memory lives on the GPU: device, array, device static.
DEVICE_KINDS = (2, 3, 5)
ALLOCATION, DEALLOCATION = 0, 1  # ``ENUM_CUDA_DEV_MEM_EVENT_OPER``

_ROW = np.dtype(
    [("start", np.int64), ("pid", np.int64), ("device", np.int64), ("bytes", np.int64), ("code", np.int64)]
)
# what each row is (the ``code`` column of the query): usable device event, other memory, unusable
_OK, _HOST, _BAD = 0, 1, 2


@dataclass
class MemoryEvents:
    """Device allocations and frees of every process of one export, in time order per process."""

    start: I64
    pid: I64
    device: I64
    signed: I64  # + bytes allocated, - bytes freed
    capacity: dict[int, int] = field(default_factory=dict)  # device id → bytes
    host: int = 0  # pageable, pinned, managed and unknown-kind rows: not device memory
    dropped: int = 0  # rows with a NULL / non-integer field, negative bytes or an unknown operation


def read_memory(db: NsysDb) -> MemoryEvents | None:
    """The export's GPU memory events, or None when it has no (non-empty) memory table."""
    cols = set(db.columns(TABLE))
    if not {"start", "globalPid", "bytes", "memoryOperationType"} <= cols:
        return None
    kinds = ", ".join(map(str, DEVICE_KINDS))
    # exports older than the ENUM tables may lack memKind: every row is then taken as device memory
    kind = f"{int_expr('memKind')} IN ({kinds})" if "memKind" in cols else "1"
    usable = (
        "typeof(start) = 'integer' AND typeof(globalPid) = 'integer' AND typeof(bytes) = 'integer' "
        f"AND bytes >= 0 AND {int_expr('memoryOperationType')} IN ({ALLOCATION}, {DEALLOCATION})"
    )
    sign = f"CASE WHEN memoryOperationType = {DEALLOCATION} THEN -bytes ELSE bytes END"
    dev = int_expr(db.col(TABLE, "deviceId", "0"), "0")
    sql = (
        f"SELECT {int_expr('start', '0')}, {int_expr('(globalPid >> 24) & 16777215', '0')}, {dev}, "
        f"CASE WHEN {usable} THEN {sign} ELSE 0 END, "
        f"CASE WHEN NOT ({usable}) THEN {_BAD} WHEN {kind} THEN {_OK} ELSE {_HOST} END FROM {TABLE}"
    )
    rows = db.fetch(sql, _ROW)
    if not len(rows):
        return None
    code = rows["code"]
    ok = rows[code == _OK]
    # one process's rows in time order (exports since nsys 2025.6 promise no order); stable, so
    # an allocation and a free at the same ns keep the order nsys wrote them in
    ok = ok[np.lexsort((ok["start"], ok["pid"]))]
    return MemoryEvents(
        start=ok["start"],
        pid=ok["pid"],
        device=ok["device"],
        signed=ok["bytes"],
        capacity=_capacity(db),
        host=int((code == _HOST).sum()),
        dropped=int((code == _BAD).sum()),
    )


def _capacity(db: NsysDb) -> dict[int, int]:
    """Device id → total memory (B) from ``TARGET_INFO_GPU``. Whether the events' ``deviceId`` is
    that table's ``id`` is not documented (NSYS.md §2): when every GPU of the file has the same
    size, which is the usual case, the id does not matter and ``-1`` holds that size."""
    if not {"id", "totalMemory"} <= set(db.columns("TARGET_INFO_GPU")):
        return {}
    rows = db.execute(
        "SELECT id, totalMemory FROM TARGET_INFO_GPU WHERE typeof(id) = 'integer' "
        "AND typeof(totalMemory) = 'integer' AND totalMemory > 0"
    ).fetchall()
    out = {int(i): int(t) for i, t in rows}
    if len(set(out.values())) == 1:
        out[-1] = next(iter(out.values()))
    return out


def rank_memory(mem: MemoryEvents | None, pid: int, offset: int) -> dict[str, Any]:
    """``{"memory": {...}, "time_base_ns": offset}`` for process ``pid`` (times put on the epoch
    clock with ``offset``), or ``{}`` when it has no device memory events."""
    if mem is None:
        return {}
    lo, hi = np.searchsorted(mem.pid, [pid, pid + 1])
    if hi <= lo:
        return {}
    dev = mem.device[lo:hi]
    same = mem.capacity.get(-1)
    capacity = {
        str(d): c for d in np.unique(dev).tolist() if (c := mem.capacity.get(int(d), same)) is not None
    }
    return {
        "memory": {
            "source": "cuda",
            "events": int(hi - lo),
            "dropped": 0,
            "capacity": capacity,
            "t_ns": (mem.start[lo:hi] + offset).tolist(),
            "device": dev.tolist(),
            "bytes": mem.signed[lo:hi].tolist(),
        },
        # the trace's own time base, so that the report's peak_ts_us reads as nsys shows it
        "time_base_ns": offset,
    }


def memory_warning(mem: MemoryEvents | None) -> str | None:
    """One line for the file's memory rows not counted as device memory, or None when all are."""
    if mem is None or not (mem.host or mem.dropped):
        return None
    parts = []
    if mem.host:
        parts.append(f"{mem.host} host, managed or unknown-kind row(s) are not device memory")
    if mem.dropped:
        parts.append(
            f"{mem.dropped} row(s) dropped (NULL or non-integer start, process or bytes, negative "
            "bytes, or an operation neither allocation nor deallocation)"
        )
    return f"{TABLE}: " + "; ".join(parts)
