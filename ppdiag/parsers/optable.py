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
and ``meta["pipeline"]`` = its DP replica index. All work is vectorized (pandas / numpy); the
mapping to ranks is :mod:`ppdiag.parsers.optable_ranks`.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.io import qpath
from ppdiag.model import RankTimeline
from ppdiag.parsers import ParseOptions, register
from ppdiag.parsers.optable_ranks import OPTYPES, to_ranks

if TYPE_CHECKING:
    import pandas as pd

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
OPTIONAL = ("seq_id", "mc", "gmc", "mb_id")

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
        return to_ranks(df, src, laid, warnings, res)


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
                    src, "Parquet op tables need pyarrow: pip install pyarrow (the ppdiag[parquet] extra)"
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


register(OpTableParser())

__all__ = ["OPTYPES", "REQUIRED", "OpTableParser"]
