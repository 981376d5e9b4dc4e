"""Allocator events for synthetic runs: weights held all along, activations per micro-batch.

:func:`with_memory` asks the Kineto writer for ``[memory]`` instant events (``profile_memory``):
every rank holds ``weights_mb`` from the start; each forward block of a micro-batch leaves
``activation_mb`` allocated at its end and its backward frees them at its end, so the level at a
time is ``weights + activation x (forwards done whose backward has not ended)``. The events carry
``Total Allocated`` / ``Total Reserved`` (the reserve rounds the peak up to 2 MiB blocks) the way
PyTorch >= 1.10 writes them; ``totals=False`` writes only the signed ``Bytes`` of older traces.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ppdiag.model import Kind, Phase
from ppsynth.run import SynthRank, SynthRun

MIB = 1024 * 1024


def with_memory(run: SynthRun, weights_mb: float, activation_mb: float, totals: bool = True) -> SynthRun:
    """``run`` with allocator events requested (in ``run.config["memory"]``, read by the writer)."""
    run.config["memory"] = {"weights_mb": weights_mb, "activation_mb": activation_mb, "totals": totals}
    return run


def allocations(run: SynthRun, rk: SynthRank) -> list[tuple[int, int, int]]:
    """The rank's allocations and frees as ``(true time ns, signed bytes, block)`` in time order,
    ``[]`` unless :func:`with_memory` asked for them. ``block`` names what the memory holds: 0 the
    weights, ``k + 1`` the activations of the k-th (step, stage, micro-batch) block, allocated at
    its forward's end and freed at its backward's end."""
    cfg = run.config.get("memory")
    if not cfg:
        return []
    g = rk.gpu
    w = int(cfg["weights_mb"] * MIB)
    a = int(cfg["activation_mb"] * MIB)
    comp = g.kind == int(Kind.COMPUTE)
    blocks = comp & np.isin(g.phase, (int(Phase.FWD), int(Phase.BWD))) & (g.mb >= 0)
    keys = np.unique(np.stack([g.step[blocks], g.stage[blocks], g.mb[blocks]], axis=1), axis=0)
    number = {tuple(k): i + 1 for i, k in enumerate(keys.tolist())}
    out: list[tuple[int, int, int]] = []
    for phase, sign in ((Phase.FWD, 1), (Phase.BWD, -1)):
        m = comp & (g.phase == int(phase)) & (g.mb >= 0)
        if not m.any():
            continue
        # one block = the kernels of one (step, stage, micro-batch): its end is the last one's
        key = np.stack([g.step[m], g.stage[m], g.mb[m]], axis=1)
        uk, inv = np.unique(key, axis=0, return_inverse=True)
        ends = np.full(len(uk), -1, np.int64)
        np.maximum.at(ends, inv.ravel(), g.end[m])
        ids = [number[tuple(k)] for k in uk.tolist()]
        out.extend((int(t), sign * a, b) for t, b in zip(ends.tolist(), ids, strict=True))
    t0 = int(rk.step_windows[0, 0]) - 500_000 if len(rk.step_windows) else 0
    out.append((t0, w, 0))
    out.sort()
    return out


def memory_events(run: SynthRun, rk: SynthRank, off: int, fmt: Any) -> list[tuple[int, int, str]]:
    """The rank's ``[memory]`` events as the writer's ``(ts_ns, order, json)`` rows (``off`` turns a
    true-clock time into the written relative ns, ``fmt`` formats ns as Kineto's µs)."""
    out = [(t, b) for t, b, _ in allocations(run, rk)]
    if not out:
        return []
    cfg = run.config["memory"]
    level = np.cumsum([b for _, b in out])
    reserve = np.maximum.accumulate(-(-level // (2 * MIB)) * (2 * MIB))
    rows = []
    for k, ((t, b), lv, rs) in enumerate(zip(out, level.tolist(), reserve.tolist(), strict=True)):
        args: dict[str, Any] = {"Device Type": 1, "Device Id": rk.device_index, "Bytes": b}
        if cfg.get("totals", True):
            args = {"Total Reserved": rs, "Total Allocated": lv, **args, "Addr": 1 << 40, "Ev Idx": k}
        text = (
            f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": {rk.pid}, '
            f'"tid": {rk.tid}, "ts": {fmt(t + off)}, "args": {json.dumps(args)}}}'
        )
        rows.append((t + off, 9, text))
    return rows
