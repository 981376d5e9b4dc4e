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
from ppdiag.parsers.heap import trim_heap
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
        out = to_ranks(df, src, False, [], res)
        del df
        trim_heap()  # the table's pages, freed now, back to the system (not kept through the analysis)
        return out


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
        df = _read_raw(path, src, head, replicas)
    except InputError:
        raise
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise InputError(src, f"cannot read the op table ({str(exc).splitlines()[0][:200]})") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(src, f"op table lacks the required column(s) {', '.join(missing)}")
    n, res = len(df), 0.0
    cols: dict[str, Any] = {}
    try:
        # column by column, each raw column let go once converted: the table is held about once,
        # not raw + converted + the frame's consolidated copy (4x the frame at the peak before)
        for c, name in _OUT.items():
            raw = df.pop(name) if name in df.columns else None
            cols[c] = _converted(c, raw, n)
            if raw is not None and c in ("t0", "dur"):
                # ends are start + duration: both columns' resolution
                res = max(res, resolution_ns(raw.to_numpy(), 1e9))
            del raw
    except (ValueError, TypeError) as exc:
        raise InputError(src, f"op table has non-numeric values ({str(exc).splitlines()[0][:200]})") from None
    return pd.DataFrame(cols, copy=False), res


# the frame's columns and the table's column each is read from
_OUT = {
    "dp_rank": "dp_rank",
    "stage": "stage",
    "rank": "rank",
    "step": "step",
    "optype": "optype",
    "t0": "start_ts",
    "dur": "duration",
    "seq_id": "seq_id",
    "mc": "mc",
    "gmc": "gmc",
    "mb_id": "mb_id",
}
_INTS = ("dp_rank", "stage", "rank", "step")


def _converted(c: str, raw: pd.Series[Any] | None, n: int) -> Any:
    """Frame column ``c`` from its table column: ints, times in ns, optypes as a categorical
    (one small code per row, not one string object per row); an absent optional column is -1."""
    import pandas as pd

    if raw is None:
        return np.full(n, -1, dtype=np.int64)
    if c == "optype":
        if isinstance(raw.dtype, pd.CategoricalDtype) and all(isinstance(v, str) for v in raw.cat.categories):
            return raw
        return raw.astype(str).astype("category")
    if c in ("t0", "dur"):
        return seconds_to_ns(raw)
    if c in _INTS:
        return raw.to_numpy(np.int64)
    return raw.fillna(-1).to_numpy(np.int64)


def _read_raw(path: Path, src: str, head: bytes, replicas: Sequence[int] | None) -> pd.DataFrame:
    """The table as read: Parquet, JSON Lines or CSV (a CSV's known columns typed as they are
    read, when they parse so: no float or string copy of the integer columns on the way)."""
    import pandas as pd

    if head.startswith(b"PAR1"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(
                src, "Parquet op tables need pyarrow: pip install pyarrow (the ppdiag[parquet] extra)"
            ) from None
        rows = None if replicas is None else [("dp_rank", "in", list(replicas))]
        return pd.read_parquet(path, filters=rows)
    if _first_line(head).startswith(b"{"):
        return pd.read_json(path, lines=True, compression=_compression(path))
    typed: dict[str, Any] = {c: np.int64 for c in _INTS}
    typed["optype"] = "category"
    try:
        return pd.read_csv(path, compression=_compression(path), dtype=typed)
    except (ValueError, TypeError):
        # a value that is not an integer where one is due (1.0, 2e3, text): read untyped, and
        # the conversion says what it found
        return pd.read_csv(path, compression=_compression(path))


register(OpTableParser())

__all__ = ["OPTYPES", "REQUIRED", "OpTableParser", "read_table", "seconds_to_ns"]
