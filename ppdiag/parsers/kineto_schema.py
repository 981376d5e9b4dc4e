"""The typed, field-selective schema of a Kineto trace and the column helpers every mode uses.

msgspec Structs name only the keys ppdiag reads (every other key is skipped without building
objects); the helpers turn one attribute of many events into a numpy column without Python
bytecode per event. Category codes map ``cat`` strings to the kinds the parse tells apart.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Union

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.model import (
    Kind,
)

I64A = npt.NDArray[np.int64]
F64A = npt.NDArray[np.float64]

# ----------------------------------------------------------------------------------------------
# Typed, field-selective decoding
# ----------------------------------------------------------------------------------------------

# (attribute, JSON key, strict type, default). Only these keys are materialised; msgspec skips
# every other key (call stacks, shapes of ops we never look at) without building objects for it.
_ARG_FIELDS: tuple[tuple[str, str, Any, Any], ...] = (
    ("ext", "External id", int, -1),
    ("ext_lc", "external id", int, -1),  # 2021 traces
    ("correlation", "correlation", int, -1),
    ("stream", "stream", int, -1),
    ("device", "device", int, -1),
    ("nbytes", "bytes", int | str, -1),  # ROCm runtime calls write a string
    ("coll", "Collective name", str, ""),
    ("pg_name", "Process Group Name", int | str, ""),
    ("pg_id", "Process Group ID", int | str, ""),  # early 2024 traces
    ("pg_desc", "Process Group Description", str, ""),
    ("pg_ranks", "Process Group Ranks", str | list[int], ""),
    ("rank_start", "Global rank start", int, -1),
    ("rank_stride", "Global rank stride", int, -1),
    ("group_size", "Group size", int, -1),
    ("src", "Src Rank", int, -1),
    ("dst", "Dst Rank", int, -1),
    ("peer_rank", "Rank", int, -1),
    ("seq", "Seq", int, -1),
    ("nelems", "In msg nelems", int, -1),
    ("dtype", "dtype", str, ""),
    ("concrete", "Concrete Inputs", msgspec.Raw, msgspec.Raw()),
    ("dims", "Input Dims", msgspec.Raw, msgspec.Raw()),
    ("types", "Input type", msgspec.Raw, msgspec.Raw()),
)


@dataclass(frozen=True)
class TraceTypes:
    """The msgspec types used to decode one trace (strict or lenient variant)."""

    args: Any
    event: Any
    trace: Any
    decoder: msgspec.json.Decoder[Any]
    event_decoder: msgspec.json.Decoder[Any]
    args_decoder: msgspec.json.Decoder[Any]  # a JSON array of args objects (or nulls)


def _event_fields(lenient: bool) -> list[tuple[str, Any, Any]]:
    """(name, type, default) of the event Struct's fields (any JSON type when ``lenient``)."""
    return [
        ("ph", Any if lenient else str, ""),
        ("cat", Any if lenient else str, ""),
        ("name", Any if lenient else str, ""),
        ("pid", Any if lenient else int | str, -1),
        ("tid", Any if lenient else int | str, -1),
        # NaN, not 0: a missing ts must be told apart from a real one (it is counted and dropped)
        ("ts", Any if lenient else float, float("nan")),
        ("dur", Any if lenient else float, 0.0),
        # args stay raw JSON until read: only the events that need them (GPU, runtime and comm
        # ops, a small share of a trace) pay for decoding them, see _decode_args
        ("args", msgspec.Raw, msgspec.Raw()),
    ]


def _make_types(lenient: bool) -> TraceTypes:
    """Build the Struct types. The lenient variant accepts any JSON type for every field and is
    only used when a trace breaks the usual typing (it is slower: coercion happens later)."""
    arg_fields = [(a, Any if lenient else t, d) for a, _, t, d in _ARG_FIELDS]
    args_t = msgspec.defstruct(
        "KinetoArgs",
        arg_fields,
        rename={a: k for a, k, _, _ in _ARG_FIELDS},
        gc=False,
    )
    event_t = msgspec.defstruct("KinetoEvent", _event_fields(lenient), gc=False)
    trace_t = msgspec.defstruct(
        "KinetoTrace",
        [
            ("traceEvents", list[event_t] | None, None),  # type: ignore[valid-type]
            ("distributedInfo", Any, None),
            ("deviceProperties", Any, None),
            ("baseTimeNanoseconds", Any, None),
            ("host_name", Any, None),
        ],
    )
    # A bare event with a mandatory "ph": used to validate a candidate cut point of a damaged file.
    check_t = msgspec.defstruct("KinetoEventCheck", [("ph", Any)])
    return TraceTypes(
        args=args_t,
        event=event_t,
        trace=trace_t,
        decoder=msgspec.json.Decoder(trace_t),
        event_decoder=msgspec.json.Decoder(check_t),
        args_decoder=msgspec.json.Decoder(list[args_t | None]),  # type: ignore[valid-type]
    )


_STRICT = _make_types(lenient=False)
_LENIENT = _make_types(lenient=True)

# Chrome-trace phases whose events no step reads beyond the category and name (flow, metadata,
# counter, async and object events): a filtered decode builds them as stubs, and an unknown
# phase fails the tagged decode (the slice is then decoded untagged, as before)
_FULL_PHASES = ("X", "B", "E", "i", "I")
_STUB_PHASES = tuple("stfMCbneSTpFPONDRc()vV")


def _make_tagged() -> tuple[msgspec.json.Decoder[Any], dict[type, str]]:
    """A decoder of a JSON array of events as a union tagged on ``ph``: the events of
    ``_FULL_PHASES`` get every field of the strict event (their ``ph`` is a class attribute), the
    others only ``cat`` and ``name`` (the rest reads as the defaults, class attributes too), so
    that their times, threads and args build no objects. Used where the caller drops every stub
    unless its category or name says otherwise (then it decodes the slice again untagged)."""
    fields = [(f, t, d) for f, t, d in _event_fields(lenient=False) if f != "ph"]
    named = [(f, t, d) for f, t, d in fields if f in ("cat", "name")]
    defaults = {f: d for f, _, d in fields if f not in ("cat", "name")}
    types: list[Any] = [
        msgspec.defstruct(f"KinetoEvent{i}", fields, tag_field="ph", tag=ph, namespace={"ph": ph}, gc=False)
        for i, ph in enumerate(_FULL_PHASES)
    ]
    types += [
        msgspec.defstruct(
            f"KinetoStub{i}",
            named,
            tag_field="ph",
            tag=ph,
            namespace={"ph": ph, **defaults},
            gc=False,
        )
        for i, ph in enumerate(_STUB_PHASES)
    ]
    return msgspec.json.Decoder(list[Union[tuple(types)]]), {t: t.ph for t in types}  # type: ignore[misc]  # noqa: UP007


#: the tagged decoder, and the ``ph`` of each of its Struct types
TAGGED_EVENTS, TAGGED_PH = _make_tagged()


def _join_raw(raws: list[msgspec.Raw], empty: bytes) -> bytes:
    """The raw JSON values joined by commas, ``empty`` standing for a missing one."""
    if all(map(len, raws)):
        return b",".join(raws)
    return b",".join([r if len(r) else empty for r in raws])


def _decode_args(raws: list[msgspec.Raw]) -> list[Any]:
    """The args Structs of some events (None where an event has no args object), decoded in one
    call over the joined raw JSON; strictly typed, else leniently (any JSON type per field)."""
    if not raws:
        return []
    blob = b"".join((b"[", _join_raw(raws, b"null"), b"]"))
    try:
        out: list[Any] = _STRICT.args_decoder.decode(blob)
    except msgspec.ValidationError:
        out = _LENIENT.args_decoder.decode(blob)
    return out


def _int_args_decoders(keys: tuple[str, ...]) -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]:
    """(strict, lenient) decoders of a JSON array of args objects (or nulls) that read only the
    ``_ARG_FIELDS`` named ``keys``, typed as there: the events whose args only give a few ints
    (GPU ops, runtime calls: most of the args decoded) skip the other fields' lookups. Each field
    is read as the full args Struct reads it (strictly when every value of the batch is typed
    as expected, else as any JSON value), so the values are the same."""
    fields = [f for f in _ARG_FIELDS if f[0] in keys]
    out = []
    for lenient in (False, True):
        t = msgspec.defstruct(
            "KinetoIntArgs",
            [(a, Any if lenient else typ, d) for a, _, typ, d in fields],
            rename={a: k for a, k, _, _ in fields},
            gc=False,
        )
        out.append(msgspec.json.Decoder(list[t | None]))  # type: ignore[valid-type]
    return out[0], out[1]


#: the args fields of GPU ops (stream, device, correlation, bytes) and of runtime calls
GPU_ARGS = _int_args_decoders(("stream", "device", "correlation", "nbytes"))
RUNTIME_ARGS = _int_args_decoders(("correlation",))


def decode_int_args(
    raws: list[msgspec.Raw], decoders: tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]
) -> list[Any]:
    """:func:`_decode_args` with one of the narrow decoders (``GPU_ARGS``, ``RUNTIME_ARGS``)."""
    if not raws:
        return []
    blob = b"".join((b"[", _join_raw(raws, b"null"), b"]"))
    try:
        out: list[Any] = decoders[0].decode(blob)
    except msgspec.ValidationError:
        out = decoders[1].decode(blob)
    return out


def trace_decoder() -> msgspec.json.Decoder[Any]:
    """The typed decoder ppdiag uses (the floor the parse benchmark compares against)."""
    return _STRICT.decoder


_DTYPE_SIZE = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "byte": 1,
    "uint8": 1,
    "unsigned char": 1,
    "char": 1,
    "int8": 1,
    "signed char": 1,
    "short": 2,
    "int16": 2,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "long int": 8,
    "long long": 8,
    "bool": 1,
    "complexfloat": 8,
    "complexdouble": 16,
    "complexhalf": 4,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}


def dtype_size(dtype: Any) -> int:
    """Bytes per element of a PyTorch dtype string ("Float", "c10::BFloat16", "float"), or -1."""
    if not isinstance(dtype, str) or not dtype:
        return -1
    d = dtype.lower()
    if d.startswith("c10::"):
        d = d[5:]
    if d.startswith("torch."):
        d = d[6:]
    return _DTYPE_SIZE.get(d, -1)


def _as_int(v: Any, default: int = -1) -> int:
    if v is None or isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    try:
        return int(float(v)) if isinstance(v, float | str) else default
    except (TypeError, ValueError):
        return default


def _i64(values: list[Any], default: int = -1, name: str = "", path: str = "") -> I64A:
    """int64 array from a list that is normally all ints (lenient traces may hold anything).

    A value beyond int64 (a link id some tools write as 128 bits): with ``name`` (an id that
    links events, compared only for equality) it becomes :func:`_wide_id`, the same int64 for the
    same value wherever it appears; otherwise it reads as ``default``."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        out = [_as_int(v, default) for v in values]
        fit = [-(2**63) <= v < 2**63 for v in out]
        if name:
            return np.asarray(
                [v if ok else _wide_id(v) for v, ok in zip(out, fit, strict=True)], dtype=np.int64
            )
        return np.asarray([v if ok else default for v, ok in zip(out, fit, strict=True)], dtype=np.int64)


def _wide_id(v: int) -> int:
    """An id beyond int64 as an int64 in [2**62, 2**63) (ids profilers count up from 0 never get
    there; -1 is none): a hash of its digits, so equal ids stay equal across fields and files."""
    h = int.from_bytes(hashlib.blake2b(str(v).encode(), digest_size=8).digest(), "little")
    return 2**62 + h % (2**62)


def _f64(values: list[Any]) -> F64A:
    """float64 array; values that are not finite numbers (null, NaN, text) become 0."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        out = []
        for v in values:
            try:
                out.append(float(v))
            except (TypeError, ValueError):
                out.append(0.0)
        arr = np.asarray(out, dtype=np.float64)
    if not np.isfinite(arr).all():
        arr = np.where(np.isfinite(arr), arr, 0.0)
    return arr


def us_to_ns(us: F64A, base_ns: int) -> I64A:
    """µs floats to int64 ns: integer and fraction parts separately so that absolute-epoch µs
    (1.7e15) do not lose the precision ``round(ts*1000)`` would lose in float64."""
    whole = np.floor(us)
    ns = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)
    return ns + np.int64(base_ns) if base_ns else ns


def _tid_int(tid: Any) -> int:
    if isinstance(tid, int):
        return tid
    if isinstance(tid, float) and abs(tid) < 2**63:
        # as numpy's int64 conversion reads it (the all-number fast path of _tids): the same
        # value must give the same thread whatever else its slice holds
        return int(tid)
    if isinstance(tid, str):
        m = re.search(r"-?\d{1,18}", tid)
        if m:
            return int(m.group(0))
    return -1


def _tids(values: list[Any]) -> I64A:
    """pid / tid values as int64: ints as they are, the first number in a string ("stream 7"),
    else -1. Strings are read once per distinct value (a trace has a few threads)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    try:
        keys = list(zip(map(type, values), values, strict=True))  # 1 and 1.0 are told apart
        read = {k: _tid_int(k[1]) for k in set(keys)}
    except TypeError:  # unhashable values (lenient traces)
        return np.asarray([_tid_int(v) for v in values], dtype=np.int64)
    return np.fromiter(map(read.__getitem__, keys), dtype=np.int64, count=len(values))


def _raw_json(raw: Any) -> Any:
    """Decode a msgspec.Raw arg value (None when absent or not JSON)."""
    if raw is None:
        return None
    if not isinstance(raw, msgspec.Raw):
        return raw
    if not len(raw):
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


K_OTHER, K_KERNEL, K_MEMCPY, K_MEMSET, K_SYNC, K_RUNTIME, K_CPUOP, K_ANNOT, K_PYFUNC = range(9)
_CAT = {
    "kernel": K_KERNEL,
    "Kernel": K_KERNEL,
    "gpu_memcpy": K_MEMCPY,
    "Memcpy": K_MEMCPY,
    "gpu_memset": K_MEMSET,
    "Memset": K_MEMSET,
    "cuda_sync": K_SYNC,
    "cuda_runtime": K_RUNTIME,
    "cuda_driver": K_RUNTIME,
    "Runtime": K_RUNTIME,
    "Driver": K_RUNTIME,
    "xpu_runtime": K_RUNTIME,
    "xpu_driver": K_RUNTIME,
    "privateuse1_runtime": K_RUNTIME,
    "privateuse1_driver": K_RUNTIME,
    "mtia_runtime": K_RUNTIME,
    "cpu_op": K_CPUOP,
    "Operator": K_CPUOP,
    "user_annotation": K_ANNOT,
    "User Annotation": K_ANNOT,
    "python_function": K_PYFUNC,
}
_GPU_KIND = {K_KERNEL: Kind.COMPUTE, K_MEMCPY: Kind.MEMCPY, K_MEMSET: Kind.MEMSET, K_SYNC: Kind.SYNC}


# Largest |value| a field may take: ranks and sizes beyond any real job; times that still fit
# int64 nanoseconds once the base is added.
_MAX_RANK = 1 << 24
_MAX_NS = 1 << 62
_MAX_US = float(_MAX_NS // 1000)
_MAX_DUR_US = 7 * 86400 * 1e6  # a week: no kernel or op lasts longer


def _col(objs: list[Any], attr: str) -> list[Any]:
    """One attribute of every object, gathered by C-level iteration (no Python bytecode per
    event): the first step of every per-kind column build."""
    return list(map(attrgetter(attr), objs))


#: Name of the allocator's instant events (``profile_memory=True``), kept by the sliced decoding.
MEMORY_EVENT = "[memory]"
