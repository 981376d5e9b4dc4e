"""Device memory over time from the allocator's events, per rank (``memory[]`` of the report).

The events come from :mod:`ppdiag.parsers.kineto_memory` and :mod:`ppdiag.parsers.nsys_memory`
(``RankTimeline.meta["memory"]``): with the allocator's totals the level is ``Total Allocated``
after each event; without them (older Kineto traces, and nsys, whose CUDA-level allocations are
what a caching allocator reserves) it is the running sum of the signed ``Bytes``, i.e. relative to
what the device held when the profiler started (the report says so). The peak is the highest
level and its time; the micro-batches in flight at the peak are the forwards done whose backward
has not ended (from the block labels); the activation memory one micro-batch holds is the median
rise of the level across a forward.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.model.memory_row import MemoryRow as MemoryRow
from ppdiag.model.timeline import Phase, RankTimeline

MB = 1024.0 * 1024.0
NS_PER_MS = 1e6


_Blocks = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int8],
    npt.NDArray[np.int32],
    npt.NDArray[np.int32],
]


_NOTES = {
    "totals": "measured (allocator totals)",
    "bytes": "peak relative to the window's start (no allocator totals: running sum of the allocations)",
    # nsys --cuda-memory-usage: cudaMalloc / cudaFree, i.e. what a caching allocator reserves
    "cuda": (
        "CUDA device allocations (nsys --cuda-memory-usage): what the caching allocator reserved, "
        "relative to the capture's start"
    ),
}


def _level(
    mem: dict[str, object], device: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    t = np.asarray(mem["t_ns"], np.int64)
    dev = np.asarray(mem["device"], np.int64)
    m = dev == device
    if mem.get("source") == "totals":
        alloc = np.asarray(mem["allocated"], np.int64)[m]
        res = np.asarray(mem["reserved"], np.int64)[m]
    else:
        alloc = np.cumsum(np.asarray(mem["bytes"], np.int64)[m])
        res = np.full(alloc.shape, -1, np.int64)
    return t[m], alloc, res


def memory_row(
    tl: RankTimeline,
    origin_ns: int,
    blocks: _Blocks | None = None,
    stage: int | None = None,
    pp: int = 1,
    microbatches: int | None = None,
) -> MemoryRow | None:
    """The rank's memory row, or None without allocator events. ``blocks`` are its labelled blocks
    on the aligned clock: (start, end, phase, micro-batch, stage); ``stage`` its pipeline stage of
    ``pp`` and ``microbatches`` the run's M (for the other schedules' predicted peaks)."""
    mem = tl.meta.get("memory")
    if not isinstance(mem, dict) or not mem.get("events"):
        return None
    devs = np.asarray(mem["device"], np.int64)
    uniq, counts = np.unique(devs, return_counts=True)
    device = int(uniq[np.argmax(counts)])  # the rank's own GPU has most of the events
    t, alloc, res = _level(mem, device)
    i = int(np.argmax(alloc))
    off = tl.clock_offset_ns
    t_peak = int(t[i]) + off
    base = int(tl.meta.get("time_base_ns") or 0)
    cap = (mem.get("capacity") or {}).get(str(device))
    cap_mb = round(cap / MB, 1) if isinstance(cap, int) and cap > 0 else None
    peak = float(alloc[i])
    inflight: list[int] = []
    act: float | None = None
    if blocks is not None and len(blocks[0]):
        inflight = _inflight_at(blocks, t_peak)
        act = _activation_per_mb(blocks, t + off, alloc)
    predicted: dict[str, float] = {}
    if act is not None and inflight and microbatches and stage is not None and pp > 1:
        rest = peak / MB - len(inflight) * act
        predicted = {
            "gpipe": round(rest + microbatches * act, 3),
            "1f1b": round(rest + min(pp - stage, microbatches) * act, 3),
        }
    note = _NOTES.get(str(mem.get("source")), _NOTES["bytes"])
    return MemoryRow(
        rank=tl.rank,
        device=device,
        source=str(mem.get("source")),
        events=int(mem["events"]),
        peak_allocated_mb=round(peak / MB, 3),
        peak_reserved_mb=round(float(res.max()) / MB, 3) if (res >= 0).any() else None,
        peak_ts_us=round((int(t[i]) - base) / 1000.0, 3),
        peak_t_ms=round((t_peak - origin_ns) / NS_PER_MS, 4),
        capacity_mb=cap_mb,
        peak_of_capacity=round(peak / cap, 4) if cap_mb is not None and isinstance(cap, int) else None,
        steady_allocated_mb=round(float(np.median(alloc)) / MB, 3),
        inflight_at_peak=len(inflight) if blocks is not None and len(blocks[0]) else None,
        inflight_microbatches=inflight,
        activation_per_mb_mb=act,
        predicted_peak_mb=predicted,
        note=note,
    )


def _inflight_at(blocks: _Blocks, t_peak: int) -> list[int]:
    """The micro-batches whose forward is done and whose backward has not ended at ``t_peak``."""
    bs, be, ph, mb, st = blocks
    fwd = ph == int(Phase.FWD)
    bwd = ph == int(Phase.BWD)
    # a step's forwards restart the micro-batch numbers: look only at the blocks since the
    # last first-micro-batch forward that started before the peak
    first = fwd & (bs <= t_peak) & (mb == (mb[fwd].min() if fwd.any() else -1))
    since = bs >= (bs[first].max() if first.any() else np.iinfo(np.int64).min)
    f = fwd & since & (be <= t_peak)
    b = bwd & since & (be <= t_peak)  # a running backward still holds its activations
    done = set(zip(st[f].tolist(), mb[f].tolist(), strict=True))
    back = set(zip(st[b].tolist(), mb[b].tolist(), strict=True))
    return sorted(m for _, m in done - back)


def _activation_per_mb(
    blocks: _Blocks, ta: npt.NDArray[np.int64], alloc: npt.NDArray[np.int64]
) -> float | None:
    """MiB one micro-batch's forward leaves allocated: the median rise of the level across a
    forward (the level just before it starts and just after it ends; ``ta`` on the aligned clock)."""
    bs, be, ph, _, _ = blocks
    fwd = ph == int(Phase.FWD)
    if not fwd.any() or len(ta) <= 1:
        return None
    k0 = np.searchsorted(ta, bs[fwd], side="right") - 1
    k1 = np.searchsorted(ta, be[fwd], side="right") - 1
    ok = (k0 >= 0) & (k1 >= 0)
    if not ok.any():
        return None
    rise = alloc[k1[ok]] - alloc[k0[ok]]
    return round(float(np.median(rise)) / MB, 3)
