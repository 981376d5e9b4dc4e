"""Metamorphic relations: rewrites of a run's input files that must leave its diagnosis unchanged.

Each relation copies the input files into a new folder and rewrites them (event order, key order
and whitespace, compression, file names, rank numbers, an added replica / process / step); the
test diagnoses both and compares what :class:`Sig` holds. They need no ground truth: a relation
that fails is a defect of the reader (or of what it lets through), whatever the input.
"""

from __future__ import annotations

import bz2
import gzip
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ppdiag.report_types import Report

# the relations, by name
ORDER = "order"  # events in another order, metadata last
KEYS = "keys"  # keys reordered, whitespace compacted
COMPRESSION = "compression"  # compressed / decompressed
NAMES = "names"  # file names made opaque
RENUMBER = "renumber"  # ranks renumbered consistently
REPLICA = "replica"  # a DP replica duplicated
UNRELATED = "unrelated"  # a data-loader process and a profiler thread added
REPEAT = "repeat"  # a step repeated
RELATIONS = (ORDER, KEYS, COMPRESSION, NAMES, RENUMBER, REPLICA, UNRELATED, REPEAT)


@dataclass(frozen=True)
class Sig:
    """What a relation must keep: structure, findings (codes and ranks) and the time split."""

    pp: int
    stage_map: dict[int, int]
    schedule: str
    microbatches: int | None
    findings: frozenset[tuple[str, tuple[int, ...]]]
    step_ms: float
    lost_ms: dict[str, float]
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)
    stages: dict[int, dict[str, float]] = field(default_factory=dict)
    stage_of: dict[int, int | None] = field(default_factory=dict)


def sig_of(rep: Report) -> Sig:
    """The signature of one report; per-rank and per-stage rows hold compute and every cause."""
    s = rep.summary
    return Sig(
        pp=rep.run.pp,
        stage_map={int(k): int(v) for k, v in rep.run.stage_map.items()},
        schedule=rep.run.schedule,
        microbatches=rep.run.microbatches,
        findings=frozenset((f.code, tuple(sorted(f.ranks))) for f in rep.findings),
        step_ms=float(s.step_mean_ms or s.step_ms or 0.0),
        lost_ms=dict(s.lost_ms),
        ranks={r.rank: {"compute": r.compute_ms, **r.lost_ms} for r in rep.ranks},
        stages={st.stage: {"compute": st.compute_ms or 0.0, **st.lost_ms} for st in rep.stages},
        stage_of={r.rank: r.stage for r in rep.ranks},
    )


def differences(
    a: Sig, b: Sig, tol: float = 0.015, perm: dict[int, int] | None = None, per_rank: bool = True
) -> list[str]:
    """Where ``b`` (the rewritten input's) differs from ``a``: structure, findings and ranks named
    through ``perm`` (old rank -> new), and every time within ``tol`` of the step."""
    p = perm or {}

    def m(r: int) -> int:
        return p.get(r, r)

    out: list[str] = []
    for key in ("pp", "schedule", "microbatches"):
        if getattr(a, key) != getattr(b, key):
            out.append(f"{key}: {getattr(a, key)} -> {getattr(b, key)}")
    # the stage map names one rank per stage (the first replica's): renumbered, the stage of
    # every rank is what must stay
    if perm is None and a.stage_map != b.stage_map:
        out.append(f"stage_map: {a.stage_map} -> {b.stage_map}")
    if per_rank and {m(r): s for r, s in a.stage_of.items()} != b.stage_of:
        out.append(f"stage of each rank: {a.stage_of} -> {b.stage_of}")
    want = {(c, tuple(sorted(m(r) for r in rs))) for c, rs in a.findings}
    if per_rank and want != set(b.findings):
        out.append(f"findings: {sorted(want)} -> {sorted(b.findings)}")
    if not per_rank and {c for c, _ in want} != {c for c, _ in b.findings}:
        # ranks added (a copied replica): the findings' codes stay, their rank lists may grow
        out.append(f"finding codes: {sorted(want)} -> {sorted(b.findings)}")
    lim = tol * max(a.step_ms, 1e-9)
    if abs(a.step_ms - b.step_ms) > lim:
        out.append(f"step: {a.step_ms:.3f} -> {b.step_ms:.3f} ms")
    out += _times("summary", a.lost_ms, b.lost_ms, lim)
    if per_rank:
        if {m(r) for r in a.ranks} != set(b.ranks):
            out.append(f"ranks: {sorted(a.ranks)} -> {sorted(b.ranks)}")
        for r, row in a.ranks.items():
            out += _times(f"rank {r}", row, b.ranks.get(m(r), {}), lim)
    for s, row in a.stages.items():
        out += _times(f"stage {s}", row, b.stages.get(s, {}), lim)
    return out


def _times(where: str, a: dict[str, float], b: dict[str, float], lim: float) -> list[str]:
    return [
        f"{where} {k}: {a.get(k, 0.0):.3f} -> {b.get(k, 0.0):.3f} ms"
        for k in sorted(set(a) | set(b))
        if abs(a.get(k, 0.0) - b.get(k, 0.0)) > lim
    ]


# ---- file helpers -------------------------------------------------------------------------------


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when gzip or bzip2."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:3] == b"BZh":
        return bz2.decompress(raw)
    return raw


def _gz(path: Path) -> bool:
    return path.read_bytes()[:2] == b"\x1f\x8b"


def write_like(src: Path, dst: Path, data: bytes) -> Path:
    """``data`` written to ``dst``, gzipped when ``src`` was."""
    dst.write_bytes(gzip.compress(data, 1) if _gz(src) else data)
    return dst


def inputs_of(paths: list[Path]) -> list[Path]:
    """The files of ``paths`` (a run directory's files, sorted)."""
    out: list[Path] = []
    for p in paths:
        out += sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    return out


Rewrite = Callable[[list[Path], Path], list[Path]]


def per_file(fn: Callable[[Path, Path], Path]) -> Rewrite:
    """A rewrite of a whole input from a rewrite of one file into a folder."""

    def run(paths: list[Path], out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        for f in inputs_of(paths):
            fn(f, out)
        return [out]

    return run


# ---- Chrome / Kineto JSON -----------------------------------------------------------------------


def _events(obj: Any) -> list[dict[str, Any]]:
    return obj if isinstance(obj, list) else obj.get("traceEvents", [])


def _with_events(obj: Any, events: list[dict[str, Any]]) -> Any:
    if isinstance(obj, list):
        return events
    obj["traceEvents"] = events
    return obj


def json_order(f: Path, out: Path) -> Path:
    """Events reversed, metadata (``ph: M``) moved to the end."""
    obj = json.loads(read_bytes(f))
    ev = _events(obj)
    meta = [e for e in ev if e.get("ph") == "M"]
    rest = [e for e in reversed(ev) if e.get("ph") != "M"]
    return write_like(f, out / f.name, json.dumps(_with_events(obj, rest + meta)).encode())


def _reverse_keys(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _reverse_keys(x[k]) for k in reversed(list(x))}
    if isinstance(x, list):
        return [_reverse_keys(v) for v in x]
    return x


def json_keys(f: Path, out: Path) -> Path:
    """Every object's keys in reverse order, no whitespace."""
    obj = _reverse_keys(json.loads(read_bytes(f)))
    return write_like(f, out / f.name, json.dumps(obj, separators=(",", ":")).encode())


def compression(f: Path, out: Path) -> Path:
    """gzip undone (``x.json.gz`` -> ``x.json``), or plain data bzip2-compressed under its own name."""
    raw = f.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        name = f.name[:-3] if f.name.endswith(".gz") else f.name
        (out / name).write_bytes(gzip.decompress(raw))
        return out / name
    (out / f.name).write_bytes(bz2.compress(raw, 1))
    return out / f.name


def opaque_names(paths: list[Path], out: Path) -> list[Path]:
    """Every file copied under a name that says nothing (``f0.json``), its kind of suffix kept."""
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(inputs_of(paths)):
        suffix = "".join(s for s in f.suffixes[-2:] if s in (".json", ".gz", ".sqlite", ".csv", ".parquet"))
        shutil.copy(f, out / f"f{i}{suffix or f.suffix}")
    return [out]


def kineto_unrelated(f: Path, out: Path) -> Path:
    """A data-loader process (its own pid, CPU ops) and a profiler thread in the traced process."""
    obj = json.loads(read_bytes(f))
    ev = _events(obj)
    xs = [e for e in ev if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    t0 = min(float(e["ts"]) for e in xs)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in xs)
    pid = next((e["pid"] for e in xs if e.get("cat") in ("cpu_op", "user_annotation")), xs[0]["pid"])
    add: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 987654, "tid": 0, "args": {"name": "pt_data_worker"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 424242, "args": {"name": "profiler_flush"}},
    ]
    for k in range(20):
        ts = t0 + (t1 - t0) * k / 20
        add.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::copy_",
                "pid": 987654,
                "tid": 1,
                "ts": ts,
                "dur": (t1 - t0) / 50,
                "args": {},
            }
        )
        add.append(
            {
                "ph": "X",
                "cat": "python_function",
                "name": "threading.py(1016): _bootstrap",
                "pid": pid,
                "tid": 424242,
                "ts": ts,
                "dur": (t1 - t0) / 60,
                "args": {},
            }
        )
    return write_like(f, out / f.name, json.dumps(_with_events(obj, ev + add)).encode())


def kineto_renumber(perm: dict[int, int]) -> Callable[[Path, Path], Path]:
    """Ranks renumbered by ``perm`` wherever a Kineto trace states one: ``distributedInfo.rank``,
    the process groups' rank lists (sorted, as torch lists them) and the p2p peers of the default
    group; the file gets an opaque name (a file name that says ``rank0`` would contradict the new
    number). Runs whose groups are not the whole world need their group-relative ranks mapped too,
    which this does not do."""

    def m(r: Any) -> Any:
        return perm.get(int(r), int(r)) if isinstance(r, int) or (isinstance(r, str) and r.isdigit()) else r

    def fn(f: Path, out: Path) -> Path:
        obj = json.loads(read_bytes(f))
        di = obj.get("distributedInfo") or {}
        old = int(di.get("rank", 0))
        di["rank"] = perm.get(old, old)
        pgs = di.get("pg_config") or []
        for pg in pgs.values() if isinstance(pgs, dict) else pgs:
            if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
                # torch lists a group's ranks sorted, whatever order they were created in
                pg["ranks"] = sorted(m(r) for r in pg["ranks"])
        for e in obj.get("traceEvents", []):
            a = e.get("args")
            if isinstance(a, dict):
                for k in ("Src Rank", "Dst Rank", "Rank"):
                    if k in a:
                        a[k] = m(a[k])
                ci = a.get("Concrete Inputs")
                p2p = str(e.get("name", "")).startswith(("c10d::send", "c10d::recv"))
                if p2p and isinstance(ci, list) and len(ci) > 2:
                    # the peer's rank in the (default, sorted) group: its global rank there
                    ci[2] = str(m(ci[2]))
        name = f"n{di['rank']}x" + ("".join(f.suffixes[-2:]) if f.name.endswith(".gz") else ".json")
        return write_like(f, out / name, json.dumps(obj).encode())

    return fn


# ---- op tables ----------------------------------------------------------------------------------


def table_rewrite(fn: Callable[[pd.DataFrame], pd.DataFrame], suffix: str = ".csv") -> Rewrite:
    """A rewrite of an op table (CSV) through a function of its rows."""

    def run(paths: list[Path], out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        (f,) = inputs_of(paths)
        df = fn(pd.read_csv(f))
        dst = out / f"ops{suffix}"
        df.to_csv(dst, index=False, float_format="%.9g")
        return [dst]

    return run


def shuffle_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df.sample(frac=1.0, random_state=7).reset_index(drop=True)


def reverse_columns(df: pd.DataFrame) -> pd.DataFrame:
    return df[list(reversed(df.columns))]


def renumber_ranks(perm: dict[int, int]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def fn(df: pd.DataFrame) -> pd.DataFrame:
        out = df.copy()
        out["rank"] = out["rank"].map(lambda r: perm.get(int(r), int(r)))
        return out

    return fn


def duplicate_replica(df: pd.DataFrame) -> pd.DataFrame:
    """Replica 0's rows again as a new replica, its ranks numbered after the last rank."""
    rep = df[df["dp_rank"] == 0].copy()
    ranks = sorted(rep["rank"].unique())
    top = int(df["rank"].max()) + 1
    rep["rank"] = rep["rank"].map({r: top + i for i, r in enumerate(ranks)})
    rep["dp_rank"] = int(df["dp_rank"].max()) + 1
    return pd.concat([df, rep], ignore_index=True)


def repeat_steps(times: int) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """Every step's rows again ``times - 1`` times under new step numbers (after the last)."""

    def fn(df: pd.DataFrame) -> pd.DataFrame:
        top = int(df["step"].max())
        parts = [df]
        for k in range(1, times):
            c = df.copy()
            c["step"] = c["step"] + k * (top + 1)
            parts.append(c)
        return pd.concat(parts, ignore_index=True)

    return fn
