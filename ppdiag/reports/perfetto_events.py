"""The event writer of the Perfetto overlay: the synthetic track ids, metadata events, complete
slices written in chunks from column lists, flow arrows, and the overlap lanes that keep the
slices of one track from partially overlapping (Perfetto would mis-nest them).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import KIND_NAMES, PHASE_NAMES, Direction

#: Writes one pre-rendered metadata event (and counts it).
Meta = Callable[[str], None]

CHUNK = 20_000
# Synthetic thread ids for the overlay tracks: far above real stream / thread ids, below 2**31.
TID_LOST = 2_000_000_000
TID_STEPS = 2_000_000_001
TID_LABELS = 2_000_000_002
TID_COMM_OPS = 2_000_000_003
TID_SENDS = 2_000_000_004
TID_RECVS = 2_000_000_005
TID_COLL = 2_000_000_006
TID_PATH = 2_000_000_007
# extra lanes: of device streams (below TID_LOST, so device tracks stay below it) and of the
# synthetic tracks
TID_DEVICE_LANES = 1_900_000_000
TID_COMM_KINDS = 2_000_000_100  # comm ops (host) of the second, third... op kind
TID_TRACK_LANES = 2_000_010_000

DIRECTIONS = {int(Direction.SEND): "send", int(Direction.RECV): "recv", int(Direction.BOTH): "sendrecv"}
KINDS = {int(k): v for k, v in KIND_NAMES.items()}
PHASES = {int(k): v for k, v in PHASE_NAMES.items()}


def meta_event(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> str:
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return json.dumps(ev)


def lanes(start: npt.ArrayLike, end: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """A lane per slice such that the slices of one lane never overlap, in as few lanes as the
    deepest overlap needs. Slices that overlap nothing (found vectorized: a new cluster begins
    where a start is at or after every earlier end) stay in lane 0; only the few clusters of
    overlapping slices are laid out one by one (first free lane, in start order)."""
    import heapq

    st = np.asarray(start, dtype=np.int64)
    en = np.maximum(np.asarray(end, dtype=np.int64), st)
    lane = np.zeros(st.shape[0], np.int64)
    if st.shape[0] < 2:
        return lane
    order = np.argsort(st, kind="stable")
    s_, e_ = st[order], en[order]
    prev_max = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, e_[:-1]])
    new_cluster = s_ >= prev_max
    cid = np.cumsum(new_cluster) - 1
    size = np.bincount(cid)
    for c in np.flatnonzero(size > 1).tolist():
        rows = np.flatnonzero(cid == c)
        free: list[tuple[int, int]] = []  # (end, lane) of the lanes in use
        spare: list[int] = []
        n_lanes = 0
        for i in rows.tolist():
            while free and free[0][0] <= s_[i]:
                heapq.heappush(spare, heapq.heappop(free)[1])
            if spare:
                k = heapq.heappop(spare)
            else:
                k, n_lanes = n_lanes, n_lanes + 1
            lane[order[i]] = k
            heapq.heappush(free, (int(e_[i]), k))
    return lane


class Tids:
    """Thread ids of a rank's tracks and their overlap lanes, named as they are first used."""

    def __init__(self, meta: Meta, pid: int) -> None:
        self.meta = meta
        self.pid = pid
        self.next_device = TID_DEVICE_LANES
        self.next_track = TID_TRACK_LANES
        self.named: dict[tuple[int, int], int] = {}

    def of(self, base: int, lane_ids: npt.NDArray[np.int64], name: str, sort: int, device: bool) -> list[int]:
        """The tid of every slice: ``base`` for lane 0, an extra track per further lane."""
        out = np.full(lane_ids.shape[0], base, np.int64)
        for k in np.unique(lane_ids).tolist():
            if k == 0:
                continue
            key = (base, k)
            if key not in self.named:
                if device:
                    tid, self.next_device = self.next_device, self.next_device + 1
                else:
                    tid, self.next_track = self.next_track, self.next_track + 1
                self.named[key] = tid
                self.meta(meta_event("thread_name", self.pid, tid, {"name": f"{name} · overlap {k}"}))
                self.meta(meta_event("thread_sort_index", self.pid, tid, {"sort_index": sort}))
            out[lane_ids == k] = self.named[key]
        return out.tolist()


def emit_slices(
    out: IO[str],
    first: list[bool],
    pid: int,
    tid: int | Sequence[int],
    ts: Sequence[float],
    dur: Sequence[float],
    names: list[str],
    name_idx: Sequence[int],
    cat: str | list[str],
    args: list[str],
    cname: list[str] | None = None,
) -> int:
    """Write complete ('X') events from column lists; ``args`` are pre-rendered JSON objects."""
    n = len(ts)
    buf = io.StringIO()
    for i in range(n):
        c = cat if isinstance(cat, str) else cat[i]
        t = tid if isinstance(tid, int) else tid[i]
        cn = f',"cname":"{cname[i]}"' if cname is not None and cname[i] else ""
        buf.write(
            f'{"" if first[0] else ","}\n{{"ph":"X","pid":{pid},"tid":{t},"ts":{ts[i]:.3f},'
            f'"dur":{dur[i]:.3f},"name":{names[name_idx[i]]},"cat":"{c}"{cn},"args":{args[i]}}}'
        )
        first[0] = False
    out.write(buf.getvalue())
    return n


def flow_pair(
    out: IO[str], first: list[bool], fid: int, a: tuple[int, int, float], b: tuple[int, int, float], name: str
) -> None:
    """One flow arrow (``s`` at ``a``, ``f`` bound to the enclosing slice at ``b``): (pid, tid, ts µs)."""
    out.write(
        f'{"" if first[0] else ","}\n{{"ph":"s","id":{fid},"pid":{a[0]},"tid":{a[1]},"ts":{a[2]:.3f},'
        f'"name":"{name}","cat":"flow"}},\n{{"ph":"f","bp":"e","id":{fid},"pid":{b[0]},"tid":{b[1]},'
        f'"ts":{b[2]:.3f},"name":"{name}","cat":"flow"}}'
    )
    first[0] = False
