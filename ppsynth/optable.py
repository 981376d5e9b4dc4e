"""Op tables (and their Chrome-timeline form) of simulated data-parallel pipeline jobs, with truth.

:func:`simulate_optable` replays a 1F1B schedule (:func:`ppdiag.simulate.schedules.rank_orders`)
per DP replica with a cost per block, so faults that a per-stage simulator cannot express are
possible: a slow worker (one rank of one replica ``factor`` times slower), a heavy stage (one stage
slower in every replica) and per-micro-batch cost variance (each micro-batch's blocks scaled by a
log-normal factor drawn per step, replica and micro-batch: the data's sequence lengths), plus a small
timer noise per block. Every block's receive waits for its neighbour's block plus ``p2p_ms``; after
its last block each rank joins its stage's gradient reduce-scatter across replicas, which ends
``rs_ms`` after the last replica arrives; the optimizer follows. Steps start at 0 on every rank
(``start_ts`` is step-relative, as in the tables production platforms keep).

Truth (:class:`OpTableTruth`) is re-simulation with the same random draws: the mean step time, and
the step time with the slow worker at its peers' cost, with every stage at the mean stage cost
(rebalanced), and with every block at its stage's mean cost (no variance).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppdiag.simulate.schedules import F, rank_orders

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class OpTableParams:
    """A simulated job: shape, costs (ms) and faults."""

    pp: int = 4
    dp: int = 2
    microbatches: int = 8
    steps: tuple[int, ...] = (3, 5, 9, 12, 20, 23)
    fwd_ms: float = 2.0
    bwd_ratio: float = 2.0
    p2p_ms: float = 0.05
    rs_ms: float = 0.4
    optim_ms: float = 0.8
    noise: float = 0.005  # timer noise: relative spread of every block's cost
    slow_worker: tuple[int, int, float] | None = None  # (dp_rank, stage, factor)
    heavy_stage: tuple[int, float] | None = None  # (stage, factor) in every replica
    mb_cv: float = 0.0  # coefficient of variation of the per-micro-batch cost factor
    seed: int = 0
    tp: int = 1  # tensor-parallel size: the table traces TP rank 0 of every (replica, stage)

    def rank_of(self, dp: int, stage: int) -> int:
        """Global rank of TP rank 0 in Megatron's default order."""
        return (stage * self.dp + dp) * self.tp


@dataclass
class OpTableTruth:
    """Mean step times (ms) from re-simulation with the same draws."""

    step_ms: float
    no_slow_worker_ms: float
    rebalanced_ms: float
    no_variance_ms: float


def _costs(p: OpTableParams) -> F64:
    """Block costs in ms, ``[step, dp, stage, op(F=0, B=1), mb]``."""
    rng = np.random.default_rng(p.seed)
    n_s, m = len(p.steps), p.microbatches
    base = np.full((p.pp,), p.fwd_ms)
    if p.heavy_stage is not None:
        base[p.heavy_stage[0]] *= p.heavy_stage[1]
    c = np.empty((n_s, p.dp, p.pp, 2, m))
    c[:, :, :, 0, :] = base[None, None, :, None]
    c[:, :, :, 1, :] = base[None, None, :, None] * p.bwd_ratio
    if p.mb_cv > 0:
        sig = np.sqrt(np.log1p(p.mb_cv**2))
        f = rng.lognormal(-0.5 * sig * sig, sig, size=(n_s, p.dp, 1, 1, m))
        c = c * f
    c = c * (1.0 + p.noise * rng.standard_normal(c.shape))
    if p.slow_worker is not None:
        d, s, k = p.slow_worker
        c[:, d, s] *= k
    return c


def _row(
    rows: list[dict[str, Any]],
    seq: dict[tuple[int, str], int],
    d: int,
    s: int,
    rank: int,
    step: int,
    optype: str,
    t0: float,
    dur: float,
    mb_id: int,
) -> None:
    """Append one block-level op (times in ms, written in seconds); ``seq_id`` counts per optype."""
    k = seq.get((s, optype), 0)
    seq[(s, optype)] = k + 1
    rows.append(
        {
            "dp_rank": d,
            "stage": s,
            "rank": rank,
            "step": step,
            "optype": optype,
            "start_ts": t0 / 1e3,
            "duration": dur / 1e3,
            "seq_id": k,
            "mc": 0,
            "gmc": s,
            "mb_id": mb_id,
        }
    )


def _replay(p: OpTableParams, cost: F64) -> tuple[list[dict[str, Any]], F64]:
    """Rows of the op table and the step time per step (ms)."""
    orders = rank_orders("1f1b", p.pp, p.microbatches)
    rows: list[dict[str, Any]] = []
    step_ms = np.zeros(len(p.steps))
    for si, step in enumerate(p.steps):
        last_end = np.zeros((p.dp, p.pp))
        for d in range(p.dp):
            last_end[d] = _replay_replica(p, cost, orders, rows, si, step, d)
        # the stage's reduce-scatter ends when its slowest replica has arrived, plus the transfer
        rs_end = last_end.max(axis=0) + p.rs_ms
        for d in range(p.dp):
            for s in range(p.pp):
                base = {
                    "dp_rank": d,
                    "stage": s,
                    "rank": p.rank_of(d, s),
                    "step": step,
                    "mc": -1,
                    "gmc": -1,
                    "mb_id": -1,
                }
                rs = (rs_end[s] - last_end[d, s]) / 1e3
                rows.append(
                    {
                        **base,
                        "optype": "grads-reduce-scatter",
                        "start_ts": last_end[d, s] / 1e3,
                        "duration": rs,
                    }
                    | {"seq_id": 0}
                )
                t1, opt = rs_end[s] / 1e3, p.optim_ms / 1e3
                rows.append({**base, "optype": "optimizer", "start_ts": t1, "duration": opt, "seq_id": 0})
        step_ms[si] = float(rs_end.max() + p.optim_ms)
    return rows, step_ms


def _replay_replica(
    p: OpTableParams,
    cost: F64,
    orders: list[list[Any]],
    rows: list[dict[str, Any]],
    si: int,
    step: int,
    d: int,
) -> list[float]:
    """One replica's blocks of one step, appended to ``rows``; returns each stage's last end."""
    end: dict[tuple[int, int, int], float] = {}
    ptr = [0] * p.pp
    free = [0.0] * p.pp
    seq: dict[tuple[int, str], int] = {}
    done = 0
    total = sum(len(o) for o in orders)
    while done < total:  # one pass per dependency wave; every block runs exactly once
        moved = False
        for s in range(p.pp):
            rank = p.rank_of(d, s)
            while ptr[s] < len(orders[s]):
                a = orders[s][ptr[s]]
                op, mb = (0 if a.op == F else 1), a.mb
                if op == 0:
                    dep = (s - 1, 0, mb) if s > 0 else None
                else:
                    dep = (s + 1, 1, mb) if s < p.pp - 1 else (s, 0, mb)
                if dep is not None and dep not in end:
                    break
                start = free[s]
                what = "forward" if op == 0 else "backward"
                if dep is not None and dep[0] != s:
                    # the receive ends when the data is there (at least 1 µs when it already is),
                    # and the block computes after it
                    recv = max(end[dep] + p.p2p_ms - start, 0.001)
                    _row(rows, seq, d, s, rank, step, f"{what}-recv", start, recv, mb)
                    start += recv
                dur = float(cost[si, d, s, op, mb])
                _row(rows, seq, d, s, rank, step, f"{what}-compute", start, dur, mb)
                end[(s, op, mb)] = start + dur
                free[s] = start + dur
                if (op == 0 and s < p.pp - 1) or (op == 1 and s > 0):
                    _row(rows, seq, d, s, rank, step, f"{what}-send", start + dur, p.p2p_ms, mb)
                ptr[s] += 1
                done += 1
                moved = True
        if not moved:
            raise RuntimeError("schedule deadlock")
    return free


def simulate_optable(p: OpTableParams) -> tuple[pd.DataFrame, OpTableTruth]:
    """The op table of ``p`` (one row per op, all ranks) and its truth."""
    cost = _costs(p)
    rows, step = _replay(p, cost)
    df = pd.DataFrame(rows)
    no_slow = cost.copy()
    if p.slow_worker is not None:
        d, s, k = p.slow_worker
        no_slow[:, d, s] /= k
    _, step_ns = _replay(p, no_slow)
    # rebalanced: every stage at the mean stage cost (the same total compute per replica)
    reb = cost * (cost.sum(axis=(2, 4), keepdims=True) / p.pp / cost.sum(axis=4, keepdims=True))
    _, step_rb = _replay(p, reb)
    mean_blk = np.broadcast_to(cost.mean(axis=(0, 1, 4), keepdims=True), cost.shape).copy()
    _, step_nv = _replay(p, mean_blk)
    return df, OpTableTruth(
        float(step.mean()), float(step_ns.mean()), float(step_rb.mean()), float(step_nv.mean())
    )


def write_table(df: pd.DataFrame, path: Path) -> Path:
    """Write an op table as CSV (``.csv``), JSON Lines (``.jsonl``) or Parquet (``.parquet``)."""
    path = Path(path)
    if path.suffix == ".csv":
        df.to_csv(path, index=False, float_format="%.9g")
    elif path.suffix == ".jsonl":
        df.to_json(path, orient="records", lines=True, double_precision=12)
    elif path.suffix == ".parquet":
        out = df.copy()
        out["start_ts"] = out["start_ts"].astype(np.float32)
        out["duration"] = out["duration"].astype(np.float32)
        out.to_parquet(path, index=False)
    else:
        raise ValueError(f"unknown op table suffix {path.suffix!r}")
    return path


_LANE_OF = {
    "forward-compute": "compute",
    "backward-compute": "compute",
    "optimizer": "compute",
    "forward-send": "pp-comm",
    "forward-recv": "pp-comm",
    "backward-send": "pp-comm",
    "backward-recv": "pp-comm",
    "grads-reduce-scatter": "dp-comm",
}
_LANES = ("compute", "pp-comm", "dp-comm", "misc")


def write_chrome(
    df: pd.DataFrame,
    path: Path,
    gz: bool = False,
    meta: str = "first",
    relative: bool = False,
    rank_tids: bool = False,
    transfer_ms: float | None = None,
) -> Path:
    """Write the table as a Chrome/Perfetto JSON array: steps side by side on one µs clock.

    ``meta``: where the ``thread_name`` / ``process_name`` metadata goes (``first``, ``last``,
    ``middle`` or ``none``); ``relative``: every step's times from its own start (no laying);
    ``rank_tids``: lanes numbered ``rank * lanes + i`` (the global rank in the lane id) instead of
    ``stage * 10 + i``; ``transfer_ms``: every send, receive and collective drawn as its last
    ``transfer_ms`` only (the wait for its peers cut out, as some writers draw them).
    """
    if transfer_ms is not None:
        df = df.copy()
        comm = df["optype"].map(_LANE_OF).isin(("pp-comm", "dp-comm"))
        cut = np.minimum(df["duration"], transfer_ms / 1e3)
        df.loc[comm, "start_ts"] = (df["start_ts"] + df["duration"] - cut)[comm]
        df.loc[comm, "duration"] = cut[comm]
    spans = (df["start_ts"] + df["duration"]).groupby(df["step"]).max()
    # the same gap between steps as the table reader lays them with (a 20th of the step, >= 1 ms):
    # both forms of one run are then the same timeline
    gaps = np.maximum(np.floor(spans * 1e9 / 20) / 1e9, 0.001)
    offs = (spans + gaps).cumsum().shift(fill_value=0.0)
    ts = (df["start_ts"] + (0.0 if relative else df["step"].map(offs))) * 1e6
    lane = df["optype"].map(_LANE_OF).fillna("misc")
    base = df["rank"] * len(_LANES) if rank_tids else df["stage"] * 10
    tid = base + lane.map({n: i for i, n in enumerate(_LANES)})
    meta_events = _lane_meta(df, rank_tids)
    events: list[dict[str, Any]] = list(meta_events) if meta == "first" else []
    for name, pid, t, t0, dur, step, mc, mb, sq in zip(
        df["optype"],
        df["dp_rank"],
        tid,
        ts,
        df["duration"],
        df["step"],
        df["mc"],
        df["mb_id"],
        df["seq_id"],
        strict=True,
    ):
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": name,
                "pid": int(pid),
                "tid": int(t),
                "ts": round(float(t0), 3),
                "dur": round(float(dur) * 1e6, 3),
                "args": {"step": int(step), "model_chunk": int(mc), "mb_id": int(mb), "seq_id": int(sq)},
            }
        )
    if meta == "last":
        events.extend(meta_events)
    elif meta == "middle":
        events[len(events) // 2 : len(events) // 2] = meta_events
    data = json.dumps(events).encode()
    path = Path(path)
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def _lane_meta(df: pd.DataFrame, rank_tids: bool) -> list[dict[str, Any]]:
    """The ``process_name`` and ``thread_name`` metadata events of the timeline form."""
    out: list[dict[str, Any]] = []
    place = df[["dp_rank", "stage", "rank"]].drop_duplicates().sort_values(["dp_rank", "stage"])
    for d in sorted(df["dp_rank"].unique()):
        out.append({"ph": "M", "name": "process_name", "pid": int(d), "args": {"name": f"DP rank [{d}]"}})
        mine = place[place["dp_rank"] == d]
        for s, r in zip(mine["stage"], mine["rank"], strict=True):
            for i, ln in enumerate(_LANES):
                tid = int(r) * len(_LANES) + i if rank_tids else int(s) * 10 + i
                out.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": int(d),
                        "tid": tid,
                        "args": {"name": f"PP rank {s}, TP rank 0, {ln}"},
                    }
                )
    return out


__all__ = ["OpTableParams", "OpTableTruth", "simulate_optable", "write_chrome", "write_table"]
