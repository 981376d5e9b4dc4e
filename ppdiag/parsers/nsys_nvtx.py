"""NVTX ranges of an nsys export: user annotations (steps, pipeline labels) and the NCCL domain's
API ranges with their extended payloads (communicator, bytes, peer).

NCCL (>= 2.19) annotates each API call as a push/pop range in the NVTX domain ``"NCCL"`` with a
typed payload whose layout is described by ``NVTX_PAYLOAD_SCHEMA_ENTRIES`` (entry names such as
``"Peer rank"``, ``"Message size [bytes]"``, ``"NCCL communicator ID"``); the bytes of each
payload are in ``NVTX_EVENTS.binaryData`` when the export was made with ``--include-blobs``
(decoded by :mod:`ppdiag.parsers.nsys_payloads`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_not
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Direction
from ppdiag.parsers.nsys_arrow import Blobs
from ppdiag.parsers.nsys_db import BadTimes, NsysDb, bad_time_code, factorize, int_expr, valid_times
from ppdiag.parsers.nsys_names import (
    NCCL_API_NAMES,
    NCCL_COLLECTIVE_APIS,
    NCCL_GROUP_END,
    NCCL_GROUP_START,
    NCCL_INIT_APIS,
    NCCL_P2P_APIS,
    OP_NAMESPACES_SQL,
    classify_range,
    nccl_api,
    strip_op_tail,
)
from ppdiag.parsers.nsys_nccl_plain import plain_nccl_rows
from ppdiag.parsers.nsys_payloads import (
    F_BYTES,
    F_COMM,
    F_NRANKS,
    F_PEER,
    F_RANK,
    decode_payloads,
    merge_json,
)

I64 = npt.NDArray[np.int64]
NVTX = "NVTX_EVENTS"
RANGE_TYPES = (59, 60, 70, 71)  # push/pop, start/end, and their NVTXT variants (NSYS.md §4)
DOMAIN_CREATE = 75
THREAD_NAME = 39

# NCCL API range categories
API_OTHER, API_P2P, API_COLL, API_GROUP_START, API_GROUP_END, API_INIT = 0, 1, 2, 3, 4, 5


@dataclass
class HostRanges:
    """Kept NVTX ranges of all processes (file-level name table ``names``)."""

    start: I64
    end: I64
    pid: I64
    tid: I64
    name: npt.NDArray[np.int32]
    kind: npt.NDArray[np.int8]
    num: I64
    numbered: npt.NDArray[np.bool_]
    stage: npt.NDArray[np.int32]
    mb: npt.NDArray[np.int32]
    phase: npt.NDArray[np.int8]
    direction: npt.NDArray[np.int8]
    names: list[str]
    torch_p2p: npt.NDArray[np.bool_]  # PyTorch "nccl:send a->b" / "nccl:recv a<-b" ranges
    group_rank: I64  # their own process-group rank (-1 unknown or not torch_p2p)
    group_peer: I64  # their peer's process-group rank (-1 unknown or not torch_p2p)


@dataclass
class NcclCalls:
    """NCCL API ranges of all processes with their decoded payloads (-1 / 0 when absent)."""

    start: I64
    end: I64
    pid: I64
    tid: I64
    api: npt.NDArray[np.int8]
    name: npt.NDArray[np.int32]  # index into ``names``
    names: list[str]
    direction: npt.NDArray[np.int8]
    peer_local: I64
    bytes: I64
    comm: I64  # communicator hash reinterpreted as int64; 0 when unknown
    nranks: I64
    rank: I64
    has_payload: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass
class Spans:
    """Plain (pid, tid, start, end) spans, e.g. ranges that prove all-to-all."""

    start: I64
    end: I64
    pid: I64
    tid: I64


@dataclass
class NvtxData:
    ranges: HostRanges
    nccl: NcclCalls
    collective: Spans  # ranges of collectives (all-to-all, c10d ops): NCCL launches inside are theirs
    thread_ranks: dict[int, int] = field(default_factory=dict)  # pid → rank from "MPI Rank N"
    skipped_op_ranges: int = 0
    has_nvtx_table: bool = False
    nccl_domain: bool = False
    nccl_domain_unnamed: int = 0  # (process, domain) pairs taken as NCCL's without a domain-create row
    bad_times: BadTimes = field(default_factory=BadTimes)  # ranges dropped for their start/end
    open_torch_p2p: int = 0  # PyTorch p2p ranges without an end, kept at their start


def _empty_i64() -> I64:
    return np.empty(0, dtype=np.int64)


def read_nvtx(db: NsysDb) -> NvtxData:
    """NVTX ranges of the export, split into user ranges and NCCL API calls."""
    if not db.has(NVTX) or not {"start", "eventType"} <= set(db.columns(NVTX)):
        return NvtxData(_empty_ranges(), _empty_nccl(), _empty_spans())
    domains = _domains(db)
    nccl_keys = [(pid, dom) for (pid, dom), name in domains.items() if name.upper() == "NCCL"]
    unnamed = _nccl_like_domains(db, list(domains))
    nccl_keys += unnamed
    ranges, a2a, skipped, bad, open_p2p = _user_ranges(db, domains, nccl_keys)
    nccl = _nccl_calls(db, nccl_keys) if nccl_keys else _empty_nccl()
    return NvtxData(
        ranges=ranges,
        nccl=nccl,
        collective=a2a,
        thread_ranks=_thread_ranks(db),
        skipped_op_ranges=skipped,
        has_nvtx_table=True,
        nccl_domain=bool(nccl_keys),
        nccl_domain_unnamed=len(unnamed),
        bad_times=bad,
        open_torch_p2p=open_p2p,
    )


def _nccl_like_domains(db: NsysDb, named: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(pid, domainId) of non-default NVTX domains that are NCCL's although no domain-create row
    names them (the capture began after NCCL registered its domain, or the row was lost): their
    ranges carry NCCL API names (``ncclSend``, ``ncclAllReduce``...), or their payload schemas
    have NCCL's fields. The rows of the ``named`` domains are left out before the tests (most
    of the table where NCCL's domain is named)."""
    if "domainId" not in db.columns(NVTX):
        return []
    types = ", ".join(str(t) for t in RANGE_TYPES)
    api = ", ".join(f"'{a}'" for a in sorted(NCCL_API_NAMES))
    dom = int_expr("domainId", "0")
    tests = []
    if "text" in db.columns(NVTX):
        tests.append(f"lower(text) IN ({api})")
    if "textId" in db.columns(NVTX) and db.has("StringIds"):
        tests.append(f"textId IN (SELECT id FROM StringIds WHERE lower(value) IN ({api}))")
    schema_doms = _nccl_schema_domains(db)
    if schema_doms:
        tests.append(f"{dom} IN ({', '.join(str(d) for d in schema_doms)})")
    if not tests:
        return []
    rows = db.execute(
        f"SELECT DISTINCT (coalesce(globalTid, 0) >> 24) & 16777215, {dom} FROM {NVTX} "
        f"WHERE eventType IN ({types}) AND {dom} != 0{_exclude_clause(named)} AND ({' OR '.join(tests)})"
    ).fetchall()
    return sorted((int(p), int(d)) for p, d in rows)


def _nccl_schema_domains(db: NsysDb) -> list[int]:
    """NVTX domains whose payload schemas carry NCCL's entries (``NCCL communicator ID``...)."""
    table = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
    if not {"domainId", "name"} <= set(db.columns(table)):
        return []
    marks = ", ".join("?" for _ in (F_COMM, F_PEER))
    rows = db.execute(
        f"SELECT DISTINCT {int_expr('domainId', '0')} FROM {table} WHERE name IN ({marks})", (F_COMM, F_PEER)
    ).fetchall()
    return sorted({int(r[0]) for r in rows} - {0})


def _text_expr(db: NsysDb) -> tuple[str, str]:
    text = db.col(NVTX, "text", "NULL")
    text_id = int_expr(db.col(NVTX, "textId", "NULL"))
    return text_id, text


def _domains(db: NsysDb) -> dict[tuple[int, int], str]:
    """(pid, domainId) → domain name, from the NvtxDomainCreate rows of each process."""
    if "domainId" not in db.columns(NVTX):
        return {}
    text_id, text = _text_expr(db)
    rows = db.execute(
        "SELECT DISTINCT (coalesce(globalTid, 0) >> 24) & 16777215, "
        f"{int_expr('domainId', '0')}, {text_id}, {text} "
        f"FROM {NVTX} WHERE eventType = {DOMAIN_CREATE}"
    ).fetchall()
    strings = db.strings(r[2] for r in rows)
    out: dict[tuple[int, int], str] = {}
    for pid, dom, tid_, txt in rows:
        out[(int(pid), int(dom or 0))] = (
            strings.get(int(tid_), "") if tid_ is not None and tid_ >= 0 else str(txt or "")
        )
    return out


def _thread_ranks(db: NsysDb) -> dict[int, int]:
    """Thread-naming marks such as ``"MPI Rank 3"`` (MPI tracing): pid → rank."""
    text_id, text = _text_expr(db)
    rows = db.execute(
        f"SELECT (coalesce(globalTid, 0) >> 24) & 16777215, {text_id}, {text} FROM {NVTX} "
        f"WHERE eventType = {THREAD_NAME}"
    ).fetchall()
    strings = db.strings(r[1] for r in rows)
    out: dict[int, int] = {}
    pat = re.compile(r"(?:MPI\s+)?Rank\s+(\d+)", re.IGNORECASE)
    for pid, tid_, txt in rows:
        s = strings.get(int(tid_), "") if tid_ is not None and tid_ >= 0 else str(txt or "")
        m = pat.fullmatch(s.strip())
        if m:
            out.setdefault(int(pid), int(m.group(1)))
    return out


# up to this many (pid, domain) keys are matched by a chain of comparisons, more by a row-value
# IN (VALUES ...): SQLite evaluates the few comparisons about twice as fast as the IN's lookup
# (~10 ms of a 130 k-row NVTX table per scan)
_KEY_CHAIN = 8


def _key_test(keys: list[tuple[int, int]]) -> str:
    """SQL: the row's (process, domain) is one of ``keys`` (integers, written into the query; never
    NULL, so the chain of comparisons and the IN give the same truth value)."""
    pid = "((coalesce(globalTid, 0) >> 24) & 16777215)"
    dom = int_expr("domainId", "0")
    if len(keys) <= _KEY_CHAIN:
        return "(" + " OR ".join(f"({pid} = {int(p)} AND {dom} = {int(d)})" for p, d in keys) + ")"
    vals = ", ".join(f"({int(p)}, {int(d)})" for p, d in keys)
    return f"(({pid}, {dom}) IN (VALUES {vals}))"


def _exclude_clause(keys: list[tuple[int, int]]) -> str:
    return f" AND NOT {_key_test(keys)}" if keys else ""


def _user_range_sql(db: NsysDb, nccl_keys: list[tuple[int, int]]) -> str:
    """The query of user ranges: every range outside the NCCL domains but plain operator ranges,
    plus the rows of any domain with unusable times (only to be counted)."""
    text_id, text = _text_expr(db)
    dom = int_expr(db.col(NVTX, "domainId", "0"), "0")
    excl = _exclude_clause(nccl_keys)
    types = ", ".join(str(t) for t in RANGE_TYPES)
    # emit_nvtx tails (", seq = N, op_id = M, sizes = ...") are cut in SQL so that names repeat, and
    # plain operator ranges (aten::, prim::...) never leave SQLite: they can outnumber kernels.
    t = text
    base = (
        f"CASE WHEN instr({t}, ', seq = ') > 0 THEN substr({t}, 1, instr({t}, ', seq = ') - 1) "
        f"WHEN instr({t}, ', op_id = ') > 0 THEN substr({t}, 1, instr({t}, ', op_id = ') - 1) "
        f"WHEN instr({t}, ', sizes = [') > 0 THEN substr({t}, 1, instr({t}, ', sizes = [') - 1) ELSE {t} END"
    )
    ops = " OR ".join(f"{t} GLOB '{g}'" for g in OP_NAMESPACES_SQL)
    not_op = f" AND NOT coalesce({ops}, 0)" if t != "NULL" else ""
    valid = valid_times()
    end = int_expr('"end"', "0")
    sql = (
        f"SELECT {int_expr('start', '0')}, {end}, "
        f"{int_expr('globalTid', '0')}, {text_id}, {dom}, "
        f"CASE WHEN {text_id} < 0 THEN {base} END, {bad_time_code()} FROM {NVTX} "
        # (valid AND kept) OR NOT valid, written so that the times are tested once per row (every
        # term is 0 or 1, never NULL)
        f"WHERE eventType IN ({types}) AND (NOT ({valid}) OR (1{excl}{not_op}))"
    )
    return sql


_USER_ROW = np.dtype(
    [
        ("start", np.int64),
        ("end", np.int64),
        ("gtid", np.int64),
        ("tid_", np.int64),
        ("dom", np.int64),
        ("text", object),
        ("bad", np.int64),
    ]
)


class _Classes:
    """Per-row columns of the range classification, run once per distinct name (MPI-domain rows
    with the MPI rules)."""

    def __init__(self, names: list[str], codes: I64, is_mpi: npt.NDArray[np.bool_]) -> None:
        self.codes, self.is_mpi, self.any_mpi = codes, is_mpi, bool(is_mpi.any())
        self.plain = [classify_range(s, "") for s in names]
        self.mpi = [classify_range(s, "MPI") for s in names] if self.any_mpi else self.plain

    def col(self, attr: str, dtype: Any) -> np.ndarray:
        a = np.array([getattr(c, attr) for c in self.plain], dtype=dtype)[self.codes]
        if self.any_mpi:
            b = np.array([getattr(c, attr) for c in self.mpi], dtype=dtype)[self.codes]
            a = np.where(self.is_mpi, b, a)
        return a


def _user_ranges(
    db: NsysDb, domains: dict[tuple[int, int], str], nccl_keys: list[tuple[int, int]]
) -> tuple[HostRanges, Spans, int, BadTimes, int]:
    """User ranges, all-to-all evidence spans, how many op ranges were left out, the range rows of
    any domain dropped for their start/end, and how many unclosed PyTorch p2p ranges were kept."""
    rows = db.fetch(_user_range_sql(db, nccl_keys), _USER_ROW)
    if not len(rows):
        return _empty_ranges(), _empty_spans(), 0, BadTimes(), 0
    pid = (rows["gtid"] >> 24) & 0xFFFFFF
    tid = rows["gtid"] & 0xFFFFFF
    # One code per distinct (registered id | plain text); classification runs per distinct name.
    codes, names = name_codes(db, rows["tid_"], rows["text"], strip_op_tail)
    # Domain names matter for MPI ranges only: classify those rows with the MPI rules.
    is_mpi = np.zeros(len(rows), dtype=bool)
    for p, d in [k for k, v in domains.items() if v.upper() == "MPI"]:
        is_mpi |= (pid == p) & (rows["dom"] == d)
    cls = _Classes(names, codes, is_mpi)
    col = cls.col
    # PyTorch's p2p titles are asynchronous record functions: one whose range was never closed on
    # its thread still says, by its start, which NCCL kernel it issued. Kept with zero length.
    bad_code = rows["bad"]
    rescued = (bad_code == 4) & col("torch_p2p", bool)
    rows["end"][rescued] = rows["start"][rescued]
    good = (bad_code == 0) | rescued
    bad = BadTimes.from_codes(bad_code[~good])
    keep = col("keep", bool) & good
    a2a = col("collective", bool) & good
    spans = Spans(rows["start"][a2a], rows["end"][a2a], pid[a2a], tid[a2a])
    k = keep
    # Re-index names to the kept rows only (dropped op ranges may hold most distinct names).
    used, new_codes = np.unique(codes[k], return_inverse=True)
    out = HostRanges(
        start=rows["start"][k],
        end=rows["end"][k],
        pid=pid[k],
        tid=tid[k],
        name=new_codes.astype(np.int32),
        kind=col("kind", np.int8)[k],
        num=col("num", np.int64)[k],
        numbered=col("numbered", bool)[k],
        stage=col("stage", np.int32)[k],
        mb=col("mb", np.int32)[k],
        phase=col("phase", np.int8)[k],
        direction=col("direction", np.int8)[k],
        names=[names[i] for i in used.tolist()],
        torch_p2p=col("torch_p2p", bool)[k],
        group_rank=col("group_rank", np.int64)[k],
        group_peer=col("group_peer", np.int64)[k],
    )
    return out, spans, int((~keep & good).sum()), bad, int(rescued.sum())


def name_codes(
    db: NsysDb, text_ids: I64, texts: np.ndarray, clean: Callable[[str], str] | None = None
) -> tuple[I64, list[str]]:
    """Per-row code into a list of distinct names, for rows named by a registered string id
    (``textId`` ≥ 0) or by plain text; hash-based, so the cost is one pass over the rows."""
    reg = text_ids >= 0
    codes = np.empty(len(text_ids), dtype=np.int64)
    names: list[str] = []
    if reg.any():
        rcodes, ruq = factorize(text_ids[reg])
        strings = db.strings(ruq.tolist())
        codes[reg] = rcodes
        names.extend(strings.get(int(u), "") for u in ruq)
    if (~reg).any():
        txt = texts[~reg]
        txt[np.equal(txt, np.array(None, dtype=object))] = ""  # SQL NULL (SQLite stores no NaN)
        pcodes, puniq = factorize(txt)
        codes[~reg] = pcodes + len(names)
        names.extend(str(x) for x in puniq)
    if clean is not None:
        names = [clean(x) for x in names]
    return codes, names


_NCCL_ROW = np.dtype(
    [
        ("start", np.int64),
        ("end", np.int64),
        ("gtid", np.int64),
        ("tid_", np.int64),
        ("text", object),
        ("blob", object),
        ("json", object),
        ("jtid", np.int64),
    ]
)
_NCCL_INTS = np.dtype([(c, np.int64) for c in ("start", "end", "gtid", "tid_", "needs_text")])


@dataclass
class _NcclRows:
    """The NCCL domains' range rows: integer columns, the text columns (None: all NULL) and the
    payload BLOBs."""

    ints: np.ndarray  # start, end, gtid, tid_, jtid
    text: np.ndarray | None
    json: np.ndarray | None
    blobs: Blobs


def _nccl_rows(db: NsysDb, keys: list[tuple[int, int]]) -> _NcclRows:
    """The NCCL domains' range rows, in table order.

    As plain columns through ADBC where they allow it (:mod:`ppdiag.parsers.nsys_nccl_plain`).
    Else through ADBC where it is on and no row needs a text column (a name held as plain text rather
    than a registered string id, or a JSON payload): the payloads then come as one buffer, with
    no Python object per row (sqlite3 made ~8 per row, most of this read's cost). Else with
    sqlite3, the same rows."""
    text_id, text = _text_expr(db)
    blob = db.col(NVTX, "binaryData", "NULL")
    jtext = db.col(NVTX, "jsonText", "NULL")
    jtid = int_expr(db.col(NVTX, "jsonTextId", "NULL"))
    gtid = int_expr("globalTid", "0")
    types = ", ".join(str(t) for t in RANGE_TYPES)
    # the keys are written into the query (ADBC takes no parameters)
    where = f"FROM {NVTX} WHERE eventType IN ({types}) AND {valid_times()} AND {_key_test(keys)}"
    plain = plain_nccl_rows(db, keys, types)
    if plain is not None:
        ints = np.empty(len(plain[0]), dtype=_NCCL_INTS)
        for c in ("start", "end", "gtid", "tid_"):
            ints[c] = plain[0][c]
        ints["needs_text"] = -1  # the jsonTextId column: every value was NULL
        return _NcclRows(ints, None, None, plain[1])
    if db.arrow is not None:
        # one flag for what the text columns would add: a plain-text name, a JSON payload
        needs_text = f"(({text}) IS NOT NULL AND {text_id} < 0) OR ({jtext}) IS NOT NULL OR {jtid} >= 0"
        got = db.arrow.fetch_blobs(
            f'SELECT start, "end", {gtid}, {text_id}, {needs_text}, '
            f"CASE WHEN typeof({blob}) = 'blob' THEN {blob} END {where}",
            _NCCL_INTS,
        )
        if got is not None and not got[0]["needs_text"].any():
            ints = got[0]
            ints["needs_text"] = -1  # the jsonTextId column: every value was -1
            return _NcclRows(ints, None, None, got[1])
    sql = f'SELECT start, "end", {gtid}, {text_id}, {text}, {blob}, {jtext}, {jtid} {where}'
    rows = db.fetch(sql, _NCCL_ROW)
    ints = np.empty(len(rows), dtype=_NCCL_INTS)
    for c in ("start", "end", "gtid", "tid_"):
        ints[c] = rows[c]
    ints["needs_text"] = rows["jtid"]
    return _NcclRows(ints, rows["text"], rows["json"], Blobs.from_objects(rows["blob"]))


def _nccl_calls(db: NsysDb, keys: list[tuple[int, int]]) -> NcclCalls:
    got = _nccl_rows(db, keys)
    rows, n = got.ints, len(got.ints)
    if not n:
        return _empty_nccl()
    texts = got.text if got.text is not None else np.full(n, None, dtype=object)
    codes, names = name_codes(db, rows["tid_"], texts)
    apis = [nccl_api(x) for x in names]
    api = np.array([_api_code(a) for a in apis], dtype=np.int8)[codes]
    direction = np.array([NCCL_P2P_APIS.get(a, Direction.NONE) for a in apis], dtype=np.int8)[codes]
    fields = decode_payloads(db, got.blobs, codes, apis)
    jtid = rows["needs_text"]
    has_json = jtid >= 0
    if got.json is not None:
        # map of operator.is_not over the rows runs in C (no Python bytecode per row)
        has_json |= np.fromiter(map(is_not, got.json.tolist(), repeat(None)), dtype=bool, count=n)
    if has_json.any():
        strings = db.strings(np.unique(jtid[jtid >= 0]).tolist())
        json_texts = got.json if got.json is not None else np.full(n, None, dtype=object)
        merge_json(fields, json_texts, jtid, strings, has_json)
    return NcclCalls(
        start=rows["start"],
        end=rows["end"],
        pid=(rows["gtid"] >> 24) & 0xFFFFFF,
        tid=rows["gtid"] & 0xFFFFFF,
        api=api,
        name=codes.astype(np.int32),
        names=names,
        direction=direction,
        peer_local=fields[F_PEER],
        bytes=fields[F_BYTES],
        comm=fields[F_COMM],
        nranks=fields[F_NRANKS],
        rank=fields[F_RANK],
        has_payload=fields["_has"].astype(bool),
    )


def _api_code(api: str) -> int:
    if api in NCCL_P2P_APIS:
        return API_P2P
    if api in NCCL_COLLECTIVE_APIS:
        return API_COLL
    if api == NCCL_GROUP_START:
        return API_GROUP_START
    if api == NCCL_GROUP_END:
        return API_GROUP_END
    if api in NCCL_INIT_APIS:
        return API_INIT
    return API_OTHER


def _empty_ranges() -> HostRanges:
    z = _empty_i64()
    return HostRanges(
        start=z,
        end=z,
        pid=z,
        tid=z,
        name=np.empty(0, np.int32),
        kind=np.empty(0, np.int8),
        num=z,
        numbered=np.empty(0, bool),
        stage=np.empty(0, np.int32),
        mb=np.empty(0, np.int32),
        phase=np.empty(0, np.int8),
        direction=np.empty(0, np.int8),
        names=[],
        torch_p2p=np.empty(0, bool),
        group_rank=z,
        group_peer=z,
    )


def _empty_nccl() -> NcclCalls:
    z = _empty_i64()
    return NcclCalls(
        start=z,
        end=z,
        pid=z,
        tid=z,
        api=np.empty(0, np.int8),
        name=np.empty(0, np.int32),
        names=[],
        direction=np.empty(0, np.int8),
        peer_local=z,
        bytes=z,
        comm=z,
        nranks=z,
        rank=z,
        has_payload=np.empty(0, bool),
    )


def _empty_spans() -> Spans:
    z = _empty_i64()
    return Spans(z, z, z, z)
