"""Perfetto / chrome://tracing overlay: the run's device work plus one track of lost time by cause.

One process per rank (named with its stage), one thread per device stream (CPU thread for CPU-only
runs) carrying every device interval of the columnar model, then synthetic tracks per rank:
``lost time (cause)`` with each gap as a slice named by its cause (blame rank and step in args),
``steps`` and the pipeline labels / comm ops the parsers kept. All on the common (aligned) clock,
shifted so the first event is at 0 (``otherData.t0_ns`` gives the absolute time back).

Written as a stream: events are formatted in chunks straight from the numpy columns, so memory
stays bounded by one chunk, whatever the trace size. A ``.gz`` path writes gzip, which Perfetto
opens directly.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.model.timeline import KIND_NAMES, PHASE_NAMES, Direction, RangeKind
from ppdiag.reports import register
from ppdiag.reports.style import CAUSE_CNAMES, CAUSE_LABELS

if TYPE_CHECKING:
    from ppdiag.diagnosis import Diagnosis

CHUNK = 20_000
# Synthetic thread ids for the overlay tracks: far above real stream / thread ids, below 2**31.
TID_LOST = 2_000_000_000
TID_STEPS = 2_000_000_001
TID_LABELS = 2_000_000_002
TID_COMM_OPS = 2_000_000_003

_DIR = {int(Direction.SEND): "send", int(Direction.RECV): "recv", int(Direction.BOTH): "sendrecv"}
_KIND = {int(k): v for k, v in KIND_NAMES.items()}
_PHASE = {int(k): v for k, v in PHASE_NAMES.items()}


@dataclass
class PerfettoStats:
    """What was written."""

    events: int = 0
    device_events: int = 0
    gap_events: int = 0
    ranks: int = 0


def _stage_label(diag: Diagnosis) -> dict[int, str]:
    from ppdiag.reports.html import stages_by_rank

    return {r: "stage " + ",".join(map(str, v)) for r, v in stages_by_rank(diag).items() if v}


def _t0(diag: Diagnosis) -> int:
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


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> str:
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return json.dumps(ev)


def _emit_slices(
    out: IO[str],
    first: list[bool],
    pid: int,
    tid: Any,
    ts: Any,
    dur: Any,
    names: list[str],
    name_idx: Any,
    cat: str | list[str],
    args: list[str],
    cname: list[str] | None = None,
) -> int:
    """Write complete ('X') events from column lists; ``args`` are pre-rendered JSON objects."""
    n = len(ts)
    buf = io.StringIO()
    for i in range(n):
        c = cat if isinstance(cat, str) else cat[i]
        t = tid if isinstance(tid, int) else tid[i]
        cn = f',"cname":"{cname[i]}"' if cname is not None and cname[i] else ""
        buf.write(
            f'{"" if first[0] else ","}\n{{"ph":"X","pid":{pid},"tid":{t},"ts":{ts[i]:.3f},'
            f'"dur":{dur[i]:.3f},"name":{names[name_idx[i]]},"cat":"{c}"{cn},"args":{args[i]}}}'
        )
        first[0] = False
    out.write(buf.getvalue())
    return n


def write_trace(diag: Diagnosis, out: IO[str]) -> PerfettoStats:
    """Write the overlay as Chrome trace JSON to an open text stream."""
    stats = PerfettoStats()
    t0 = _t0(diag)
    stages = _stage_label(diag)
    ranks = sorted(diag.run.ranks, key=lambda rt: rt.rank)
    order = sorted(
        (rt.rank for rt in ranks),
        key=lambda r: (0, int(stages[r].split()[1].split(",")[0]), r) if r in stages else (1, 0, r),
    )
    sort_index = {r: i for i, r in enumerate(order)}
    # ppdiag's marker first: a later run recognises the overlay as an output, not a trace
    out.write('{"ppdiag":{"kind":"perfetto"},"displayTimeUnit":"ns","otherData":')
    summ = (diag.report or {}).get("summary") or {}
    out.write(
        json.dumps(
            {
                "producer": "ppdiag",
                "t0_ns": t0,
                "clock": "aligned common clock, ts = (t - t0_ns) / 1000",
                "step_ms": summ.get("step_ms"),
                "lost_ratio": summ.get("lost_ratio"),
                "causes": {k: CAUSE_LABELS[k] for k in CAUSE_KEYS},
            }
        )
    )
    out.write(',"traceEvents":[')
    first = [True]

    def meta(s: str) -> None:
        out.write(("" if first[0] else ",") + "\n" + s)
        first[0] = False
        stats.events += 1

    cause_names = [json.dumps(CAUSE_LABELS[k]) for k in CAUSE_KEYS]
    for rt in ranks:
        r = rt.rank
        stats.ranks += 1
        pname = f"rank {r}" + (f" · {stages[r]}" if r in stages else "")
        meta(_meta("process_name", r, None, {"name": pname}))
        meta(_meta("process_sort_index", r, None, {"sort_index": sort_index.get(r, r)}))
        meta(_meta("thread_name", r, TID_LOST, {"name": "lost time (cause)"}))
        meta(_meta("thread_sort_index", r, TID_LOST, {"sort_index": -3}))
        iv = rt.intervals
        names = [json.dumps(n) for n in rt.names] or ['""']
        if len(iv):
            streams = np.unique(iv.stream)
            what = "CPU thread" if rt.cpu_only else "stream"
            for i, s in enumerate(streams.tolist()):
                meta(_meta("thread_name", r, int(s), {"name": f"{what} {s}"}))
                meta(_meta("thread_sort_index", r, int(s), {"sort_index": i}))
            off = rt.clock_offset_ns
            for a in range(0, len(iv), CHUNK):
                sl = slice(a, a + CHUNK)
                st = iv.start[sl]
                ts = ((st + off - t0) / 1000.0).tolist()
                dur = (np.maximum(iv.end[sl] - st, 0) / 1000.0).tolist()
                kind, phase, mb = iv.kind[sl].tolist(), iv.phase[sl].tolist(), iv.mb[sl].tolist()
                chunk, peer, dirn = iv.chunk[sl].tolist(), iv.peer[sl].tolist(), iv.direction[sl].tolist()
                nbytes = iv.bytes[sl].tolist()
                args = []
                cats = []
                for j in range(len(ts)):
                    parts = [f'"phase":"{_PHASE.get(phase[j], "unknown")}"']
                    if mb[j] >= 0:
                        parts.append(f'"mb":{mb[j]}')
                    if chunk[j] >= 0:
                        parts.append(f'"chunk":{chunk[j]}')
                    if peer[j] >= 0:
                        parts.append(f'"peer":{peer[j]}')
                    if dirn[j] in _DIR:
                        parts.append(f'"direction":"{_DIR[dirn[j]]}"')
                    if nbytes[j] >= 0:
                        parts.append(f'"bytes":{nbytes[j]}')
                    args.append("{" + ",".join(parts) + "}")
                    cats.append(_KIND.get(kind[j], "other"))
                n = _emit_slices(
                    out,
                    first,
                    r,
                    iv.stream[sl].tolist(),
                    ts,
                    dur,
                    names,
                    np.clip(iv.name[sl], 0, len(names) - 1).tolist(),
                    cats,
                    args,
                )
                stats.events += n
                stats.device_events += n
        g = diag.gaps.get(r)
        if g is not None and len(g):
            for a in range(0, len(g), CHUNK):
                sl = slice(a, a + CHUNK)
                ts = ((g.start[sl] - t0) / 1000.0).tolist()
                dur = (np.maximum(g.end[sl] - g.start[sl], 0) / 1000.0).tolist()
                cause = np.clip(g.cause[sl].astype(np.int64), 0, len(CAUSE_KEYS) - 1).tolist()
                blame, step = g.blame[sl].tolist(), g.step[sl].tolist()
                args = [
                    json.dumps(
                        {
                            "cause": CAUSE_KEYS[c],
                            "blame_rank": b if b >= 0 else None,
                            "step": s,
                            "ms": round(d / 1000.0, 6),
                        }
                    )
                    for c, b, s, d in zip(cause, blame, step, dur, strict=True)
                ]
                cn = [CAUSE_CNAMES[CAUSE_KEYS[c]] for c in cause]
                n = _emit_slices(out, first, r, TID_LOST, ts, dur, cause_names, cause, "lost", args, cn)
                stats.events += n
                stats.gap_events += n
        stats.events += _emit_ranges(out, first, diag, rt, t0, names)
    out.write("\n]}\n")
    return stats


def _emit_ranges(out: IO[str], first: list[bool], diag: Diagnosis, rt: Any, t0: int, names: list[str]) -> int:
    """Steps, pipeline labels and comm-issue ops the parsers kept, each kind on its own track."""
    rg = rt.ranges
    n_total = 0
    steps = [w for w in diag.steps if w.rank == rt.rank]
    tracks = (
        (TID_STEPS, "steps", -2),
        (TID_LABELS, "pipeline labels (host)", -1),
        (TID_COMM_OPS, "comm ops (host)", 0),
    )
    have = {
        TID_STEPS: bool(steps) or bool(len(rg) and (rg.kind == int(RangeKind.STEP)).any()),
        TID_LABELS: bool(len(rg) and (rg.kind == int(RangeKind.LABEL)).any()),
        TID_COMM_OPS: bool(len(rg) and (rg.kind == int(RangeKind.COMM_OP)).any()),
    }
    for tid, label, order in tracks:
        if not have[tid]:
            continue
        out.write(("" if first[0] else ",") + "\n" + _meta("thread_name", rt.rank, tid, {"name": label}))
        first[0] = False
        out.write(",\n" + _meta("thread_sort_index", rt.rank, tid, {"sort_index": order}))
        n_total += 2
    if steps:
        # the analyzed step windows, as the analysis used them (aligned clock)
        snames = [json.dumps(f"step {w.number}" if w.number >= 0 else f"step #{w.index}") for w in steps]
        ts = [(w.start - t0) / 1000.0 for w in steps]
        dur = [max(0, w.end - w.start) / 1000.0 for w in steps]
        args = [
            json.dumps({"index": w.index, "number": w.number, "ms": round((w.end - w.start) / 1e6, 6)})
            for w in steps
        ]
        n_total += _emit_slices(
            out, first, rt.rank, TID_STEPS, ts, dur, snames, list(range(len(steps))), "step", args
        )
    if len(rg):
        off = rt.clock_offset_ns
        for kind, tid in ((RangeKind.LABEL, TID_LABELS), (RangeKind.COMM_OP, TID_COMM_OPS)):
            sub = rg.of_kind(kind)
            if not len(sub):
                continue
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
                n_total += _emit_slices(
                    out,
                    first,
                    rt.rank,
                    tid,
                    ts,
                    dur,
                    names,
                    np.clip(sub.name[sl], 0, len(names) - 1).tolist(),
                    "label" if kind == RangeKind.LABEL else "comm_op",
                    args,
                )
    return n_total


def write_perfetto(diag: Diagnosis, path: str | Path) -> PerfettoStats:
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

    def write(self, diagnosis: Diagnosis, path: Path) -> None:
        write_perfetto(diagnosis, path)


register(PerfettoReporter())
