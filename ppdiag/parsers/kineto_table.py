"""The decoded events of a Kineto trace as numpy columns, built one slice of events at a time.

Decoding yields per-event msgspec Structs; :class:`EventsBuilder` turns each slice of them into
columns (phase code, category code, name id, pid, tid, ts, dur) and keeps of the args only what a
later step reads: the int fields of GPU and runtime events (stream, device, correlation, bytes),
and the raw args of host comm ops, comm kernels and allocator events (a small share of a trace).
The Structs of a slice are freed before the next slice is decoded, so a parse holds ~70 bytes per
event instead of a Struct, its strings and its args.

Every conversion has the semantics the parse always had: ``ts``/``dur`` read as :func:`_f64` with
a mask of the values that are real finite numbers (not null, text or bool), tids as
:func:`_tids`, names as ``str``; a slice whose values are all plain floats and ints takes the
array fast path, any other slice the per-value one (lenient traces).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.parsers.kineto_names import _RE_COMM_KERNEL, N_COMM, N_PP_COMM, _NameMemo
from ppdiag.parsers.kineto_schema import (
    _CAT,
    _STRICT,
    F64A,
    GPU_ARGS,
    I64A,
    K_ANNOT,
    K_CPUOP,
    K_KERNEL,
    K_OTHER,
    K_PYFUNC,
    K_RUNTIME,
    K_SYNC,
    MEMORY_EVENT,
    RUNTIME_ARGS,
    TAGGED_PH,
    _col,
    _f64,
    _i64,
    _tids,
    decode_int_args,
)

# phase codes (``ph``)
PH_X, PH_B, PH_E, PH_I, PH_OTHER = range(5)
_PH = {"X": PH_X, "B": PH_B, "E": PH_E, "i": PH_I, "I": PH_I}
_NUMBER_TYPES = frozenset((float, int))
_DTYPES: dict[str, Any] = {
    "ph": np.int8,
    "cat": np.int8,
    "name": np.int32,
    "pid": np.int64,
    "tid": np.int64,
    "ts": np.float64,
    "ts_ok": np.bool_,
    "dur": np.float64,
    "dur_ok": np.bool_,
    "stream": np.int64,
    "device": np.int64,
    "corr": np.int64,
    "nbytes": np.int64,
}
_CONSTANT = frozenset(("stream", "device", "corr", "nbytes"))  # -1 where no args were read


@dataclass
class Events:
    """Columns of the decoded events (one row per event decoding kept, in file order).

    ``stream``/``device``/``nbytes`` are read from the args of GPU-category events and
    ``corr`` from those of GPU and runtime events (-1 elsewhere); ``args`` holds the raw args of
    the rows whose args are read as a whole later (host comm ops, comm kernels)."""

    ph: npt.NDArray[np.int8]
    cat: npt.NDArray[np.int8]  # the category's code whatever ``ph`` (K_OTHER when unknown)
    name: npt.NDArray[np.int32]  # index into ``names``
    pid: I64A
    tid: I64A
    ts: F64A  # µs, as _f64 reads it
    ts_ok: npt.NDArray[np.bool_]  # ts is a real finite number
    dur: F64A
    dur_ok: npt.NDArray[np.bool_]
    stream: I64A
    device: I64A
    corr: I64A
    nbytes: I64A
    names: list[str]
    args: dict[int, msgspec.Raw]
    mem_ts: list[Any] = field(default_factory=list)  # allocator events: ts and raw args
    mem_args: list[msgspec.Raw] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ph)


class Decoded(enum.IntEnum):
    """How a slice of events was decoded: what their field values may be."""

    LENIENT = 0  # any JSON type per field
    STRICT = 1  # the strict types: cat, name and ph are str, ts and dur float
    STUBBED = 2  # strict, tagged on ph: the events of phases but X/B/E/i/I are stubs


_PH_OF_TYPE = {t: _PH.get(ph, PH_OTHER) for t, ph in TAGGED_PH.items()}
_GET_CAT, _GET_PH, _GET_TS, _GET_DUR, _GET_NAME = (
    attrgetter("cat"),
    attrgetter("ph"),
    attrgetter("ts"),
    attrgetter("dur"),
    attrgetter("name"),
)


def _typed_columns(evs: list[Any], how: Decoded) -> dict[str, npt.NDArray[Any]]:
    """The ph, cat, ts and dur columns of strictly typed events, gathered straight into arrays
    (no list per field, no check of the value types: they are known)."""
    n = len(evs)
    if how == Decoded.STUBBED:
        ph = np.fromiter(map(_PH_OF_TYPE.__getitem__, map(type, evs)), np.int8, n)
    else:
        ph = np.fromiter(map(_PH.get, map(_GET_PH, evs), repeat(PH_OTHER)), np.int8, n)
    cols: dict[str, npt.NDArray[Any]] = {
        "ph": ph,
        "cat": np.fromiter(map(_CAT.get, map(_GET_CAT, evs), repeat(K_OTHER)), np.int8, n),
    }
    for key, get in (("ts", _GET_TS), ("dur", _GET_DUR)):
        arr = np.fromiter(map(get, evs), np.float64, n)
        ok = np.isfinite(arr)
        cols[key], cols[key + "_ok"] = (arr if ok.all() else np.where(ok, arr, 0.0)), ok
    return cols


def _codes(values: list[Any], table: dict[str, int], default: int) -> npt.NDArray[np.int8]:
    """``table[v]`` for string values, ``default`` for any other value (unhashable ones too)."""
    try:
        return np.fromiter(map(table.get, values, repeat(default)), dtype=np.int8, count=len(values))
    except TypeError:
        return np.fromiter(
            (table.get(v, default) if isinstance(v, str) else default for v in values), np.int8, len(values)
        )


def _times(values: list[Any]) -> tuple[F64A, npt.NDArray[np.bool_]]:
    """(values as _f64 reads them, mask of real finite numbers)."""
    if set(map(type, values)) <= _NUMBER_TYPES:
        arr = np.asarray(values, dtype=np.float64)
        ok = np.isfinite(arr)
        return (arr if ok.all() else np.where(ok, arr, 0.0)), ok
    is_num = np.fromiter(map(_NUMBER_TYPES.__contains__, map(type, values)), bool, len(values))
    raw = np.asarray([v if k else 0.0 for v, k in zip(values, is_num, strict=True)], dtype=np.float64)
    return _f64(values), is_num & np.isfinite(raw)


def _take(evs: list[Any], idx: npt.NDArray[np.intp]) -> list[Any]:
    """``evs[idx]`` for a list, gathered at C level."""
    return list(map(evs.__getitem__, idx.tolist()))


_NO_ARGS = _STRICT.args()  # every field at its default: what an event without args reads


def _arg_ints(rows: list[msgspec.Raw], path: str) -> tuple[I64A, I64A, I64A, I64A]:
    """(stream, device, correlation, bytes) of the args of some events (-1 when absent)."""
    args = decode_int_args(rows, GPU_ARGS)
    if None in args:  # events without args (or "args": null)
        args = [a if a is not None else _NO_ARGS for a in args]
    return (
        _i64(_col(args, "stream")),
        _i64(_col(args, "device")),
        _i64(_col(args, "correlation"), name="correlation", path=path),
        _i64(_col(args, "nbytes")),
    )


def _arg_corr(rows: list[msgspec.Raw], path: str) -> I64A:
    """The correlation of the args of some events (-1 when absent): runtime calls, whose args
    give nothing else ppdiag reads."""
    args = decode_int_args(rows, RUNTIME_ARGS)
    if None in args:
        args = [a if a is not None else _NO_ARGS for a in args]
    return _i64(_col(args, "correlation"), name="correlation", path=path)


# a slice's columns and the builder (for its per-name facts) -> (rows to keep, dropped rows that
# count as used events, usable GPU events)
Select = Callable[[dict[str, npt.NDArray[Any]], "EventsBuilder"], tuple[npt.NDArray[np.bool_], int, int]]


class EventsBuilder:
    """Accumulates the columns of slices of decoded events; :meth:`finish` joins them."""

    def __init__(self, memo: _NameMemo, path: str) -> None:
        self._memo = memo
        self._path = path
        self._ids: dict[str, int] = {}
        self._names: list[str] = []
        self._comm_name = bytearray()  # per name id: 1 when a host op of that name is a comm op
        self._ccl_name = bytearray()  # per name id: 1 when a kernel of that name is a comm kernel
        # the columns, written in place slice after slice (np.empty: the rows never written cost no
        # memory); a column of _CONSTANT is only stored once a slice holds a value other than -1
        self._store: dict[str, npt.NDArray[Any]] = {}
        self._cap = 0
        self._args: dict[int, msgspec.Raw] = {}
        self._mem_ts: list[Any] = []
        self._mem_args: list[msgspec.Raw] = []
        self._rows = 0
        self._cls: list[int] = []
        self._rk: list[int] = []
        self.memory_id = -1  # name id of the allocator's events, once seen

    def _typed_name_ids(self, evs: list[Any]) -> npt.NDArray[np.int32]:
        """The name ids of strictly typed events (str names): straight from the Structs when
        every name is known already (most slices after the first few: no list of the names, no
        set of them), else as :meth:`_name_ids` assigns them."""
        try:
            return np.fromiter(map(self._ids.__getitem__, map(_GET_NAME, evs)), np.int32, len(evs))
        except KeyError:  # a new name: registered in the order _name_ids gives every slice
            return self._name_ids(_col(evs, "name"), typed=True)

    def _name_ids(self, raw_names: list[Any], typed: bool = False) -> npt.NDArray[np.int32]:
        names = raw_names
        if not typed and not set(map(type, names)) <= {str}:
            names = [v if isinstance(v, str) else str(v) for v in names]  # lenient traces only
        new = set(names).difference(self._ids)
        for nm in sorted(new):
            self._ids[nm] = len(self._names)
            self._names.append(nm)
            self._comm_name.append(self._memo[nm].cls in (N_COMM, N_PP_COMM))
            self._ccl_name.append(_is_comm_kernel_name(nm))
            info = self._memo[nm]
            self._cls.append(info.cls)
            self._rk.append(info.range_kind)
            if nm == MEMORY_EVENT:
                self.memory_id = self._ids[nm]
        return np.fromiter(map(self._ids.__getitem__, names), dtype=np.int32, count=len(names))

    def name_info(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(class, range kind) of every name id so far (see :class:`NameInfo`)."""
        return np.asarray(self._cls, dtype=np.int64), np.asarray(self._rk, dtype=np.int64)

    def add(
        self, evs: list[Any], select: Select | None = None, how: Decoded = Decoded.LENIENT
    ) -> tuple[int, int] | None:
        """Add the columns of ``evs`` (the caller drops the Structs afterwards). ``select`` picks
        the rows to keep from the slice's columns; returns what it counted (dropped rows that
        count as used, usable GPU events), (0, 0) without it. ``how`` they were decoded: typed
        values take the direct paths; with ``Decoded.STUBBED`` the events of phases other than
        X/B/E/i/I are stubs (category and name only), and when ``select`` keeps one nothing is
        added and None is returned (the caller decodes the slice in full)."""
        n = len(evs)
        if not n:
            return 0, 0
        if how == Decoded.LENIENT:
            cols: dict[str, npt.NDArray[Any]] = {
                "ph": _codes(_col(evs, "ph"), _PH, PH_OTHER),
                "cat": _codes(_col(evs, "cat"), _CAT, K_OTHER),
            }
            cols["ts"], cols["ts_ok"] = _times(_col(evs, "ts"))
            cols["dur"], cols["dur_ok"] = _times(_col(evs, "dur"))
        else:
            cols = _typed_columns(evs, how)
        if how == Decoded.LENIENT:
            cols["name"] = self._name_ids(_col(evs, "name"))
        else:
            cols["name"] = self._typed_name_ids(evs)
        counted = (0, 0)
        if select is not None:
            keep, dropped, n_gpu = select(cols, self)
            if how == Decoded.STUBBED and keep[cols["ph"] == PH_OTHER].any():
                return None
            counted = (dropped, n_gpu)
            if not keep.all():
                idx = np.flatnonzero(keep)
                cols = {c: v[idx] for c, v in cols.items()}
                evs = _take(evs, idx)
                n = len(evs)
                if not n:
                    return counted
        cols["pid"] = _tids(_col(evs, "pid"))
        cols["tid"] = _tids(_col(evs, "tid"))
        ph, cat, name = cols["ph"], cols["cat"], cols["name"]
        for c in ("stream", "device", "corr", "nbytes"):
            cols[c] = np.full(n, -1, dtype=np.int64)
        gpu = (cat >= K_KERNEL) & (cat <= K_SYNC)
        # GPU events that are (or may become, B of a B/E pair) complete: their args' int fields
        gi = np.flatnonzero(gpu & ((ph == PH_X) | (ph == PH_B)))
        if len(gi):
            for key, vals in zip(
                ("stream", "device", "corr", "nbytes"),
                _arg_ints(_col(_take(evs, gi), "args"), self._path),
                strict=True,
            ):
                cols[key][gi] = vals
        ri = np.flatnonzero((cat == K_RUNTIME) & (ph == PH_X))
        if len(ri):
            cols["corr"][ri] = _arg_corr(_col(_take(evs, ri), "args"), self._path)
        self._keep_raw_args(evs, cols, gi)
        if self.memory_id >= 0:
            mem = _take(evs, np.flatnonzero(name == self.memory_id))
            self._mem_ts += _col(mem, "ts")
            self._mem_args += map(msgspec.Raw.copy, _col(mem, "args"))
        self._put(cols, n)
        return counted

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows (the events of the document: no slice keeps more)."""
        if rows > self._cap:
            self._grow(rows)

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * self._cap, 1 << 12)
        for c, dt in _DTYPES.items():
            old = self._store.get(c)
            if old is None and c in _CONSTANT:
                continue
            self._store[c] = new = np.empty(cap, dtype=dt)
            if old is not None:
                new[: self._rows] = old[: self._rows]
        self._cap = cap

    def _put(self, cols: dict[str, npt.NDArray[Any]], n: int) -> None:
        """Write one slice's columns after the rows so far."""
        lo, hi = self._rows, self._rows + n
        if hi > self._cap:
            self._grow(hi)
        for c, v in cols.items():
            to = self._store.get(c)
            if to is None:  # a constant column so far
                if not (v != -1).any():
                    continue
                self._store[c] = to = np.empty(self._cap, dtype=np.int64)
                to[:lo] = -1
            to[lo:hi] = v
        self._rows = hi

    def _keep_raw_args(
        self, evs: list[Any], cols: dict[str, npt.NDArray[Any]], gi: npt.NDArray[np.intp]
    ) -> None:
        """Keep (copied out of the slice's text) the raw args of host comm ops and comm kernels."""
        cat, ph, name = cols["cat"], cols["ph"], cols["name"]
        host = (ph == PH_X) & ((cat == K_CPUOP) | (cat == K_ANNOT) | (cat == K_PYFUNC))
        comm_name = np.frombuffer(bytes(self._comm_name), dtype=np.uint8).astype(bool)
        ccl_name = np.frombuffer(bytes(self._ccl_name), dtype=np.uint8).astype(bool)
        want = host & comm_name[name]
        kern = gi[(cat[gi] == K_KERNEL) & ccl_name[name[gi]]]
        rows = np.union1d(np.flatnonzero(want), kern)
        raws = _col(_take(evs, rows), "args")
        self._args.update(zip((rows + self._rows).tolist(), map(msgspec.Raw.copy, raws), strict=True))

    def finish(self) -> Events:
        """The columns of every slice added (no copy: the slices were written in place). A
        column that only ever held -1 is a read-only view of one -1 (the four args columns of a
        CPU trace: 32 bytes a row that are never allocated); every reader indexes them."""
        n, store = self._rows, self._store
        self._store = {}
        cols: dict[str, Any] = {}
        for c, dt in _DTYPES.items():
            if c in store:
                cols[c] = store[c][:n]
            elif c in _CONSTANT and n:
                cols[c] = np.broadcast_to(np.int64(-1), (n,))
            else:
                cols[c] = np.zeros(0, dtype=dt)
        return Events(
            **cols,
            names=self._names,
            args=self._args,
            mem_ts=self._mem_ts,
            mem_args=self._mem_args,
        )


def _is_comm_kernel_name(s: str) -> bool:
    """Comm kernels name themselves in the first characters (``ncclDevKernel_*``, ``void
    ncclKernel_*``): searching only there keeps long templated kernel names cheap."""
    return ("ccl" in s[:48] or "CCL" in s[:48]) and _RE_COMM_KERNEL.search(s, 0, 48) is not None


def events_from_structs(evs: list[Any], memo: _NameMemo, path: str, slice_len: int = 1 << 12) -> Events:
    """The columns of a whole decoded event list (the whole-document path), built a slice at a
    time so that the temporary per-slice lists stay small."""
    b = EventsBuilder(memo, path)
    b.reserve(len(evs))
    for lo in range(0, len(evs), slice_len):
        b.add(evs[lo : lo + slice_len])
    return b.finish()
