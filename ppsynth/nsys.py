"""Write a :class:`~ppsynth.run.SynthRun` as Nsight Systems SQLite exports.

The files have the tables and columns real exports have (the nsys 2024.5 schema, exported
``--lazy``: tables without rows are left out): ``StringIds``, ``CUPTI_ACTIVITY_KIND_KERNEL`` /
``MEMCPY`` / ``MEMSET`` / ``SYNCHRONIZATION`` / ``RUNTIME``, ``NVTX_EVENTS`` with the NCCL domain's
API ranges and their binary payloads (``--include-blobs``), the payload schemas, ``ThreadNames``,
``PROCESSES``, ``TARGET_INFO_*`` and ``META_DATA_*`` with the launcher environment (``RANK``...).

What nsys would see of a PyTorch job, and so what is written:

* every GPU activity with its launching CUDA runtime/driver call (``correlationId``);
* annotation ranges (``ProfilerStep#N``, pipeline labels, ``Optimizer.step#...``) as NVTX push/pop
  ranges of the default domain — PyTorch's own ``nccl:*`` profiler titles and CPU ops are not NVTX
  and are left out;
* NCCL's NVTX ranges: one ``ncclCommInitRank`` per communicator (PyTorch keeps one communicator
  per p2p pair, where the lower global rank is rank 0, and one per process group) and one
  ``ncclSend`` / ``ncclRecv`` / ``ncclAllReduce``... around each NCCL kernel launch, with the
  communicator id, message size and communicator-local peer rank in the payload;
* timestamps relative to the session start (``TARGET_INFO_SESSION_START_TIME``) unless
  ``ts_normalize`` asks for absolute ones. A rank's local time of true time ``t`` is
  ``epoch_ns + t + clock_skew_ns``, exactly what the Kineto writer emits.
"""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Kind, Phase
from ppsynth.nsys_nccl import Comm, add_nccl, communicators, first_time
from ppsynth.nsys_tables import (
    COPY_KIND,
    DDL,
    MEM_KIND,
    NCCL_DOMAIN_ID,
    PRODUCT_VERSION,
    RUNTIME_SUFFIX,
    SCHEMA_COMM_INIT,
    SCHEMA_SENDRECV,
    SCHEMA_VERSION,
    SCHEMAS,
    TORCH_COMM_TITLE,
    VM_ID,
    Clock,
    ExportRows,
    columns,
    comm_hash,
    create_tables,
    global_pid,
    global_tid,
    insert,
    nvtx_row,
    payload_blob,
)
from ppsynth.run import ApiKind, HostCat, StreamRole, SynthRank, SynthRun

# the schema helpers are part of this module's interface (tests build exports by hand with them)
__all__ = [
    "DDL",
    "SCHEMAS",
    "SCHEMA_COMM_INIT",
    "SCHEMA_SENDRECV",
    "comm_hash",
    "create_tables",
    "insert",
    "nvtx_row",
    "payload_blob",
    "write_nsys",
]
_SCHEMAS = SCHEMAS  # the name the hand-built exports of the tests and benchmarks import


def write_nsys(
    run: SynthRun,
    out_dir: str | Path,
    per_rank_files: bool = True,
    *,
    ts_normalize: bool = False,
    nccl_payloads: bool = True,
    comm_init: bool = True,
) -> list[Path]:
    """Write ``run`` as nsys SQLite exports; returns the files written.

    ``per_rank_files``: one ``report_<rank>.sqlite`` per rank (``nsys profile -o report_%q{RANK}``)
    with ``RANK`` in the capture environment; else one ``report.sqlite`` holding every rank's process
    (``nsys profile torchrun ...``), where only the launcher's environment is recorded (one
    ``report_<host>.sqlite`` per host when the ranks span hosts).
    ``ts_normalize``: absolute UTC timestamps, as ``nsys export --ts-normalize=true`` writes.
    ``nccl_payloads``: the NCCL ranges' payload blobs (``--include-blobs=true``).
    ``comm_init``: the ``ncclCommInitRank`` ranges (absent when the capture started later).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    comms = communicators(run)
    # One report is one host's capture, on that host's clock: without per-rank files, one report per
    # host (``nsys profile torchrun ...`` on each node); the ranks of a host share its clock skew.
    hosts: dict[str, list[SynthRank]] = {}
    for r in run.ranks:
        hosts.setdefault(r.host_name, []).append(r)
    groups = [[r] for r in run.ranks] if per_rank_files else list(hosts.values())
    paths: list[Path] = []
    for members in groups:
        first = min(first_time(r) + run.epoch_ns + r.clock_skew_ns for r in members)
        # Real sessions start a little before the first event; whole microseconds like nsys.
        session = (first - 250_000_000) // 1000 * 1000
        base = 0 if ts_normalize else session
        f = ExportRows()
        for r in members:
            _add_rank(
                f,
                run,
                r,
                Clock(base, run.epoch_ns, r.clock_skew_ns),
                comms[r.rank],
                nccl_payloads,
                comm_init,
            )
        name = (
            f"report_{members[0].rank}.sqlite"
            if per_rank_files
            else ("report.sqlite" if len(groups) == 1 else f"report_{members[0].host_name}.sqlite")
        )
        path = out / name
        path.unlink(missing_ok=True)
        env = _launcher_env(run, members[0]) if per_rank_files else _torchrun_env(run)
        _write_file(path, f, session, env, ts_normalize, nccl_payloads, members)
        paths.append(path)
    return paths


def _add_rank(
    f: ExportRows,
    run: SynthRun,
    r: SynthRank,
    clock: Clock,
    comms: dict[tuple[Any, ...], Comm],
    payloads: bool,
    comm_init: bool,
) -> None:
    """Every row of rank ``r``: GPU activities, runtime calls, NVTX ranges, NCCL, threads, devices."""
    _add_gpu(f, run, r, clock)
    _add_runtime(f, run, r, clock)
    h = r.host
    hstart, hend = clock(h.start), clock(h.end)
    for i in np.flatnonzero(h.cat == HostCat.ANNOTATION).tolist():
        text = run.names[int(h.name[i])]
        if TORCH_COMM_TITLE.match(text):
            continue  # PyTorch's collective titles exist only in its own profiler
        f.nvtx.append(nvtx_row(int(hstart[i]), int(hend[i]), global_tid(r.pid, int(h.tid[i])), text=text))
    add_nccl(f, run, r, clock, comms, payloads, comm_init)
    _add_process(f, r, payloads)


def _add_gpu(f: ExportRows, run: SynthRun, r: SynthRank, clock: Clock) -> None:
    """Kernels, copies, memsets and synchronisations, in the column order of the DDL."""
    s = f.strings
    gpid = global_pid(r.pid)
    names = run.names
    g = r.gpu
    dev = int(r.device_index)
    start, end = clock(g.start), clock(g.end)
    corr = g.correlation
    name_ids = {int(i): s.id(names[int(i)] if 0 <= int(i) < len(names) else "") for i in np.unique(g.name)}
    # constants stand for what nsys records but ppdiag ignores (launch geometry, registers, memory kinds)
    # fmt: off
    kern = np.flatnonzero(np.isin(g.kind, (Kind.COMPUTE, Kind.P2P, Kind.COLLECTIVE)))
    if len(kern):
        short = {i: s.id(_short_name(names[i])) for i in name_ids}
        kn = g.name[kern].tolist()
        grid = list(range(f.grid_id + 1, f.grid_id + 1 + len(kern)))
        f.grid_id += len(kern)
        f.kernels.extend(_zip_rows(
            len(kern), start[kern].tolist(), end[kern].tolist(), dev, 1, None, g.stream[kern].tolist(),
            _opt_list(corr[kern]), gpid, [name_ids[i] for i in kn], [short[i] for i in kn], None, 1, 0, 32,
            1, 1, 1, 128, 1, 1, 0, 0, 0, 0, grid, 0, None, None,
        ))
    mc = np.flatnonzero(g.kind == Kind.MEMCPY)
    if len(mc):
        kinds = [_copy_kinds(names[i]) for i in g.name[mc].tolist()]
        f.memcpy.extend(_zip_rows(
            len(mc), start[mc].tolist(), end[mc].tolist(), dev, 1, None, g.stream[mc].tolist(),
            _opt_list(corr[mc]), gpid, np.maximum(g.bytes[mc], 0).tolist(), [k[0] for k in kinds], None,
            [k[1] for k in kinds], [k[2] for k in kinds], dev, 1, dev, 1, None, None, None,
        ))
    ms = np.flatnonzero(g.kind == Kind.MEMSET)
    if len(ms):
        f.memset.extend(_zip_rows(
            len(ms), start[ms].tolist(), end[ms].tolist(), dev, 1, None, g.stream[ms].tolist(),
            _opt_list(corr[ms]), gpid, 0, np.maximum(g.bytes[ms], 0).tolist(), None, 2,
        ))
    sy = np.flatnonzero(g.kind == Kind.SYNC)
    if len(sy):
        f.sync.extend(_zip_rows(
            len(sy), start[sy].tolist(), end[sy].tolist(), dev, 1, None,
            np.where(g.stream[sy] >= 0, g.stream[sy], 0xFFFFFFFF).tolist(), _opt_list(corr[sy]), gpid, 3,
            0xFFFFFFFF,
        ))
    # fmt: on


def _add_runtime(f: ExportRows, run: SynthRun, r: SynthRank, clock: Clock) -> None:
    """The CUDA runtime and driver calls (runtime names carry their version suffix)."""
    rt = r.runtime
    if not len(rt):
        return
    s, names = f.strings, run.names
    rstart, rend = clock(rt.start), clock(rt.end)
    driver = rt.api == ApiKind.DRIVER
    label_ids = {}
    for i, d in set(zip(rt.name.tolist(), driver.tolist(), strict=True)):
        api = names[i]
        label_ids[(i, d)] = s.id(api if d else api + RUNTIME_SUFFIX.get(api, "_v3020"))
    f.runtime.extend(
        _zip_rows(
            len(rt),
            rstart.tolist(),
            rend.tolist(),
            driver.astype(np.int64).tolist(),
            [global_tid(r.pid, t) for t in rt.tid.tolist()],
            _opt_list(rt.correlation),
            [label_ids[k] for k in zip(rt.name.tolist(), driver.tolist(), strict=True)],
            0,
            None,
        )
    )


def _add_process(f: ExportRows, r: SynthRank, payloads: bool) -> None:
    """Thread names, the process, its GPU, context and streams, and the payload schemas."""
    s, rt, h = f.strings, r.runtime, r.host
    gpid = global_pid(r.pid)
    dev = int(r.device_index)
    tids = sorted({int(t) for t in rt.tid.tolist()} | {int(t) for t in h.tid.tolist()} | {int(r.tid)})
    for t in tids:
        # PyTorch names its main thread and the autograd engine's device threads like this.
        tname = (
            "pt_main_thread"
            if t == r.tid
            else f"pt_autograd_{r.device_index}"
            if _runs_backward(r, t)
            else f"python3-{t}"
        )
        f.threads.append((s.id(tname), 20, global_tid(r.pid, t)))
    f.processes.append((gpid, r.pid, "python3"))
    f.gpus.append(_gpu_row(r))
    f.contexts.append((7, 0, VM_ID, r.pid, dev, 1, None, 0))
    for st in r.streams:
        nccl = st.role != StreamRole.COMPUTE
        f.streams.append((int(st.id), 0, VM_ID, r.pid, 1, -1 if nccl else 0, 2 if nccl else 1))
    if payloads:
        for sid, (size, entries) in SCHEMAS.items():
            f.schemas.append((NCCL_DOMAIN_ID, sid, None, 1, None, len(entries), size, None))
            for idx, (ename, typ, off) in enumerate(entries):
                f.schema_entries.append((NCCL_DOMAIN_ID, sid, idx, None, typ, ename, None, None, off or None))


def _runs_backward(r: SynthRank, tid: int) -> bool:
    sel = r.host.tid == tid
    return bool(sel.any() and np.isin(r.host.phase[sel], (Phase.BWD, Phase.WGRAD)).any())


def _short_name(full: str) -> str:
    """``void ns::kern<T>(args)`` → ``kern`` (nsys ``shortName``)."""
    base = full.split("(", 1)[0].removeprefix("void ").split("<", 1)[0].strip()
    return base.rsplit("::", 1)[-1] or full


def _opt_list(a: npt.NDArray[np.int64]) -> list[int | None]:
    return [v if v >= 0 else None for v in a.tolist()]


def _zip_rows(n: int, *cols: Any) -> list[tuple[Any, ...]]:
    """Rows from columns given as lists or as one value for every row."""
    return list(zip(*(c if isinstance(c, list) else itertools.repeat(c, n) for c in cols), strict=True))


def _copy_kinds(name: str) -> tuple[int, int, int]:
    """``Memcpy HtoD (Pageable -> Device)`` → (copyKind, srcKind, dstKind)."""
    parts = name.replace("(", " ").replace(")", " ").split()
    ck = next((COPY_KIND[p] for p in parts if p in COPY_KIND), 8)
    kinds = [MEM_KIND[p.lower()] for p in parts if p.lower() in MEM_KIND]
    src, dst = [*kinds, 2, 2][:2]
    return ck, src, dst


def _gpu_row(r: SynthRank) -> tuple[Any, ...]:
    vals: list[Any] = [
        VM_ID,
        int(r.device_index),
        r.device_name,
        f"0000:{0x18 + r.device_index:02x}:00.0",
        1,
        52428800,
        85520809984,
        3352320000000,
        1980000000,
        132,
        0,
        f"GPU-{hashlib.md5(f'{r.host_name}/{r.device_index}'.encode()).hexdigest()}",
        0,
        "GH100",
        int(r.device_index),
        None,
        None,
        0,
        1,
        65536,
        4,
        65536,
        49152,
        232448,
        233472,
        65536,
        32,
        3,
        64,
        32,
        1024,
        1024,
        1024,
        64,
        2147483647,
        65535,
        65535,
        9,
        0,
        9,
        0,
    ]
    return tuple(vals)


def _launcher_env(run: SynthRun, r: SynthRank) -> dict[str, str]:
    """Environment of a per-rank process as torchrun / srun set it."""
    return {
        "RANK": str(r.rank),
        "WORLD_SIZE": str(run.world_size),
        "LOCAL_RANK": str(r.device_index),
        "LOCAL_WORLD_SIZE": str(min(run.world_size, 8)),
        "MASTER_ADDR": "node00",
        "MASTER_PORT": "29500",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_DEBUG": "WARN",
    }


def _torchrun_env(run: SynthRun) -> dict[str, str]:
    """The launcher (torchrun) itself: its children's ranks are not in its environment."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"}


def _write_file(
    path: Path,
    f: ExportRows,
    session: int,
    env: dict[str, str],
    ts_normalize: bool,
    payloads: bool,
    members: list[SynthRank],
) -> None:
    """Write the rows of one export, then its session, system and metadata tables."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        present = {
            "CUPTI_ACTIVITY_KIND_KERNEL": f.kernels,
            "CUPTI_ACTIVITY_KIND_MEMCPY": f.memcpy,
            "CUPTI_ACTIVITY_KIND_MEMSET": f.memset,
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": f.sync,
            "CUPTI_ACTIVITY_KIND_RUNTIME": f.runtime,
            "NVTX_EVENTS": f.nvtx,
            "NVTX_PAYLOAD_SCHEMAS": f.schemas,
            "NVTX_PAYLOAD_SCHEMA_ENTRIES": f.schema_entries,
            "ThreadNames": f.threads,
            "PROCESSES": f.processes,
            "TARGET_INFO_GPU": f.gpus,
            "TARGET_INFO_CUDA_STREAM": f.streams,
            "TARGET_INFO_CUDA_CONTEXT_INFO": f.contexts,
        }
        create_tables(
            conn,
            [
                "StringIds",
                "TARGET_INFO_SESSION_START_TIME",
                "TARGET_INFO_SYSTEM_ENV",
                "META_DATA_EXPORT",
                "META_DATA_CAPTURE",
            ],
        )
        for table, rows in present.items():
            if rows:  # --lazy: empty tables are not exported
                create_tables(conn, [table])
                insert(conn, table, columns(table), rows)
        insert(conn, "StringIds", ("id", "value"), f.strings.rows())
        _write_meta(conn, path, session, env, ts_normalize, payloads, members)
        conn.commit()
    finally:
        conn.close()


def _write_meta(
    conn: sqlite3.Connection,
    path: Path,
    session: int,
    env: dict[str, str],
    ts_normalize: bool,
    payloads: bool,
    members: list[SynthRank],
) -> None:
    """Session start, the host's system environment, the export parameters and the capture."""
    utc = datetime.fromtimestamp(session / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    insert(
        conn,
        "TARGET_INFO_SESSION_START_TIME",
        ("utcEpochNs", "utcTime", "localTime"),
        [(session, utc, utc)],
    )
    sysenv = [
        ("Hostname", members[0].host_name),
        ("CpuCores", "64"),
        ("CudaDriverVersion", "12040"),
        ("NvDriverVersion", "550.54.15"),
        ("OsDescription", "Ubuntu 22.04.4 LTS"),
    ]
    insert(
        conn,
        "TARGET_INFO_SYSTEM_ENV",
        ("globalVid", "devStateName", "name", "nameEnum", "value"),
        [(VM_ID << 48, "Initial", k, i, v) for i, (k, v) in enumerate(sysenv)],
    )
    export = [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
        ("EXPORT_PRODUCT_VERSION", PRODUCT_VERSION),
        ("EXPORT_SCHEMA_VERSION", SCHEMA_VERSION),
        ("EXPORT_PARAM_EXPORT_TYPE", "SQLite"),
        ("EXPORT_PARAM_INPUT_FILE", path.with_suffix(".nsys-rep").name),
        ("EXPORT_PARAM_LAZY", "true"),
        ("EXPORT_PARAM_INCLUDE_BLOBS", "true" if payloads else "false"),
        ("EXPORT_PARAM_TIME_NORMALIZE", "true" if ts_normalize else "false"),
        ("EXPORT_PARAM_TIME_SHIFT", "0"),
    ]
    insert(conn, "META_DATA_EXPORT", ("name", "value"), export)
    capture = [
        ("CAPTURE_EVENT_TYPE", "Cuda"),
        ("CAPTURE_EVENT_TYPE", "NvtxEvents"),
        ("PROCESS_0:HOW_TO_ATTACH", "LaunchAnother"),
        ("PROCESS_0:COMMAND", "python" if len(members) == 1 else "torchrun"),
        ("PROCESS_0:PID", "0"),
        ("PROCESS_0:COLLECT_NVTX_TRACE", "true"),
        ("PROCESS_0:COLLECT_CUDA_TRACE", "true"),
    ]
    capture += [("PROCESS_0:ENVIRONMENT_VARIABLE", f'{k}="{v}"') for k, v in env.items()]
    insert(conn, "META_DATA_CAPTURE", ("name", "value"), capture)
