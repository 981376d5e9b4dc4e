"""Benchmark of the Nsight Systems reader against the floor of reading the same rows.

Generates a large nsys-schema SQLite export (default 3 M kernels: compute kernels plus NCCL p2p
kernels with their NCCL NVTX ranges and payloads, one launching runtime call per kernel, extra
API calls that launch nothing, step and label ranges), then times, each in a fresh process:

* floor: ``SELECT start, end, deviceId, streamId, correlationId, globalPid, demangledName FROM
  CUPTI_ACTIVITY_KIND_KERNEL`` fetched into numpy (and, for reference, with ``fetchall()``);
* ppdiag: ``NsysParser().parse`` of the file (kernels with launches, NVTX, NCCL projection,
  names, per-rank tables).

Prints both times, their ratio and each process's peak RSS.

    python benchmarks/bench_nsys.py [--kernels 3000000] [--file /tmp/big.sqlite] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ppsynth.nsys import (  # noqa: E402
    _SCHEMAS,
    DDL,
    SCHEMA_COMM_INIT,
    SCHEMA_SENDRECV,
    create_tables,
    insert,
    nvtx_row,
    payload_blob,
)

PID, TID = 31337, 31337
GPID = (1 << 48) | (PID << 24)
GTID = GPID | TID
SESSION = 1_767_225_600_000_000_000


def _cols(table: str) -> list[str]:
    return [c.strip().split()[0] for c in DDL[table].split(",")]


def generate(path: Path, n_kernels: int, seed: int = 0) -> dict[str, int]:
    """Write the export; returns row counts."""
    rng = np.random.default_rng(seed)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    create_tables(
        conn,
        [
            "StringIds",
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            "NVTX_EVENTS",
            "NVTX_PAYLOAD_SCHEMAS",
            "NVTX_PAYLOAD_SCHEMA_ENTRIES",
            "TARGET_INFO_SESSION_START_TIME",
            "META_DATA_EXPORT",
            "META_DATA_CAPTURE",
            "ThreadNames",
            "PROCESSES",
        ],
    )
    names = [f"void at::native::kernel_{i}<float, 4>(at::TensorIteratorBase&, int)" for i in range(200)]
    sendrecv = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)"
    strings = {
        s: i + 1
        for i, s in enumerate(
            [
                *names,
                sendrecv,
                "cudaLaunchKernel_v7000",
                "cuLaunchKernelEx",
                "cudaEventRecord_v3020",
                "ncclSend",
                "ncclRecv",
                "ncclCommInitRank",
                "pt_main_thread",
            ]
        )
    }
    insert(conn, "StringIds", ("id", "value"), [(i, s) for s, i in strings.items()])

    n = n_kernels
    gap = rng.integers(500, 3000, n)
    dur = rng.integers(2000, 20000, n)
    start = 1_000_000_000 + np.cumsum(gap + dur)  # ns after the session start
    is_comm = rng.random(n) < 0.08
    stream = np.where(is_comm, np.where(rng.random(n) < 0.5, 20, 24), 7)
    name = np.where(is_comm, strings[sendrecv], rng.integers(1, len(names) + 1, n))
    corr = np.arange(1, n + 1) * 2  # odd ids go to API calls that launch nothing
    launch = start - rng.integers(5_000, 200_000, n)
    kcols = [
        start,
        start + dur,
        np.zeros(n, np.int64),
        np.ones(n, np.int64),
        None,
        stream,
        corr,
        np.full(n, GPID),
        name,
        name,
        None,
        np.ones(n, np.int64),
        np.zeros(n, np.int64),
        np.full(n, 32),
        np.full(n, 128),
        np.ones(n, np.int64),
        np.ones(n, np.int64),
        np.full(n, 256),
        np.ones(n, np.int64),
        np.ones(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.arange(n),
        np.zeros(n, np.int64),
        None,
        None,
    ]
    insert(conn, "CUPTI_ACTIVITY_KIND_KERNEL", _cols("CUPTI_ACTIVITY_KIND_KERNEL"), _rows(kcols, n))
    # one launch per kernel (driver API for NCCL) plus one event record per 4 kernels
    m = n // 4
    extra_t = launch[::4][:m] - 3000
    r_start = np.concatenate([launch, extra_t])
    r_class = np.concatenate([np.where(is_comm, 1, 0), np.zeros(m, np.int64)])
    r_corr = np.concatenate([corr, corr[::4][:m] - 1])
    r_name = np.concatenate(
        [
            np.where(is_comm, strings["cuLaunchKernelEx"], strings["cudaLaunchKernel_v7000"]),
            np.full(m, strings["cudaEventRecord_v3020"]),
        ]
    )
    nr = n + m
    rcols = [
        r_start,
        r_start + 2500,
        r_class,
        np.full(nr, GTID),
        r_corr,
        r_name,
        np.zeros(nr, np.int64),
        None,
    ]
    insert(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", _cols("CUPTI_ACTIVITY_KIND_RUNTIME"), _rows(rcols, nr))

    # NVTX: the NCCL domain, one communicator, an ncclSend/ncclRecv range around every NCCL launch,
    # step ranges every 10 000 kernels and a label per 200 kernels.
    nv: list[tuple[object, ...]] = []
    comm = 0x5EED
    nv.append(_nvtx(0, None, 75, "NCCL", None, 1, None))
    nv.append(
        _nvtx(
            500_000,
            600_000,
            59,
            None,
            strings["ncclCommInitRank"],
            1,
            payload_blob(SCHEMA_COMM_INIT, {"NCCL communicator ID": comm, "No. of ranks": 2, "Rank": 0}),
        )
    )
    ci = np.flatnonzero(is_comm)
    send = stream[ci] == 24
    blobs = {
        s: payload_blob(
            SCHEMA_SENDRECV, {"NCCL communicator ID": comm, "Message size [bytes]": 1 << 22, "Peer rank": 1}
        )
        for s in (0, 1)
    }
    for i, s in zip(ci.tolist(), send.tolist(), strict=True):
        lt = int(launch[i])
        nv.append(
            _nvtx(lt - 1000, lt + 3500, 59, None, strings["ncclSend" if s else "ncclRecv"], 1, blobs[s])
        )
    steps = np.arange(0, n, 10_000)
    for k, i in enumerate(steps.tolist()):
        j = min(i + 10_000, n) - 1
        nv.append(_nvtx(int(launch[i]) - 100, int(start[j] + dur[j]), 59, f"ProfilerStep#{k}", None, 0, None))
    for k, i in enumerate(range(0, n, 200)):
        j = min(i + 200, n) - 1
        nv.append(_nvtx(int(launch[i]) - 50, int(launch[j]) + 10, 59, f"PP:0F{k % 8}", None, 0, None))
    insert(conn, "NVTX_EVENTS", _cols("NVTX_EVENTS"), nv)
    for sid, (size, entries) in _SCHEMAS.items():
        insert(
            conn,
            "NVTX_PAYLOAD_SCHEMAS",
            _cols("NVTX_PAYLOAD_SCHEMAS"),
            [(1, sid, None, 1, None, len(entries), size, None)],
        )
        insert(
            conn,
            "NVTX_PAYLOAD_SCHEMA_ENTRIES",
            _cols("NVTX_PAYLOAD_SCHEMA_ENTRIES"),
            [(1, sid, i, None, t, nm, None, None, o or None) for i, (nm, t, o) in enumerate(entries)],
        )
    insert(
        conn, "TARGET_INFO_SESSION_START_TIME", ("utcEpochNs", "utcTime", "localTime"), [(SESSION, "", "")]
    )
    insert(
        conn,
        "META_DATA_EXPORT",
        ("name", "value"),
        [("EXPORT_PRODUCT_VERSION", "2024.5.1.113"), ("EXPORT_PARAM_TIME_NORMALIZE", "false")],
    )
    insert(conn, "META_DATA_CAPTURE", ("name", "value"), [("PROCESS_0:ENVIRONMENT_VARIABLE", 'RANK="0"')])
    insert(conn, "ThreadNames", ("nameId", "priority", "globalTid"), [(strings["pt_main_thread"], 20, GTID)])
    insert(conn, "PROCESSES", ("globalPid", "pid", "name"), [(GPID, PID, "python3")])
    conn.commit()
    conn.close()
    return {"kernels": n, "runtime": nr, "nvtx": len(nv)}


def _rows(cols: list[np.ndarray | None], n: int) -> Iterator[tuple[object, ...]]:
    lists = [c.tolist() if c is not None else [None] * n for c in cols]
    return zip(*lists, strict=True)


def _nvtx(
    start: int,
    end: int | None,
    etype: int,
    text: str | None,
    text_id: int | None,
    domain: int,
    blob: bytes | None,
) -> tuple[object, ...]:
    return nvtx_row(start, end, GTID, text=text, text_id=text_id, event_type=etype, domain=domain, blob=blob)


_CHILD = r"""
import json, sys, time
sys.path.insert(0, {repo!r})
import numpy as np, sqlite3
from pathlib import Path
from ppdiag.parsers import ParseOptions
from ppdiag.parsers.nsys import NsysParser
mode, path = sys.argv[1], sys.argv[2]
SQL = ('SELECT start, "end", deviceId, streamId, correlationId, globalPid, demangledName '
       'FROM CUPTI_ACTIVITY_KIND_KERNEL')
t = time.perf_counter()
if mode == "floor":
    conn = sqlite3.connect(f"file:{{path}}?mode=ro&immutable=1", uri=True)
    dt = np.dtype([(c, np.int64) for c in ("s", "e", "d", "st", "c", "p", "n")])
    rows = len(np.fromiter(conn.execute(SQL), dtype=dt))
elif mode == "fetchall":
    conn = sqlite3.connect(f"file:{{path}}?mode=ro&immutable=1", uri=True)
    rows = len(conn.execute(SQL).fetchall())
else:
    tls = NsysParser().parse(Path(path), ParseOptions())
    rows = sum(len(t.intervals) for t in tls)
dt_s = time.perf_counter() - t
# VmHWM belongs to this process image only (ru_maxrss can carry the parent's peak over exec)
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))
print(json.dumps({{"s": dt_s, "rows": rows, "rss_mb": hwm / 1024}}))
"""


def measure(mode: str, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(repo=str(REPO)), mode, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=3_000_000)
    ap.add_argument(
        "--file", type=Path, default=None, help="where to write the export (default: a temp file)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated export")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each reader (best is reported)")
    args = ap.parse_args()
    path = args.file or Path(tempfile.mkdtemp()) / "bench_nsys.sqlite"
    t = time.perf_counter()
    counts = generate(path, args.kernels)
    size_mib = path.stat().st_size / 2**20
    print(f"generated {path} ({size_mib:.0f} MiB): {counts} in {time.perf_counter() - t:.1f} s")
    try:
        # modes interleaved, best of each: the machine's load changes between runs
        modes = ("floor", "fetchall", "ppdiag")
        runs = [[measure(m, path) for m in modes] for _ in range(args.repeat)]
        res = {m: min((r[i] for r in runs), key=lambda x: x["s"]) for i, m in enumerate(modes)}
        for m, r in res.items():
            print(f"{m:9s} {r['s']:7.2f} s  rows {int(r['rows']):>9d}  peak RSS {r['rss_mb']:7.0f} MiB")
        ratio = res["ppdiag"]["s"] / res["floor"]["s"]
        print(f"ratio ppdiag / floor (numpy fetch of the kernel columns): {ratio:.2f}")
        print(
            f"ratio ppdiag / fetchall of the same columns:              "
            f"{res['ppdiag']['s'] / res['fetchall']['s']:.2f}"
        )
    finally:
        if not args.keep and args.file is None:
            path.unlink(missing_ok=True)
            os.rmdir(path.parent)


if __name__ == "__main__":
    main()
