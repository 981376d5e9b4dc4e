"""Move ranks of a recorded run to other hosts: rewrite a trace's host name and clock.

A run that spans hosts differs from a one-host run in two things only: each host names itself in
its traces, and each host's clock reads its own time (NTP leaves milliseconds to seconds between
hosts). :func:`move_ranks` rewrites the traces of chosen ranks so: the host name (Kineto
``host_name``, the ``<host>_<pid>`` prefix of ``tensorboard_trace_handler`` file names, the Nsight
Systems ``Hostname``) and every timestamp shifted by the host's skew. Nothing else changes, so the
diagnosis of the rewritten run must equal the original's (docs/clocks.md). ``ppdiag demo --hosts 2
--skew-ms D`` uses it to show a two-host run; the clock metamorphic tests use it on every input.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_WORKER = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)(?P<rest>\.\d+\.pt\.trace\.json(?:\.gz)?)$")
_KINETO = (".json", ".json.gz")
_NSYS = (".sqlite",)
# columns of an Nsight Systems export that hold times on the capture's clock
_NSYS_TIME_COLS = ("start", "end", "timestamp")


@dataclass(frozen=True)
class Move:
    """Where one rank goes: its new host name and how far that host's clock is ahead (ns; a
    negative skew is a clock behind)."""

    host: str
    skew_ns: int


def trace_rank(path: Path) -> int | None:
    """The rank a trace file holds: Kineto ``distributedInfo.rank``, else a ``rank<N>`` /
    ``report_<N>`` file name; None when neither says."""
    name = path.name
    if name.endswith(_KINETO):
        try:
            d = _load_json(path)
        except (OSError, ValueError, EOFError):
            d = None
        info = d.get("distributedInfo") if isinstance(d, dict) else None
        r = info.get("rank") if isinstance(info, dict) else None
        if isinstance(r, int) and not isinstance(r, bool):
            return r
    m = re.search(r"(?:rank|report_)(\d+)", name)
    return int(m.group(1)) if m else None


def _load_json(path: Path) -> Any:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _renamed(name: str, host: str) -> str:
    """A ``tensorboard_trace_handler`` file name (``<host>_<pid>.<n>.pt.trace.json``) with the new
    host; other names unchanged."""
    m = _WORKER.match(name)
    return f"{host}_{m.group('pid')}{m.group('rest')}" if m else name


def rewrite_kineto(src: Path, dst_dir: Path, move: Move) -> Path:
    """Write ``src`` (Kineto JSON, gzipped or not) into ``dst_dir`` with the new host name and every
    event's ``ts`` shifted by the skew; returns the written path (renamed when the name carries
    the host)."""
    raw = src.read_bytes()
    zipped = raw[:2] == b"\x1f\x8b"
    d = json.loads(gzip.decompress(raw) if zipped else raw)
    if not isinstance(d, dict):
        raise ValueError(f"{src}: not a Kineto trace object")
    d["host_name"] = move.host
    shift_us = move.skew_ns / 1000.0
    for e in d.get("traceEvents") or []:
        ts = e.get("ts") if isinstance(e, dict) else None
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            # integer µs stay integers where the skew is whole µs (the 2021-2023 formats)
            e["ts"] = ts + (int(shift_us) if isinstance(ts, int) and shift_us.is_integer() else shift_us)
    out = dst_dir / _renamed(src.name, move.host)
    data = json.dumps(d).encode()
    out.write_bytes(gzip.compress(data, 6) if zipped else data)
    return out


def rewrite_nsys(src: Path, dst_dir: Path, move: Move) -> Path:
    """Copy an Nsight Systems SQLite export into ``dst_dir`` with the new ``Hostname`` and its clock
    moved by the skew: the session start time when the times are relative to it, else every
    ``start`` / ``end`` / ``timestamp`` column (``--ts-normalize`` exports)."""
    out = dst_dir / src.name
    shutil.copyfile(src, out)
    conn = sqlite3.connect(out)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        cols = {t: [str(r[1]) for r in conn.execute(f'PRAGMA table_info("{t}")')] for t in tables}
        if "TARGET_INFO_SYSTEM_ENV" in cols:
            conn.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (move.host,))
        start = cols.get("TARGET_INFO_SESSION_START_TIME", [])
        has_start = (
            "utcEpochNs" in start
            and conn.execute(
                "SELECT COUNT(*) FROM TARGET_INFO_SESSION_START_TIME WHERE utcEpochNs IS NOT NULL"
            ).fetchone()[0]
        )
        normalized = _nsys_normalized(conn, cols)
        if has_start and not normalized:
            conn.execute(
                "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (move.skew_ns,)
            )
        else:
            for t, cs in cols.items():
                for c in cs:
                    if c in _NSYS_TIME_COLS:
                        conn.execute(
                            f'UPDATE "{t}" SET "{c}" = "{c}" + ? WHERE typeof("{c}") = \'integer\'',
                            (move.skew_ns,),
                        )
        conn.commit()
    finally:
        conn.close()
    return out


def _nsys_normalized(conn: sqlite3.Connection, cols: Mapping[str, list[str]]) -> bool:
    """Whether the export's times are already on the UTC epoch (``--ts-normalize``)."""
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t in cols and {"name", "value"} <= set(cols[t]):
            row = conn.execute(f"SELECT value FROM {t} WHERE name = 'EXPORT_PARAM_TIME_NORMALIZE'").fetchone()
            if row is not None:
                return str(row[0]).strip().lower() == "true"
    return False


def rewrite_trace(src: Path, dst_dir: Path, move: Move) -> Path:
    """Rewrite one trace file by its format (Kineto JSON or Nsight Systems SQLite)."""
    if src.name.endswith(_NSYS):
        return rewrite_nsys(src, dst_dir, move)
    if src.name.endswith(_KINETO):
        return rewrite_kineto(src, dst_dir, move)
    raise ValueError(f"{src}: not a Kineto JSON or Nsight Systems SQLite trace")


def is_trace(path: Path) -> bool:
    """Whether ``path`` is a trace file this module rewrites."""
    return (
        path.is_file()
        and path.name.endswith(_KINETO + _NSYS)
        and not path.name.startswith(("report.", "groundtruth"))
    )


def move_ranks(src_dir: Path, dst_dir: Path, moves: Mapping[int, Move]) -> dict[int, Path]:
    """Copy the run in ``src_dir`` to ``dst_dir`` with the ranks of ``moves`` moved (host name and
    clock) and every other file copied as it is. Returns the written trace of each moved rank.
    Raises ValueError when a rank of ``moves`` has no trace in ``src_dir``."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    done: dict[int, Path] = {}
    for p in sorted(src_dir.iterdir()):
        if not p.is_file():
            continue
        r = trace_rank(p) if is_trace(p) else None
        if r is not None and r in moves:
            done[r] = rewrite_trace(p, dst_dir, moves[r])
        elif p.resolve() != (dst_dir / p.name).resolve():
            shutil.copyfile(p, dst_dir / p.name)
    missing = sorted(set(moves) - set(done))
    if missing:
        raise ValueError(f"{src_dir}: no trace of ranks {missing}")
    return done


def rewrite_in_place(run_dir: Path, moves: Mapping[int, Move]) -> dict[int, Path]:
    """:func:`move_ranks` onto the same directory: each moved trace replaced by its rewrite (a
    renamed one's old file removed)."""
    done: dict[int, Path] = {}
    for p in sorted(run_dir.iterdir()):
        r = trace_rank(p) if is_trace(p) else None
        if r is None or r not in moves:
            continue
        tmp = run_dir / ".skew-tmp"
        tmp.mkdir(exist_ok=True)
        out = rewrite_trace(p, tmp, moves[r])
        final = run_dir / out.name
        out.replace(final)
        tmp.rmdir()
        if final != p:
            p.unlink()
        done[r] = final
    return done


def spread_over_hosts(run_dir: Path, world: int, hosts: int, skew_ns: int) -> list[dict[str, object]]:
    """Put a recorded run on ``hosts`` hosts: consecutive ranks split into ``hosts`` groups (as a
    launcher places them), group ``h`` named ``host<h>`` with a clock ``h * skew_ns`` ahead. The
    traces are rewritten in place and the placement is added to ``groundtruth.json`` (``hosts``:
    each host's ranks, its skew and the offset an aligner should find, ``-skew``). Returns it."""
    per = -(-world // hosts)
    placed: list[dict[str, object]] = []
    moves: dict[int, Move] = {}
    for h in range(hosts):
        ranks = list(range(h * per, min((h + 1) * per, world)))
        if not ranks:
            continue
        for r in ranks:
            moves[r] = Move(f"host{h}", h * skew_ns)
        placed.append({"host": f"host{h}", "ranks": ranks, "skew_ns": h * skew_ns, "offset_ns": -h * skew_ns})
    rewrite_in_place(run_dir, moves)
    gt = run_dir / "groundtruth.json"
    if gt.exists():
        truth = json.loads(gt.read_text())
        truth["hosts"] = placed
        gt.write_text(json.dumps(truth))
    return placed
