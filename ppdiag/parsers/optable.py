"""Op-level timelines of production jobs: one file holds every rank's per-micro-batch ops.

Two forms carry the same data (Megatron-style timers, in-house platform tracers):

* **op table** (CSV, JSON Lines, or Parquet through pyarrow, the ``ppdiag[parquet]`` extra): one row
  per op with ``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id``;
  ``start_ts`` / ``duration`` in seconds, ``start_ts`` relative to the start of that step on that
  rank's clock. Steps may be a sample (23, 25, 33 ...): they are laid side by side on one clock, in
  step order, each step window as long as its longest rank plus a small gap (said in a warning).
* **Chrome / Perfetto timeline**: a JSON array (optionally gzipped) of ``ph: "X"`` events, ``name``
  = optype, ``ts`` / ``dur`` in µs (one run-wide clock or step-relative), ``args: {step,
  model_chunk, mb_id, seq_id}``; ``pid`` is the DP rank and each ``tid`` a lane named by
  ``thread_name`` metadata ``"PP rank s, TP rank t, <lane>"`` wherever it sits, or by nothing
  (:mod:`ppdiag.parsers.optimeline`, a parser of its own, reads it as it comes).

Mapping: ``forward-compute`` / ``backward-compute`` are COMPUTE intervals (phase FWD / BWD, the
micro-batch, the chunk) with a pipeline LABEL range each (virtual stage ``gmc`` when given, else the
stage), so the pipeline layer reads stage map, schedule and M from the data; sends / receives are
P2P with the neighbouring stage of the same replica as peer; the DP collectives are COLLECTIVE in a
process group per stage across replicas (the embedding all-reduce in the first+last stage group);
the optimizer is COMPUTE with phase OPTIM, its gradient clip a COLLECTIVE over every rank (the
gradient-norm all-reduce, which waits for the slowest rank); ``gc`` and unknown optypes are kept
as OTHER ranges (unknown ones counted in a warning). Every rank gets its pipeline as a
``PIPELINE`` process group and ``meta["pipeline"]`` = its DP replica index. All work is vectorized
(pandas / numpy); the mapping to ranks is :mod:`ppdiag.parsers.optable_ranks`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.io import qpath
from ppdiag.model import RankTimeline
from ppdiag.parsers import ParseOptions, register
from ppdiag.parsers.optable_ranks import OPTYPES, resolution_ns, to_ranks

if TYPE_CHECKING:
    import pandas as pd

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")
OPTIONAL = ("seq_id", "mc", "gmc", "mb_id")

_CSV_HEAD = re.compile(rb"^\W*dp_rank\b|\bdp_rank\b.*\boptype\b|\boptype\b.*\bdp_rank\b", re.IGNORECASE)


def _first_line(head: bytes) -> bytes:
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").split(b"\n", 1)[0]


class OpTableParser:
    """Op tables (CSV / JSON Lines / Parquet), all ranks in one file."""

    name = "optable"
    format = "optable"
    suffixes: tuple[str, ...] = (".csv", ".csv.gz", ".jsonl", ".jsonl.gz", ".ndjson", ".parquet")
    describe = "op tables (*.csv, *.jsonl, *.parquet, gzipped or not)"
    holds_every_rank = True

    def sniff(self, path: Path, head: bytes) -> bool:
        if head.startswith(b"PAR1"):
            return True
        line = _first_line(head)
        if line.startswith(b"{"):
            return b'"optype"' in line and b'"dp_rank"' in line
        if line.startswith(b"["):
            return False  # a JSON array: the Chrome timeline form (ppdiag.parsers.optimeline)
        return bool(_CSV_HEAD.search(line)) and b"," in line

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        src = qpath(path)
        df, res = read_table(path, src, _read_head(path))
        return to_ranks(df, src, False, [], res)


_Codec = Literal["gzip", "bz2", "xz", "zstd"]
_MAGIC: dict[bytes, _Codec] = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bz2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


def _compression(path: Path) -> _Codec | None:
    """The compression of a table by its bytes, not its name (a gzipped ``ops.csv`` is read too)."""
    with open(path, "rb") as fh:
        head = fh.read(6)
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def _read_head(path: Path) -> bytes:
    """The first bytes of the file, decompressed whatever compressed it."""
    from ppdiag.parsers.detect import read_head

    return read_head(path, 1 << 12)


def seconds_to_ns(col: pd.Series[Any]) -> npt.NDArray[np.int64]:
    """A column of seconds as integer ns (float32 seconds are normal: their resolution goes to the
    replay's timing tolerance)."""
    return np.rint(col.to_numpy(np.float64) * 1e9).astype(np.int64)


def read_table(
    path: Path, src: str, head: bytes, replicas: Sequence[int] | None = None
) -> tuple[pd.DataFrame, float]:
    """The table's rows as the frame :func:`ppdiag.parsers.optable_ranks.to_ranks` reads, and the
    resolution of its times in ns. ``replicas``: only the rows of these ``dp_rank`` values (a
    Parquet table's row groups are skipped by their statistics when it is sorted by ``dp_rank``)."""
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    try:
        if head.startswith(b"PAR1"):
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise InputError(
                    src, "Parquet op tables need pyarrow: pip install pyarrow (the ppdiag[parquet] extra)"
                ) from None
            rows = None if replicas is None else [("dp_rank", "in", list(replicas))]
            df = pd.read_parquet(path, filters=rows)
        elif _first_line(head).startswith(b"{"):
            df = pd.read_json(path, lines=True, compression=_compression(path))
        else:
            df = pd.read_csv(path, compression=_compression(path))
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
                "t0": seconds_to_ns(df["start_ts"]),
                "dur": seconds_to_ns(df["duration"]),
                "seq_id": df["seq_id"].fillna(-1).to_numpy(np.int64),
                "mc": df["mc"].fillna(-1).to_numpy(np.int64),
                "gmc": df["gmc"].fillna(-1).to_numpy(np.int64),
                "mb_id": df["mb_id"].fillna(-1).to_numpy(np.int64),
            }
        )
    except (ValueError, TypeError) as exc:
        raise InputError(src, f"op table has non-numeric values ({str(exc).splitlines()[0][:200]})") from None
    # ends are start + duration: both columns' resolution
    res = max(resolution_ns(df["start_ts"].to_numpy(), 1e9), resolution_ns(df["duration"].to_numpy(), 1e9))
    return out, res


register(OpTableParser())

__all__ = ["OPTYPES", "REQUIRED", "OpTableParser", "read_table", "seconds_to_ns"]
