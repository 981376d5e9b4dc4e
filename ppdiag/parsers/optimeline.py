"""The Chrome / Perfetto form of an op timeline, read as it comes: a parser of its own (the run
format it reports is the op table's, whose data it carries; :mod:`ppdiag.parsers.optable`).

A JSON array (optionally gzipped) of ``ph: "X"`` events, ``name`` = optype, ``ts`` / ``dur`` in µs,
``args: {step, model_chunk, mb_id, seq_id}``; ``pid`` is the DP rank and each ``tid`` a lane that
``thread_name`` metadata names ``"PP rank s, TP rank t, <lane>"``. What real files vary in, and how
each is read:

* **where the metadata sits**: first, last (production writers append it), in the middle, or
  nowhere. The format is told by the events' shape (``args.step`` with ``mb_id`` / ``model_chunk``),
  the whole array is decoded before any lane is looked up. Without lane names every lane that
  runs forward / backward blocks is one rank, the lanes after it (by ``tid``) are its other lanes,
  and the stages of a replica are ordered by when each rank's first forward block starts (stage
  ``s`` waits for the activations of stage ``s - 1``); tensor-parallel lanes cannot be told apart.
* **the clock**: one run-wide clock (steps one after the other) or step-relative times (every
  step's window starts near 0, so the windows overlap); the latter are laid side by side like the
  table form's ``start_ts``.
* **the global rank**: writers that number each rank's lanes ``tid = rank * lanes + i`` name it;
  it is taken when every rank's lanes form such a block and the numbers follow Megatron's default
  order ``rank = (stage * D + dp) * T + tp`` for one ``T`` (so a table that traces one TP rank per
  stage keeps its ranks 0, 4, 8 ...); else ranks are numbered in that order with ``T`` the TP lanes
  seen.
* **communication drawn as its transfer only**: the waits are put back
  (:mod:`ppdiag.parsers.optable_waits`).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.io import qpath
from ppdiag.model import RankTimeline
from ppdiag.parsers import ParseOptions, register
from ppdiag.parsers.heap import trim_heap
from ppdiag.parsers.optable_ranks import resolution_ns, to_ranks, world_of
from ppdiag.parsers.optable_waits import restore_waits, waits_cut

if TYPE_CHECKING:
    import pandas as pd

_LANE = re.compile(r"PP\s*rank\s*(\d+)\s*,\s*TP\s*rank\s*(\d+)\s*,\s*([\w-]+)", re.IGNORECASE)
_DP = re.compile(r"DP\s*rank\s*\[?\s*(\d+)", re.IGNORECASE)
_BLOCKS = ("forward-compute", "backward-compute")
_I64 = npt.NDArray[np.int64]


def sniff_chrome(head: bytes) -> bool:
    """True for the head of a JSON array of op events: lane names, or (metadata last or absent)
    complete events whose args carry a step and a micro-batch or model chunk."""
    h = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not h.startswith(b"[") or b'"ph"' not in h:
        return False
    if (b"PP rank" in h or b"DP rank" in h) and b'"thread_name"' in h:
        return True
    return b'"args"' in h and b'"step"' in h and (b'"mb_id"' in h or b'"model_chunk"' in h)


class _Args(msgspec.Struct):
    """The ``args`` fields the timeline form carries (``name`` for metadata events); writers put
    ``null`` where a field does not apply (the chunk of a collective)."""

    step: int | None = None
    model_chunk: int | None = None
    mb_id: int | None = None
    seq_id: int | None = None
    name: str = ""


class _Event(msgspec.Struct):
    """One Chrome trace event, only the fields read here."""

    ph: str = ""
    name: str = ""
    pid: int = -1
    tid: int = -1
    ts: float = 0.0
    dur: float = 0.0
    args: _Args | None = None


_NO_ARGS = _Args()


def _ints(values: list[int | None]) -> _I64:
    return np.fromiter((-1 if v is None else v for v in values), np.int64, len(values))


def _decode_events(data: bytes, src: str) -> pd.DataFrame:
    """The events as columns (typed decode: far faster than json + a frame of dicts)."""
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    try:
        events = msgspec.json.decode(data, type=list[_Event])
    except msgspec.ValidationError as exc:
        raise InputError(src, f"timeline events do not have the expected fields ({str(exc)[:200]})") from None
    except msgspec.DecodeError as exc:
        raise InputError(src, f"cannot read the timeline JSON ({str(exc)[:200]})") from None
    if not events:
        raise InputError(src, "timeline JSON is not a non-empty array of events")
    args = [e.args or _NO_ARGS for e in events]
    n = len(events)
    return pd.DataFrame(
        {
            "ph": [e.ph for e in events],
            "name": [e.name for e in events],
            "pid": np.fromiter((e.pid for e in events), np.int64, n),
            "tid": np.fromiter((e.tid for e in events), np.int64, n),
            "ts": np.fromiter((e.ts for e in events), np.float64, n),
            "dur": np.fromiter((e.dur for e in events), np.float64, n),
            "a_step": _ints([x.step for x in args]),
            "a_mc": _ints([x.model_chunk for x in args]),
            "a_mb": _ints([x.mb_id for x in args]),
            "a_seq": _ints([x.seq_id for x in args]),
            "a_name": [x.name for x in args],
        }
    )


class _Lanes:
    """Where each lane sits: ``(pid, tid) -> (stage, tp)``, the DP rank of each pid, and the global
    rank of each lane when the lane ids name it."""

    def __init__(self) -> None:
        self.place: dict[tuple[int, int], tuple[int, int]] = {}
        self.dp_of: dict[int, int] = {}
        self.rank_of: dict[tuple[int, int], int] = {}


def _named_lanes(ev: pd.DataFrame) -> _Lanes:
    """Lanes from the ``thread_name`` / ``process_name`` metadata, wherever it sits in the array."""
    out = _Lanes()
    meta = ev[ev["ph"] == "M"]
    lanes = meta[meta["name"] == "thread_name"]
    for pid, tid, name in zip(lanes["pid"], lanes["tid"], lanes["a_name"], strict=True):
        m = _LANE.search(name)
        if m:
            out.place[(int(pid), int(tid))] = (int(m.group(1)), int(m.group(2)))
    procs = meta[meta["name"] == "process_name"]
    for pid, name in zip(procs["pid"], procs["a_name"], strict=True):
        m = _DP.search(name)
        if m:
            out.dp_of[int(pid)] = int(m.group(1))
    out.rank_of = _tid_ranks(out)
    return out


def _tid_ranks(lanes: _Lanes) -> dict[tuple[int, int], int]:
    """Global ranks the lane ids name (``tid = rank * L + i``), when they follow Megatron's order."""
    workers: dict[tuple[int, int, int], list[int]] = {}
    for (pid, tid), (st, t) in lanes.place.items():
        workers.setdefault((pid, st, t), []).append(tid)
    sizes = {len(v) for v in workers.values()}
    if len(workers) < 2 or len(sizes) != 1:
        return {}
    size = sizes.pop()
    first = {w: min(v) for w, v in workers.items()}
    if any(max(v) - first[w] + 1 != size or first[w] % size for w, v in workers.items()):
        return {}
    keys = list(workers)
    k = np.array([first[w] // size for w in keys], dtype=np.int64)
    s = np.array([w[1] for w in keys], dtype=np.int64)
    tp = np.array([w[2] for w in keys], dtype=np.int64)
    dp = np.array([lanes.dp_of.get(w[0], w[0]) for w in keys], dtype=np.int64)
    if np.unique(k).size != k.size or (dp < 0).any():
        return {}
    t_size, _ = world_of(k, dp, s, int(s.max()) + 1)
    if not t_size or bool(np.any(k % t_size != tp)):
        return {}
    by_worker = dict(zip(keys, k.tolist(), strict=True))
    return {(pid, tid): by_worker[(pid, *lanes.place[(pid, tid)])] for pid, tid in lanes.place}


def _inferred_lanes(x: pd.DataFrame, warnings: list[str]) -> _Lanes:
    """Lanes of a timeline without lane names: each lane with forward / backward blocks is a rank,
    the lanes numbered after it belong to it, and a replica's ranks are ordered into stages by
    when their first forward block of each step starts (median over the steps). Vectorized over
    all replicas (group-bys and sorted searches; one dict entry per lane)."""
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    out = _Lanes()
    blocks = x[x["name"].isin(_BLOCKS)]
    if not len(blocks):
        return out
    # the compute lanes (one per rank), sorted by (pid, tid)
    comp = blocks[["pid", "tid"]].drop_duplicates().sort_values(["pid", "tid"])
    c_pid, c_tid = comp["pid"].to_numpy(np.int64), comp["tid"].to_numpy(np.int64)
    # each rank's first forward of a step, relative to its replica's first op of that step
    fwd = x[(x["name"] == _BLOCKS[0]) & (x["a_mc"] <= 0)]
    step_lo = x.groupby(["pid", "a_step"])["ts"].min()
    first = fwd.groupby(["pid", "tid", "a_step"])["ts"].min()
    lo = step_lo.reindex(
        pd.MultiIndex.from_arrays([first.index.get_level_values(0), first.index.get_level_values(2)])
    )
    key = (first - lo.to_numpy()).groupby(level=[0, 1]).median()
    when = key.reindex(pd.MultiIndex.from_arrays([c_pid, c_tid])).fillna(np.inf).to_numpy()
    order = np.lexsort((c_tid, when, c_pid))
    stage = np.empty(c_pid.size, dtype=np.int64)
    sp = c_pid[order]
    starts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    stage[order] = np.arange(sp.size) - np.repeat(starts, np.diff(np.r_[starts, sp.size]))
    # every lane belongs to the compute lane at or before it in its pid (the first one if none)
    lanes = x[["pid", "tid"]].drop_duplicates()
    l_pid, l_tid = lanes["pid"].to_numpy(np.int64), lanes["tid"].to_numpy(np.int64)
    span = int(max(c_tid.max(), l_tid.max()) - min(c_tid.min(), l_tid.min())) + 1
    base = int(min(c_tid.min(), l_tid.min()))
    c_key = c_pid * span + (c_tid - base)
    at = np.searchsorted(c_key, l_pid * span + (l_tid - base), side="right") - 1
    first_of_pid = np.searchsorted(c_pid, l_pid, side="left")
    own = np.where((at >= 0) & (c_pid[np.clip(at, 0, None)] == l_pid), at, first_of_pid)
    has = (own < c_pid.size) & (c_pid[np.clip(own, 0, c_pid.size - 1)] == l_pid)
    st = stage[np.clip(own, 0, c_pid.size - 1)]
    out.place = {(int(p), int(t)): (int(v), 0) for p, t, v, h in zip(l_pid, l_tid, st, has, strict=True) if h}
    warnings.append(
        "timeline has no 'PP rank s, TP rank t' lane names: each lane with forward/backward blocks "
        "taken as one rank, a replica's stages ordered by when their first forward starts "
        "(tensor-parallel ranks cannot be told apart)"
    )
    return out


def _step_relative(step: _I64, t0: _I64, t1: _I64) -> bool:
    """True when the steps' windows overlap (each starts near 0: step-relative times), false for
    steps one after the other on one clock."""
    steps, inv = np.unique(step, return_inverse=True)
    if steps.size < 2:
        return False
    lo = np.full(steps.size, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(steps.size, dtype=np.int64)
    np.minimum.at(lo, inv, t0)
    np.maximum.at(hi, inv, t1)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    overlap = np.minimum(hi[:-1], hi[1:]) - lo[1:]
    shorter = np.minimum(hi[:-1] - lo[:-1], hi[1:] - lo[1:])
    return int(np.sum(overlap > shorter // 2)) * 2 > steps.size - 1


def read_chrome(path: Path, src: str, warnings: list[str]) -> tuple[pd.DataFrame, float, bool, str]:
    """(op rows, the times' resolution in ns, whether the rows lie on one clock already, where the
    ranks come from)."""
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    try:
        data = _read_all(path)
    except (OSError, EOFError, ValueError) as exc:
        raise InputError(src, f"cannot read the timeline JSON ({str(exc)[:200]})") from None
    ev = _decode_events(data, src)
    x = ev[ev["ph"] == "X"]
    if not len(x):
        raise InputError(src, "timeline has no complete ('ph': 'X') events")
    if bool((x["a_step"] < 0).all()):
        raise InputError(src, "timeline events carry no args.step")
    lanes = _named_lanes(ev)
    if not lanes.place:
        lanes = _inferred_lanes(x, warnings)
    if not lanes.place:
        raise InputError(src, "timeline has no 'PP rank s, TP rank t, ...' thread_name lanes")
    pid = x["pid"].to_numpy(np.int64)
    key = pd.MultiIndex.from_arrays([pid, x["tid"].to_numpy(np.int64)])
    pos = pd.MultiIndex.from_tuples(list(lanes.place)).get_indexer(key)
    no_lane = pos < 0
    if no_lane.all():
        raise InputError(src, "timeline has no 'PP rank s, TP rank t, ...' thread_name lanes")
    if no_lane.any():
        warnings.append(f"{int(no_lane.sum())} events on lanes without a 'PP rank s, TP rank t' name dropped")
    x, pid, pos = x[~no_lane], pid[~no_lane], pos[~no_lane]
    lane_vals = np.array(list(lanes.place.values()), dtype=np.int64)
    stage, tp = lane_vals[pos, 0], lane_vals[pos, 1]
    dp = pd.Series(pid).map(lanes.dp_of).fillna(pd.Series(pid)).to_numpy(np.int64)
    n_dp, n_pp, n_tp = int(dp.max()) + 1, int(stage.max()) + 1, int(tp.max()) + 1
    rank_source = "lane ids (Megatron order)"
    if lanes.rank_of:
        rank = np.array([lanes.rank_of[k] for k in lanes.place], dtype=np.int64)[pos]
    else:
        rank_source = "Megatron order from (dp, pp, tp)"
        rank = (stage * n_dp + dp) * n_tp + tp
        warnings.append(
            "timeline form names no global ranks: numbered in Megatron's default order "
            "rank = (pp * dp_size + dp) * tp_size + tp"
        )
    mc = x["a_mc"].to_numpy(np.int64)
    # virtual stage of chunk c on stage s with the interleaved placement: c * pp + s
    gmc = np.where(mc >= 0, mc * n_pp + stage, -1)
    if (mc <= 0).all():
        gmc = np.where(mc >= 0, stage, -1)
    res = max(resolution_ns(x["ts"].to_numpy(), 1e3), resolution_ns(x["dur"].to_numpy(), 1e3))
    t0 = np.rint(x["ts"].to_numpy(np.float64) * 1e3).astype(np.int64)
    dur = np.rint(x["dur"].to_numpy(np.float64) * 1e3).astype(np.int64)
    step = x["a_step"].to_numpy(np.int64)
    relative = _step_relative(step, t0, t0 + dur)
    if relative:
        warnings.append(
            "timeline times are step-relative (the steps' windows overlap): steps laid side by side"
        )
    out = pd.DataFrame(
        {
            "dp_rank": dp,
            "stage": stage,
            "rank": rank,
            "step": step,
            # a code per row, not a string object per row (as the op table's reader)
            "optype": pd.Categorical(x["name"].astype(str)),
            "t0": t0,
            "dur": dur,
            "seq_id": x["a_seq"].to_numpy(np.int64),
            "mc": mc,
            "gmc": gmc,
            "mb_id": x["a_mb"].to_numpy(np.int64),
        }
    )
    if waits_cut(out):
        out = restore_waits(out, warnings)
    return out, res, not relative, rank_source


def _read_all(path: Path) -> bytes:
    """The whole file, decompressed by its bytes (gzip, bzip2, xz; zstd with ``zstandard``)."""
    import bz2
    import lzma

    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        return gzip.decompress(raw)
    if raw[:3] == b"BZh":
        return bz2.decompress(raw)
    if raw[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(raw)
    if raw[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    return raw


class OpTimelineParser:
    """Chrome / Perfetto op timelines: a JSON array of op events, every rank in one file."""

    name = "optimeline"
    format = "optable"  # an op table's rows in another form: the same run format in the report
    suffixes: tuple[str, ...] = (".json", ".json.gz")
    describe = "a Chrome op timeline (*.json)"
    holds_every_rank = True

    def sniff(self, path: Path, head: bytes) -> bool:
        return sniff_chrome(head)

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        src = qpath(path)
        warnings: list[str] = []
        df, res, laid, rank_source = read_chrome(path, src, warnings)
        out = to_ranks(df, src, laid, warnings, res, rank_source)
        del df
        trim_heap()  # the events' and the table's pages, freed now, back to the system
        return out


PARSER = register(OpTimelineParser())

__all__ = ["PARSER", "OpTimelineParser", "read_chrome", "sniff_chrome"]
