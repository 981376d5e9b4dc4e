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

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.parsers.kineto_schema import _col, _join_raw, us_to_ns

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


def _ints(values: list[Any], default: int) -> list[int]:
    """:func:`_int` of every value; a list of plain ints is returned as it is."""
    if set(map(type, values)) <= {int}:
        return values
    return [_int(v, default) for v in values]


def _floats(values: list[Any]) -> npt.NDArray[np.float64]:
    """Numbers (bools too) as float64, anything else as NaN."""
    if set(map(type, values)) <= {float, int}:
        return np.asarray(values, dtype=np.float64)
    return np.array([v if isinstance(v, int | float) else np.nan for v in values], np.float64)


def memory_meta(
    ts_values: list[Any], raws: list[msgspec.Raw], base_ns: int, devprops: list[Any]
) -> dict[str, Any]:
    """``{"memory": {...}}`` with the CUDA ``[memory]`` events of a trace (time order), or ``{}``
    when it has none; ``ts_values``/``raws``: the ``ts`` and raw args of every ``[memory]`` event
    (see :class:`~ppdiag.parsers.kineto_table.Events`). Events whose ``ts`` or args are unusable
    are counted in ``dropped``."""
    if not raws:
        return {}
    # an event without args reads as one with every field at its default (Device Type -1)
    blob = b"".join((b"[", _join_raw(raws, b"{}"), b"]"))
    try:
        args: list[Any] = _DECODER.decode(blob)
    except msgspec.DecodeError:
        return {"memory": {"dropped": len(raws), "events": 0}}
    if None in args:  # "args": null
        args = [x if x is not None else _MemArgs() for x in args]
    ts = _floats(ts_values)
    dev_type = np.asarray(_ints(_col(args, "device_type"), -1), dtype=np.int64)
    ok = np.isfinite(ts) & (dev_type == CUDA)
    dropped = int((~np.isfinite(ts)).sum())
    if not ok.any():
        return {"memory": {"dropped": dropped, "events": 0}} if dropped else {}
    sel = np.flatnonzero(ok)
    t = us_to_ns(ts[sel], base_ns)
    order = np.argsort(t, kind="stable")
    a = list(map(args.__getitem__, sel[order].tolist()))  # time order
    has_totals = None not in _col(a, "allocated")
    col = {
        "t_ns": t[order].tolist(),
        "device": _ints(_col(a, "device_id"), 0),
        "bytes": _ints(_col(a, "nbytes"), 0),
    }
    if has_totals:
        col["allocated"] = _ints(_col(a, "allocated"), 0)
        col["reserved"] = _ints(_col(a, "reserved"), -1)
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
