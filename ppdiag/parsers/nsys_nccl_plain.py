"""The NCCL domains' NVTX range rows read as plain columns through ADBC, filtered in numpy.

The query of :func:`ppdiag.parsers.nsys_nvtx._nccl_rows` guards every integer column with a
``typeof`` test and picks the rows of the NCCL (process, domain) pairs with one comparison chain
per row; SQLite evaluating those expressions was about 40 % of that read (~0.04 s CPU of a 65 MB
export's 131 k NCCL ranges, measured). Here the same rows come from plain columns, selected in
SQL by the domain id alone, and are filtered in numpy:

* the reader takes a column only where every value is an int64 without NULLs, so each ``typeof``
  test of the guarded query is true and each guarded column is the plain one (else None: the
  guarded query reads the rows);
* the guarded query's key test on ``domainId`` (an integer, or 0 when not one) keeps only rows
  whose ``domainId`` is an integer equal to a key's domain, which ``domainId IN (...)`` keeps too
  when no key's domain is 0: the SQL selection holds every wanted row, and numpy keeps exactly
  the rows of the keys' (process, domain) pairs with ``end >= start``;
* a row that would need a text column (a plain-text name, a JSON payload) sends the read back to
  the guarded query, which decides per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.parsers.nsys_arrow import Blobs
from ppdiag.parsers.nsys_db import NsysDb

NVTX = "NVTX_EVENTS"
_PLAIN = np.dtype([(c, np.int64) for c in ("start", "end", "gtid", "tid_", "dom", "texts")])
_DOM_BITS = 39  # (process << 39) | domain packs a 24-bit process and a domain below 2**39 in int64
_NEEDED = ("start", "end", "globalTid", "textId", "domainId", "binaryData")


def plain_nccl_rows(
    db: NsysDb, keys: list[tuple[int, int]], range_types: str
) -> tuple[npt.NDArray[Any], Blobs] | None:
    """(rows with the int64 fields ``start``, ``end``, ``gtid`` (``globalTid``) and ``tid_``
    (``textId``), their payload BLOBs) of the range rows (``eventType`` in ``range_types``,
    integer times with ``end >= start``) of the (process, domain) ``keys``, in table order,
    exactly as the guarded query gives them; None where this read cannot tell."""
    if db.arrow is None or not keys or not set(_NEEDED) <= set(db.columns(NVTX)):
        return None
    doms = sorted({d for _, d in keys})
    if doms[0] <= 0 or doms[-1] >= 1 << _DOM_BITS:
        return None
    texts = [db.col(NVTX, c, "") for c in ("text", "jsonText", "jsonTextId")]
    present = [t for t in texts if t]
    # 1 where a text column holds a value: the guarded query then decides (only NULLs here)
    needs = f"coalesce({', '.join(present)}, NULL) IS NOT NULL" if present else "0"
    got = db.arrow.fetch_blobs(
        f'SELECT start, "end", globalTid, textId, domainId, {needs}, '
        "CASE WHEN typeof(binaryData) = 'blob' THEN binaryData END "
        f"FROM {NVTX} WHERE eventType IN ({range_types}) AND domainId IN ({', '.join(str(d) for d in doms)})",
        _PLAIN,
    )
    if got is None:
        return None
    rows, blobs = got
    pid = (rows["gtid"] >> 24) & 0xFFFFFF
    code = (pid << _DOM_BITS) | rows["dom"]  # the SQL kept domains in (0, 2**39) only
    want = np.array(sorted((int(p) << _DOM_BITS) | int(d) for p, d in keys), dtype=np.int64)
    keep = np.isin(code, want) & (rows["end"] >= rows["start"])
    if rows["texts"][keep].any():
        return None
    if not keep.all():
        rows, blobs = rows[keep], blobs.take(keep)
    return rows, blobs
