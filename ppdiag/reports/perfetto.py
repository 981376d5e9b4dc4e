"""Perfetto / chrome://tracing overlay: the run's device work plus one track of lost time by cause.

One process per rank (named with its stage), one thread per device stream (CPU thread for CPU-only
runs) carrying every device interval of the columnar model, then synthetic tracks per rank:
``lost time (cause)`` with each gap as a slice named by its cause (blame rank and step in args),
``steps`` and the pipeline labels / comm ops the parsers kept (one track per op kind: ``c10d::``,
``gloo:``, ``nccl:``, ...), ``p2p sends / recvs (matched)`` with a flow arrow from every send to
its matched receive, ``collectives (matched)`` with an arrow from each instance's last arriver to
every member that waited for it, and ``critical path`` with the pieces of the step's critical path
that ran on the rank. All on the common (aligned) clock, shifted so the first event is at 0
(``otherData.t0_ns`` gives the absolute time back).

No two slices on one track partially overlap (Perfetto would mis-nest them): the slices of a
track that overlap an earlier one move to extra lanes of it (``stream 7 · overlap 1``).

Written as a stream: events are formatted in chunks straight from the numpy columns, so memory
stays bounded by one chunk, whatever the trace size. A ``.gz`` path writes gzip, which Perfetto
opens directly.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import GapTable, StepWindow
from ppdiag.model.timeline import Intervals, RangeKind, Ranges, RankTimeline
from ppdiag.report_types import Cause
from ppdiag.reports import register
from ppdiag.reports.perfetto_events import (
    CHUNK,
    DIRECTIONS,
    KINDS,
    PHASES,
    TID_COMM_KINDS,
    TID_COMM_OPS,
    TID_LABELS,
    TID_LOST,
    TID_PATH,
    TID_STEPS,
    Meta,
    Tids,
    emit_slices,
    lanes,
    meta_event,
)
from ppdiag.reports.perfetto_flows import emit_flows
from ppdiag.reports.style import CAUSE_CNAMES, CAUSE_LABELS

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed


@dataclass
class PerfettoStats:
    """What was written."""

    events: int = 0
    device_events: int = 0
    gap_events: int = 0
    ranks: int = 0
    flows: int = 0  # send -> matched recv arrows
    collective_flows: int = 0  # last arriver -> waiter arrows


def _stage_label(diag: Analyzed) -> dict[int, str]:
    from ppdiag.reports.html_model import stages_by_rank

    return {r: "stage " + ",".join(map(str, v)) for r, v in stages_by_rank(diag).items() if v}


def _t0(diag: Analyzed) -> int:
    lo: int | None = None
    for rt in diag.run.ranks:
        if len(rt.intervals):
            v = int(rt.intervals.start.min()) + rt.clock_offset_ns
            lo = v if lo is None else min(lo, v)
        if len(rt.ranges):
            v = int(rt.ranges.start.min()) + rt.clock_offset_ns
            lo = v if lo is None else min(lo, v)
    for g in diag.gaps.values():
        if len(g):
            lo = int(g.start.min()) if lo is None else min(lo, int(g.start.min()))
    return lo or 0


def _header(diag: Analyzed, out: IO[str], t0: int) -> None:
    """ppdiag's marker first (a later run recognises the overlay as an output, not a trace), then
    what the overlay is and its clock."""
    out.write('{"ppdiag":{"kind":"perfetto"},"displayTimeUnit":"ns","otherData":')
    summ = diag.result.summary
    out.write(
        json.dumps(
            {
                "producer": "ppdiag",
                "t0_ns": t0,
                "clock": "aligned common clock, ts = (t - t0_ns) / 1000",
                "step_ms": summ.step_ms,
                "lost_ratio": summ.lost_ratio,
                "causes": {k: CAUSE_LABELS[k] for k in Cause},
            }
        )
    )
    out.write(',"traceEvents":[')


def _device_args(iv: Intervals, sl: slice) -> tuple[list[str], list[str]]:
    """The args (pre-rendered JSON) and the category of every device interval in ``sl``."""
    phase, mb = iv.phase[sl].tolist(), iv.mb[sl].tolist()
    chunk, peer, dirn = iv.chunk[sl].tolist(), iv.peer[sl].tolist(), iv.direction[sl].tolist()
    nbytes = iv.bytes[sl].tolist()
    args = []
    for j in range(len(phase)):
        parts = [f'"phase":"{PHASES.get(phase[j], "unknown")}"']
        if mb[j] >= 0:
            parts.append(f'"mb":{mb[j]}')
        if chunk[j] >= 0:
            parts.append(f'"chunk":{chunk[j]}')
        if peer[j] >= 0:
            parts.append(f'"peer":{peer[j]}')
        if dirn[j] in DIRECTIONS:
            parts.append(f'"direction":"{DIRECTIONS[dirn[j]]}"')
        if nbytes[j] >= 0:
            parts.append(f'"bytes":{nbytes[j]}')
        args.append("{" + ",".join(parts) + "}")
    return args, [KINDS.get(k, "other") for k in iv.kind[sl].tolist()]


def _device_events(
    out: IO[str], first: list[bool], meta: Meta, rt: RankTimeline, t0: int, names: list[str], tids: Tids
) -> int:
    """Every device interval of the rank on its stream's track (overlaps on extra lanes)."""
    iv = rt.intervals
    r = rt.rank
    streams = np.unique(iv.stream)
    what = "CPU thread" if rt.cpu_only else "stream"
    tid_of = np.asarray(iv.stream, dtype=np.int64).copy()
    for i, s in enumerate(streams.tolist()):
        meta(meta_event("thread_name", r, int(s), {"name": f"{what} {s}"}))
        meta(meta_event("thread_sort_index", r, int(s), {"sort_index": i}))
        m = iv.stream == s
        tid_of[m] = tids.of(int(s), lanes(iv.start[m], iv.end[m]), f"{what} {s}", i, device=True)
    off = rt.clock_offset_ns
    n_total = 0
    for a in range(0, len(iv), CHUNK):
        sl = slice(a, a + CHUNK)
        st = iv.start[sl]
        ts = ((st + off - t0) / 1000.0).tolist()
        dur = (np.maximum(iv.end[sl] - st, 0) / 1000.0).tolist()
        args, cats = _device_args(iv, sl)
        name_idx = np.clip(iv.name[sl], 0, len(names) - 1).tolist()
        n_total += emit_slices(out, first, r, tid_of[sl].tolist(), ts, dur, names, name_idx, cats, args)
    return n_total


def _gap_events(out: IO[str], first: list[bool], g: GapTable, rank: int, t0: int, tids: Tids) -> int:
    """The rank's lost time, one slice per gap named by its cause (blame rank and step in args)."""
    cause_names = [json.dumps(CAUSE_LABELS[k]) for k in Cause]
    # gap pieces may overlap each other (a wait and the transfer inside it): extra lanes
    g_tid = np.asarray(tids.of(TID_LOST, lanes(g.start, g.end), "lost time (cause)", -3, device=False))
    n_total = 0
    for a in range(0, len(g), CHUNK):
        sl = slice(a, a + CHUNK)
        ts = ((g.start[sl] - t0) / 1000.0).tolist()
        dur = (np.maximum(g.end[sl] - g.start[sl], 0) / 1000.0).tolist()
        cause = np.clip(g.cause[sl].astype(np.int64), 0, len(Cause) - 1).tolist()
        blame, step = g.blame[sl].tolist(), g.step[sl].tolist()
        args = [
            json.dumps(
                {
                    "cause": Cause.of(c),
                    "blame_rank": b if b >= 0 else None,
                    "step": s,
                    "ms": round(d / 1000.0, 6),
                }
            )
            for c, b, s, d in zip(cause, blame, step, dur, strict=True)
        ]
        cn = [CAUSE_CNAMES[Cause.of(c)] for c in cause]
        n_total += emit_slices(
            out, first, rank, g_tid[sl].tolist(), ts, dur, cause_names, cause, "lost", args, cn
        )
    return n_total


def _process_order(diag: Analyzed, stages: dict[int, str]) -> dict[int, int]:
    """Sort index of every rank's process: by first stage, then rank; ranks without a stage last."""
    order = sorted(
        (rt.rank for rt in diag.run.ranks),
        key=lambda r: (0, int(stages[r].split()[1].split(",")[0]), r) if r in stages else (1, 0, r),
    )
    return {r: i for i, r in enumerate(order)}


def write_trace(diag: Analyzed, out: IO[str]) -> PerfettoStats:
    """Write the overlay as Chrome trace JSON to an open text stream."""
    stats = PerfettoStats()
    t0 = _t0(diag)
    stages = _stage_label(diag)
    sort_index = _process_order(diag, stages)
    _header(diag, out, t0)
    first = [True]

    def meta(s: str) -> None:
        out.write(("" if first[0] else ",") + "\n" + s)
        first[0] = False
        stats.events += 1

    # one allocator of overlap-lane tids per rank for every track of it (tids must not collide)
    tids_by_rank: dict[int, Tids] = {}
    for rt in sorted(diag.run.ranks, key=lambda rt: rt.rank):
        r = rt.rank
        stats.ranks += 1
        pname = f"rank {r}" + (f" · {stages[r]}" if r in stages else "")
        meta(meta_event("process_name", r, None, {"name": pname}))
        meta(meta_event("process_sort_index", r, None, {"sort_index": sort_index.get(r, r)}))
        meta(meta_event("thread_name", r, TID_LOST, {"name": "lost time (cause)"}))
        meta(meta_event("thread_sort_index", r, TID_LOST, {"sort_index": -3}))
        names = [json.dumps(n) for n in rt.names] or ['""']
        tids = tids_by_rank.setdefault(r, Tids(meta, r))
        if len(rt.intervals):
            n = _device_events(out, first, meta, rt, t0, names, tids)
            stats.events += n
            stats.device_events += n
        g = diag.gaps.get(r)
        if g is not None and len(g):
            n = _gap_events(out, first, g, r, t0, tids)
            stats.events += n
            stats.gap_events += n
        stats.events += _emit_ranges(out, first, diag, rt, t0, names, tids)
        stats.events += _emit_path(out, first, meta, diag, r, t0)
    flows = emit_flows(out, first, meta, diag, t0, tids_by_rank)
    stats.events += flows[0]
    stats.flows, stats.collective_flows = flows[1], flows[2]
    out.write("\n]}\n")
    return stats


def _op_kind(name: str) -> str:
    """The kind of a comm-issue op, for its track: ``c10d``, ``gloo``, ``nccl``, ... (the name's
    namespace), else ``other``."""
    for sep in ("::", ":"):
        if sep in name:
            return name.split(sep, 1)[0].strip() or "other"
    return "other"


def _track_meta(out: IO[str], first: list[bool], rank: int, tid: int, label: str, order: int) -> int:
    """A track's name and sort index (two metadata events)."""
    out.write(("" if first[0] else ",") + "\n" + meta_event("thread_name", rank, tid, {"name": label}))
    first[0] = False
    out.write(",\n" + meta_event("thread_sort_index", rank, tid, {"sort_index": order}))
    return 2


def _step_slices(out: IO[str], first: list[bool], rank: int, steps: list[StepWindow], t0: int) -> int:
    """The analyzed step windows, as the analysis used them (aligned clock)."""
    snames = [json.dumps(f"step {w.number}" if w.number >= 0 else f"step #{w.index}") for w in steps]
    ts = [(w.start - t0) / 1000.0 for w in steps]
    dur = [max(0, w.end - w.start) / 1000.0 for w in steps]
    args = [
        json.dumps({"index": w.index, "number": w.number, "ms": round((w.end - w.start) / 1e6, 6)})
        for w in steps
    ]
    return emit_slices(out, first, rank, TID_STEPS, ts, dur, snames, list(range(len(steps))), "step", args)


def _comm_op_tids(
    out: IO[str], first: list[bool], rt: RankTimeline, sub: Ranges, tids: Tids
) -> tuple[npt.NDArray[np.int64], int]:
    """One track per op kind (c10d::send and gloo:send of one transfer overlap partially): the tid
    of every comm op, and the metadata events written."""
    kinds = sorted({_op_kind(n) for n in rt.names} | {"other"})
    kind_of_name = np.array([kinds.index(_op_kind(n)) for n in rt.names] or [0], np.int64)
    k_of = kind_of_name[np.clip(sub.name.astype(np.int64), 0, kind_of_name.shape[0] - 1)]
    tid_of = np.full(len(sub), TID_COMM_OPS, np.int64)
    n_meta = 0
    for j, ki in enumerate(np.unique(k_of).tolist()):
        ktid = TID_COMM_OPS if j == 0 else TID_COMM_KINDS + j
        label = f"comm ops (host) · {kinds[ki]}"
        n_meta += _track_meta(out, first, rt.rank, ktid, label, j)
        sel = k_of == ki
        tid_of[sel] = tids.of(ktid, lanes(sub.start[sel], sub.end[sel]), label, j, device=False)
    return tid_of, n_meta


def _range_slices(
    out: IO[str],
    first: list[bool],
    rt: RankTimeline,
    sub: Ranges,
    tid_of: npt.NDArray[np.int64],
    label: bool,
    t0: int,
    names: list[str],
) -> int:
    """Pipeline labels or comm ops of one rank, with their micro-batch and peer in args."""
    off = rt.clock_offset_ns
    n_total = 0
    for a in range(0, len(sub), CHUNK):
        sl = slice(a, a + CHUNK)
        ts = ((sub.start[sl] + off - t0) / 1000.0).tolist()
        dur = (np.maximum(sub.end[sl] - sub.start[sl], 0) / 1000.0).tolist()
        mb, peer = sub.mb[sl].tolist(), sub.peer[sl].tolist()
        args = []
        for j in range(len(ts)):
            parts = []
            if mb[j] >= 0:
                parts.append(f'"mb":{mb[j]}')
            if peer[j] >= 0:
                parts.append(f'"peer":{peer[j]}')
            args.append("{" + ",".join(parts) + "}")
        name_idx = np.clip(sub.name[sl], 0, len(names) - 1).tolist()
        cat = "label" if label else "comm_op"
        n_total += emit_slices(out, first, rt.rank, tid_of[sl].tolist(), ts, dur, names, name_idx, cat, args)
    return n_total


def _emit_ranges(
    out: IO[str], first: list[bool], diag: Analyzed, rt: RankTimeline, t0: int, names: list[str], tids: Tids
) -> int:
    """Steps, pipeline labels and comm-issue ops the parsers kept, each kind on its own track
    (comm ops: one track per op namespace), overlapping slices on extra lanes."""
    rg = rt.ranges
    n_total = 0
    steps = [w for w in diag.steps if w.rank == rt.rank]
    if steps or (len(rg) and (rg.kind == int(RangeKind.STEP)).any()):
        n_total += _track_meta(out, first, rt.rank, TID_STEPS, "steps", -2)
    if len(rg) and (rg.kind == int(RangeKind.LABEL)).any():
        n_total += _track_meta(out, first, rt.rank, TID_LABELS, "pipeline labels (host)", -1)
    if steps:
        n_total += _step_slices(out, first, rt.rank, steps, t0)
    if not len(rg):
        return n_total
    for kind in (RangeKind.LABEL, RangeKind.COMM_OP):
        sub = rg.of_kind(kind)
        if not len(sub):
            continue
        if kind == RangeKind.COMM_OP:
            tid_of, n_meta = _comm_op_tids(out, first, rt, sub, tids)
            n_total += n_meta
        else:
            tid_of = np.asarray(
                tids.of(TID_LABELS, lanes(sub.start, sub.end), "pipeline labels (host)", -1, device=False)
            )
        n_total += _range_slices(out, first, rt, sub, tid_of, kind == RangeKind.LABEL, t0, names)
    return n_total


def _emit_path(out: IO[str], first: list[bool], meta: Any, diag: Analyzed, rank: int, t0: int) -> int:
    """The pieces of every step's critical path that ran on ``rank``, on a track of their own
    (the pieces tile the path, so they never overlap)."""
    paths = diag.result.critical_path or []
    rows = [(cs, pc) for cs in paths for pc in cs.pieces if pc.rank == rank]
    if not rows:
        return 0
    meta(meta_event("thread_name", rank, TID_PATH, {"name": "critical path"}))
    meta(meta_event("thread_sort_index", rank, TID_PATH, {"sort_index": -4}))
    labels: list[str] = []
    for _cs, pc in rows:
        if pc.kind == "block":
            labels.append(f"{pc.phase or ''}{'' if pc.mb is None else pc.mb} (critical)")
        elif pc.kind == "gap":
            labels.append(f"{CAUSE_LABELS.get(pc.cause or '', pc.cause)} (critical)")
        elif pc.kind == "transfer":
            labels.append(f"transfer from rank {pc.peer} (critical)")
        else:
            labels.append("compute outside blocks (critical)")
    uniq = sorted(set(labels))
    idx = [uniq.index(x) for x in labels]
    # the step start minus t0 in integers first: ns since the epoch do not fit a float exactly
    ts = [((cs.start_ns - t0) + pc.t_ms * 1e6) / 1000.0 for cs, pc in rows]
    dur = [pc.dur_ms * 1000.0 for _cs, pc in rows]
    args = [
        json.dumps({"step": cs.step, "kind": pc.kind, "stage": pc.stage, "ms": pc.dur_ms}) for cs, pc in rows
    ]
    return emit_slices(
        out, first, rank, TID_PATH, ts, dur, [json.dumps(u) for u in uniq], idx, "critical", args
    )


def write_perfetto(diag: Analyzed, path: str | Path) -> PerfettoStats:
    """Write the overlay to ``path`` (gzip when it ends in ``.gz``)."""
    p = Path(path)
    if p.suffix == ".gz":
        with gzip.open(p, "wt", encoding="utf-8", errors="backslashreplace", compresslevel=6) as fh:
            return write_trace(diag, fh)
    with p.open("w", encoding="utf-8", errors="backslashreplace") as fh:
        return write_trace(diag, fh)


class PerfettoReporter:
    """Reporter ``perfetto``: Chrome trace JSON with the cause tracks."""

    name = "perfetto"
    suffix = ".json"

    def write(self, diagnosis: Analyzed, path: Path) -> None:
        write_perfetto(diagnosis, path)


register(PerfettoReporter())
