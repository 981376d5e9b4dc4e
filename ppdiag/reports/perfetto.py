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
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.model.timeline import KIND_NAMES, PHASE_NAMES, Direction, RangeKind
from ppdiag.reports import register
from ppdiag.reports.context import context_of
from ppdiag.reports.style import CAUSE_CNAMES, CAUSE_LABELS

if TYPE_CHECKING:
    from ppdiag.reports.context import Analyzed

CHUNK = 20_000
# Synthetic thread ids for the overlay tracks: far above real stream / thread ids, below 2**31.
TID_LOST = 2_000_000_000
TID_STEPS = 2_000_000_001
TID_LABELS = 2_000_000_002
TID_COMM_OPS = 2_000_000_003
TID_SENDS = 2_000_000_004
TID_RECVS = 2_000_000_005
TID_COLL = 2_000_000_006
TID_PATH = 2_000_000_007
# extra lanes: of device streams (below TID_LOST, so device tracks stay below it) and of the
# synthetic tracks
TID_DEVICE_LANES = 1_900_000_000
TID_COMM_KINDS = 2_000_000_100  # comm ops (host) of the second, third... op kind
TID_TRACK_LANES = 2_000_010_000

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


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> str:
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return json.dumps(ev)


def lanes(start: Any, end: Any) -> np.ndarray:
    """A lane per slice such that the slices of one lane never overlap, in as few lanes as the
    deepest overlap needs. Slices that overlap nothing (found vectorized: a new cluster begins
    where a start is at or after every earlier end) stay in lane 0; only the few clusters of
    overlapping slices are laid out one by one (first free lane, in start order)."""
    import heapq

    st = np.asarray(start, dtype=np.int64)
    en = np.maximum(np.asarray(end, dtype=np.int64), st)
    lane = np.zeros(st.shape[0], np.int64)
    if st.shape[0] < 2:
        return lane
    order = np.argsort(st, kind="stable")
    s_, e_ = st[order], en[order]
    prev_max = np.maximum.accumulate(np.r_[np.iinfo(np.int64).min, e_[:-1]])
    new_cluster = s_ >= prev_max
    cid = np.cumsum(new_cluster) - 1
    size = np.bincount(cid)
    for c in np.flatnonzero(size > 1).tolist():
        rows = np.flatnonzero(cid == c)
        free: list[tuple[int, int]] = []  # (end, lane) of the lanes in use
        spare: list[int] = []
        n_lanes = 0
        for i in rows.tolist():
            while free and free[0][0] <= s_[i]:
                heapq.heappush(spare, heapq.heappop(free)[1])
            if spare:
                k = heapq.heappop(spare)
            else:
                k, n_lanes = n_lanes, n_lanes + 1
            lane[order[i]] = k
            heapq.heappush(free, (int(e_[i]), k))
    return lane


class _Tids:
    """Thread ids of a rank's tracks and their overlap lanes, named as they are first used."""

    def __init__(self, meta: Any, pid: int) -> None:
        self.meta = meta
        self.pid = pid
        self.next_device = TID_DEVICE_LANES
        self.next_track = TID_TRACK_LANES
        self.named: dict[tuple[int, int], int] = {}

    def of(self, base: int, lane_ids: np.ndarray, name: str, sort: int, device: bool) -> list[int]:
        """The tid of every slice: ``base`` for lane 0, an extra track per further lane."""
        out = np.full(lane_ids.shape[0], base, np.int64)
        for k in np.unique(lane_ids).tolist():
            if k == 0:
                continue
            key = (base, k)
            if key not in self.named:
                if device:
                    tid, self.next_device = self.next_device, self.next_device + 1
                else:
                    tid, self.next_track = self.next_track, self.next_track + 1
                self.named[key] = tid
                self.meta(_meta("thread_name", self.pid, tid, {"name": f"{name} · overlap {k}"}))
                self.meta(_meta("thread_sort_index", self.pid, tid, {"sort_index": sort}))
            out[lane_ids == k] = self.named[key]
        return out.tolist()


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


def write_trace(diag: Analyzed, out: IO[str]) -> PerfettoStats:
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
    summ = diag.result.summary
    out.write(
        json.dumps(
            {
                "producer": "ppdiag",
                "t0_ns": t0,
                "clock": "aligned common clock, ts = (t - t0_ns) / 1000",
                "step_ms": summ.step_ms,
                "lost_ratio": summ.lost_ratio,
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
    # one allocator of overlap-lane tids per rank for every track of it (tids must not collide)
    tids_by_rank: dict[int, _Tids] = {}
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
        tids = tids_by_rank.setdefault(r, _Tids(meta, r))
        if len(iv):
            streams = np.unique(iv.stream)
            what = "CPU thread" if rt.cpu_only else "stream"
            tid_of = np.asarray(iv.stream, dtype=np.int64).copy()
            for i, s in enumerate(streams.tolist()):
                meta(_meta("thread_name", r, int(s), {"name": f"{what} {s}"}))
                meta(_meta("thread_sort_index", r, int(s), {"sort_index": i}))
                m = iv.stream == s
                tid_of[m] = tids.of(int(s), lanes(iv.start[m], iv.end[m]), f"{what} {s}", i, device=True)
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
                    tid_of[sl].tolist(),
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
            # gap pieces may overlap each other (a wait and the transfer inside it): extra lanes
            g_tid = np.asarray(
                tids.of(TID_LOST, lanes(g.start, g.end), "lost time (cause)", -3, device=False)
            )
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
                n = _emit_slices(
                    out, first, r, g_tid[sl].tolist(), ts, dur, cause_names, cause, "lost", args, cn
                )
                stats.events += n
                stats.gap_events += n
        stats.events += _emit_ranges(out, first, diag, rt, t0, names, tids)
        stats.events += _emit_path(out, first, meta, diag, r, t0)
    flows = _emit_flows(out, first, meta, diag, t0, tids_by_rank)
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


def _emit_ranges(
    out: IO[str], first: list[bool], diag: Analyzed, rt: Any, t0: int, names: list[str], tids: _Tids
) -> int:
    """Steps, pipeline labels and comm-issue ops the parsers kept, each kind on its own track
    (comm ops: one track per op namespace), overlapping slices on extra lanes."""
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
        if not have[tid] or tid == TID_COMM_OPS:
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
            if kind == RangeKind.COMM_OP:
                # one track per op kind: c10d::send and gloo:send of one transfer overlap partially
                kinds = sorted({_op_kind(n) for n in rt.names} | {"other"})
                kind_of_name = np.array([kinds.index(_op_kind(n)) for n in rt.names] or [0], np.int64)
                nid = np.clip(sub.name.astype(np.int64), 0, kind_of_name.shape[0] - 1)
                k_of = kind_of_name[nid]
                tid_of = np.full(len(sub), TID_COMM_OPS, np.int64)
                for j, ki in enumerate(np.unique(k_of).tolist()):
                    ktid = TID_COMM_OPS if j == 0 else TID_COMM_KINDS + j
                    label = f"comm ops (host) · {kinds[ki]}"
                    out.write(
                        ("" if first[0] else ",")
                        + "\n"
                        + _meta("thread_name", rt.rank, ktid, {"name": label})
                    )
                    first[0] = False
                    out.write(",\n" + _meta("thread_sort_index", rt.rank, ktid, {"sort_index": j}))
                    n_total += 2
                    sel = k_of == ki
                    tid_of[sel] = tids.of(ktid, lanes(sub.start[sel], sub.end[sel]), label, j, device=False)
            else:
                tid_of = np.asarray(
                    tids.of(tid, lanes(sub.start, sub.end), "pipeline labels (host)", -1, device=False)
                )
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
                    np.asarray(tid_of)[sl].tolist(),
                    ts,
                    dur,
                    names,
                    np.clip(sub.name[sl], 0, len(names) - 1).tolist(),
                    "label" if kind == RangeKind.LABEL else "comm_op",
                    args,
                )
    return n_total


def _emit_path(out: IO[str], first: list[bool], meta: Any, diag: Analyzed, rank: int, t0: int) -> int:
    """The pieces of every step's critical path that ran on ``rank``, on a track of their own
    (the pieces tile the path, so they never overlap)."""
    paths = diag.result.critical_path or []
    rows = [(cs, pc) for cs in paths for pc in cs.pieces if pc.rank == rank]
    if not rows:
        return 0
    meta(_meta("thread_name", rank, TID_PATH, {"name": "critical path"}))
    meta(_meta("thread_sort_index", rank, TID_PATH, {"sort_index": -4}))
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
    return _emit_slices(
        out, first, rank, TID_PATH, ts, dur, [json.dumps(u) for u in uniq], idx, "critical", args
    )


def _flow_pair(
    out: IO[str], first: list[bool], fid: int, a: tuple[int, int, float], b: tuple[int, int, float], name: str
) -> None:
    """One flow arrow (``s`` at ``a``, ``f`` bound to the enclosing slice at ``b``): (pid, tid, ts µs)."""
    out.write(
        f'{"" if first[0] else ","}\n{{"ph":"s","id":{fid},"pid":{a[0]},"tid":{a[1]},"ts":{a[2]:.3f},'
        f'"name":"{name}","cat":"flow"}},\n{{"ph":"f","bp":"e","id":{fid},"pid":{b[0]},"tid":{b[1]},'
        f'"ts":{b[2]:.3f},"name":"{name}","cat":"flow"}}'
    )
    first[0] = False


def _emit_flows(
    out: IO[str], first: list[bool], meta: Any, diag: Analyzed, t0: int, tids_by_rank: dict[int, _Tids]
) -> tuple[int, int, int]:
    """Matched p2p sends and receives and matched collective instances on their own tracks, with a
    flow arrow from every send to its receive and from each collective's last arriver to every
    member that waited for it. Returns (events, p2p flows, collective flows)."""
    events = 0
    p2p_flows = 0
    coll_flows = 0
    pipe = context_of(diag).pipeline
    pairs = pipe.pairs if pipe is not None else None
    traced = {rt.rank for rt in diag.run.ranks}
    fid = 1
    if pipe is not None and pairs is not None and len(pairs):
        offs = pipe.clocks.offsets
        src = pairs.src.astype(np.int64)
        dst = pairs.dst.astype(np.int64)
        o_s = np.array([offs.get(int(r), 0) for r in src], np.int64)
        o_d = np.array([offs.get(int(r), 0) for r in dst], np.int64)
        ss, se = pairs.send_start + o_s, pairs.send_end + o_s
        rs, re = pairs.recv_start + o_d, pairs.recv_end + o_d
        keep = np.isin(src, list(traced)) & np.isin(dst, list(traced))
        n = int(keep.sum())
        tid_s = np.zeros(len(pairs), np.int64)
        tid_r = np.zeros(len(pairs), np.int64)
        for side, ranks_, a, z, base, label, tid_arr in (
            ("send", src, ss, se, TID_SENDS, "p2p sends (matched)", tid_s),
            ("recv", dst, rs, re, TID_RECVS, "p2p recvs (matched)", tid_r),
        ):
            for r in np.unique(ranks_[keep]).tolist():
                m = keep & (ranks_ == r)
                tids = tids_by_rank.setdefault(r, _Tids(meta, r))
                meta(_meta("thread_name", r, base, {"name": label}))
                meta(_meta("thread_sort_index", r, base, {"sort_index": 1 if side == "send" else 2}))
                tid_arr[m] = tids.of(base, lanes(a[m], z[m]), label, 1 if side == "send" else 2, device=False)
                idx = np.flatnonzero(m)
                ts = ((a[idx] - t0) / 1000.0).tolist()
                dur = (np.maximum(z[idx] - a[idx], 0) / 1000.0).tolist()
                peer = (dst if side == "send" else src)[idx].tolist()
                args = [f'{{"peer":{p},"pair":{i}}}' for p, i in zip(peer, idx.tolist(), strict=True)]
                events += _emit_slices(
                    out,
                    first,
                    r,
                    tid_arr[idx].tolist(),
                    ts,
                    dur,
                    [f'"{side}"'],
                    [0] * len(idx),
                    "p2p_matched",
                    args,
                )
        for i in np.flatnonzero(keep).tolist():
            d_us = max(0.0, (re[i] - rs[i]) / 1000.0)
            _flow_pair(
                out,
                first,
                fid,
                (int(src[i]), int(tid_s[i]), (ss[i] - t0) / 1000.0),
                (int(dst[i]), int(tid_r[i]), (re[i] - t0) / 1000.0 - min(0.001, d_us / 2)),
                "p2p",
            )
            fid += 1
        p2p_flows = n
        events += 2 * n
    coll = _collective_flows(out, first, meta, diag, t0, fid, tids_by_rank)
    events += coll[0]
    coll_flows = coll[1]
    return events, p2p_flows, coll_flows


def _collective_flows(
    out: IO[str],
    first: list[bool],
    meta: Any,
    diag: Analyzed,
    t0: int,
    fid: int,
    tids_by_rank: dict[int, _Tids],
) -> tuple[int, int]:
    """Matched collective instances: each member's op on a ``collectives (matched)`` track and an
    arrow from the last member to arrive to every other one (the waiters)."""
    from ppdiag.pipeline.collectives import match_collectives

    if not diag.run.ranks:
        return 0, 0
    try:
        cm = match_collectives(diag.run.by_rank())
    except (ValueError, KeyError, IndexError):  # nothing the overlay needs: no collective arrows
        return 0, 0
    if not len(cm) or not len(cm.rank):
        return 0, 0
    shift = cm.shift if cm.shift is not None else np.zeros(cm.start.shape[0], np.int64)
    st, en = cm.start + shift, cm.end + shift
    rank = cm.rank.astype(np.int64)
    tid_of = np.zeros(rank.shape[0], np.int64)
    events = 0
    for r in np.unique(rank).tolist():
        m = rank == r
        tids = tids_by_rank.setdefault(r, _Tids(meta, r))
        meta(_meta("thread_name", r, TID_COLL, {"name": "collectives (matched)"}))
        meta(_meta("thread_sort_index", r, TID_COLL, {"sort_index": 3}))
        tid_of[m] = tids.of(TID_COLL, lanes(st[m], en[m]), "collectives (matched)", 3, device=False)
        idx = np.flatnonzero(m)
        events += _emit_slices(
            out,
            first,
            r,
            tid_of[idx].tolist(),
            ((st[idx] - t0) / 1000.0).tolist(),
            (np.maximum(en[idx] - st[idx], 0) / 1000.0).tolist(),
            ['"collective"'],
            [0] * len(idx),
            "collective_matched",
            [f'{{"instance":{i}}}' for i in cm.inst[idx].tolist()],
        )
    # per instance (member rows sorted by instance): the last arriver is the latest start
    first_row = cm.first[cm.count >= 2]
    cnt = cm.count[cm.count >= 2]
    flows = 0
    for f0, c in zip(first_row.tolist(), cnt.tolist(), strict=True):
        rows = np.arange(f0, f0 + c)
        last = int(rows[np.argmax(st[rows])])
        for w in rows.tolist():
            if w == last:
                continue
            d_us = max(0.0, (en[w] - st[w]) / 1000.0)
            _flow_pair(
                out,
                first,
                fid,
                (int(rank[last]), int(tid_of[last]), (st[last] - t0) / 1000.0),
                (int(rank[w]), int(tid_of[w]), (en[w] - t0) / 1000.0 - min(0.001, d_us / 2)),
                "last arriver",
            )
            fid += 1
            flows += 1
    return events + 2 * flows, flows


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
