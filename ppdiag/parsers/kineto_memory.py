"""The allocator's ``[memory]`` instant events of a Kineto trace (``profile_memory=True``).

PyTorch writes one instant event (``ph: "i"``, name ``[memory]``) per allocation and free, on the
host thread that made it, with ``args``: ``Device Type`` (1 = CUDA, 0 = CPU), ``Device Id``,
``Bytes`` (signed: + allocation, - free), and since PyTorch 1.10 the allocator's running totals
``Total Allocated`` / ``Total Reserved`` of that device after the event (``Addr``, ``Ev Idx``
besides). Older traces carry only ``Bytes``: their level is the running sum of ``Bytes`` since the
profiler started, so it is relative to what was allocated before the window. The device's capacity
is ``totalGlobalMem`` of its ``deviceProperties`` entry.

:func:`memory_meta` returns the CUDA events as plain lists for ``RankTimeline.meta["memory"]``
(JSON-safe, so the parse cache keeps them); :mod:`ppdiag.model.memory` reads them.
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Any

import msgspec
import numpy as np

from ppdiag.parsers.kineto_schema import MEMORY_EVENT, us_to_ns

CUDA = 1  # ``Device Type`` of a CUDA device (c10::DeviceType::CUDA)


class _MemArgs(
    msgspec.Struct,
    gc=False,
    rename={
        "device_type": "Device Type",
        "device_id": "Device Id",
        "nbytes": "Bytes",
        "allocated": "Total Allocated",
        "reserved": "Total Reserved",
    },
):
    device_type: Any = -1
    device_id: Any = -1
    nbytes: Any = 0
    allocated: Any = None
    reserved: Any = None


_DECODER = msgspec.json.Decoder(list[_MemArgs | None])


def _int(v: Any, default: int) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) else default


def memory_meta(evs: list[Any], base_ns: int, devprops: list[Any]) -> dict[str, Any]:
    """``{"memory": {...}}`` with the CUDA ``[memory]`` events of a trace (time order), or ``{}``
    when it has none. Events whose ``ts`` or args are unusable are counted in ``dropped``."""
    n = len(evs)
    if not n:
        return {}
    is_mem = np.fromiter(
        map(operator.eq, map(operator.attrgetter("name"), evs), repeat(MEMORY_EVENT)), bool, n
    )
    idx = np.flatnonzero(is_mem)
    if not len(idx):
        return {}
    raws = [evs[i].args for i in idx]
    blob = b"".join((b"[", b",".join([r if len(r) else b"null" for r in raws]), b"]"))
    try:
        args = _DECODER.decode(blob)
    except msgspec.DecodeError:
        return {"memory": {"dropped": len(idx), "events": 0}}
    ts = np.array([evs[i].ts if isinstance(evs[i].ts, int | float) else np.nan for i in idx], np.float64)
    dev_type = np.array([_int(a.device_type, -1) if a else -1 for a in args], np.int64)
    ok = np.isfinite(ts) & (dev_type == CUDA)
    dropped = int((~np.isfinite(ts)).sum())
    if not ok.any():
        return {"memory": {"dropped": dropped, "events": 0}} if dropped else {}
    sel = np.flatnonzero(ok)
    a = [x for x in (args[i] for i in sel) if x is not None]  # Device Type CUDA: args present
    t = us_to_ns(ts[sel], base_ns)
    order = np.argsort(t, kind="stable")
    has_totals = all(x.allocated is not None for x in a)
    col = {
        "t_ns": t[order].tolist(),
        "device": [_int(a[i].device_id, 0) for i in order],
        "bytes": [_int(a[i].nbytes, 0) for i in order],
    }
    if has_totals:
        col["allocated"] = [_int(a[i].allocated, 0) for i in order]
        col["reserved"] = [_int(a[i].reserved, -1) for i in order]
    capacity = {
        str(_int(p.get("id"), -1)): _int(p.get("totalGlobalMem"), -1)
        for p in devprops
        if isinstance(p, dict) and _int(p.get("totalGlobalMem"), -1) > 0
    }
    return {
        "memory": {
            "source": "totals" if has_totals else "bytes",
            "events": len(sel),
            "dropped": dropped,
            "capacity": capacity,
            **col,
        }
    }
