"""Op-level timelines of production jobs: one file holds every rank's per-micro-batch ops.

Two forms carry the same data (Megatron-style timers, in-house platform tracers):

* **op table** (CSV, JSON Lines, or Parquet through pyarrow, the ``ppdiag[parquet]`` extra): one row
  per op with ``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id``;
  ``start_ts`` / ``duration`` in seconds, ``start_ts`` relative to the start of that step on that
  rank's clock. Steps may be a sample (23, 25, 33 ...): they are laid side by side on one clock, in
  step order, each step window as long as its longest rank plus a small gap (said in a warning).
* **Chrome / Perfetto timeline**: a JSON array (optionally gzipped) of ``ph: "X"`` events, ``name``
  = optype, ``ts`` / ``dur`` in µs on one run-wide clock, ``args: {step, model_chunk, mb_id,
  seq_id}``; ``pid`` is the DP rank and each ``tid`` a lane named by ``thread_name`` metadata
  ``"PP rank s, TP rank t, <lane>"``. The global rank is not in this form: ranks are numbered in
  Megatron's default order ``rank = (s * D + d) * T + t`` (said in a warning).

Mapping: ``forward-compute`` / ``backward-compute`` are COMPUTE intervals (phase FWD / BWD, the
micro-batch, the chunk) with a pipeline LABEL range each (virtual stage ``gmc`` when given, else the
stage), so the pipeline layer reads stage map, schedule and M from the data; sends / receives are
P2P with the neighbouring stage of the same replica as peer; the DP collectives are COLLECTIVE in a
process group per stage across replicas (the embedding all-reduce in the first+last stage group);
optimizer ops are COMPUTE with phase OPTIM; ``gc`` and unknown optypes are kept as OTHER ranges
(unknown ones counted in a warning). Every rank gets its pipeline as a ``PIPELINE`` process group
and ``meta["pipeline"]`` = its DP replica index. All work is vectorized (pandas / numpy).
"""

from __future__ import annotations

import gzip
import itertools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.io import qpath
from ppdiag.model import Direction, Intervals, Kind, Phase, ProcessGroup, RangeKind, Ranges, RankTimeline
from ppdiag.parsers import ParseOptions, register

if TYPE_CHECKING:
    import pandas as pd

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
OPTIONAL = ("seq_id", "mc", "gmc", "mb_id")

# optype -> code; the order is the code (and the interval name id - 1)
OPTYPES = (
    "forward-compute",
    "backward-compute",
    "forward-send",
    "forward-recv",
    "backward-send",
    "backward-recv",
    "grads-reduce-scatter",
    "params-all-gather",
    "embedding-grads-all-reduce",
    "layernorm-grads-all-reduce",
    "optimizer",
    "optimizer-clip-main-grad",
    "gc",
    "other",
)
_CODE = {n: i for i, n in enumerate(OPTYPES)}
FC, BC, FS, FR, BS, BR, RS, AG, EMB, LN, OPT, CLIP, GC, OTHER = range(len(OPTYPES))
_COMPUTE = (FC, BC, OPT, CLIP)
_P2P = (FS, FR, BS, BR)
_COLL = (RS, AG, EMB, LN)
# stream per op family: one compute stream, one per p2p direction, one for DP collectives
_STREAM = np.array([7, 7, 21, 22, 23, 24, 40, 40, 41, 42, 7, 7, 0, 0], dtype=np.int64)
_PHASE = np.array([1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 5, 5], dtype=np.int8)
# neighbour stage offset and direction of each p2p optype
_PEER_OFF = np.zeros(len(OPTYPES), dtype=np.int64)
_PEER_OFF[[FS, BR]] = 1
_PEER_OFF[[FR, BS]] = -1
_DIR = np.zeros(len(OPTYPES), dtype=np.int8)
_DIR[[FS, BS]] = int(Direction.SEND)
_DIR[[FR, BR]] = int(Direction.RECV)
# group slot in every rank's process_groups: 0 pipeline, 1 DP (stage across replicas),
# 2 embedding (first + last stage of the pipeline), 3 the rank's TP lane peers (layernorm grads)
_GROUP = np.full(len(OPTYPES), -1, dtype=np.int32)
_GROUP[[RS, AG]] = 1
_GROUP[EMB] = 2
_GROUP[LN] = 3

_LANE = re.compile(r"PP\s*rank\s*(\d+)\s*,\s*TP\s*rank\s*(\d+)\s*,\s*([\w-]+)", re.IGNORECASE)
_DP = re.compile(r"DP\s*rank\s*\[?\s*(\d+)", re.IGNORECASE)
_CSV_HEAD = re.compile(rb"^\W*dp_rank\b|\bdp_rank\b.*\boptype\b|\boptype\b.*\bdp_rank\b", re.IGNORECASE)


def _first_line(head: bytes) -> bytes:
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").split(b"\n", 1)[0]


class OpTableParser:
    """Op tables (CSV / JSON Lines / Parquet) and their Chrome-timeline form, all ranks in one file."""

    name = "optable"

    def sniff(self, path: Path, head: bytes) -> bool:
        if head.startswith(b"PAR1"):
            return True
        line = _first_line(head)
        if line.startswith(b"{"):
            return b'"optype"' in line and b'"dp_rank"' in line
        if line.startswith(b"["):
            h = head.lstrip(b"\xef\xbb\xbf \t\r\n")
            return b'"ph"' in h and (b"PP rank" in h or b"DP rank" in h) and b'"thread_name"' in h
        return bool(_CSV_HEAD.search(line)) and b"," in line

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        src = qpath(path)
        head = _read_head(path)
        warnings: list[str] = []
        if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            df, res = _read_chrome(path, src, warnings)
            laid = True
        else:
            df, res = _read_table(path, src, head)
            laid = False
        return _to_ranks(df, src, laid, warnings, res)


def _read_head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(1 << 12)
    if head[:2] == b"\x1f\x8b":
        with gzip.open(path, "rb") as gz:
            head = gz.read(1 << 12)
    return head


def _resolution_ns(values: npt.NDArray[Any], unit_ns: float) -> float:
    """The timer resolution the time column carries, in ns: the spacing of its float type at its
    largest magnitude (float32 seconds at 0.1 s are 7 ns apart, at 30 s 2 µs apart)."""
    if not values.size or not np.issubdtype(values.dtype, np.floating):
        return 0.0
    top = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0
    return float(np.spacing(values.dtype.type(top))) * unit_ns


def _read_table(path: Path, src: str, head: bytes) -> tuple[pd.DataFrame, float]:
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    try:
        if head.startswith(b"PAR1"):
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise InputError(
                    src, "Parquet op tables need pyarrow: pip install 'ppdiag[parquet]'"
                ) from None
            df = pd.read_parquet(path)
        elif _first_line(head).startswith(b"{"):
            df = pd.read_json(path, lines=True, compression="infer")
        else:
            df = pd.read_csv(path, compression="infer")
    except InputError:
        raise
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise InputError(src, f"cannot read the op table ({str(exc).splitlines()[0][:200]})") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(src, f"op table lacks the required column(s) {', '.join(missing)}")
    for c in OPTIONAL:
        if c not in df.columns:
            df[c] = -1
    try:
        out = pd.DataFrame(
            {
                "dp_rank": df["dp_rank"].to_numpy(np.int64),
                "stage": df["stage"].to_numpy(np.int64),
                "rank": df["rank"].to_numpy(np.int64),
                "step": df["step"].to_numpy(np.int64),
                "optype": df["optype"].astype(str).to_numpy(),
                # float32 seconds are normal (their resolution goes to the replay's timing tolerance)
                "t0": np.rint(df["start_ts"].to_numpy(np.float64) * 1e9).astype(np.int64),
                "dur": np.rint(df["duration"].to_numpy(np.float64) * 1e9).astype(np.int64),
                "seq_id": df["seq_id"].fillna(-1).to_numpy(np.int64),
                "mc": df["mc"].fillna(-1).to_numpy(np.int64),
                "gmc": df["gmc"].fillna(-1).to_numpy(np.int64),
                "mb_id": df["mb_id"].fillna(-1).to_numpy(np.int64),
            }
        )
    except (ValueError, TypeError) as exc:
        raise InputError(src, f"op table has non-numeric values ({str(exc).splitlines()[0][:200]})") from None
    # ends are start + duration: both columns' resolution
    res = max(_resolution_ns(df["start_ts"].to_numpy(), 1e9), _resolution_ns(df["duration"].to_numpy(), 1e9))
    return out, res


class _Args(msgspec.Struct):
    """The ``args`` fields the timeline form carries (``name`` for metadata events)."""

    step: int = -1
    model_chunk: int = -1
    mb_id: int = -1
    seq_id: int = -1
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
    return pd.DataFrame(
        {
            "ph": [e.ph for e in events],
            "name": [e.name for e in events],
            "pid": np.fromiter((e.pid for e in events), np.int64, len(events)),
            "tid": np.fromiter((e.tid for e in events), np.int64, len(events)),
            "ts": np.fromiter((e.ts for e in events), np.float64, len(events)),
            "dur": np.fromiter((e.dur for e in events), np.float64, len(events)),
            "a_step": np.fromiter((x.step for x in args), np.int64, len(events)),
            "a_mc": np.fromiter((x.model_chunk for x in args), np.int64, len(events)),
            "a_mb": np.fromiter((x.mb_id for x in args), np.int64, len(events)),
            "a_seq": np.fromiter((x.seq_id for x in args), np.int64, len(events)),
            "a_name": [x.name for x in args],
        }
    )


def _read_chrome(path: Path, src: str, warnings: list[str]) -> tuple[pd.DataFrame, float]:
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    try:
        opener: Any = gzip.open if _is_gzip(path) else open
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:
        raise InputError(src, f"cannot read the timeline JSON ({str(exc)[:200]})") from None
    ev = _decode_events(data, src)
    meta = ev[ev["ph"] == "M"]
    lanes = meta[meta["name"] == "thread_name"]
    parsed = [_LANE.search(n) for n in lanes["a_name"]]
    lane_pp: dict[tuple[int, int], tuple[int, int]] = {}
    for (pid, tid), m in zip(zip(lanes["pid"], lanes["tid"], strict=True), parsed, strict=True):
        if m:
            lane_pp[(int(pid), int(tid))] = (int(m.group(1)), int(m.group(2)))
    procs = meta[meta["name"] == "process_name"]
    dp_of: dict[int, int] = {}
    for pid, a in zip(procs["pid"], procs["a_name"], strict=True):
        m = _DP.search(a)
        if m:
            dp_of[int(pid)] = int(m.group(1))
    x = ev[ev["ph"] == "X"]
    if not len(x):
        raise InputError(src, "timeline has no complete ('ph': 'X') events")
    pid = x["pid"].to_numpy(np.int64)
    tid = x["tid"].to_numpy(np.int64)
    key = pd.MultiIndex.from_arrays([pid, tid])
    lane_idx = pd.MultiIndex.from_tuples(list(lane_pp) or [(-1, -1)])
    pos = lane_idx.get_indexer(key)
    lane_vals = np.array(list(lane_pp.values()) or [(-1, -1)], dtype=np.int64)
    no_lane = pos < 0
    if no_lane.all():
        raise InputError(src, "timeline has no 'PP rank s, TP rank t, ...' thread_name lanes")
    if no_lane.any():
        warnings.append(f"{int(no_lane.sum())} events on lanes without a 'PP rank s, TP rank t' name dropped")
    keep = ~no_lane
    x = x[keep]
    pid, pos = pid[keep], pos[keep]
    stage = lane_vals[pos, 0]
    tp = lane_vals[pos, 1]
    dp = pd.Series(pid).map(dp_of).fillna(pd.Series(pid)).to_numpy(np.int64)
    if bool((x["a_step"] < 0).all()):
        raise InputError(src, "timeline events carry no args.step")
    n_dp = int(dp.max()) + 1
    n_pp = int(stage.max()) + 1
    n_tp = int(tp.max()) + 1
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
    res = max(_resolution_ns(x["ts"].to_numpy(), 1e3), _resolution_ns(x["dur"].to_numpy(), 1e3))
    out = pd.DataFrame(
        {
            "dp_rank": dp,
            "stage": stage,
            "rank": rank,
            "step": x["a_step"].to_numpy(np.int64),
            "optype": x["name"].astype(str).to_numpy(),
            "t0": np.rint(x["ts"].to_numpy(np.float64) * 1e3).astype(np.int64),
            "dur": np.rint(x["dur"].to_numpy(np.float64) * 1e3).astype(np.int64),
            "seq_id": x["a_seq"].to_numpy(np.int64),
            "mc": mc,
            "gmc": gmc,
            "mb_id": x["a_mb"].to_numpy(np.int64),
        }
    )
    return out, res


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _lay_steps(
    df: pd.DataFrame,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Step-relative times onto one clock: the sampled steps side by side in step order.

    Returns the absolute start per row plus the step numbers and their windows' starts / ends.
    """
    steps, inv = np.unique(df["step"].to_numpy(), return_inverse=True)
    end = (df["t0"] + df["dur"]).to_numpy()
    span = np.zeros(steps.size, dtype=np.int64)
    np.maximum.at(span, inv, end)
    lo = np.zeros(steps.size, dtype=np.int64)
    np.minimum.at(lo, inv, df["t0"].to_numpy())
    span = span - lo
    # a gap between sampled steps keeps the windows apart on the timeline
    gap = np.maximum(span // 20, 1_000_000)
    starts = np.concatenate([[0], np.cumsum(span + gap)[:-1]]) - lo
    t_abs = df["t0"].to_numpy() + starts[inv]
    return t_abs, steps, starts + lo


def _check_p2p_order(
    df: pd.DataFrame,
    codes: npt.NDArray[np.int64],
    t_abs: npt.NDArray[np.int64],
    n_pp: int,
    warnings: list[str],
) -> None:
    """The stage placement checked against the transfers: a receive of micro-batch ``k`` ends after
    its sender's send of ``k`` starts. Many receives that finish before their send began mean the
    ``stage`` / ``dp_rank`` columns (or lanes) do not say where the ranks really sit."""
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    ends = t_abs + df["dur"].to_numpy()
    dp, st, step, mb = (df[c].to_numpy() for c in ("dp_rank", "stage", "step", "mb_id"))
    bad = total = 0
    for send, recv, off in ((FS, FR, 1), (BS, BR, -1)):
        sm, rm = codes == send, codes == recv
        if not sm.any() or not rm.any():
            continue
        s_df = pd.DataFrame(
            {"dp": dp[sm], "st": (st[sm] + off) % n_pp, "step": step[sm], "mb": mb[sm], "t": t_abs[sm]}
        )
        r_df = pd.DataFrame({"dp": dp[rm], "st": st[rm], "step": step[rm], "mb": mb[rm], "e": ends[rm]})
        # first transfer of each micro-batch per link and step (interleaved chunks send several)
        j = (
            s_df.groupby(["dp", "st", "step", "mb"])
            .t.min()
            .to_frame()
            .join(r_df.groupby(["dp", "st", "step", "mb"]).e.max(), how="inner")
        )
        total += len(j)
        bad += int((j["e"] < j["t"] - 10_000).sum())
    if total and bad > 0.05 * total:
        warnings.append(
            f"{bad} of {total} receives end before their sender's send starts: the stage / dp_rank placement "
            "(columns or lane names) may not match the transfers"
        )


def _to_ranks(
    df: pd.DataFrame, src: str, laid: bool, warnings: list[str], resolution_ns: float
) -> list[RankTimeline]:
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    if not len(df):
        raise InputError(src, "op table has no rows")
    codes = pd.Index(OPTYPES).get_indexer(pd.Index(df["optype"].astype(str))).astype(np.int64)
    unknown = codes < 0
    if unknown.any():
        unk, counts = np.unique(df["optype"].to_numpy()[unknown], return_counts=True)
        shown = ", ".join(f"{n} ({c})" for n, c in list(zip(unk, counts, strict=True))[:8])
        warnings.append(f"{int(unknown.sum())} ops of unknown optype kept as 'other': {shown}")
        codes = np.where(unknown, OTHER, codes)
    bad = (df["dur"].to_numpy() < 0) | (df["rank"].to_numpy() < 0) | (df["stage"].to_numpy() < 0)
    if bad.any():
        warnings.append(f"{int(bad.sum())} ops with a negative duration, rank or stage dropped")
        df = df[~bad].reset_index(drop=True)
        codes = codes[~bad]
    if laid:
        t_abs = df["t0"].to_numpy()
        step_arr = df["step"].to_numpy()
        steps, inv = np.unique(step_arr, return_inverse=True)
        w_lo = np.full(steps.size, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(w_lo, inv, t_abs)
        w_hi = np.zeros(steps.size, dtype=np.int64)
        np.maximum.at(w_hi, inv, t_abs + df["dur"].to_numpy())
    else:
        t_abs, steps, w_lo = _lay_steps(df)
        inv = np.searchsorted(steps, df["step"].to_numpy())
        w_hi = np.zeros(steps.size, dtype=np.int64)
        np.maximum.at(w_hi, inv, t_abs + df["dur"].to_numpy())
        if steps.size > 1 and bool(np.any(np.diff(steps) > 1)):
            warnings.append(
                f"{steps.size} sampled steps ({steps[0]}..{steps[-1]}) laid side by side on one clock"
            )
    dur = df["dur"].to_numpy()
    rank = df["rank"].to_numpy()
    dp = df["dp_rank"].to_numpy()
    stage = df["stage"].to_numpy()
    n_pp = int(stage.max()) + 1
    # placement from the columns; each rank has one (dp, stage)
    place = pd.DataFrame({"rank": rank, "dp": dp, "stage": stage}).drop_duplicates()
    if place["rank"].duplicated().any():
        dup = place[place["rank"].duplicated(keep=False)]["rank"].iloc[0]
        raise InputError(src, f"rank {dup} appears with more than one (dp_rank, stage)")
    loc = pd.Series(place["rank"].to_numpy(), index=pd.MultiIndex.from_arrays([place["dp"], place["stage"]]))
    # tp lanes: ranks sharing (dp, stage) are one stage's tensor-parallel group
    lines: dict[int, list[int]] = {}
    for d in sorted(place["dp"].unique()):
        sub = place[place["dp"] == d].sort_values(["stage", "rank"])
        lines[int(d)] = [int(r) for r in sub.drop_duplicates("stage")["rank"]]
    # peer of a p2p op: the neighbouring stage in the same replica (wraps for interleaved chunks)
    is_p2p = np.isin(codes, _P2P)
    peer_stage = (stage + _PEER_OFF[codes]) % n_pp
    peer = np.full(len(df), -1, dtype=np.int64)
    if is_p2p.any():
        idx = loc.index.get_indexer(pd.MultiIndex.from_arrays([dp[is_p2p], peer_stage[is_p2p]]))
        peer[is_p2p] = np.where(idx >= 0, loc.to_numpy()[np.clip(idx, 0, None)], -1)
    _check_p2p_order(df, codes, t_abs, n_pp, warnings)
    kind = np.full(len(df), -1, dtype=np.int8)
    kind[np.isin(codes, _COMPUTE)] = int(Kind.COMPUTE)
    kind[is_p2p] = int(Kind.P2P)
    kind[np.isin(codes, _COLL)] = int(Kind.COLLECTIVE)
    gmc = df["gmc"].to_numpy()
    lstage = np.where(gmc >= 0, gmc, stage)
    mb = df["mb_id"].to_numpy()
    mc = df["mc"].to_numpy()
    seq = df["seq_id"].to_numpy()
    names = ["", *OPTYPES]
    order = np.lexsort((t_abs, rank))
    r_sorted = rank[order]
    cuts = np.flatnonzero(np.r_[True, r_sorted[1:] != r_sorted[:-1], True])
    stage_ranks: dict[int, list[int]] = {}
    for r, s in zip(place["rank"], place["stage"], strict=True):
        stage_ranks.setdefault(int(s), []).append(int(r))
    out: list[RankTimeline] = []
    n_ranks = int(place["rank"].nunique())
    for a, b in itertools.pairwise(cuts):  # one iteration per rank
        sel = order[a:b]
        r = int(rank[sel[0]])
        d, s = int(dp[sel[0]]), int(stage[sel[0]])
        c = codes[sel]
        iv_m = kind[sel] >= 0
        isel = sel[iv_m]
        ic = codes[isel]
        intervals = Intervals.from_columns(
            isel.size,
            {
                "start": t_abs[isel],
                "end": t_abs[isel] + dur[isel],
                "stream": _STREAM[ic],
                "kind": kind[isel],
                "name": ic + 1,
                "phase": _PHASE[ic],
                "mb": np.where(np.isin(ic, (FC, BC)) | is_p2p[isel], mb[isel], -1),
                "chunk": mc[isel],
                "peer": peer[isel],
                "direction": _DIR[ic],
                "seq": np.where(kind[isel] == int(Kind.COLLECTIVE), -1, seq[isel]),
                "group": _GROUP[ic],
            },
        )
        blk = sel[(c == FC) | (c == BC)]
        oth = sel[(c == GC) | (c == OTHER)]
        lab = Ranges.from_columns(
            blk.size,
            {
                "start": t_abs[blk],
                "end": t_abs[blk] + dur[blk],
                "kind": np.full(blk.size, int(RangeKind.LABEL)),
                "name": codes[blk] + 1,
                "stage": lstage[blk],
                "mb": mb[blk],
                "phase": _PHASE[codes[blk]],
            },
        )
        other = Ranges.from_columns(
            oth.size,
            {
                "start": t_abs[oth],
                "end": t_abs[oth] + dur[oth],
                "kind": np.full(oth.size, int(RangeKind.OTHER)),
                "name": codes[oth] + 1,
                "phase": np.full(oth.size, int(Phase.OTHER)),
            },
        )
        st_rows = Ranges.from_columns(
            steps.size,
            {
                "start": w_lo,
                "end": w_hi,
                "kind": np.full(steps.size, int(RangeKind.STEP)),
                "name": np.zeros(steps.size),
                "num": steps,
            },
        )
        ranges = Ranges.concat([st_rows, lab, other])
        ranges = ranges.take(np.argsort(ranges.start, kind="stable"))
        line = lines[d]
        tp_peers = sorted(int(x) for x in place[(place["dp"] == d) & (place["stage"] == s)]["rank"])
        groups = [
            ProcessGroup(f"pp_dp{d}", "PIPELINE_MODEL_PARALLEL_GROUP", line),
            ProcessGroup(f"dp_stage{s}", "DATA_PARALLEL_GROUP", sorted(stage_ranks[s])),
            ProcessGroup(f"emb_dp{d}", "EMBEDDING_GROUP", sorted({line[0], line[-1]})),
            ProcessGroup(f"tp_dp{d}_s{s}", "TENSOR_MODEL_PARALLEL_GROUP", tp_peers),
        ]
        out.append(
            RankTimeline(
                rank=r,
                source=src,
                format="optable",
                names=names,
                intervals=intervals.sorted(),
                ranges=ranges,
                world_size=n_ranks,
                process_groups=groups,
                rank_source="rank column" if not laid else "Megatron order from (dp, pp, tp)",
                events_total=int(sel.size),
                # said once for the file, not once per rank
                warnings=list(warnings) if not out else [],
                meta={"pipeline": d, "dp_rank": d, "pp_rank": s, "time_resolution_ns": resolution_ns},
            )
        )
    return out


register(OpTableParser())

__all__ = ["OPTYPES", "REQUIRED", "OpTableParser"]
