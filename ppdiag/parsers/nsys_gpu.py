"""GPU activity of an nsys export: kernels, memcpy, memset and synchronization rows with the host
call that enqueued each one, for all processes of the file at once.

The launching call is matched on (process, correlationId) (correlation ids are unique per
process only) among CUDA runtime/driver rows (``eventClass`` 0/1), which drops the duplicate rows
CUDA backtrace capture adds (class 67). Kernels, copies, memsets and syncs look it up in numpy in
the runtime rows fetched once (:class:`Launches`): a SQL join builds a temporary index over the whole
runtime table for each GPU table it joins, ~0.2 s per table on a 560 k-call export however few
rows the table has. Synchronization rows take their API's nameId from the same lookup. Exports
whose correlation ids do not fit 32 bits keep the SQL join. Device, process and stream are packed
into one integer column and the name with the correlation id into another, so each row crosses
the SQLite → Python boundary as six integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Direction, Kind
from ppdiag.parsers.nsys_arrow import ArrowReader
from ppdiag.parsers.nsys_db import BadTimes, NsysDb, bad_time_code, factorize, int_expr, valid_times
from ppdiag.parsers.nsys_names import classify_kernel, memcpy_name, memset_name

I64 = npt.NDArray[np.int64]

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"

NO_STREAM = 0xFFFFFFFF  # CUPTI "invalid stream" (device-wide synchronization)

_ROW = np.dtype(
    [
        ("start", np.int64),
        ("end", np.int64),
        ("packed", np.int64),
        ("nametid", np.int64),
        ("launch", np.int64),
        ("bad", np.int64),
    ]
)
_NO_PID = (1 << 62) - 1  # above any globalPid >> 24: a GPU row without a process matches no call
_RUNTIME_ROW = np.dtype([("start", np.int64), ("gtid", np.int64), ("corr", np.int64), ("api", np.int64)])
_ROW_EXTRA = np.dtype(
    [
        ("start", np.int64),
        ("end", np.int64),
        ("packed", np.int64),
        ("nametid", np.int64),
        ("launch", np.int64),
        ("x1", np.int64),
        ("x2", np.int64),
        ("bad", np.int64),
    ]
)


@dataclass
class GpuOps:
    """Every GPU row of the file, ordered by (process, start); ``name`` indexes ``names``."""

    start: I64
    end: I64
    pid: I64
    device: I64
    stream: I64
    kind: npt.NDArray[np.int8]
    direction: npt.NDArray[np.int8]
    sendrecv: npt.NDArray[np.bool_]  # SendRecv kernels (p2p unless the launch says all-to-all)
    name: npt.NDArray[np.int32]
    bytes: I64
    launch: I64  # start of the enqueuing runtime/driver call, -1 when unknown
    ltid: I64  # thread of that call (TID bits), 0 when unknown
    names: list[str]
    duplicate_launch_rows: int = 0
    bad_times: dict[str, BadTimes] = field(default_factory=dict)  # table → rows dropped for their times

    def __len__(self) -> int:
        return int(self.start.shape[0])


def _launch_join(db: NsysDb, alias: str) -> tuple[str, str, str]:
    """(launch start expr, launch tid expr, JOIN clause) for GPU table ``alias``; no-op without RUNTIME.

    Only rows with usable times join (the others are dropped, and must come out once each to be
    counted once)."""
    rcols = db.columns(RUNTIME)
    if not {"start", "correlationId", "globalTid"} <= set(rcols):
        return "-1", "0", ""
    cls = "AND r.eventClass IN (0, 1)" if "eventClass" in rcols else ""
    join = (
        f"LEFT JOIN {RUNTIME} AS r ON r.correlationId = {alias}.correlationId "
        f"AND (r.globalTid >> 24) = ({alias}.globalPid >> 24) {cls} AND {valid_times(alias)}"
    )
    return int_expr("r.start"), "coalesce(r.globalTid & 16777215, 0)", join


def _packed(db: NsysDb, table: str, alias: str) -> str:
    dev = db.col(table, "deviceId", "0", alias)
    stream = db.col(table, "streamId", "0", alias)
    gpid = db.col(table, "globalPid", "0", alias)
    return (
        f"((coalesce({dev}, 0) & 255) << 56) | (((coalesce({gpid}, 0) >> 24) & 16777215) << 32)"
        f" | (coalesce({stream}, 0) & 4294967295)"
    )


def _fetch(
    db: NsysDb,
    table: str,
    name_expr: str,
    extra: list[str],
    bad: dict[str, BadTimes] | None = None,
    launches: Launches | None = None,
    name_col: str | None = None,
) -> np.ndarray:
    """Rows of one GPU table with their launching call; ``extra`` adds up to two integer columns.
    ``name_col``: the plain column ``name_expr`` reads (see :func:`_plain_rows`).

    Rows whose start/end are not integers or run backwards are left in SQLite and counted in
    ``bad`` (per table). The launch is joined in numpy on the runtime rows ``launches`` holds
    (fetched once for all GPU tables) where their correlation ids fit 32 bits, else in SQL."""
    if not {"start", "end"} <= set(db.columns(table)):
        return np.empty(0, dtype=_ROW_EXTRA if extra else _ROW)
    cols = set(db.columns(table))
    joinable = {"correlationId", "globalPid"} <= cols
    if joinable and launches is not None and launches.usable:
        return _fetch_numpy_join(db, table, name_expr, extra, bad, launches, name_col)
    if joinable:
        lstart, ltid, join = _launch_join(db, "g")
    else:
        lstart, ltid, join = "-1", "0", ""
    extras = [*extra, "0", "0"][:2] if extra else []
    select = [
        int_expr("g.start", "0"),
        int_expr('g."end"', "0"),
        _packed(db, table, "g"),
        f"({ltid} << 32) | ({name_expr} & 4294967295)",
        lstart,
        *extras,
        bad_time_code("g"),
    ]
    sql = f"SELECT {', '.join(select)} FROM {table} AS g {join}"
    rows = _keep_valid(db.fetch(sql, _ROW_EXTRA if extra else _ROW), table, bad)
    if join and len(rows) > (n := db.count(table) - (bad[table].total if bad and table in bad else 0)):
        rows = _dedupe(rows, n)
    return rows


def _fetch_numpy_join(
    db: NsysDb,
    table: str,
    name_expr: str | None,
    extra: list[str],
    bad: dict[str, BadTimes] | None,
    launches: Launches,
    name_col: str | None = None,
) -> np.ndarray:
    """:func:`_fetch` with the launch looked up in ``launches``: the GPU row carries its name and
    correlation id packed in one column and its process in another (the launch columns are 0 and
    filled here). ``name_expr`` None names the row by its call's nameId (synchronization)."""
    rows = _plain_rows(db, table, name_col) if name_col is not None and not extra else None
    if rows is None:
        rows = db.fetch(_join_sql(db, table, name_expr, extra), _ROW_EXTRA if extra else _ROW)
    rows = _keep_valid(rows, table, bad)
    namecorr = rows["nametid"]
    launch, ltid, api = launches.lookup(rows["launch"], namecorr & 0xFFFFFFFF)
    name = (namecorr >> 32) & 0xFFFFFFFF if name_expr is not None else api & 0xFFFFFFFF
    rows["nametid"] = (ltid << 32) | name
    rows["launch"] = launch
    return rows


def _join_sql(db: NsysDb, table: str, name_expr: str | None, extra: list[str]) -> str:
    """The query of :func:`_fetch_numpy_join`: integer columns only, each guarded by its type."""
    # 0xFFFFFFFF: a correlation id that is not a 32-bit integer, which no kept runtime row has
    corr = int_expr("g.correlationId", "4294967295")
    corr = f"(CASE WHEN {corr} BETWEEN 0 AND 4294967295 THEN {corr} ELSE 4294967295 END)"
    extras = [*extra, "0", "0"][:2] if extra else []
    select = [
        int_expr("g.start", "0"),
        int_expr('g."end"', "0"),
        _packed(db, table, "g"),
        f"(({name_expr or '0'} & 4294967295) << 32) | {corr}",
        int_expr("g.globalPid >> 24", str(_NO_PID)),
        *extras,
        bad_time_code("g"),
    ]
    return f"SELECT {', '.join(select)} FROM {table} AS g"


_PLAIN = np.dtype([(c, np.int64) for c in ("start", "end", "dev", "stream", "gpid", "corr", "name")])


def _plain_rows(db: NsysDb, table: str, name_col: str) -> np.ndarray | None:
    """The rows of :func:`_fetch_numpy_join`'s query without extra columns, computed in numpy from
    the table's plain columns read through ADBC; None where the reader is off, a column is missing
    or a value is not an integer (the query itself then decides, value by value).

    Where every value is an integer, each ``typeof(x) = 'integer'`` test of the query is true and
    what is left is int64 arithmetic that numpy does as SQLite does (two's complement, arithmetic
    right shift): SQLite evaluating those CASE expressions per row was about half of the kernel
    table's scan (~0.2 s CPU of a 65 MB export's 430 k kernels)."""
    if db.arrow is None or not {"deviceId", "streamId", name_col} <= set(db.columns(table)):
        return None
    sql = f'SELECT start, "end", deviceId, streamId, globalPid, correlationId, "{name_col}" FROM {table}'
    r = db.arrow.fetch(sql, _PLAIN)
    if r is None:
        return None
    out = np.empty(len(r), dtype=_ROW)
    out["start"], out["end"] = r["start"], r["end"]
    out["packed"] = (
        ((r["dev"] & 255) << 56) | (((r["gpid"] >> 24) & 0xFFFFFF) << 32) | (r["stream"] & 0xFFFFFFFF)
    )
    corr = r["corr"]
    corr = np.where((corr >= 0) & (corr <= 0xFFFFFFFF), corr, 0xFFFFFFFF)
    out["nametid"] = ((r["name"] & 0xFFFFFFFF) << 32) | corr
    out["launch"] = r["gpid"] >> 24
    # bad_time_code of integer times: 0 when the range runs forward, else 3 (reversed)
    out["bad"] = np.where(r["end"] >= r["start"], 0, 3)
    return out


_RUNTIME_NO_API = np.dtype([("start", np.int64), ("gtid", np.int64), ("corr", np.int64)])


def _arrow_runtime(reader: ArrowReader, source: str, with_api: bool) -> np.ndarray | None:
    """The runtime rows of :meth:`Launches.read` through ADBC (``_RUNTIME_ROW``); without the API
    name its column is -1, set here: as a constant of the query it was a fifth of the read."""
    if with_api:
        return reader.fetch(f"SELECT start, globalTid, correlationId, nameId {source}", _RUNTIME_ROW)
    got = reader.fetch(f"SELECT start, globalTid, correlationId {source}", _RUNTIME_NO_API)
    if got is None:
        return None
    rows = np.empty(len(got), dtype=_RUNTIME_ROW)
    for c in ("start", "gtid", "corr"):
        rows[c] = got[c]
    rows["api"] = -1
    return rows


@dataclass
class Launches:
    """The CUDA runtime/driver calls (``eventClass`` 0/1) of the export, sorted by (process,
    correlationId, start), to find each GPU row's launching call with one binary search (the SQL
    join of each GPU table builds an index over the whole runtime table per query instead).

    Of several calls sharing a correlation id (runtime and driver) the launch is the earliest
    start with a usable time, as the SQL join's deduplication gives, and the thread is that
    call's (in exports both calls run on one thread). ``usable`` is False where a correlation id
    does not fit 32 bits (the SQL join is kept there)."""

    keys: I64
    best: I64  # per sorted row, its key's earliest usable start (-1 none)
    tid: I64  # per sorted row, the thread of its key's earliest call
    api: I64  # per sorted row, that call's nameId (-1 unknown)
    pids: I64  # distinct (globalTid >> 24) values, sorted
    usable: bool

    @classmethod
    def read(cls, db: NsysDb, with_api: bool = False) -> Launches | None:
        rcols = db.columns(RUNTIME)
        if not {"start", "correlationId", "globalTid"} <= set(rcols):
            return None
        cls_filter = "AND eventClass IN (0, 1)" if "eventClass" in rcols else ""
        # the API name only where synchronization rows need it (one integer per call less)
        api = int_expr("nameId") if with_api and "nameId" in rcols else "-1"
        sql = (
            f"SELECT {int_expr('start')}, globalTid, correlationId, {api} FROM {RUNTIME} WHERE "
            f"typeof(globalTid) = 'integer' AND typeof(correlationId) = 'integer' {cls_filter}"
        )
        # the plain columns first (through ADBC): where every value it returns is an integer, the
        # typeof tests above keep every row and change no value
        plain = "nameId" if api != "-1" else "-1"
        where = f"WHERE {cls_filter[4:]}" if cls_filter else ""
        rows = None
        if db.arrow is not None:
            rows = _arrow_runtime(db.arrow, f"FROM {RUNTIME} {where}", plain != "-1")
        if rows is None:
            rows = db.fetch(sql, _RUNTIME_ROW)
        corr = rows["corr"]
        z = np.empty(0, dtype=np.int64)
        if len(corr) and (corr.min() < 0 or corr.max() >= 0xFFFFFFFF):
            return cls(z, z, z, z, z, usable=False)
        gpid = rows["gtid"] >> 24
        # the distinct processes from the first row of each run of one process (the calls come
        # in time order, a process's in long runs): a sort of a few values, not of every call
        pids = np.unique(gpid[np.r_[True, gpid[1:] != gpid[:-1]]]) if len(gpid) else gpid
        keys = (np.searchsorted(pids, gpid).astype(np.int64) << 32) | corr
        big = np.iinfo(np.int64).max
        start = np.where(rows["start"] >= 0, rows["start"], big)
        # by key, then start: each key's first row is its earliest call (rowid order on ties);
        # calls already in start order (as exports write them) need only the sort by key
        if len(start) > 1 and not (start[1:] >= start[:-1]).all():
            order = np.argsort(start, kind="stable")
            order = order[np.argsort(keys[order], kind="stable")]
        else:
            order = np.argsort(keys, kind="stable")
        keys = keys[order]
        new = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.empty(0, bool)
        head = order[np.flatnonzero(new)][np.cumsum(new) - 1]
        best = start[head]
        best[best == big] = -1
        return cls(keys, best, rows["gtid"][head] & 0xFFFFFF, rows["api"][head], pids, usable=True)

    def lookup(self, gpid: I64, corr: I64) -> tuple[I64, I64, I64]:
        """(launch start, launching thread, its nameId) per GPU row of process ``gpid``
        (globalPid >> 24) and correlation id ``corr``; -1, 0 and -1 where no call matches."""
        n = len(gpid)
        launch = np.full(n, -1, dtype=np.int64)
        ltid = np.zeros(n, dtype=np.int64)
        api = np.full(n, -1, dtype=np.int64)
        if not len(self.keys) or not n:
            return launch, ltid, api
        code = np.clip(np.searchsorted(self.pids, gpid), 0, len(self.pids) - 1)
        key = (code.astype(np.int64) << 32) | corr
        pos = np.clip(np.searchsorted(self.keys, key), 0, len(self.keys) - 1)
        hit = (self.pids[code] == gpid) & (corr != 0xFFFFFFFF) & (self.keys[pos] == key)
        launch[hit] = self.best[pos[hit]]
        ltid[hit] = self.tid[pos[hit]]
        api[hit] = self.api[pos[hit]]
        return launch, ltid, api


def _keep_valid(rows: np.ndarray, table: str, bad: dict[str, BadTimes] | None) -> np.ndarray:
    """Rows with usable times; the others counted in ``bad[table]``."""
    codes = rows["bad"]
    if not len(codes) or not codes.any():
        return rows
    if bad is not None:
        bad[table] = BadTimes.from_codes(codes)
    kept: npt.NDArray[np.void] = rows[codes == 0]
    return kept


def _dedupe(rows: np.ndarray, expected: int) -> np.ndarray:
    """Several launch rows matched one GPU row (runtime and driver call sharing a correlation id):
    the join emits the GPU row once per match, consecutively; keep the earliest call."""
    same = np.ones(len(rows), dtype=bool)
    for c in ("start", "end", "packed"):
        same[1:] &= rows[c][1:] == rows[c][:-1]
    same[0] = False
    first = np.flatnonzero(~same)
    grp = np.cumsum(~same) - 1
    launch = rows["launch"].copy()
    launch[launch < 0] = np.iinfo(np.int64).max
    best = np.full(len(first), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, grp, launch)
    out = rows[first].copy()
    best[best == np.iinfo(np.int64).max] = -1
    out["launch"] = best
    return out


def read_gpu_ops(db: NsysDb) -> GpuOps:
    """All kernels, copies, memsets and sync rows of the export."""
    names: list[str] = [""]
    bad: dict[str, BadTimes] = {}
    joined = [
        t
        for t in (KERNEL, MEMCPY, MEMSET)
        if {"start", "end", "correlationId", "globalPid"} <= set(db.columns(t))
    ]
    sync = {"start", "end", "correlationId", "globalPid"} <= set(db.columns(SYNC)) and db.count(SYNC) > 0
    launches = Launches.read(db, with_api=sync) if joined or sync else None
    parts = [
        p
        for p in (
            _kernel_part(db, names, bad, launches),
            _memcpy_part(db, names, bad, launches),
            _memset_part(db, names, bad, launches),
        )
        if p is not None
    ]
    if {"start", "end"} <= set(db.columns(SYNC)):
        parts.extend(_sync_part(db, names, bad, launches))
    if not parts:
        out = _empty(names)
        out.bad_times = bad
        return out
    cat = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    del parts
    cat = _by_process_and_start(cat)
    packed = cat["packed"]
    return GpuOps(
        start=cat["start"],
        end=cat["end"],
        pid=(packed >> 32) & 0xFFFFFF,
        device=(packed >> 56) & 0xFF,
        stream=packed & 0xFFFFFFFF,
        kind=cat["kind"],
        direction=cat["direction"],
        sendrecv=cat["sendrecv"],
        name=cat["name"],
        bytes=cat["bytes"],
        launch=cat["launch"],
        ltid=(cat["nametid"] >> 32) & 0xFFFFFF,
        names=names,
        bad_times=bad,
    )


def _by_process_and_start(cat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows ordered by (process, start): each process is then one contiguous slice, already in time
    order. Exports are nearly sorted (one time-ordered run per table), which stable sorting merges
    in linear time; nsys >= 2025.6 no longer promises any order."""
    pid = (cat["packed"] >> 32) & 0xFFFFFF
    start = cat["start"]
    order: npt.NDArray[np.intp] | None = None
    if len(start) > 1 and not (start[1:] >= start[:-1]).all():
        order = np.argsort(start, kind="stable")
    p_sorted = pid if order is None else pid[order]
    if len(p_sorted) > 1 and not (p_sorted[1:] >= p_sorted[:-1]).all():
        by_pid = np.argsort(p_sorted, kind="stable")
        order = by_pid if order is None else order[by_pid]
    if order is None:
        return cat
    return {k: v[order] for k, v in cat.items()}


def _kernel_part(
    db: NsysDb, names: list[str], bad: dict[str, BadTimes], launches: Launches | None = None
) -> dict[str, np.ndarray] | None:
    """Kernels: the demangled name is what Kineto shows; shortName when the column is missing."""
    kcols = db.columns(KERNEL)
    name_col = "demangledName" if "demangledName" in kcols else "shortName" if "shortName" in kcols else None
    if name_col is None:
        return None
    rows = _fetch(db, KERNEL, int_expr(f"g.{name_col}"), [], bad, launches, name_col)
    if not len(rows):
        return None
    sid = rows["nametid"] & 0xFFFFFFFF
    inv, uniq = factorize(sid)
    strings = db.strings(uniq.tolist())
    base = len(names)
    uniq_names = [strings.get(int(u), f"kernel#{int(u)}") for u in uniq]
    names.extend(uniq_names)
    cls = [classify_kernel(s) for s in uniq_names]
    kind = np.array([c.kind for c in cls], dtype=np.int8)[inv]
    direction = np.array([c.direction for c in cls], dtype=np.int8)[inv]
    sendrecv = np.array([c.sendrecv for c in cls], dtype=bool)[inv]
    return _part(
        rows, (inv + base).astype(np.int32), kind, direction, sendrecv, np.full(len(rows), -1, dtype=np.int64)
    )


def _memcpy_part(
    db: NsysDb, names: list[str], bad: dict[str, BadTimes], launches: Launches | None = None
) -> dict[str, np.ndarray] | None:
    if not {"start", "end"} <= set(db.columns(MEMCPY)):
        return None
    code = (
        f"((coalesce({db.col(MEMCPY, 'copyKind', '0', 'g')}, 0) & 255) << 16)"
        f" | ((coalesce({db.col(MEMCPY, 'srcKind', '255', 'g')}, 255) & 255) << 8)"
        f" | (coalesce({db.col(MEMCPY, 'dstKind', '255', 'g')}, 255) & 255)"
    )
    rows = _fetch(db, MEMCPY, "0", [code, int_expr(db.col(MEMCPY, "bytes", "-1", "g"))], bad, launches)
    if not len(rows):
        return None
    inv, uniq = factorize(rows["x1"])
    base = len(names)
    for u in uniq.tolist():
        ck, sk, dk = (u >> 16) & 255, (u >> 8) & 255, u & 255
        names.append(memcpy_name(ck, -1 if sk == 255 else sk, -1 if dk == 255 else dk))
    kind = np.full(len(rows), Kind.MEMCPY, np.int8)
    return _part(rows, (inv + base).astype(np.int32), kind, None, None, rows["x2"].copy())


def _memset_part(
    db: NsysDb, names: list[str], bad: dict[str, BadTimes], launches: Launches | None = None
) -> dict[str, np.ndarray] | None:
    if not {"start", "end"} <= set(db.columns(MEMSET)):
        return None
    extra = [int_expr(db.col(MEMSET, "memKind", "-1", "g")), int_expr(db.col(MEMSET, "bytes", "-1", "g"))]
    rows = _fetch(db, MEMSET, "0", extra, bad, launches)
    if not len(rows):
        return None
    inv, uniq = factorize(rows["x1"])
    base = len(names)
    names.extend(memset_name(int(u)) for u in uniq)
    kind = np.full(len(rows), Kind.MEMSET, np.int8)
    return _part(rows, (inv + base).astype(np.int32), kind, None, None, rows["x2"].copy())


def _sync_part(
    db: NsysDb, names: list[str], bad: dict[str, BadTimes], launches: Launches | None = None
) -> list[dict[str, np.ndarray]]:
    """Synchronization rows, named after the API that waited (the ``syncType`` of real exports
    contradicts the enum, NSYS.md §3.1)."""
    if launches is not None and launches.usable and {"correlationId", "globalPid"} <= set(db.columns(SYNC)):
        rows = _fetch_numpy_join(db, SYNC, None, [], bad, launches)
        return _sync_rows(db, names, rows)
    rcols = set(db.columns(RUNTIME))
    api = int_expr("r.nameId") if "nameId" in rcols else "-1"
    lstart, _, join = (
        _launch_join(db, "g") if {"correlationId", "globalPid"} <= set(db.columns(SYNC)) else ("-1", "0", "")
    )
    if not join:
        api = "-1"
    ltid = "coalesce(r.globalTid & 16777215, 0)" if join else "0"
    g_end = int_expr('g."end"', "0")
    sql = (
        f"SELECT {int_expr('g.start', '0')}, {g_end}, {_packed(db, SYNC, 'g')}, "
        f"({ltid} << 32) | ({api} & 4294967295), {lstart}, {bad_time_code('g')} FROM {SYNC} AS g {join}"
    )
    rows = _keep_valid(db.fetch(sql, _ROW), SYNC, bad)
    if join and len(rows) > (n := db.count(SYNC) - (bad[SYNC].total if SYNC in bad else 0)):
        rows = _dedupe(rows, n)
    return _sync_rows(db, names, rows)


def _sync_rows(db: NsysDb, names: list[str], rows: np.ndarray) -> list[dict[str, np.ndarray]]:
    """The fetched synchronization rows as a part, named by their API's label."""
    if not len(rows):
        return []
    sid = rows["nametid"] & 0xFFFFFFFF
    inv, uniq = factorize(sid)
    strings = db.strings([u for u in uniq.tolist() if u != 0xFFFFFFFF])
    base = len(names)
    names.extend(_sync_label(strings.get(int(u), "")) for u in uniq)
    return [
        _part(
            rows,
            (inv + base).astype(np.int32),
            np.full(len(rows), Kind.SYNC, np.int8),
            None,
            None,
            np.full(len(rows), -1, dtype=np.int64),
        )
    ]


def _sync_label(api: str) -> str:
    a = api.split("_v", 1)[0] if "_v" in api else api
    low = a.lower()
    if "devicesynchronize" in low or "ctxsynchronize" in low:
        return "Context Sync"
    if "streamwaitevent" in low:
        return "Stream Wait Event"
    if "eventsynchronize" in low:
        return "Event Sync"
    if "streamsynchronize" in low:
        return "Stream Sync"
    return f"Sync ({a})" if a else "Sync"


def _part(
    rows: np.ndarray,
    name: npt.NDArray[np.int32],
    kind: npt.NDArray[np.int8],
    direction: npt.NDArray[np.int8] | None,
    sendrecv: npt.NDArray[np.bool_] | None,
    nbytes: I64,
) -> dict[str, np.ndarray]:
    n = len(rows)
    # Contiguous columns: strided views of the fetched records would slow every later pass.
    return {
        "start": np.ascontiguousarray(rows["start"]),
        "end": np.ascontiguousarray(rows["end"]),
        "packed": np.ascontiguousarray(rows["packed"]),
        "nametid": np.ascontiguousarray(rows["nametid"]),
        "launch": np.ascontiguousarray(rows["launch"]),
        "kind": kind,
        "name": name,
        "direction": direction if direction is not None else np.full(n, Direction.NONE, np.int8),
        "sendrecv": sendrecv if sendrecv is not None else np.zeros(n, dtype=bool),
        "bytes": nbytes if len(nbytes) == n else np.full(n, -1, dtype=np.int64),
    }


def _empty(names: list[str]) -> GpuOps:
    z = np.empty(0, dtype=np.int64)
    return GpuOps(
        start=z,
        end=z,
        pid=z,
        device=z,
        stream=z,
        kind=np.empty(0, np.int8),
        direction=np.empty(0, np.int8),
        sendrecv=np.empty(0, bool),
        name=np.empty(0, np.int32),
        bytes=z,
        launch=z,
        ltid=z,
        names=names,
    )
