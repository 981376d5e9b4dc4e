"""Runs that stop: one rank stops mid-step and the others block on it, or a trace cut at a time.

:func:`stop_rank` turns a simulated run into what the profilers of a hung job record when a
watchdog flushes them: the stopped rank's trace ends at the stop; every rank that then needs it
blocks in its first point-to-point operation whose partner is never issued (NCCL's send and
receive both wait for their peer), and the blocking waits spread along the pipeline until no rank
can make progress. A blocked operation stays open until the flush, so its kernel ends there; all
later work of a blocked rank never runs. The ground truth (who waits for whom since when) comes
back beside the run.

:func:`cut_kineto` cuts one Kineto trace (a dict as written by :mod:`ppsynth.kineto` or by
PyTorch) at a time, the way a profiler flushed in the middle of a step writes it: events that
started before the cut are kept, those still running end at the cut, later ones are gone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind
from ppsynth.run import SynthRank, SynthRun

_NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Blocked:
    """Ground truth of one rank that blocks: in which operation, on which peer, since when (true
    clock, ns relative to ``SynthRun.epoch_ns``)."""

    rank: int
    kind: str  # "recv" | "send"
    peer: int
    since_ns: int


@dataclass(frozen=True)
class StopTruth:
    """What :func:`stop_rank` did: the stopped rank, its stop time, the ranks that block and the
    flush time at which every blocked operation's trace ends."""

    rank: int
    at_ns: int
    flush_ns: int
    blocked: tuple[Blocked, ...]  # one per (rank, peer, direction) with an open op, earliest first


def _p2p(rk: SynthRank, peer: int, send: bool) -> npt.NDArray[np.int64]:
    """Rows of ``rk``'s p2p kernels to (``send``) or from ``peer``, in start order."""
    g = rk.gpu
    d = Direction.SEND if send else Direction.RECV
    m = (
        (g.kind == int(Kind.P2P))
        & (g.peer == peer)
        & ((g.direction == int(d)) | (g.direction == int(Direction.BOTH)))
    )
    idx = np.flatnonzero(m)
    return idx[np.argsort(g.start[idx], kind="stable")].astype(np.int64)


def stop_rank(
    run: SynthRun, rank: int, at_ns: int, flush_after_ns: int = 100_000_000
) -> tuple[SynthRun, StopTruth]:
    """``run`` as recorded when ``rank`` stops at ``at_ns`` (true clock) and the watchdog flushes
    every profiler ``flush_after_ns`` after the stop. Raises ValueError when no rank blocks (the
    stop is after the last transfer)."""
    ranks = {rk.rank: rk for rk in run.ranks}
    if rank not in ranks:
        raise ValueError(f"no rank {rank} in the run")
    # cut[r]: work of rank r that starts at or after it never runs. A p2p kernel whose partner is
    # never issued stays open; the rank's work after the time the kernel would have ended needs
    # its data (or its completion), so the rank's cut moves there.
    cut = {r: _NEVER for r in ranks}
    cut[rank] = at_ns
    pairs: list[tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
    for s in ranks:
        for d in ranks:
            if s == d:
                continue
            si, ri = _p2p(ranks[s], d, True), _p2p(ranks[d], s, False)
            k = min(len(si), len(ri))
            if k:
                pairs.append((s, d, si[:k], ri[:k]))

    def issued(r: int, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """The partner ops of ``rows`` that complete their side: the stopped rank's ops that
        finished before the stop (one still running dies with it), another rank's that started
        before its cut."""
        g = ranks[r].gpu
        return g.end[rows] <= at_ns if r == rank else g.start[rows] < cut[r]

    changed = True
    while changed:  # cuts only move earlier, so this ends after at most one pass per rank
        changed = False
        for s, d, si, ri in pairs:
            for me, peer, mine, theirs in ((s, d, si, ri), (d, s, ri, si)):
                g = ranks[me].gpu
                alone = (g.start[mine] < cut[me]) & ~issued(peer, theirs)
                if alone.any():
                    t = int(g.end[mine[np.flatnonzero(alone)[0]]])
                    if t < cut[me]:
                        cut[me] = t
                        changed = True
    flush = at_ns + flush_after_ns
    opened: dict[int, list[int]] = {r: [] for r in ranks}
    blocked: list[Blocked] = []
    for s, d, si, ri in pairs:
        for me, peer, mine, theirs, kind in ((s, d, si, ri, "send"), (d, s, ri, si, "recv")):
            if me == rank:
                continue
            g = ranks[me].gpu
            lone = mine[(g.start[mine] < cut[me]) & ~issued(peer, theirs)]
            if len(lone):
                opened[me].extend(lone.tolist())
                blocked.append(Blocked(me, kind, peer, int(g.start[lone].min())))
    if not blocked:
        raise ValueError(f"no rank blocks on rank {rank} after t={at_ns} ns")
    out = [_cut_rank(rk, cut[rk.rank], rk.rank == rank, opened[rk.rank], flush) for rk in run.ranks]
    truth = StopTruth(rank, at_ns, flush, tuple(sorted(blocked, key=lambda b: (b.since_ns, b.rank))))
    return dataclasses.replace(run, ranks=out), truth


def _cut_rank(rk: SynthRank, cut: int, stopped: bool, opened: list[int], flush: int) -> SynthRank:
    """One rank's tables as recorded: work that started before its cut (and, on the stopped rank,
    ended before it); the open operations run until the flush."""
    if cut == _NEVER:
        return rk
    g = rk.gpu
    keep = g.end <= cut if stopped else g.start < cut
    end = g.end.copy()
    end[np.asarray(opened, dtype=np.int64)] = flush
    gpu = g.take(keep)
    gpu.end = end[keep]
    corr = gpu.correlation[gpu.correlation >= 0]
    rt = rk.runtime
    rt_keep = (rt.end <= cut) | np.isin(rt.correlation, corr)
    host = rk.host.take(rk.host.end <= cut)
    win = rk.step_windows
    done = win[:, 1] <= cut
    return dataclasses.replace(
        rk,
        gpu=gpu,
        runtime=rt.take(rt_keep),
        host=host,
        step_windows=win[done],
        step_numbers=[n for n, ok in zip(rk.step_numbers, done.tolist(), strict=True) if ok],
    )


def cut_kineto(trace: dict[str, Any], cut_us: float) -> tuple[dict[str, Any], int]:
    """A copy of a Kineto trace flushed at ``cut_us`` (the trace's own ``ts`` unit, µs): events
    that start at or after the cut are gone, complete events still running end at the cut. Returns
    the copy and how many events it dropped."""
    events = trace.get("traceEvents", [])
    kept: list[Any] = []
    dropped = 0
    for ev in events:  # a test helper on small traces: one dict per event is what the format is
        ts = ev.get("ts") if isinstance(ev, dict) else None
        if ev.get("ph") == "M" or not isinstance(ts, int | float):
            kept.append(ev)
            continue
        if float(ts) >= cut_us:
            dropped += 1
            continue
        dur = ev.get("dur")
        if isinstance(dur, int | float) and float(ts) + float(dur) > cut_us:
            ev = {
                **ev,
                "dur": type(dur)(cut_us - float(ts)) if isinstance(dur, float) else int(cut_us - float(ts)),
            }
        kept.append(ev)
    return {**trace, "traceEvents": kept}, dropped
