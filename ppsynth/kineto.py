"""Write a :class:`~ppsynth.run.SynthRun` as PyTorch Profiler (Kineto) JSON, one file per rank.

The layout is the current (2024+) libkineto one (``/work/shared/formats/KINETO.md``):
``schemaVersion``, ``deviceProperties``, ``distributedInfo`` with ``pg_config``, ``baseTimeNanoseconds``
and ``ts``/``dur`` in µs relative to it (``"{us}.{ns:03}"``), CPU events on ``pid = OS pid`` /
``tid = thread``, GPU events on ``pid = device`` / ``tid = stream``, kernels linked to their
``cuda_runtime`` / ``cuda_driver`` launch by ``args.correlation`` and ``ac2g`` flows, NCCL kernels
carrying the collective args of their ``record_param_comms`` op, ``ProfilerStep#N`` annotations,
the ``Trace`` span and the final ``Record Window End`` instant. Each rank's times are written on
its own (skewed) clock.
"""

from __future__ import annotations

import gzip as _gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from ppdiag.model.timeline import Direction, Kind, ProcessGroup
from ppsynth.memory import memory_events
from ppsynth.run import ApiKind, HostCat, SynthRank, SynthRun

_BUCKET_NS = 7_889_238 * 1_000_000_000  # libkineto floors its base time to ~3 months
_CBID = {
    "cudaLaunchKernel": 211,
    "cuLaunchKernelEx": 652,
    "cudaStreamWaitEvent": 147,
    "cudaStreamSynchronize": 131,
    "cudaEventRecord": 135,
}
_HOST_CAT = {
    int(HostCat.CPU_OP): "cpu_op",
    int(HostCat.ANNOTATION): "user_annotation",
    int(HostCat.PYTHON): "python_function",
}


def _fmt(ns: int) -> str:
    """libkineto's ``fmtTs``: µs with three decimals of ns, never negative."""
    ns = max(int(ns), 0)
    return f"{ns // 1000}.{ns % 1000:03d}"


def _device_props(index: int, name: str) -> dict[str, Any]:
    return {
        "id": index,
        "name": name,
        "totalGlobalMem": 85045395456,
        "computeMajor": 9,
        "computeMinor": 0,
        "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536,
        "regsPerMultiprocessor": 65536,
        "warpSize": 32,
        "sharedMemPerBlock": 49152,
        "sharedMemPerMultiprocessor": 233472,
        "numSms": 132,
        "sharedMemPerBlockOptin": 232448,
    }


def _pg_rank_list(pg: ProcessGroup) -> str:
    return "[" + ", ".join(str(r) for r in pg.ranks) + "]"


def _stride(ranks: list[int]) -> int:
    return ranks[1] - ranks[0] if len(ranks) > 1 else 1


def _comm_args(run: SynthRun, rk: SynthRank, cols: Any, i: int, on_kernel: bool) -> dict[str, Any]:
    """The collective args of a ``record_param_comms`` op (``on_kernel``: the subset kineto copies)."""
    gi = int(cols.group[i])
    pg = rk.process_groups[gi] if 0 <= gi < len(rk.process_groups) else None
    coll = run.name(int(cols.coll[i]))
    nel = int(cols.nelems[i])
    out: dict[str, Any] = {
        "Collective name": coll,
        "dtype": run.name(int(cols.dtype[i])),
        "In msg nelems": nel,
        "Out msg nelems": nel,
        "Group size": len(pg.ranks) if pg else 1,
        "In split size": "[]",
        "Out split size": "[]",
    }
    if pg is not None:
        if not on_kernel:
            out["Global rank start"] = pg.ranks[0]
            out["Global rank stride"] = _stride(pg.ranks)
        out["Process Group Name"] = pg.name
        out["Process Group Description"] = pg.desc
        out["Process Group Ranks"] = _pg_rank_list(pg)
    peer = int(cols.peer[i])
    direction = int(cols.direction[i])
    if not on_kernel:
        if pg is not None and peer >= 0 and peer in pg.ranks:
            out["Rank"] = pg.ranks.index(peer)  # for send/recv PyTorch records the peer's group rank
        elif pg is not None and rk.rank in pg.ranks:
            out["Rank"] = pg.ranks.index(rk.rank)
    if direction == Direction.SEND:
        out["Dst Rank"] = peer
    elif direction == Direction.RECV:
        out["Src Rank"] = peer
    if int(cols.seq[i]) >= 0:
        out["Seq"] = int(cols.seq[i])
    if not on_kernel:
        out["Is asynchronized op"] = 0
    return out


class _Names:
    """Run name ids as JSON string literals, escaped once each."""

    def __init__(self, run: SynthRun) -> None:
        self.run = run
        self.esc: dict[int, str] = {}

    def __call__(self, idx: int) -> str:
        s = self.esc.get(idx)
        if s is None:
            s = json.dumps(self.run.name(idx))
            self.esc[idx] = s
        return s


def rank_trace(run: SynthRun, rk: SynthRank) -> dict[str, Any]:
    """The Kineto JSON object of one rank (times on the rank's own clock)."""
    shift = run.epoch_ns + rk.clock_skew_ns
    first = (int(rk.host.start.min()) if len(rk.host) else 0) + shift
    base = (first // _BUCKET_NS) * _BUCKET_NS
    off = shift - base  # add to a true-clock time to get the relative ns written as ts
    name = _Names(run)
    t0 = int(rk.step_windows[0, 0]) + off - 1_000_000 if len(rk.step_windows) else off
    t_end_true = max(
        int(rk.host.end.max()) if len(rk.host) else 0,
        int(rk.gpu.end.max()) if len(rk.gpu) else 0,
    )
    t1 = t_end_true + off + 1_000_000
    ev: list[tuple[int, int, str]] = []  # (ts, order, json text)
    ev.extend(_host_events(run, rk, off, name))
    ev.extend(_runtime_events(rk, off, name))
    ev.extend(_gpu_events(run, rk, off, name))
    ev.extend(memory_events(run, rk, off, _fmt))  # allocator events when asked (synth/memory.py)
    ev.sort(key=lambda e: (e[0], e[1]))
    tail = [
        f'{{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", '
        f'"tid": "PyTorch Profiler", "ts": {_fmt(t0)}, "dur": {_fmt(t1 - t0)}, "args": {{"Op count": 0}}}}',
        f'{{"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": {_fmt(t1)}}}',
    ]
    return {**_header(run, rk, base), "_events": _meta_events(rk, t0) + [e[2] for e in ev] + tail}


def _meta_events(rk: SynthRank, t0: int) -> list[str]:
    """Process and thread names of the CPU and GPU rows."""
    pid, dev = rk.pid, rk.device_index
    meta = [
        ("process_name", pid, 0, {"name": "python"}),
        ("process_labels", pid, 0, {"labels": "CPU"}),
        ("process_name", dev, 0, {"name": "python"}),
        ("process_labels", dev, 0, {"labels": f"GPU {dev}"}),
        ("process_sort_index", dev, 0, {"sort_index": 0x1000000 + dev}),
    ]
    tids = sorted({int(x) for x in np.concatenate([rk.host.tid, rk.runtime.tid])})
    for tid in tids:
        label = "python" if tid == rk.tid else "pt_autograd_0"
        meta.append(("thread_name", pid, tid, {"name": f"thread {tid} ({label})"}))
    for s in rk.streams:
        meta.append(("thread_name", dev, s.id, {"name": f"stream {s.id} "}))
    return [
        f'{{"ph": "M", "name": "{n}", "ts": {_fmt(t0)}, "pid": {p}, "tid": {t}, "args": {json.dumps(a)}}}'
        for n, p, t, a in meta
    ]


def _host_events(run: SynthRun, rk: SynthRank, off: int, name: _Names) -> list[tuple[int, int, str]]:
    """CPU ops and annotations (order 0 at equal times)."""
    pid = rk.pid
    ev: list[tuple[int, int, str]] = []
    h = rk.host
    for i in range(len(h)):
        nm = run.name(int(h.name[i]))
        args: dict[str, Any] = {"External id": int(h.ext_id[i]), "Record function id": 0, "Ev Idx": i}
        if nm == "record_param_comms" and int(h.coll[i]) > 0:
            args.update(_comm_args(run, rk, h, i, on_kernel=False))
        ts = int(h.start[i]) + off
        cat = _HOST_CAT.get(int(h.cat[i]), "cpu_op")
        ev.append(
            (
                ts,
                0,
                (
                    f'{{"ph": "X", "cat": "{cat}", "name": {name(int(h.name[i]))}, "pid": {pid}, '
                    f'"tid": {int(h.tid[i])}, "ts": {_fmt(ts)}, "dur": {_fmt(int(h.end[i]) - int(h.start[i]))}, '
                    f'"args": {json.dumps(args)}}}'
                ),
            )
        )

    return ev


def _runtime_events(rk: SynthRank, off: int, name: _Names) -> list[tuple[int, int, str]]:
    """CUDA runtime and driver calls (order 1) and the flow starts of their launches (order 2)."""
    pid = rk.pid
    g = rk.gpu
    launched = {int(c) for c in g.correlation if c >= 0}
    ev: list[tuple[int, int, str]] = []
    r = rk.runtime
    for i in range(len(r)):
        nm = name.run.name(int(r.name[i]))
        corr = int(r.correlation[i])
        ts = int(r.start[i]) + off
        cat = "cuda_driver" if int(r.api[i]) == ApiKind.DRIVER else "cuda_runtime"
        args = {"cbid": _CBID.get(nm, 0), "correlation": corr}
        if int(r.ext_id[i]) >= 0:
            args = {"External id": int(r.ext_id[i]), **args}
        ev.append(
            (
                ts,
                1,
                (
                    f'{{"ph": "X", "cat": "{cat}", "name": {name(int(r.name[i]))}, "pid": {pid}, '
                    f'"tid": {int(r.tid[i])}, "ts": {_fmt(ts)}, "dur": {_fmt(int(r.end[i]) - int(r.start[i]))}, '
                    f'"args": {json.dumps(args)}}}'
                ),
            )
        )
        if corr in launched:
            ev.append(
                (
                    ts,
                    2,
                    (
                        f'{{"ph": "s", "id": {corr}, "pid": {pid}, "tid": {int(r.tid[i])}, "ts": {_fmt(ts)}, '
                        f'"cat": "ac2g", "name": "ac2g"}}'
                    ),
                )
            )

    return ev


def _gpu_events(run: SynthRun, rk: SynthRank, off: int, name: _Names) -> list[tuple[int, int, str]]:
    """Kernels, copies and memsets (order 3) and the flow ends of their launches (order 4)."""
    dev = rk.device_index
    g = rk.gpu
    ev: list[tuple[int, int, str]] = []
    for i in range(len(g)):
        ts = int(g.start[i]) + off
        stream = int(g.stream[i])
        kind = int(g.kind[i])
        comm = kind in (Kind.P2P, Kind.COLLECTIVE)
        args = {
            "queued": 0,
            "device": dev,
            "context": 1,
            "stream": stream,
            "correlation": int(g.correlation[i]),
            "registers per thread": 96 if comm else 168,
            "shared memory": 9280 if comm else 213504,
            "blocks per SM": 0.007576 if comm else 1.0,
            "warps per SM": 0.121212 if comm else 12.0,
            "grid": [1, 1, 1] if comm else [132, 1, 1],
            "block": [512, 1, 1] if comm else [384, 1, 1],
            "est. achieved occupancy %": 0 if comm else 19,
        }
        if int(g.ext_id[i]) >= 0:
            args = {"External id": int(g.ext_id[i]), **args}
        if comm and int(g.coll[i]) > 0:
            args.update(_comm_args(run, rk, g, i, on_kernel=True))
        cat = "gpu_memcpy" if kind == Kind.MEMCPY else ("gpu_memset" if kind == Kind.MEMSET else "kernel")
        ev.append(
            (
                ts,
                3,
                (
                    f'{{"ph": "X", "cat": "{cat}", "name": {name(int(g.name[i]))}, "pid": {dev}, "tid": {stream}, '
                    f'"ts": {_fmt(ts)}, "dur": {_fmt(int(g.end[i]) - int(g.start[i]))}, "args": {json.dumps(args)}}}'
                ),
            )
        )
        if int(g.correlation[i]) >= 0:
            ev.append(
                (
                    ts,
                    4,
                    (
                        f'{{"ph": "f", "id": {int(g.correlation[i])}, "pid": {dev}, "tid": {stream}, '
                        f'"ts": {_fmt(ts)}, "cat": "ac2g", "name": "ac2g", "bp": "e"}}'
                    ),
                )
            )
    return ev


def _header(run: SynthRun, rk: SynthRank, base: int) -> dict[str, Any]:
    """The trace's top-level keys before ``traceEvents``."""
    pg_config = [
        {
            "pg_name": pg.name,
            "pg_desc": pg.desc,
            "backend_config": pg.backend or "cuda:nccl",
            "pg_size": len(pg.ranks),
            "ranks": list(pg.ranks),
        }
        for pg in rk.process_groups
    ]
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            # one entry per visible device, as kineto writes them
            _device_props(i, rk.device_name)
            for i in range(max(int(run.config.get("gpus_per_node", 1)), rk.device_index + 1))
        ],
        "trace_id": f"{(run.epoch_ns ^ (rk.rank * 0x9E3779B97F4A7C15)) & ((1 << 128) - 1):032X}",
        "distributedInfo": {
            "backend": rk.backend,
            "rank": rk.rank,
            "world_size": rk.world_size,
            "pg_count": len(pg_config),
            "pg_config": pg_config,
            "nccl_version": rk.nccl_version,
        },
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base,
    }


def _dump(obj: dict[str, Any], trace_name: str) -> str:
    """Serialise like libkineto: header keys, then one event per line, then ``traceName``."""
    events = obj.pop("_events")
    head = ",\n  ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items())
    body = ",\n  ".join(events)
    return f'{{\n  {head},\n  "traceEvents": [\n  {body}\n  ],\n  "traceName": {json.dumps(trace_name)}\n}}\n'


def trace_file_name(run: SynthRun, rk: SynthRank, gzip: bool = True) -> str:
    """``rank<r>.<pid>.<ns>.pt.trace.json[.gz]``, the ``tensorboard_trace_handler`` pattern."""
    stamp = run.epoch_ns + rk.clock_skew_ns + int(rk.step_windows[-1, 1]) + 50_000_000
    return f"rank{rk.rank}.{rk.pid}.{stamp}.pt.trace.json" + (".gz" if gzip else "")


def write_kineto(
    run: SynthRun, out_dir: str | Path, gzip: bool = True, groundtruth: bool = True
) -> list[Path]:
    """Write one Kineto trace per rank into ``out_dir`` (plus ``groundtruth.json``); return the traces."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for rk in run.ranks:
        fname = trace_file_name(run, rk, gzip)
        path = out / fname
        text = _dump(rank_trace(run, rk), str(path.with_suffix("") if gzip else path))
        if gzip:
            # no name and no time in the gzip header: the same run gives the same bytes
            with (
                open(path, "wb") as raw,
                _gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=raw, mtime=0) as fh,
            ):
                fh.write(text.encode())
        else:
            path.write_text(text)
        paths.append(path)
    if groundtruth and run.truth:
        from ppsynth.scenario import write_groundtruth

        write_groundtruth(run, out)
    return paths
