"""Which global rank each process of an nsys export is (NSYS.md §7).

One report per rank: the launcher environment recorded in ``META_DATA_CAPTURE`` (``RANK``,
``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``SLURM_PROCID``...), then MPI thread names
(``"MPI Rank 3"``), then the file name (``report_3``, ``rank3``). One report holding several GPU
processes (torchrun under one nsys): a process's own environment when nsys recorded it, MPI thread
names, else the order of the GPUs the processes used, else process order — no reliable rank field
exists in that case, so each decision is stated as a warning.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ppdiag.parsers.nsys_db import NsysDb

RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PALS_RANKID", "MV2_COMM_WORLD_RANK")
LOCAL_RANK_VARS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
    "PMI_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
)
WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "SLURM_NPROCS")
NODE_VARS = ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID")
# in the rank source of processes numbered by GPU order within their report (renumbered run-wide
# when several reports do so: ppdiag.parsers.report_ranks)
ORDER_MARK = "in one report"

_ENV_ROW = re.compile(r"PROCESS_(\d+):ENVIRONMENT_VARIABLE")
_PID_ROW = re.compile(r"PROCESS_(\d+):PID")
_FILE_RANK = (
    re.compile(r"(?:^|[^a-z])rank[_.-]?(\d+)(?:$|[^0-9])", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])(?:report|proc|procid|process|worker)[_.-](\d+)(?:$|[^0-9])", re.IGNORECASE),
    re.compile(r"[_.-](\d{1,5})$"),
)


@dataclass
class CaptureEnv:
    """Environment of the processes nsys launched, by launch index, plus their recorded PIDs."""

    env: dict[int, dict[str, str]] = field(default_factory=dict)
    pid: dict[int, int] = field(default_factory=dict)


def read_capture_env(db: NsysDb) -> CaptureEnv:
    out = CaptureEnv()
    for name, value in db.name_values("META_DATA_CAPTURE"):
        m = _ENV_ROW.fullmatch(name)
        if m:
            key, sep, val = value.partition("=")
            if sep:
                out.env.setdefault(int(m.group(1)), {})[key.strip()] = _unquote(val)
            continue
        m = _PID_ROW.fullmatch(name)
        if m:
            with contextlib.suppress(ValueError):
                out.pid[int(m.group(1))] = int(value)
    return out


def _unquote(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    return v


def _int_var(env: dict[str, str], names: tuple[str, ...]) -> tuple[str, int] | None:
    for n in names:
        v = env.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return n, int(v)
    return None


def rank_from_filename(path: Path) -> int | None:
    stem = path.name
    for suffix in (".sqlite", ".nsys-rep", ".qdrep", ".db"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    for pat in _FILE_RANK:
        m = pat.search(stem)
        if m:
            return int(m.group(1))
    return None


@dataclass
class RankDecision:
    rank: int
    source: str
    world_size: int | None = None
    warning: str | None = None


def decide_ranks(
    db: NsysDb,
    pids: list[int],
    devices: dict[int, list[int]],
    thread_ranks: dict[int, int],
    proc_names: dict[int, str],
) -> dict[int, RankDecision]:
    """Rank of every GPU process ``pids`` (sorted) of one export."""
    cap = read_capture_env(db)
    src = db.path
    if len(pids) == 1:
        return {pids[0]: _single(cap, pids[0], thread_ranks, src)}

    # A process's own environment when nsys recorded its pid (attach mode), else MPI thread names.
    own = _from_own_env(cap, pids)
    if own is not None:
        return own
    if all(p in thread_ranks for p in pids) and len({thread_ranks[p] for p in pids}) == len(pids):
        return {
            p: RankDecision(thread_ranks[p], f"NVTX thread name 'MPI Rank {thread_ranks[p]}'") for p in pids
        }
    return _by_order(cap, pids, devices, proc_names)


def _from_own_env(cap: CaptureEnv, pids: list[int]) -> dict[int, RankDecision] | None:
    """Ranks from each process's own recorded environment, when every process has a distinct one."""
    by_pid = {cap.pid[i]: e for i, e in cap.env.items() if cap.pid.get(i)}
    own: dict[int, tuple[str, int]] = {}
    for p in pids:
        hit = _int_var(by_pid.get(p, {}), RANK_VARS)
        if hit:
            own[p] = hit
    if len(own) != len(pids) or len({r for _, r in own.values()}) != len(pids):
        return None
    out: dict[int, RankDecision] = {}
    for p in pids:
        var, r = own[p]
        ws = _int_var(by_pid[p], WORLD_VARS)
        out[p] = RankDecision(r, f"env {var} of process {p}", ws[1] if ws else None)
    return out


def _by_order(
    cap: CaptureEnv, pids: list[int], devices: dict[int, list[int]], proc_names: dict[int, str]
) -> dict[int, RankDecision]:
    """No rank field: ranks by the order of the GPUs the processes used (else process order), offset
    by the node index of the launcher's environment, each with a warning that says so."""
    # The launcher's environment says which node this report is, not which rank each process is.
    out: dict[int, RankDecision] = {}
    launcher = cap.env.get(0, {})
    node = _int_var(launcher, NODE_VARS)
    base = node[1] * len(pids) if node else 0
    base_note = f" + {node[0]}={node[1]} × {len(pids)} processes" if node else ""
    first_dev = {p: min(devices.get(p, [0])) for p in pids}
    if len(set(first_dev.values())) == len(pids):
        order = sorted(pids, key=lambda p: (first_dev[p], p))
        how = "order of the GPU each process used"
    else:
        order = sorted(pids)
        how = "process order (the processes share GPU ids, so the GPU order cannot tell them apart)"
    for i, p in enumerate(order):
        r = base + i
        label = f"{proc_names.get(p, 'process')} pid {p}"
        out[p] = RankDecision(
            r,
            f"{how} {ORDER_MARK}{base_note}",
            warning=(
                f"{len(pids)} GPU processes in one report; {label} taken as rank {r} by "
                f"{how}{base_note} (no rank field exists for this case; pass --stage-map if wrong)"
            ),
        )
    return out


def _single(cap: CaptureEnv, pid: int, thread_ranks: dict[int, int], src: Path) -> RankDecision:
    # With one GPU process, the environment of the process nsys launched is inherited by it.
    env = next((e for i, e in sorted(cap.env.items()) if cap.pid.get(i) in (None, 0, pid)), {})
    ws_hit = _int_var(env, WORLD_VARS)
    ws = ws_hit[1] if ws_hit else None
    hit = _int_var(env, RANK_VARS)
    if hit:
        return RankDecision(hit[1], f"env {hit[0]}", ws)
    if pid in thread_ranks:
        return RankDecision(thread_ranks[pid], f"NVTX thread name 'MPI Rank {thread_ranks[pid]}'", ws)
    from_name = rank_from_filename(src)
    if from_name is not None:
        return RankDecision(
            from_name,
            "file name",
            ws,
            warning=f"rank {from_name} taken from the file name (no RANK in the capture environment)",
        )
    local = _int_var(env, LOCAL_RANK_VARS)
    if local:
        return RankDecision(
            local[1],
            f"env {local[0]} (local rank only)",
            ws,
            warning=f"only {local[0]}={local[1]} found; it is the rank on its node, not the global rank",
        )
    # -1 lets the run loader decide: rank 0 for a single file, an error for a multi-file run.
    return RankDecision(
        -1, "none found", ws, warning="no rank in the capture environment, MPI thread names or file name"
    )
