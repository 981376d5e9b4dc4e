"""Rewrite recorded traces to strip one source of pipeline structure (ablation tests).

Each helper rewrites copies of a run's trace files in place (Kineto JSON, gzipped or not; nsys
SQLite exports through SQL), so that a test can diagnose the same recording with and without the
metadata users often lack. The generator and the recorder get no flags for this: stripping what a
real trace may lack is the test's business.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ppsynth.kernels import ALLREDUCE_BF16, ALLREDUCE_F32, SENDRECV
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.run import SynthRun

# Kineto: the sources of structure that can be stripped
SHAPES = "shapes"  # Concrete Inputs / Input Dims / Input type (record_shapes=False)
COMM_ARGS = "comm_args"  # NCCL comm args copied onto kernels (Collective name, Src/Dst Rank, ...)
PARAM_COMMS = "param_comms"  # record_param_comms host ops
PG = "pg"  # pg_config / pg_desc in distributedInfo and Process Group * args
LABELS = "labels"  # PP:<s>F<mb> / Forward n / Backward n user annotations
NVTX_NAMES = "nvtx_names"  # nccl:send a->b / nccl:recv a<-b annotations (emit_nvtx style)
ALL_KINETO = (SHAPES, COMM_ARGS, PARAM_COMMS, PG, LABELS, NVTX_NAMES)

_SHAPE_KEYS = ("Concrete Inputs", "Input Dims", "Input type", "Input Strides")
_COMM_KEYS = (
    "Collective name",
    "dtype",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "In split size",
    "Out split size",
    "Global rank start",
    "Global rank stride",
    "Process Group Name",
    "Process Group Description",
    "Process Group Ranks",
    "Rank",
    "Src Rank",
    "Dst Rank",
    "Seq",
    "Is asynchronized op",
)
_PG_KEYS = ("Process Group Name", "Process Group Description", "Process Group Ranks")
_LABEL = re.compile(r"^(PP:\d+[A-Za-z]+\d+|Forward \d+|Backward \d+|[A-Za-z_ ]*(forward|backward)[ _]?\d+)$")
_NVTX_P2P = re.compile(r"^nccl:(send|recv)\s+\d+\s*(->|<-)\s*\d+")


def _load(path: Path) -> dict[str, Any]:
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            raw = f.read()
    else:
        raw = path.read_bytes()
    obj: dict[str, Any] = json.loads(raw)
    return obj


def _save(path: Path, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def strip_kineto_trace(obj: dict[str, Any], what: Iterable[str] = ALL_KINETO) -> dict[str, int]:
    """Strip the named sources from one Kineto trace object in place; returns counts of what went."""
    what = set(what)
    counts = {w: 0 for w in what}
    kept: list[dict[str, Any]] = []
    for e in obj.get("traceEvents", []):
        name = str(e.get("name", ""))
        cat = e.get("cat")
        if PARAM_COMMS in what and name == "record_param_comms":
            counts[PARAM_COMMS] += 1
            continue
        if LABELS in what and cat in ("user_annotation", "gpu_user_annotation") and _LABEL.match(name):
            counts[LABELS] += 1
            continue
        if NVTX_NAMES in what and cat in ("user_annotation", "gpu_user_annotation") and _NVTX_P2P.match(name):
            counts[NVTX_NAMES] += 1
            continue
        args = e.get("args")
        if isinstance(args, dict):
            if SHAPES in what:
                for k in _SHAPE_KEYS:
                    if args.pop(k, None) is not None:
                        counts[SHAPES] += 1
            if COMM_ARGS in what and cat == "kernel":
                for k in _COMM_KEYS:
                    if args.pop(k, None) is not None:
                        counts[COMM_ARGS] += 1
            if PG in what:
                for k in _PG_KEYS:
                    if args.pop(k, None) is not None:
                        counts[PG] += 1
        kept.append(e)
    obj["traceEvents"] = kept
    dist = obj.get("distributedInfo")
    if PG in what and isinstance(dist, dict):
        for k in ("pg_config", "pg_count"):
            if dist.pop(k, None) is not None:
                counts[PG] += 1
    return counts


def strip_kineto_dir(src: Path, dst: Path, what: Iterable[str] = ALL_KINETO) -> dict[str, int]:
    """Copy the run folder ``src`` to ``dst`` with the named sources stripped from every trace."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    total: dict[str, int] = {}
    for p in sorted(dst.rglob("*.json*")):
        if p.name == "groundtruth.json" or not (p.suffix == ".json" or p.name.endswith(".json.gz")):
            continue
        obj = _load(p)
        if "traceEvents" not in obj:
            continue
        for k, v in strip_kineto_trace(obj, what).items():
            total[k] = total.get(k, 0) + v
        _save(p, obj)
    return total


# nsys: the sources of structure that can be stripped (SQL on a copy)
PAYLOADS = "payloads"  # NVTX payload blobs (NCCL comm args)
NCCL_RANGES = "nccl_ranges"  # the NCCL domain's ranges entirely
EMIT_NVTX = "emit_nvtx"  # PyTorch emit_nvtx nccl:send a->b / nccl:recv a<-b ranges
NSYS_LABELS = "nsys_labels"  # forward/backward pipeline labels
ALL_NSYS = (PAYLOADS, NCCL_RANGES, EMIT_NVTX)


def _nsys_text(conn: sqlite3.Connection) -> str:
    """SQL expression for an NVTX_EVENTS row's name (inline text or the string table)."""
    has_strings = conn.execute("SELECT 1 FROM sqlite_master WHERE name='StringIds'").fetchone()
    if has_strings:
        return "COALESCE(text, (SELECT value FROM StringIds s WHERE s.id = NVTX_EVENTS.textId))"
    return "text"


def strip_nsys_db(path: Path, what: Iterable[str] = ALL_NSYS) -> dict[str, int]:
    """Strip the named sources from one nsys SQLite export in place; returns rows changed."""
    what = set(what)
    counts = {w: 0 for w in what}
    conn = sqlite3.connect(path)
    try:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(NVTX_EVENTS)")}
        if not cols:
            return counts
        text = _nsys_text(conn)
        if NCCL_RANGES in what and "domainId" in cols:
            # the NCCL domain: the one whose domain-create row is named NCCL, or whose ranges carry
            # NCCL's API names
            doms = {
                int(r[0])
                for r in conn.execute(
                    f"SELECT DISTINCT domainId FROM NVTX_EVENTS WHERE {text} = 'NCCL' "
                    f"OR {text} LIKE 'ncclSend%' OR {text} LIKE 'ncclRecv%' OR {text} LIKE 'ncclAllReduce%' "
                    f"OR {text} LIKE 'ncclGroup%'"
                )
                if r[0]
            }
            for d in doms:
                counts[NCCL_RANGES] += conn.execute(
                    "DELETE FROM NVTX_EVENTS WHERE domainId = ?", (d,)
                ).rowcount
        if PAYLOADS in what:
            pcols = [
                c for c in ("binaryData", "jsonText", "jsonTextId", "uint64Value", "int64Value") if c in cols
            ]
            if "binaryData" in cols:
                counts[PAYLOADS] += conn.execute(
                    "UPDATE NVTX_EVENTS SET binaryData = NULL WHERE binaryData IS NOT NULL"
                ).rowcount
            for c in pcols:
                if c != "binaryData":
                    conn.execute(f"UPDATE NVTX_EVENTS SET {c} = NULL")
        if EMIT_NVTX in what:
            counts[EMIT_NVTX] += conn.execute(
                f"DELETE FROM NVTX_EVENTS WHERE {text} LIKE 'nccl:send%' OR {text} LIKE 'nccl:recv%'"
            ).rowcount
        if NSYS_LABELS in what:
            counts[NSYS_LABELS] += conn.execute(
                f"DELETE FROM NVTX_EVENTS WHERE {text} LIKE 'PP:%' OR {text} LIKE 'Forward %' "
                f"OR {text} LIKE 'Backward %'"
            ).rowcount
        conn.commit()
    finally:
        conn.close()
    return counts


def strip_nsys_dir(src: Path, dst: Path, what: Iterable[str] = ALL_NSYS) -> dict[str, int]:
    """Copy the run folder ``src`` to ``dst`` with the named sources stripped from every export."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    total: dict[str, int] = {}
    for p in sorted(dst.rglob("*.sqlite")):
        for k, v in strip_nsys_db(p, what).items():
            total[k] = total.get(k, 0) + v
    return total


# NCCL 2.18 and older named the kernels of the same work so
OLD_NCCL_NAMES = {
    SENDRECV: "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
    ALLREDUCE_BF16: "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)",
    ALLREDUCE_F32: "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
}


def write_variant(run: SynthRun, variant: str, out: Path) -> Path:
    """Write a simulated ``run`` under ``out`` as ``variant`` and return the run folder.

    ``variant`` starts with ``kineto`` or ``nsys``; ``-old`` renames the NCCL kernels as NCCL 2.18
    and older did, ``-bare`` leaves out the NCCL metadata (Kineto: comm args, record_param_comms,
    nccl:* titles; nsys: payload blobs), as a capture without them would be."""
    if "-old" in variant:
        run = dataclasses.replace(run, names=[OLD_NCCL_NAMES.get(n, n) for n in run.names])
    raw = out / ("raw" if "-bare" in variant else "run")
    if variant.startswith("kineto"):
        write_kineto(run, raw)
        if "-bare" in variant:
            strip_kineto_dir(raw, out / "run", (COMM_ARGS, PARAM_COMMS, NVTX_NAMES))
    else:
        write_nsys(run, raw)
        if "-bare" in variant:
            strip_nsys_dir(raw, out / "run", (PAYLOADS,))
    return out / "run"
