"""Column-wise builder of one synthetic rank's tables (GPU ops, runtime calls, host ranges), shared
by the pipeline scenarios and the collective runs."""

from __future__ import annotations

import numpy as np

from ppdiag.model.timeline import Direction, Kind, NameTable
from ppsynth.run import ApiKind, GpuOps, HostCat, HostRanges, RuntimeCalls
from ppsynth.scenario_params import US


class RankBuilder:
    """Accumulates one rank's tables column by column (no per-event objects)."""

    def __init__(self, names: NameTable, pid: int) -> None:
        self.names = names
        self.pid = pid
        self.g: dict[str, list[int]] = {c: [] for c in GpuOps.COLUMNS}
        self.rt: dict[str, list[int]] = {c: [] for c in RuntimeCalls.COLUMNS}
        self.h: dict[str, list[int]] = {c: [] for c in HostRanges.COLUMNS}
        self.corr = 1000 + (pid % 97) * 10
        self.ext = 1
        self.stream_end: dict[int, int] = {}

    def host(self, start: int, end: int, name: str, cat: HostCat, tid: int, **kw: int) -> int:
        """Append a host range; returns its external id."""
        ext = self.ext
        self.ext += 1
        row = dict(HostRanges.DEFAULTS)
        row.update(start=start, end=end, name=self.names.id(name), cat=int(cat), tid=tid, ext_id=ext)
        row.update(kw)
        for c in HostRanges.COLUMNS:
            self.h[c].append(int(row[c]))
        return ext

    def api(self, start: int, end: int, name: str, tid: int, ext: int, driver: bool = False) -> int:
        """Append a CUDA runtime (or driver) call; returns its correlation id."""
        self.corr += 1
        row = {
            "start": start,
            "end": end,
            "name": self.names.id(name),
            "correlation": self.corr,
            "ext_id": ext,
            "tid": tid,
            "api": int(ApiKind.DRIVER if driver else ApiKind.RUNTIME),
        }
        for c in RuntimeCalls.COLUMNS:
            self.rt[c].append(int(row[c]))
        return self.corr

    def kernel(
        self,
        start: int,
        end: int,
        stream: int,
        kind: Kind,
        name: str,
        corr: int,
        launch: int,
        ext: int,
        **kw: int,
    ) -> None:
        """Append a GPU op (its launch must not be after its start, nor its end before it)."""
        if launch > start:
            raise AssertionError(f"kernel {name[:40]} starts at {start} before its launch at {launch}")
        if end < start:
            raise AssertionError(f"kernel {name[:40]} ends before it starts ({start} > {end})")
        row = dict(GpuOps.DEFAULTS)
        row.update(
            start=start,
            end=end,
            stream=stream,
            kind=int(kind),
            name=self.names.id(name),
            correlation=corr,
            launch=launch,
            ext_id=ext,
        )
        row.update(kw)
        for c in GpuOps.COLUMNS:
            self.g[c].append(int(row[c]))
        self.stream_end[stream] = max(self.stream_end.get(stream, 0), end)

    def tables(self) -> tuple[GpuOps, RuntimeCalls, HostRanges]:
        """The three tables, sorted as a parser would deliver them."""
        g = GpuOps.from_columns(len(self.g["start"]), self.g).sorted()
        rt = RuntimeCalls.from_columns(len(self.rt["start"]), self.rt).sorted()
        h = HostRanges.from_columns(len(self.h["start"]), self.h)
        # parents before children at equal starts: sort by start, then longer first
        order = np.lexsort((-(h.end - h.start), h.start))
        return g, rt, h.take(order)


def coll_host(b: RankBuilder, t: int, op: str, title: str, tid: int, k: int, comm: dict[str, int]) -> int:
    """The host ranges of a collective call (op, record_param_comms, NCCL title, stream wait);
    returns the external id its kernel launch links to."""
    b.host(t + 1 * US, t + 13 * US, op, HostCat.CPU_OP, tid, step=k, **comm)
    e2 = b.host(t + 2 * US, t + 12 * US, "record_param_comms", HostCat.CPU_OP, tid, step=k, **comm)
    b.host(t + 3 * US, t + 11 * US, title, HostCat.ANNOTATION, tid, step=k, **comm)
    b.api(t + 4 * US, t + 5 * US, "cudaStreamWaitEvent", tid, e2)
    return e2


def comm_kw(
    b: RankBuilder,
    coll: str,
    peer: int,
    direction: Direction,
    nbytes: int,
    nelems: int,
    dtype: str,
    seq: int,
    group: int,
) -> dict[str, int]:
    """The communication columns of one p2p or collective row."""
    return {
        "coll": b.names.id(coll),
        "peer": peer,
        "direction": int(direction),
        "bytes": nbytes,
        "nelems": nelems,
        "dtype": b.names.id(dtype),
        "seq": seq,
        "group": group,
    }
