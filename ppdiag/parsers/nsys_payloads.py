"""NCCL's NVTX extended payloads in an nsys export: communicator, bytes, peer, ranks.

NCCL (>= 2.19) attaches a typed payload to each API range whose layout is described by
``NVTX_PAYLOAD_SCHEMA_ENTRIES`` (entry names such as ``"Peer rank"``, ``"Message size [bytes]"``,
``"NCCL communicator ID"``); the bytes of each payload are in ``NVTX_EVENTS.binaryData`` when the
export was made with ``--include-blobs``. Payloads are decoded column-wise: blobs of one length are
stacked into a byte matrix and every field is read as a numpy view at its offset. JSON payloads
(``jsonText``) are read with the same field names or their common spellings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ppdiag.parsers.nsys_arrow import Blobs
from ppdiag.parsers.nsys_db import NsysDb, int_expr
from ppdiag.parsers.nsys_names import NCCL_INIT_APIS, NCCL_P2P_APIS

I64 = npt.NDArray[np.int64]

# NVTX payload entry types → numpy dtype (nvToolsExtPayload.h; LP64 for long / size_t).
_PAYLOAD_TYPES: dict[int, str] = {
    1: "i1",
    2: "u1",
    3: "<i2",
    4: "<u2",
    5: "<i4",
    6: "<u4",
    7: "<i8",
    8: "<u8",
    9: "<i8",
    10: "<u8",
    11: "i1",
    12: "u1",
    13: "<i2",
    14: "<u2",
    15: "<i4",
    16: "<u4",
    17: "<i8",
    18: "<u8",
    22: "<u8",
    23: "<u8",
}
PAYLOAD_HEADER = 32  # nsys blob header: domain, schema id, payload size, total size (4 × u64)

F_COMM = "NCCL communicator ID"
F_BYTES = "Message size [bytes]"
F_PEER = "Peer rank"
F_NRANKS = "No. of ranks"
F_RANK = "Rank"
F_DEVICE = "CUDA device"
PAYLOAD_FIELDS = (F_COMM, F_BYTES, F_PEER, F_NRANKS, F_RANK, F_DEVICE)
# JSON spellings accepted besides the schema entry names (``--include-json`` style payloads).
_JSON_ALIASES = {
    F_COMM: ("NCCL communicator ID", "comm", "commHash", "CommHash", "communicator"),
    F_BYTES: ("Message size [bytes]", "bytes", "Bytes", "size", "msg_size"),
    F_PEER: ("Peer rank", "peer", "Peer"),
    F_NRANKS: ("No. of ranks", "nranks", "nRanks"),
    F_RANK: ("Rank", "rank", "myrank"),
    F_DEVICE: ("CUDA device", "cudaDev", "device"),
}


@dataclass
class _Schema:
    payload_size: int
    fields: dict[str, tuple[str, int]]  # entry name → (numpy dtype, offset)


def _schemas(db: NsysDb) -> dict[int, _Schema]:
    """Payload schemas keyed by schema id (NCCL's static ids are unique across domains)."""
    table = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
    cols = set(db.columns(table))
    if not {"schemaId", "idx", "type", "name"} <= cols:
        return {}
    # Integers only (a damaged schema row is skipped, not a crash); a NULL offset stays NULL.
    off = 'CASE WHEN typeof("offset") = \'integer\' THEN "offset" END' if "offset" in cols else "NULL"
    typ = int_expr('"type"')
    rows = db.execute(
        f"SELECT DISTINCT {int_expr('schemaId')}, {int_expr('idx')}, {typ}, name, {off} "
        f"FROM {table} WHERE typeof(schemaId) = 'integer' ORDER BY 1, 2"
    ).fetchall()
    sizes: dict[int, int] = {}
    if {"schemaId", "payloadSize"} <= set(db.columns("NVTX_PAYLOAD_SCHEMAS")):
        for sid, size in db.execute(
            "SELECT DISTINCT schemaId, payloadSize FROM NVTX_PAYLOAD_SCHEMAS "
            "WHERE typeof(schemaId) = 'integer' AND typeof(payloadSize) = 'integer'"
        ):
            sizes[int(sid)] = int(size)
    out: dict[int, _Schema] = {}
    cursor: dict[int, int] = {}
    for sid, _idx, typ, name, offset in rows:
        sid = int(sid)
        if offset is not None and not 0 <= int(offset) < 1 << 20:
            continue
        sch = out.setdefault(sid, _Schema(sizes.get(sid, 0), {}))
        dt = _PAYLOAD_TYPES.get(int(typ))
        width = np.dtype(dt).itemsize if dt else 8
        # The first entry's offset is stored as NULL (= 0); missing offsets follow natural alignment.
        if offset is None:
            pos = cursor.get(sid, 0)
            offset = (pos + width - 1) // width * width
        cursor[sid] = int(offset) + width
        if dt is not None and isinstance(name, str) and name:
            sch.fields[name] = (dt, int(offset))
    for sid, sch in out.items():
        if sch.payload_size <= 0:
            sch.payload_size = cursor.get(sid, 0)
    return out


def decode_payloads(db: NsysDb, blobs: Blobs, api_code: I64, apis: list[str]) -> dict[str, I64]:
    """Decode the NCCL payload fields of each row; -1 (0 for the communicator) when absent.

    ``apis[api_code[i]]`` is row ``i``'s NCCL API name (it picks the schema of bare payloads)."""
    n = len(blobs)
    out: dict[str, I64] = {f: np.full(n, -1, dtype=np.int64) for f in PAYLOAD_FIELDS}
    out[F_COMM] = np.zeros(n, dtype=np.int64)
    out["_has"] = np.zeros(n, dtype=np.int64)
    blob_len = blobs.lengths
    present = blob_len > 0
    if not present.any():
        return out
    schemas = _schemas(db)
    if not schemas:
        return out
    idx_all = np.flatnonzero(present)
    lengths = blob_len[idx_all]
    for length in _distinct(lengths):
        idx = idx_all[lengths == length]
        mat = _matrix(blobs, idx, length)
        schema_ids, body = _schema_of(mat, schemas, api_code[idx], apis)
        for sid in _distinct(schema_ids):
            sch = schemas.get(int(sid))
            if sch is None:
                continue
            sel = schema_ids == sid
            rows_sel = idx[sel]
            sub = mat[sel]
            for fname, (dt, offset) in sch.fields.items():
                if fname not in out:
                    continue
                w = np.dtype(dt).itemsize
                lo = body + offset
                if lo + w > length:
                    continue
                vals = np.ascontiguousarray(sub[:, lo : lo + w]).view(dt).reshape(-1)
                out[fname][rows_sel] = (
                    vals.astype(np.uint64).view(np.int64) if dt.endswith("u8") else vals.astype(np.int64)
                )
            out["_has"][rows_sel] = 1
    return out


def _distinct(values: I64) -> list[int]:
    """The distinct values, ascending; one compare where all are equal (NCCL's payloads mostly
    are of one length and schema) instead of a sort."""
    if len(values) and (values == values[0]).all():
        return [int(values[0])]
    return [int(v) for v in np.unique(values).tolist()]


def _matrix(blobs: Blobs, idx: I64, length: int) -> npt.NDArray[np.uint8]:
    """The values ``idx`` (each ``length`` bytes) stacked as rows of a byte matrix: a view where
    they lie back to back in the buffer (as a table's payloads of one kind do), else gathered."""
    starts = blobs.offsets[idx]
    first = int(starts[0])
    if (starts == first + length * np.arange(len(idx), dtype=np.int64)).all():
        return blobs.data[first : first + length * len(idx)].reshape(len(idx), length)
    out: npt.NDArray[np.uint8] = blobs.data[starts[:, None] + np.arange(length, dtype=np.int64)]
    return out


def _schema_of(
    mat: npt.NDArray[np.uint8], schemas: dict[int, _Schema], api_code: I64, apis: list[str]
) -> tuple[I64, int]:
    """Schema id per row and where the payload body starts in the blob."""
    length = mat.shape[1]
    if length >= PAYLOAD_HEADER:
        sid = np.ascontiguousarray(mat[:, 8:16]).view("<u8").reshape(-1).astype(np.int64)
        if np.isin(sid, list(schemas)).any():
            return sid, PAYLOAD_HEADER
    # Bare payload: pick the schema by size and by what the API carries.
    out = np.full(len(api_code), -1, dtype=np.int64)
    for k in np.unique(api_code).tolist():
        a = apis[k]
        fname = F_PEER if a in NCCL_P2P_APIS else F_NRANKS if a in NCCL_INIT_APIS else F_BYTES
        cands = [s for s, sch in schemas.items() if sch.payload_size == length and fname in sch.fields]
        if cands:
            out[api_code == k] = cands[0]
    return out, 0


def merge_json(
    fields: dict[str, I64],
    texts: np.ndarray,
    text_ids: I64,
    strings: dict[int, str],
    mask: npt.NDArray[np.bool_],
) -> None:
    """JSON payload text (per NCCL call; these are few next to kernels)."""
    for i in np.flatnonzero(mask).tolist():
        raw = texts[i] if texts[i] is not None else strings.get(int(text_ids[i]))
        try:
            obj = json.loads(raw) if raw else None
        except (TypeError, ValueError):
            obj = None
        if not isinstance(obj, dict):
            continue
        for fname, aliases in _JSON_ALIASES.items():
            for a in aliases:
                v = obj.get(a)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    iv = int(v)
                    fields[fname][i] = iv - (1 << 64) if iv >= (1 << 63) else iv
                    break
        fields["_has"][i] = 1
