"""PyTorch Profiler (Kineto) Chrome-trace JSON parser.

Reads one ``.json`` / ``.json.gz`` trace per rank and returns one :class:`RankTimeline`.

Decoding is typed and field-selective (msgspec Structs that name only the keys ppdiag reads), then
the per-event Structs are turned into numpy columns and dropped: nothing per event survives
:meth:`KinetoParser.parse`. Two modes:

* **GPU mode** (the trace has kernel / memcpy / memset events): one interval per GPU op. NCCL-style
  kernels are classified point-to-point or collective by what launched them (their own comm args,
  the ``record_param_comms`` op with the same External id, else the innermost comm host op that
  encloses the launching runtime call), never by the kernel name alone.
* **CPU mode** (no GPU events, e.g. gloo runs): the main thread is the device timeline; its
  outermost CPU ops are the work and the tails of ``gloo:*`` spans are the blocked communication.

Format facts (timestamp generations, arg keys, pid/tid meaning) follow ``formats/KINETO.md`` and
``formats/CPU_PIPELINE.md`` of the project material.
"""

from __future__ import annotations

import math
import operator
import os
import re
import zlib
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.model import (
    Direction,
    Intervals,
    Kind,
    NameTable,
    Phase,
    ProcessGroup,
    RangeKind,
    Ranges,
    RankTimeline,
)
from ppdiag.parsers import ParseOptions, register
from ppdiag.parsers.kineto_slices import Select, decode_sliced, run_instant_hooks

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
    ev_fields: list[tuple[str, Any, Any]] = [
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
    event_t = msgspec.defstruct("KinetoEvent", ev_fields, gc=False)
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


def _decode_args(raws: list[msgspec.Raw]) -> list[Any]:
    """The args Structs of some events (None where an event has no args object), decoded in one
    call over the joined raw JSON; strictly typed, else leniently (any JSON type per field)."""
    if not raws:
        return []
    blob = b"".join((b"[", b",".join([r if len(r) else b"null" for r in raws]), b"]"))
    try:
        out: list[Any] = _STRICT.args_decoder.decode(blob)
    except msgspec.ValidationError:
        out = _LENIENT.args_decoder.decode(blob)
    return out


def trace_decoder() -> msgspec.json.Decoder[Any]:
    """The typed decoder ppdiag uses (the floor the parse benchmark compares against)."""
    return _STRICT.decoder


# ----------------------------------------------------------------------------------------------
# Bytes: gzip, empty files, sniffing
# ----------------------------------------------------------------------------------------------

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LZ4_MAGIC = b"\x04\x22\x4d\x18"
_BLANK = re.compile(rb"[\s\x00]*\Z")  # stops at the first other byte: no copy of big files


def read_bytes(path: Path) -> tuple[bytes, list[str]]:
    """The file's JSON bytes (gunzipped when gzip), plus warnings (a cut gzip stream).

    A gzip stream cut short keeps everything that decompressed; corrupt gzip data is an error.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None
    if _BLANK.match(raw):
        raise InputError(str(path), "empty file")
    warnings: list[str] = []
    if raw[:4] == LZ4_MAGIC:
        raise InputError(str(path), "lz4-compressed data, not gzip or JSON; decompress it first (lz4 -d)")
    if raw[:3] == b"BZh" or raw[:6] == XZ_MAGIC or raw[:4] == ZSTD_MAGIC:
        # bzip2 / xz (standard library) or zstd (optional package) under a trace name: read, say so
        raw, what = unpack_other(raw, str(path))
        warnings.append(f"{what}-compressed data under a {path.suffix or 'plain'} name: read as {what}")
        if _BLANK.match(raw):
            raise InputError(str(path), f"empty file (after {what} decompression)")
        return raw, warnings
    if raw[:2] == GZIP_MAGIC:
        raw, cut = gunzip(raw, str(path))
        if cut:
            warnings.append("gzip stream ends early (file cut short or damaged); kept what decompressed")
        if _BLANK.match(raw):
            raise InputError(str(path), "empty file (after gunzip)")
    return raw, warnings


def zstd_module(path: str) -> Any:
    """The optional ``zstandard`` package, or an InputError naming the file and the package."""
    try:
        import zstandard
    except ImportError:
        raise InputError(
            path,
            "zstd-compressed data: reading it needs the optional 'zstandard' package "
            "(pip install zstandard), or decompress it first (zstd -d)",
        ) from None
    return zstandard


def _unzstd(raw: bytes, path: str, cap: int) -> bytes:
    """zstd data read 16 MiB at a time up to ``cap`` (a frame's claimed size is not trusted)."""
    zstandard = zstd_module(path)
    parts: list[bytes] = []
    total = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
            while True:
                out = reader.read(1 << 24)
                if not out:
                    break
                total += len(out)
                if total > cap:
                    raise InputError(
                        path,
                        f"zstd data expands past {_size(cap)} ({_size(len(raw))} compressed): refused "
                        "as a likely decompression bomb (raise the cap with PPDIAG_MAX_TRACE_GB)",
                    )
                parts.append(out)
    except zstandard.ZstdError as exc:
        raise InputError(path, f"corrupt zstd-compressed data ({exc})") from None
    return b"".join(parts)


def unpack_other(raw: bytes, path: str, limit: int | None = None) -> tuple[bytes, str]:
    """Decompress bzip2, xz or zstd data in chunks up to the cap of :func:`max_trace_bytes`;
    returns the data and the compressor's name. A cut or corrupt stream is an InputError naming
    the file."""
    import bz2
    import lzma

    cap = max_trace_bytes(len(raw)) if limit is None else limit
    if raw[:4] == ZSTD_MAGIC:
        return _unzstd(raw, path, cap), "zstd"
    what = "bzip2" if raw[:3] == b"BZh" else "xz"
    d: Any = bz2.BZ2Decompressor() if what == "bzip2" else lzma.LZMADecompressor()
    parts: list[bytes] = []
    total = 0
    try:
        out = d.decompress(raw, 1 << 24)
        while True:
            total += len(out)
            if total > cap:
                raise InputError(
                    path,
                    f"{what} data expands past {_size(cap)} ({_size(len(raw))} compressed): refused as "
                    "a likely decompression bomb (raise the cap with PPDIAG_MAX_TRACE_GB)",
                )
            parts.append(out)
            if d.eof or d.needs_input:
                break
            out = d.decompress(b"", 1 << 24)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise InputError(path, f"corrupt {what} data ({exc})") from None
    if not d.eof:
        raise InputError(path, f"{what} stream ends early (file cut short or damaged)")
    return b"".join(parts), what


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def max_trace_bytes(compressed: int) -> int:
    """The decompressed size a trace may reach: ``PPDIAG_MAX_TRACE_GB`` (default 32 GiB), and
    at most 200x its compressed size (JSON traces compress 5-50x; far more is a gzip bomb),
    never below 256 MiB."""
    try:
        gb = float(os.environ.get("PPDIAG_MAX_TRACE_GB", "32"))
    except ValueError:
        gb = 32.0
    cap = int(max(gb, 0.0) * (1 << 30))
    return min(cap, max(1 << 28, 200 * compressed)) if compressed else cap


def gunzip(raw: bytes, path: str, limit: int | None = None) -> tuple[bytes, bool]:
    """Decompress all gzip members; returns (data, cut) where cut means the stream ended early.

    Decompression stops at ``limit`` bytes (default :func:`max_trace_bytes`) with an InputError:
    memory stays bounded by the cap, whatever the stream claims."""
    cap = max_trace_bytes(len(raw)) if limit is None else limit
    # The usual file is one gzip member: inflate it in one call bounded by the cap, so the output
    # is one buffer and no b"".join copy of the whole trace is made.
    d0 = zlib.decompressobj(wbits=31)
    try:
        whole = d0.decompress(raw, cap + 1)
    except zlib.error:
        whole = b""  # the member-by-member loop below reports it
    else:
        if len(whole) > cap:
            raise InputError(
                path,
                f"gzip data expands past {_size(cap)} ({_size(len(raw))} compressed): "
                "refused as a likely gzip bomb (raise the cap with PPDIAG_MAX_TRACE_GB)",
            )
        if d0.eof and not d0.unused_data.strip(b"\x00"):
            return whole, False
    del whole, d0
    parts: list[bytes] = []
    total = 0
    data = raw
    chunk = 1 << 24
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            buf = data
            while True:
                out = d.decompress(buf, chunk)
                total += len(out)
                if total > cap:
                    raise InputError(
                        path,
                        f"gzip data expands past {_size(cap)} ({_size(len(raw))} compressed): "
                        "refused as a likely gzip bomb (raise the cap with PPDIAG_MAX_TRACE_GB)",
                    )
                parts.append(out)
                buf = d.unconsumed_tail
                if not buf:
                    break
            tail = d.flush()
            total += len(tail)
            parts.append(tail)
        except zlib.error as exc:
            raise InputError(path, f"corrupt gzip data ({exc})") from None
        if not d.eof:
            return b"".join(parts), True
        data = d.unused_data
        # trailing zero padding after the last member is harmless
        if data and data[:2] != GZIP_MAGIC:
            break
    return b"".join(parts), False


_SNIFF_KEYS = (b'"traceEvents"', b'"schemaVersion"')


def looks_like_kineto(head: bytes, name: str = "") -> bool:
    """True when ``head`` starts a JSON object that carries Kineto's top-level keys."""
    h = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not h.startswith(b"{"):
        return False
    if any(k in h for k in _SNIFF_KEYS):
        return True
    # Very long metadata (many devices / process groups) can push the keys past the head.
    return name.endswith((".pt.trace.json", ".pt.trace.json.gz"))


# ----------------------------------------------------------------------------------------------
# Damaged JSON: keep every complete event before the damage
# ----------------------------------------------------------------------------------------------

_ERR_BYTE = re.compile(r"\(byte (\d+)\)")
_CLOSE_CANDIDATE = re.compile(rb"\}(?=\s*(?:,|$))")
_NEXT_ELEMENT = re.compile(rb"\}\s*,\s*(\{)")
_MAX_CANDIDATES = 10_000  # `}` inside the damaged element are rejected cheaply, one by one
_LEADING_OBJECT = re.compile(rb"[\xef\xbb\xbf \t\r\n]*\{")
_MAX_REPAIRS = 16


@dataclass
class _Recovered:
    trace: Any
    kept_events: int
    lost_events: int
    warnings: list[str] = field(default_factory=list)
    dropped_used: int = 0  # host ops dropped while decoding (sliced decoding), see kineto_slices
    sliced: bool = False  # decoded by kineto_slices (which already ran the instant-event hooks)


def _error_pos(exc: msgspec.DecodeError, size: int) -> tuple[int, bool]:
    """(byte position, truncated) of a decode error."""
    msg = str(exc)
    if "truncated" in msg:
        return size, True
    m = _ERR_BYTE.search(msg)
    return (int(m.group(1)) if m else size), False


def _events_start(data: bytes) -> int:
    """Offset just after the ``[`` that opens traceEvents, or -1."""
    key = data.find(b'"traceEvents"')
    if key < 0:
        return -1
    m = re.compile(rb'"traceEvents"\s*:\s*\[').match(data, key)
    return m.end() if m else -1


def _last_complete_element(data: bytes, start: int, pos: int, types: TraceTypes) -> int:
    """Offset of the ``}`` that closes the last complete traceEvents element before ``pos``, or -1.

    Candidates are ``}`` followed only by whitespace and a comma (or the damage); each one is checked
    by decoding the element that ends there as a bare event, so only a handful of full decodes run.
    """
    lo = max(start, pos - (1 << 20))
    window = data[lo:pos]
    cands = [lo + m.start() for m in _CLOSE_CANDIDATE.finditer(window)]
    if lo > start and not cands:  # a giant damaged element: widen the search once
        window = data[start:pos]
        cands = [start + m.start() for m in _CLOSE_CANDIDATE.finditer(window)]
    for tried, p in enumerate(reversed(cands)):
        if tried >= _MAX_CANDIDATES:
            break
        # The element's opening brace: the previous element boundary, else the array start.
        prev = data.rfind(b"}", start, p)
        open_at = start
        while prev >= start:
            m = re.compile(rb"\}\s*,\s*\{").match(data, prev)
            if m:
                open_at = m.end() - 1
                break
            prev = data.rfind(b"}", start, prev)
        try:
            types.event_decoder.decode(data[open_at : p + 1])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        return p
    return -1


_NON_JSON_NUMBER = re.compile(rb"-?(?:NaN|nan|Infinity|inf|Inf)\b")
_NON_JSON_NUMBER_ANY = re.compile(rb"(?<=[:\[,])(\s*)-?(?:NaN|nan|Infinity|inf|Inf)(?=\s*[,\]}])")
_ARRAY_CLOSED = re.compile(rb"\}\s*\](?=\s*,\s*\"|\s*$)")


def _close_after_events(data: bytes, start: int, pos: int, types: TraceTypes) -> Any:
    """When the cut fell after traceEvents had closed (in trailing keys such as an on-demand
    ``distributedInfo``), the trace with every event, else None."""
    lo = max(start, pos - (1 << 16))
    for m in list(_ARRAY_CLOSED.finditer(data, lo, pos))[::-1][:3]:
        try:
            return types.decoder.decode(data[: m.end()] + b"}")
        except msgspec.DecodeError:
            continue
    return None


def _decode_damaged(
    data: bytes, path: str, types: TraceTypes, first_error: msgspec.DecodeError
) -> _Recovered:
    """Decode a trace whose JSON is damaged: a cut (crashed writer) or a malformed element.

    A cut keeps every complete event before it. A malformed element (e.g. an unescaped quote in a
    name from old writers) is dropped and decoding continues after it; after a few such repairs
    the rest is dropped like a cut.
    """
    start = _events_start(data)
    if start < 0 or not _LEADING_OBJECT.match(data):
        raise InputError(path, f"not a PyTorch Profiler trace (invalid JSON: {first_error})")
    warnings: list[str] = []
    lost_bytes = 0
    lost_events = 0
    repairs = 0
    doc = data
    err: msgspec.DecodeError = first_error
    fixed_numbers = False
    while True:
        pos, truncated = _error_pos(err, len(doc))
        if "trailing characters" in str(err):
            # junk after the top-level object (a second write, NUL padding): ignore it
            end = doc.rfind(b"}", 0, pos) + 1
            try:
                trace = types.decoder.decode(doc[:end])
            except msgspec.DecodeError:
                raise InputError(path, f"not a PyTorch Profiler trace (invalid JSON: {err})") from None
            warnings.append(f"ignored {len(doc) - end} bytes after the end of the JSON document")
            return _Recovered(trace, len(trace.traceEvents or []), lost_events, warnings)
        if not fixed_numbers and _NON_JSON_NUMBER.match(doc, pos):
            # NaN / Infinity written by some writers are not JSON: read them as null
            fixed_numbers = True
            doc = _NON_JSON_NUMBER_ANY.sub(b"null", doc)
            try:
                trace = _LENIENT.decoder.decode(doc)
            except msgspec.DecodeError as exc:
                err = exc
                types = _LENIENT
                continue
            warnings.append("non-JSON numbers (NaN / Infinity) read as unknown values")
            return _Recovered(trace, len(trace.traceEvents or []), lost_events, warnings)
        if pos < start:
            raise InputError(path, f"not a PyTorch Profiler trace (invalid JSON: {err})")
        if truncated:
            closed = _close_after_events(doc, start, pos, types)
            if closed is not None:
                warnings.append(
                    "truncated after the event list: all events kept, some trailing metadata lost"
                )
                return _Recovered(closed, len(closed.traceEvents or []), lost_events, warnings)
        p = _last_complete_element(doc, start, pos, types)
        if p < 0:
            # Nothing complete before the damage: maybe the event array itself had closed and the
            # damage is in trailing metadata.
            raise InputError(path, f"no complete trace event before the damage at byte {pos} ({err})")
        if not truncated and repairs < _MAX_REPAIRS:
            m = _NEXT_ELEMENT.search(doc, pos)
            if m is not None:
                nxt = m.start(1)
                skipped = doc[p + 1 : nxt]
                lost_bytes += len(skipped)
                lost_events += max(1, skipped.count(b'"ph"'))
                doc = doc[: p + 1] + b",\n" + doc[nxt:]
                repairs += 1
                try:
                    trace = types.decoder.decode(doc)
                except msgspec.DecodeError as exc:
                    err = exc
                    continue
                warnings.append(
                    f"malformed JSON: dropped {lost_events} damaged event(s) ({lost_bytes} bytes)"
                )
                return _Recovered(trace, len(trace.traceEvents or []), lost_events, warnings)
        # Cut here: close the event array and the top-level object.
        tail = doc[p + 1 :]
        try:
            trace = types.decoder.decode(doc[: p + 1] + b"]}")
        except msgspec.DecodeError as exc:
            npos, _ = _error_pos(exc, p + 3)
            if npos <= p:  # damage further up: repeat from there
                err = exc
                doc = doc[: p + 1]
                continue
            raise InputError(path, f"cannot recover the damaged trace ({exc})") from None
        kept = len(trace.traceEvents or [])
        dropped = len(tail.strip(b" \t\r\n,"))
        avg = max(1.0, (p + 1 - start) / max(1, kept))
        lost_here = math.ceil(dropped / avg) if dropped else 0
        lost_events += lost_here
        lost_bytes += dropped
        what = "truncated" if truncated else f"malformed at byte {pos}"
        warnings.append(
            f"{what}: kept {kept} complete events; dropped {dropped} bytes after the last complete "
            f"event (≈{lost_here} event(s)); anything after the cut is missing"
        )
        return _Recovered(trace, kept, lost_events, warnings)


def decode_trace(data: bytes, path: str) -> _Recovered:
    """Decode the whole trace, falling back to lenient types and damage recovery when needed."""
    try:
        trace = _STRICT.decoder.decode(data)
        return _Recovered(trace, len(trace.traceEvents or []), 0)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        bad_utf8 = _invalid_utf8(data) if "UTF-8" in str(exc) else 0
    if not bad_utf8:
        return _decode_typed(data, path)
    # a few undecodable bytes in a name must not cost the rank: replace them and say so
    fixed = data.decode("utf-8", errors="replace").encode("utf-8")
    rec = _decode_typed(fixed, path)
    rec.warnings.append(f"{bad_utf8} invalid UTF-8 byte sequence(s) in names replaced by U+FFFD")
    return rec


def _invalid_utf8(data: bytes) -> int:
    """Number of invalid UTF-8 sequences in ``data`` (0 when it is valid UTF-8)."""
    try:
        data.decode("utf-8")
        return 0
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace").count("\ufffd") - data.count("\ufffd".encode())


def _decode_typed(data: bytes, path: str) -> _Recovered:
    types = _STRICT
    for attempt in range(2):
        try:
            trace = types.decoder.decode(data)
            return _Recovered(trace, len(trace.traceEvents or []), 0)
        except msgspec.ValidationError as exc:
            if attempt == 0:
                types = _LENIENT
                continue
            raise InputError(path, f"not a PyTorch Profiler trace ({exc})") from None
        except msgspec.DecodeError as exc:
            try:
                return _decode_damaged(data, path, types, exc)
            except msgspec.ValidationError as vexc:
                if attempt == 0:
                    types = _LENIENT
                    continue
                raise InputError(path, f"not a PyTorch Profiler trace ({vexc})") from None
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------
# Names: what a host range or a kernel name means
# ----------------------------------------------------------------------------------------------

# host-name classes
N_NONE, N_STEP, N_LABEL, N_PP_COMM, N_PP_OTHER, N_COMM, N_OPTIM, N_DATA, N_BWD_OP, N_MODULE = range(10)
# comm classes (host ops and kernels)
C_NONE, C_P2P, C_COLL, C_COALESCED = range(4)

_RE_STEP = re.compile(r"^ProfilerStep#(\d{1,9})$")
_RE_PP_ACT = re.compile(r"^PP:(\d{1,9})([FBIW])(\d{1,9})$")
_RE_PP_COMM = re.compile(r"^PP:(\d{1,9})(RECV|SEND)_([FBIW])(\d{1,9})$")
_RE_PP_OVERLAP = re.compile(r"^PP:\((\d{1,9})([FBIW])(\d{1,9})[;,]")
_RE_FWDBWD = re.compile(
    r"^(forward|fwd|backward|bwd|wgrad|weight[ _-]?grad)[\s_\-#:.=]*"
    r"(?:mb|micro[ _-]?batch|microbatch|mbatch)?[\s_\-#:.=]*(\d{1,9})$",
    re.IGNORECASE,
)
_RE_BACKEND_TITLE = re.compile(r"^(nccl|gloo|mpi|ucc|xccl|hccl|rccl):")
_RE_TITLE_P2P = re.compile(r"^[a-z]+:(send|recv)\s+(\d{1,9})\s*(->|<-)\s*(\d{1,9})")
_RE_COMM_KERNEL = re.compile(r"nccl|rccl|hccl|msccl", re.IGNORECASE)
_RE_KERNEL_COLL = re.compile(
    r"all_?reduce|all_?gather|reduce_?scatter|broadcast|reduce|all_?to_?all", re.IGNORECASE
)
_RE_KERNEL_SENDRECV = re.compile(r"sendrecv|_send|_recv", re.IGNORECASE)
_RE_ALLTOALL = re.compile(r"all_?to_?all", re.IGNORECASE)

_ACTION_PHASE = {"F": Phase.FWD, "B": Phase.BWD, "I": Phase.BWD, "W": Phase.WGRAD}
_WORD_PHASE = {"forward": Phase.FWD, "fwd": Phase.FWD, "backward": Phase.BWD, "bwd": Phase.BWD}


def _label_phase(word: str) -> Phase:
    w = word.lower()
    if w in _WORD_PHASE:
        return _WORD_PHASE[w]
    return Phase.WGRAD


@dataclass(frozen=True)
class NameInfo:
    """What a host range name means; computed once per distinct name."""

    cls: int
    range_kind: int = -1  # RangeKind or -1 when not kept as a range
    num: int = -1
    stage: int = -1
    mb: int = -1
    phase: int = int(Phase.UNKNOWN)
    direction: int = int(Direction.NONE)
    comm: int = C_NONE
    alltoall: bool = False
    peer_grp: int = -1  # peer's rank in the op's process group (nccl:send a->b)
    my_grp: int = -1  # this rank's rank in that group


def classify_name(name: str) -> NameInfo:
    """Classify a host (CPU op / annotation) name. Pure function of the name."""
    if not name:
        return NameInfo(N_NONE)
    c0 = name[0]
    if c0 == "P":
        m = _RE_STEP.match(name)
        if m:
            return NameInfo(N_STEP, int(RangeKind.STEP), num=int(m.group(1)))
        if name.startswith("PP:"):
            m = _RE_PP_ACT.match(name)
            if m:
                return NameInfo(
                    N_LABEL,
                    int(RangeKind.LABEL),
                    stage=int(m.group(1)),
                    mb=int(m.group(3)),
                    phase=int(_ACTION_PHASE[m.group(2)]),
                )
            m = _RE_PP_COMM.match(name)
            if m:
                d = Direction.RECV if m.group(2) == "RECV" else Direction.SEND
                return NameInfo(
                    N_PP_COMM,
                    int(RangeKind.COMM_OP),
                    stage=int(m.group(1)),
                    mb=int(m.group(4)),
                    phase=int(_ACTION_PHASE[m.group(3)]),
                    direction=int(d),
                    comm=C_P2P,
                )
            m = _RE_PP_OVERLAP.match(name)
            if m:
                return NameInfo(
                    N_PP_OTHER,
                    int(RangeKind.OTHER),
                    stage=int(m.group(1)),
                    mb=int(m.group(3)),
                    phase=int(_ACTION_PHASE[m.group(2)]),
                )
            tail = re.match(r"^PP:(\d{1,9})", name)
            return NameInfo(N_PP_OTHER, int(RangeKind.OTHER), stage=int(tail.group(1)) if tail else -1)
    if name.startswith("c10d::"):
        op = name[6:]
        if op == "send" or op.startswith("send"):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.SEND), comm=C_P2P)
        if op.startswith("recv"):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.RECV), comm=C_P2P)
        if op.startswith(("wait", "monitored_barrier", "_coalesc")):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP))
        return NameInfo(N_COMM, int(RangeKind.COMM_OP), comm=C_COLL, alltoall=bool(_RE_ALLTOALL.search(op)))
    if name == "record_param_comms":
        # what it is depends on its args (Collective name)
        return NameInfo(N_COMM, int(RangeKind.COMM_OP))
    m = _RE_BACKEND_TITLE.match(name)
    if m:
        rest = name[m.end() :]
        mp = _RE_TITLE_P2P.match(name)
        if mp:
            d = Direction.SEND if mp.group(1) == "send" else Direction.RECV
            return NameInfo(
                N_COMM,
                int(RangeKind.COMM_OP),
                direction=int(d),
                comm=C_P2P,
                my_grp=int(mp.group(2)),
                peer_grp=int(mp.group(4)),
            )
        if rest.startswith("send"):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.SEND), comm=C_P2P)
        if rest.startswith("recv"):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.RECV), comm=C_P2P)
        if rest.startswith("coalesced"):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP), comm=C_COALESCED)
        return NameInfo(N_COMM, int(RangeKind.COMM_OP), comm=C_COLL, alltoall=bool(_RE_ALLTOALL.search(rest)))
    if name.startswith("Optimizer."):
        return NameInfo(N_OPTIM, int(RangeKind.OTHER), phase=int(Phase.OPTIM))
    if name.startswith("enumerate(DataLoader)"):
        return NameInfo(N_DATA, int(RangeKind.OTHER), phase=int(Phase.OTHER))
    if name.startswith("autograd::engine::evaluate_function:"):
        return NameInfo(N_BWD_OP)
    if name.startswith("nn.Module: "):
        return NameInfo(N_MODULE, int(RangeKind.MODULE))
    if c0 in "FfBbWw":
        m = _RE_FWDBWD.match(name)
        if m:
            return NameInfo(
                N_LABEL, int(RangeKind.LABEL), mb=int(m.group(2)), phase=int(_label_phase(m.group(1)))
            )
    return NameInfo(N_NONE)


class _NameMemo(dict[Any, NameInfo]):
    """name -> NameInfo, computed on first sight (names repeat a lot in traces)."""

    def __missing__(self, key: Any) -> NameInfo:
        v = classify_name(key if isinstance(key, str) else str(key))
        self[key] = v
        return v


# ----------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------

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

    A value beyond int64 is no id a profiler writes: with ``name`` it is an InputError naming
    the field, otherwise it reads as ``default``."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        out = [_as_int(v, default) for v in values]
        big = [v for v in out if not -(2**63) <= v < 2**63]
        if big and name:
            raise InputError(path, f"args.{name} = {big[0]} is out of range (more than 64 bits)") from None
        return np.asarray([v if -(2**63) <= v < 2**63 else default for v in out], dtype=np.int64)


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
    if isinstance(tid, str):
        m = re.search(r"-?\d{1,18}", tid)
        if m:
            return int(m.group(0))
    return -1


def _tids(values: list[Any]) -> I64A:
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.asarray([_tid_int(v) for v in values], dtype=np.int64)


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


def parse_rank_list(v: Any) -> list[int] | None:
    """Ranks given as a JSON list or as a string "[0, 1, 2]"; None when truncated ("..."), absent."""
    if isinstance(v, list):
        try:
            return [int(x) for x in v]
        except (TypeError, ValueError):
            return None
    if isinstance(v, str):
        if "..." in v:
            return None
        nums = re.findall(r"-?\d{1,12}", v)
        return [int(x) for x in nums] if nums or v.strip() == "[]" else None
    return None


_RE_FILE_RANK = re.compile(r"(?:^|[^a-z0-9])(rank|worker)[-_ ]?(\d{1,9})(?![0-9])", re.IGNORECASE)


def rank_from_filename(path: Path) -> int | None:
    """Rank from names like ``rank3``, ``rank-3``, ``rank_3``, ``worker3``, ``worker-3`` (file name
    first, then its directory). ``rank`` wins over ``worker``."""
    for part in (path.name, path.parent.name):
        found = {m.group(1).lower(): int(m.group(2)) for m in reversed(list(_RE_FILE_RANK.finditer(part)))}
        if "rank" in found:
            return found["rank"]
        if "worker" in found:
            return found["worker"]
    return None


def _ranks_from_arith(start: int, stride: int, size: int) -> list[int] | None:
    if start >= 0 and stride > 0 and size > 0:
        return [start + stride * i for i in range(size)]
    return None


# ----------------------------------------------------------------------------------------------
# Per-rank context: process groups and rank mapping
# ----------------------------------------------------------------------------------------------


@dataclass
class _Ctx:
    path: str
    rank: int
    groups: list[ProcessGroup]
    warnings: list[str] = field(default_factory=list)
    # each group's ranks as a set, built once: a group may list 10^6 ranks and every comm op asks
    _members: dict[int, tuple[int, frozenset[int]]] = field(default_factory=dict)

    def members(self, i: int) -> frozenset[int]:
        """The ranks of group ``i`` as a set (rebuilt when the group's rank list was filled in)."""
        ranks = self.groups[i].ranks
        got = self._members.get(i)
        if got is None or got[0] != len(ranks):
            got = (len(ranks), frozenset(ranks))
            self._members[i] = got
        return got[1]

    def group_index(self, name: str, desc: str, ranks: list[int] | None) -> int:
        """Index of a process group, adding it when the comm metadata names one not in pg_config."""
        if not name and ranks is None:
            return -1
        for i, g in enumerate(self.groups):
            if name and g.name == name:
                if not g.ranks and ranks:
                    g.ranks = ranks
                if not g.desc and desc:
                    g.desc = desc
                return i
        if not name:
            for i, g in enumerate(self.groups):
                if ranks and g.ranks == ranks:
                    return i
            name = f"?{len(self.groups)}"
        self.groups.append(ProcessGroup(name=name, desc=desc, ranks=list(ranks or [])))
        return len(self.groups) - 1

    def to_global(self, grp_rank: int, group: int = -1, my_grp: int = -1) -> int:
        """Global rank of ``grp_rank`` in ``group`` (or in the only plausible group when unknown)."""
        if grp_rank < 0:
            return -1
        if 0 <= group < len(self.groups):
            r = self.groups[group].ranks
            return r[grp_rank] if grp_rank < len(r) else -1
        if not self.groups:
            return grp_rank  # no group information: the default group, where group rank == global rank
        cands: set[int] = set()
        for i, g in enumerate(self.groups):
            if not g.ranks or grp_rank >= len(g.ranks):
                continue
            if self.rank >= 0 and self.rank not in self.members(i):
                continue
            if my_grp >= 0 and (my_grp >= len(g.ranks) or g.ranks[my_grp] != self.rank):
                continue
            cands.add(g.ranks[grp_rank])
        return cands.pop() if len(cands) == 1 else -1


@dataclass
class _CommInfo:
    """Communication facts of one host op or kernel (all -1 / NONE when unknown)."""

    comm: int = C_NONE
    direction: int = int(Direction.NONE)
    peer: int = -1
    peer_grp: int = -1
    my_grp: int = -1
    nbytes: int = -1
    seq: int = -1
    group: int = -1
    alltoall: bool = False


def _coll_class(coll: str) -> tuple[int, int, bool]:
    """(comm class, direction, alltoall) from a ``Collective name`` value."""
    c = coll.lower()
    if c in ("send", "isend"):
        return C_P2P, int(Direction.SEND), False
    if c in ("recv", "irecv", "recv_any_source"):
        return C_P2P, int(Direction.RECV), False
    if c in ("wait", "init", "", "barrier_wait", "unknown"):
        return C_NONE, int(Direction.NONE), False
    if "coalesced" in c and not any(k in c for k in ("gather", "reduce", "scatter")):
        return C_COALESCED, int(Direction.NONE), False
    return C_COLL, int(Direction.NONE), bool(_RE_ALLTOALL.search(c))


def _args_comm(a: Any, ctx: _Ctx) -> _CommInfo:
    """Comm facts carried by an event's args (record_param_comms or an NCCL kernel)."""
    info = _CommInfo()
    if a is None:
        return info
    coll = a.coll if isinstance(a.coll, str) else ""
    if coll:
        info.comm, info.direction, info.alltoall = _coll_class(coll)
    name = a.pg_name if a.pg_name not in (None, "") else a.pg_id
    name = "" if name in (None, "", -1) else str(name)
    ranks = parse_rank_list(a.pg_ranks)
    if ranks is None or (not ranks and _as_int(a.group_size) > 1):
        ranks = _ranks_from_arith(_as_int(a.rank_start), _as_int(a.rank_stride), _as_int(a.group_size))
    if ranks is not None and not ranks:
        ranks = None
    desc = a.pg_desc if isinstance(a.pg_desc, str) else ""
    if name or ranks:
        info.group = ctx.group_index(name, desc, ranks)
    if info.direction == Direction.SEND:
        info.peer = _as_int(a.dst)
    elif info.direction == Direction.RECV:
        info.peer = _as_int(a.src)
    if info.peer < 0 and info.comm == C_P2P:
        info.peer_grp = _as_int(a.peer_rank)  # for send/recv "Rank" is the peer's group rank
        if info.peer_grp >= 0 and info.group >= 0:
            info.peer = ctx.to_global(info.peer_grp, info.group)
    size = dtype_size(a.dtype)
    nel = _as_int(a.nelems)
    if size > 0 and nel >= 0:
        info.nbytes = nel * size
    info.seq = _as_int(a.seq)
    return info


def _shape_bytes(dims: Any, types: Any) -> int:
    """Payload bytes of an op's first tensor argument from ``Input Dims`` / ``Input type``."""
    if not isinstance(dims, list) or not dims:
        return -1
    first = dims[0]
    tname = types[0] if isinstance(types, list) and types else ""
    size = dtype_size(tname)
    if size < 0 or not isinstance(first, list):
        return -1
    if first and isinstance(first[0], list):  # a TensorList
        total = 0
        for t in first:
            if isinstance(t, list):
                total += int(np.prod(t, dtype=np.int64)) if t else 1
        return total * size
    return (int(np.prod(first, dtype=np.int64)) if first else 1) * size


def _host_comm(info: NameInfo, a: Any, ctx: _Ctx) -> _CommInfo:
    """Comm facts of one host comm op from its name and args."""
    out = _CommInfo(
        comm=info.comm,
        direction=info.direction,
        peer_grp=info.peer_grp,
        my_grp=info.my_grp,
        alltoall=info.alltoall,
    )
    if a is None:
        return out
    if info.cls == N_COMM:
        meta = _args_comm(a, ctx)
        if meta.comm != C_NONE or out.comm == C_NONE:
            if meta.comm != C_NONE:
                out.comm, out.alltoall = meta.comm, meta.alltoall
            if meta.direction:
                out.direction = meta.direction
        out.peer = meta.peer
        if meta.peer_grp >= 0 and out.peer_grp < 0:
            out.peer_grp = meta.peer_grp
        out.nbytes, out.seq, out.group = meta.nbytes, meta.seq, meta.group
        if out.comm == C_P2P and out.peer < 0 and out.peer_grp < 0:
            conc = _raw_json(a.concrete)
            # c10d::send / recv_ with record_shapes: [tensors, group, "peer group rank", "tag"]
            if isinstance(conc, list) and len(conc) >= 3:
                out.peer_grp = _as_int(conc[2])
        if out.nbytes < 0:
            out.nbytes = _shape_bytes(_raw_json(a.dims), _raw_json(a.types))
    if out.peer < 0 and out.peer_grp >= 0:
        out.peer = ctx.to_global(out.peer_grp, out.group, out.my_grp)
    return out


# ----------------------------------------------------------------------------------------------
# Category codes
# ----------------------------------------------------------------------------------------------

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


@dataclass
class _Host:
    """Kept host ranges (steps, labels, comm ops, other annotations) as parallel lists."""

    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)
    info: list[NameInfo] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    comm: list[_CommInfo] = field(default_factory=list)
    is_cpu_op: list[bool] = field(default_factory=list)
    ext: list[int] = field(default_factory=list)  # External id of comm ops, -1 otherwise
    # autograd backward ops (not kept as ranges: only to mark the GPU work they launch)
    bwd: tuple[I64A, I64A, I64A] | None = None  # start, end, tid


# ----------------------------------------------------------------------------------------------
# The parser
# ----------------------------------------------------------------------------------------------


class KinetoParser:
    """PyTorch Profiler / Kineto Chrome-trace JSON (``.json``, ``.json.gz``)."""

    name = "kineto"

    def sniff(self, path: Path, head: bytes) -> bool:
        """True when ``head`` (gunzipped) starts a JSON object with Kineto's top-level keys."""
        return looks_like_kineto(head, path.name)

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        """Parse one Kineto trace file into one rank."""
        path = Path(path)
        data, warnings = read_bytes(path)
        # hand the bytes over: once decoded they are freed, not held by this frame all along
        held = [data]
        del data
        try:
            return [_parse_bytes(held, path, warnings)]
        except InputError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, OverflowError, AttributeError) as exc:
            if os.environ.get("PPDIAG_DEBUG"):
                raise
            raise InputError(str(path), f"unsupported trace content ({type(exc).__name__}: {exc})") from None


_SLICE_DECODER = msgspec.json.Decoder(list[_STRICT.event])  # type: ignore[name-defined]


#: Name of the allocator's instant events (``profile_memory=True``), kept by the sliced decoding.
MEMORY_EVENT = "[memory]"


def _decode_sliced(data: bytes, memo: _NameMemo) -> _Recovered | None:
    """The trace decoded a slice at a time (see :mod:`ppdiag.parsers.kineto_slices`), without the
    host ops a GPU trace's parse never reads; None when the whole document must be decoded."""

    got = decode_sliced(data, _SLICE_DECODER, lambda top: _slice_select(top, memo))
    if got is None:
        return None
    top = got.top
    trace = _STRICT.trace(
        traceEvents=got.events,
        distributedInfo=top.distributedInfo,
        deviceProperties=top.deviceProperties,
        baseTimeNanoseconds=top.baseTimeNanoseconds,
        host_name=top.host_name,
    )
    return _Recovered(trace, got.total, 0, dropped_used=got.dropped_used, sliced=True)


def _slice_select(top: Any, memo: _NameMemo) -> Select:
    """The per-slice filter: keep every used event except the host ops no later step reads
    (those with usable times are dropped and counted), and count the usable GPU events."""
    b = top.baseTimeNanoseconds
    base = _as_int(b, 0) if b is not None else 0
    lim = _MAX_US - abs(base) / 1000.0

    def usable(sub: list[Any]) -> npt.NDArray[np.bool_]:
        # the times _drop_bad_times would neither drop nor alter (strict decoding: floats)
        ts = np.fromiter(_col(sub, "ts"), dtype=np.float64, count=len(sub))
        dur = np.fromiter(_col(sub, "dur"), dtype=np.float64, count=len(sub))
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(ts) & (np.abs(ts) < lim) & np.isfinite(dur)
            ok &= (dur >= 0) & (dur <= _MAX_DUR_US)
        return ok

    def select(evs: list[Any]) -> tuple[npt.NDArray[np.bool_], int, int]:
        n = len(evs)
        cat = np.fromiter(map(_CAT.get, _col(evs, "cat"), repeat(K_OTHER)), dtype=np.int8, count=n)
        is_x = np.fromiter(map(operator.eq, _col(evs, "ph"), repeat("X")), dtype=bool, count=n)
        gpu = (cat >= K_KERNEL) & (cat <= K_SYNC)
        gi = np.flatnonzero(gpu & is_x).tolist()
        n_gpu = int(usable([evs[i] for i in gi]).sum()) if gi else 0
        keep = (is_x & (cat != K_OTHER)) | (gpu & ~is_x)
        # the allocator's instant events: ppdiag/parsers/kineto_memory.py reads them
        keep |= np.fromiter(map(operator.eq, _col(evs, "name"), repeat(MEMORY_EVENT)), dtype=bool, count=n)
        hi = np.flatnonzero(is_x & ((cat == K_CPUOP) | (cat == K_ANNOT) | (cat == K_PYFUNC)))
        if not len(hi):
            return keep, 0, n_gpu
        infos = list(map(memo.__getitem__, _col([evs[i] for i in hi.tolist()], "name")))
        rk = np.fromiter(map(attrgetter("range_kind"), infos), dtype=np.int64, count=len(infos))
        cl = np.fromiter(map(attrgetter("cls"), infos), dtype=np.int64, count=len(infos))
        hc = cat[hi]
        # what _collect_host reads: named ranges, every annotation, module Python functions, and
        # the autograd backward ops
        needed = ((rk >= 0) | (hc == K_ANNOT)) & ~((hc == K_PYFUNC) & (cl != N_MODULE))
        needed |= cl == N_BWD_OP
        cand = hi[~needed]
        drop = cand[usable([evs[i] for i in cand.tolist()])] if len(cand) else cand
        keep[drop] = False
        return keep, len(drop), n_gpu

    return select


def _parse_bytes(held: list[bytes], path: Path, warnings: list[str]) -> RankTimeline:
    from ppdiag.parsers.kineto_memory import memory_meta  # it reads this module's time helpers

    data = held.pop()  # the only reference from here on: ``del data`` below frees the bytes
    spath = str(path)
    if not _LEADING_OBJECT.match(data, 0, 4096):
        raise InputError(spath, "not a PyTorch Profiler trace (not a JSON object)")
    memo = _NameMemo()
    rec = _decode_sliced(data, memo) or decode_trace(data, spath)
    del data
    warnings = warnings + rec.warnings
    trace = rec.trace
    evs = trace.traceEvents
    if evs is None:
        raise InputError(spath, "not a PyTorch Profiler trace (no traceEvents)")
    if not evs:
        raise InputError(spath, "empty trace (traceEvents is empty)")
    if not rec.sliced:
        run_instant_hooks(evs)

    dist = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    _check_fields(dist, trace.baseTimeNanoseconds, spath)
    rank = _as_int(dist.get("rank"), -1)
    rank_source = "distributedInfo"
    if rank < 0:
        fr = rank_from_filename(path)
        rank, rank_source = (fr, "file name") if fr is not None else (-1, "none")
    world = _as_int(dist.get("world_size"), -1)
    backend = dist.get("backend") if isinstance(dist.get("backend"), str) else None
    groups = _process_groups(dist)
    ctx = _Ctx(spath, rank, groups)
    base = _as_int(trace.baseTimeNanoseconds, 0) if trace.baseTimeNanoseconds is not None else 0
    if trace.baseTimeNanoseconds is not None and (
        isinstance(trace.baseTimeNanoseconds, bool) or _as_int(trace.baseTimeNanoseconds, -1) < 0
    ):
        warnings = [
            *warnings,
            f"baseTimeNanoseconds {trace.baseTimeNanoseconds!r} is not a number of ns: "
            "timestamps read as absolute µs",
        ]
    devprops = trace.deviceProperties if isinstance(trace.deviceProperties, list) else []

    codes = _event_codes(evs)
    # every dropped or altered event of this file in one warning (the loader names the file)
    changed = _read_begin_end(evs, codes) + _drop_bad_times(evs, codes, base, rec.dropped_used)
    if changed:
        warnings = [*warnings, "; ".join(changed)]
    gpu_idx = np.flatnonzero((codes >= K_KERNEL) & (codes <= K_SYNC))
    host_idx = np.flatnonzero((codes == K_CPUOP) | (codes == K_ANNOT) | (codes == K_PYFUNC))

    names = NameTable()
    host = _collect_host(evs, host_idx, codes, memo, base, ctx)

    meta: dict[str, Any] = {
        "time_base_ns": base,
        "ts_format": "relative+baseTimeNanoseconds" if base else "absolute µs",
    }
    if isinstance(trace.host_name, str) and trace.host_name:
        meta["host_name"] = trace.host_name  # ranks on one host share its cores (contention)
    meta.update(memory_meta(evs, base, devprops))  # allocator events (ppdiag/parsers/kineto_memory.py)
    if len(gpu_idx):
        intervals, device, extra = _gpu_mode(evs, gpu_idx, codes, host, base, ctx, names, devprops)
        meta.update(extra)
        cpu_only = False
    else:
        if devprops or (backend or "").lower() == "nccl":
            why = "the trace lists CUDA devices" if devprops else "the backend is nccl"
            if changed:
                # GPU events are there, in a form ppdiag cannot place: say that, not "enable CUDA"
                raise InputError(spath, f"no usable GPU events ({'; '.join(changed)})")
            if rec.lost_events or rec.warnings or warnings:
                # Kineto writes GPU events after the CPU events: a cut can take all of them
                raise InputError(
                    spath,
                    f"no GPU events in the {rec.kept_events} events before the file was cut ({why}); "
                    "the trace is truncated",
                )
            raise InputError(
                spath,
                f"no GPU events ({why}, but no kernel/memcpy/memset was recorded: profile with "
                "ProfilerActivity.CUDA)",
            )
        cpu_idx = np.flatnonzero(codes == K_CPUOP)
        if not len(cpu_idx):
            raise InputError(spath, "no GPU events and no CPU ops: nothing to analyze")
        intervals, extra = _cpu_mode(evs, cpu_idx, host, memo, base, ctx, names)
        meta.update(extra)
        device = "cpu"
        cpu_only = True
    del evs, trace
    ranges = _build_ranges(host, names)
    warnings = warnings + ctx.warnings
    return RankTimeline(
        rank=rank,
        source=spath,
        format="kineto",
        names=names.names,
        intervals=intervals.sorted(),
        ranges=ranges,
        world_size=world if world > 0 else None,
        backend=backend,
        device=device,
        cpu_only=cpu_only,
        process_groups=ctx.groups,
        rank_source=rank_source,
        events_total=rec.kept_events,
        events_lost=rec.lost_events,
        warnings=warnings,
        meta=meta,
    )


# Largest |value| a field may take: ranks and sizes beyond any real job; times that still fit
# int64 nanoseconds once the base is added.
_MAX_RANK = 1 << 24
_MAX_NS = 1 << 62
_MAX_US = float(_MAX_NS // 1000)
_MAX_DUR_US = 7 * 86400 * 1e6  # a week: no kernel or op lasts longer


def _check_fields(dist: dict[str, Any], base: Any, path: str) -> None:
    """Refuse top-level numbers no profiler writes, naming the field (not a crash later)."""
    for key in ("rank", "world_size"):
        v = dist.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (-1 <= v < _MAX_RANK):
            raise InputError(path, f"distributedInfo.{key} = {v!r} is out of range (0..{_MAX_RANK - 1})")
    b = base
    if isinstance(b, str):
        try:
            b = float(b)
        except ValueError:
            return  # not a number at all: warned about, and the timestamps read as absolute
    if isinstance(b, (int, float)) and not isinstance(b, bool) and not (abs(b) < _MAX_NS):
        raise InputError(path, f"baseTimeNanoseconds = {base!r} is out of range (more than 2^62 ns)")


def _col(objs: list[Any], attr: str) -> list[Any]:
    """One attribute of every object, gathered by C-level iteration (no Python bytecode per
    event): the first step of every per-kind column build."""
    return list(map(attrgetter(attr), objs))


def _event_codes(evs: list[Any]) -> npt.NDArray[np.int8]:
    """The kind code of every event: its category's code for complete (``X``) events, else
    K_OTHER. Vectorised over the event list; a category that is not a string (lenient traces)
    takes the per-event path, where such an event is of no known kind."""
    n = len(evs)
    try:
        codes = np.fromiter(map(_CAT.get, _col(evs, "cat"), repeat(K_OTHER)), dtype=np.int8, count=n)
    except TypeError:
        return np.fromiter(
            (_CAT.get(e.cat, K_OTHER) if e.ph == "X" and isinstance(e.cat, str) else K_OTHER for e in evs),
            dtype=np.int8,
            count=n,
        )
    is_x = np.fromiter(map(operator.eq, _col(evs, "ph"), repeat("X")), dtype=bool, count=n)
    codes[~is_x] = K_OTHER
    return codes


def _read_begin_end(evs: list[Any], codes: npt.NDArray[np.int8]) -> list[str]:
    """GPU events written as ``B``/``E`` pairs instead of complete ``X`` events: pair them per
    (pid, tid) in time order and read each pair as one complete event; count what is left.

    Only GPU categories are looked at (host B/E events are not used by the analysis)."""
    gpu_cats = {c for c, k in _CAT.items() if K_KERNEL <= k <= K_SYNC}
    idx = [i for i, e in enumerate(evs) if e.ph != "X" and isinstance(e.cat, str) and e.cat in gpu_cats]
    if not idx:
        return []
    begin: dict[tuple[Any, Any], list[int]] = {}
    paired = unmatched = other = 0
    order = sorted(idx, key=lambda i: (_num_or_nan(evs[i].ts), 0 if evs[i].ph == "E" else 1))
    for i in order:
        e = evs[i]
        key = (e.pid, e.tid)
        if e.ph == "B":
            begin.setdefault(key, []).append(i)
        elif e.ph == "E":
            stack = begin.get(key)
            if not stack:
                unmatched += 1
                continue
            bi = stack.pop()
            b = evs[bi]
            t0, t1 = _num_or_nan(b.ts), _num_or_nan(e.ts)
            if not (math.isfinite(t0) and math.isfinite(t1)) or t1 < t0:
                unmatched += 1
                continue
            b.ph, b.dur = "X", t1 - t0
            codes[bi] = _CAT[b.cat]
            paired += 1
        else:
            other += 1
    unmatched += sum(len(v) for v in begin.values())
    out = []
    if paired:
        out.append(f"{paired} GPU events written as B/E pairs read as complete events")
    if unmatched or other:
        out.append(
            f"dropped {unmatched + other} GPU events that are not complete (ph X) events "
            f"({unmatched} unpaired B/E, {other} with another ph)"
        )
    return out


def _num_array(vals: list[Any]) -> tuple[F64A, npt.NDArray[np.bool_]]:
    """float64 values and a mask of the entries that are real numbers (not null, text or bool)."""
    ok = np.fromiter((type(v) is float or type(v) is int for v in vals), dtype=bool, count=len(vals))
    if ok.all():
        return np.asarray(vals, dtype=np.float64), ok
    return np.asarray([v if k else 0.0 for v, k in zip(vals, ok, strict=True)], dtype=np.float64), ok


def _num_or_nan(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def _drop_bad_times(evs: list[Any], codes: npt.NDArray[np.int8], base: int, unseen: int = 0) -> list[str]:
    """Drop (code ``K_OTHER``) the used events whose ``ts``/``dur`` are unusable and count them:
    ts missing / null / text / bool / not finite, ts beyond int64 ns, dur over a week. Negative
    or non-numeric durations are kept as zero-length events, and counted too. ``unseen``: used
    events with usable times that sliced decoding dropped before (they count in the totals)."""
    used = np.flatnonzero(codes != K_OTHER)
    if not len(used):
        return []
    total = len(used) + unseen
    ts, ts_ok = _num_array([evs[i].ts for i in used])
    dur, dur_ok = _num_array([evs[i].dur for i in used])
    no_ts = ~ts_ok | ~np.isfinite(ts)
    lim = _MAX_US - abs(base) / 1000.0
    far = ~no_ts & (np.abs(ts) >= lim)
    bad_dur = ~dur_ok | ~np.isfinite(dur)
    neg = ~bad_dur & (dur < 0)
    huge = ~bad_dur & (dur > _MAX_DUR_US)
    drop = no_ts | far | huge
    n = int(drop.sum())
    zero = (neg | bad_dur) & ~drop
    out = []
    if n:
        codes[used[drop]] = K_OTHER
        parts = [
            (int(no_ts.sum()), "ts missing, null, text or not finite"),
            (int(far.sum()), "ts out of range"),
            (int(huge.sum()), "dur over a week"),
        ]
        why = ", ".join(f"{k} {w}" for k, w in parts if k)
        out.append(f"dropped {n} of {total} events with unusable times ({why})")
    if zero.any():
        # kept at their start with zero length (what the parse does with them), but said
        parts = [
            (int((neg & ~drop).sum()), "a negative dur"),
            (int((bad_dur & ~drop).sum()), "no numeric dur"),
        ]
        why = ", ".join(f"{k} with {w}" for k, w in parts if k)
        out.append(f"{int(zero.sum())} of {total} events read as zero-length ({why})")
    return out


def _process_groups(dist: dict[str, Any]) -> list[ProcessGroup]:
    out: list[ProcessGroup] = []
    cfg = dist.get("pg_config")
    if not isinstance(cfg, list):
        return out
    for g in cfg:
        if not isinstance(g, dict):
            continue
        name = g.get("pg_name", g.get("uid", ""))
        desc = g.get("pg_desc", "")
        ranks = parse_rank_list(g.get("ranks"))
        out.append(
            ProcessGroup(
                name="" if name is None else str(name),
                desc=desc if isinstance(desc, str) else str(desc),
                ranks=ranks or [],
                backend=str(g.get("backend_config", "") or ""),
            )
        )
    return out


def _collect_host(
    evs: list[Any],
    host_idx: npt.NDArray[np.intp],
    codes: npt.NDArray[np.int8],
    memo: _NameMemo,
    base: int,
    ctx: _Ctx,
) -> _Host:
    """Keep the host ranges later layers need (and comm ops for kernel classification)."""
    host = _Host()
    if not len(host_idx):
        return host
    idx_list = host_idx.tolist()
    sub = [evs[i] for i in idx_list]
    infos = [memo[e.name] for e in sub]
    sub_codes = codes[host_idx]
    is_bwd = np.fromiter((i.cls == N_BWD_OP for i in infos), dtype=bool, count=len(infos))
    if is_bwd.any():
        bsel = np.flatnonzero(is_bwd).tolist()
        b_ev = [sub[i] for i in bsel]
        b_s = us_to_ns(_f64(_col(b_ev, "ts")), base)
        b_e = b_s + np.maximum(us_to_ns(_f64(_col(b_ev, "dur")), 0), 0)
        host.bwd = (b_s, b_e, _tids(_col(b_ev, "tid")))
    keep_cls = np.fromiter((i.range_kind >= 0 for i in infos), dtype=bool, count=len(infos))
    # every user annotation is kept (they are few and name user phases); CPU ops and Python
    # functions only when their name means something to ppdiag
    keep = keep_cls | (sub_codes == K_ANNOT)
    keep &= ~((sub_codes == K_PYFUNC) & ~np.fromiter((i.cls == N_MODULE for i in infos), bool, len(infos)))
    kept = np.flatnonzero(keep).tolist()
    if not kept:
        return host
    ks = [sub[i] for i in kept]
    ts = us_to_ns(_f64(_col(ks, "ts")), base)
    dur = np.maximum(us_to_ns(_f64(_col(ks, "dur")), 0), 0)
    host.start = ts.tolist()
    host.end = (ts + dur).tolist()
    host.tid = _tids(_col(ks, "tid")).tolist()
    comm_args = iter(
        _decode_args([e.args for j, e in zip(kept, ks, strict=True) if infos[j].cls in _COMM_CLS])
    )
    for j, e in zip(kept, ks, strict=True):
        info = infos[j]
        if info.range_kind < 0:
            info = NameInfo(info.cls, int(RangeKind.OTHER), phase=info.phase)
        host.info.append(info)
        host.name.append(e.name if isinstance(e.name, str) else str(e.name))
        host.is_cpu_op.append(bool(sub_codes[j] == K_CPUOP))
        if info.cls in _COMM_CLS:
            a = next(comm_args)
            host.comm.append(_host_comm(info, a, ctx))
            x = -1 if a is None else _as_int(a.ext)
            host.ext.append(x if x >= 0 or a is None else _as_int(a.ext_lc))
        else:
            host.comm.append(_CommInfo())
            host.ext.append(-1)
    _inherit_from_issuer(host)
    return host


_COMM_CLS = (N_COMM, N_PP_COMM)


def _inherit_from_issuer(host: _Host) -> None:
    """Backend spans (``gloo:send``) carry no peer: take it from the ``c10d::`` op that issued them
    (the latest-starting one on the same thread that contains the span's start)."""
    iss = [i for i, nm in enumerate(host.name) if nm.startswith("c10d::") and host.comm[i].comm == C_P2P]
    want = [
        i
        for i, nm in enumerate(host.name)
        if host.comm[i].comm == C_P2P
        and host.info[i].cls == N_COMM
        and not nm.startswith("c10d::")
        and (host.comm[i].peer < 0 or not host.comm[i].direction)
    ]
    if not iss or not want:
        return
    i_tid = np.array([host.tid[i] for i in iss], dtype=np.int64)
    i_s = np.array([host.start[i] for i in iss], dtype=np.int64)
    i_e = np.array([host.end[i] for i in iss], dtype=np.int64)
    order = np.lexsort((i_s, i_tid))
    i_tid, i_s, i_e = i_tid[order], i_s[order], i_e[order]
    iss_sorted = [iss[int(k)] for k in order]
    w_tid = np.array([host.tid[i] for i in want], dtype=np.int64)
    w_s = np.array([host.start[i] for i in want], dtype=np.int64)
    # search on (tid, start) pairs: the last issuer of that thread starting at or before the span
    key_i = np.stack((i_tid, i_s), axis=1)
    pos = np.searchsorted(i_tid, w_tid, side="left")
    end = np.searchsorted(i_tid, w_tid, side="right")
    for k, i in enumerate(want):
        lo, hi = int(pos[k]), int(end[k])
        if lo >= hi:
            continue
        j = lo + int(np.searchsorted(key_i[lo:hi, 1], w_s[k], side="right")) - 1
        if j < lo or i_e[j] < w_s[k]:
            continue
        c, src = host.comm[i], host.comm[iss_sorted[j]]
        if c.peer < 0:
            c.peer = src.peer
        if not c.direction:
            c.direction = src.direction
        if c.nbytes < 0:
            c.nbytes = src.nbytes


def _build_ranges(host: _Host, names: NameTable) -> Ranges:
    n = len(host.start)
    if not n:
        return Ranges.empty()
    cols: dict[str, Any] = {
        "start": host.start,
        "end": host.end,
        "tid": host.tid,
        "kind": [i.range_kind for i in host.info],
        "name": [names.id(s) for s in host.name],
        "num": [i.num for i in host.info],
        "stage": [i.stage for i in host.info],
        "mb": [i.mb for i in host.info],
        "phase": [i.phase for i in host.info],
        "peer": [c.peer for c in host.comm],
        "direction": [c.direction or i.direction for c, i in zip(host.comm, host.info, strict=True)],
        "bytes": [c.nbytes for c in host.comm],
        "seq": [c.seq for c in host.comm],
        "group": [c.group for c in host.comm],
    }
    r = Ranges.from_columns(n, cols)
    return r.take(np.lexsort((r.end, r.start)))


# ----------------------------------------------------------------------------------------------
# GPU mode
# ----------------------------------------------------------------------------------------------


def _gpu_mode(
    evs: list[Any],
    gpu_idx: npt.NDArray[np.intp],
    codes: npt.NDArray[np.int8],
    host: _Host,
    base: int,
    ctx: _Ctx,
    names: NameTable,
    devprops: list[Any],
) -> tuple[Intervals, str | None, dict[str, Any]]:
    g = [evs[i] for i in gpu_idx.tolist()]
    n = len(g)
    gcodes = codes[gpu_idx]
    start = us_to_ns(_f64(_col(g, "ts")), base)
    dur = np.maximum(us_to_ns(_f64(_col(g, "dur")), 0), 0)
    empty_args = _STRICT.args()
    gargs = [a if a is not None else empty_args for a in _decode_args(_col(g, "args"))]
    stream = _i64(_col(gargs, "stream"))
    tid = _tids(_col(g, "tid"))
    stream = np.where(stream >= 0, stream, tid)
    dev = _tids(_col(g, "pid"))
    adev = _i64(_col(gargs, "device"))
    dev = np.where(dev >= 0, dev, adev)
    corr = _i64(_col(gargs, "correlation"), name="correlation", path=ctx.path)
    gname = [e.name if isinstance(e.name, str) else str(e.name) for e in g]
    name_id = np.fromiter((names.id(s) for s in gname), dtype=np.int32, count=n)
    nbytes = _i64(_col(gargs, "nbytes"))

    devices = np.unique(dev[dev >= 0])
    if len(devices) > 1:
        # one process drove several GPUs: keep streams of different devices apart
        stream = dev * (1 << 32) + stream
        ctx.warnings.append(
            f"GPU events on {len(devices)} devices {devices.tolist()}; streams are keyed by (device, stream)"
        )
    main_dev = int(np.bincount(dev[dev >= 0]).argmax()) if (dev >= 0).any() else -1
    device_name = None
    for p in devprops:
        if isinstance(p, dict) and _as_int(p.get("id")) == main_dev and p.get("name"):
            device_name = str(p["name"])
    if device_name is None and devprops and isinstance(devprops[0], dict) and devprops[0].get("name"):
        device_name = str(devprops[0]["name"])

    lut = np.zeros(K_SYNC + 1, dtype=np.int8)
    for code, k in _GPU_KIND.items():
        lut[code] = k
    kind = lut[gcodes]

    # launch: the runtime call with the same correlation id (vectorized join)
    rt_idx = np.flatnonzero(codes == K_RUNTIME)
    launch = np.full(n, -1, dtype=np.int64)
    launch_tid = np.full(n, -1, dtype=np.int64)
    if len(rt_idx):
        rt = [evs[i] for i in rt_idx.tolist()]
        rt_args = [(a.correlation if a is not None else -1) for a in _decode_args(_col(rt, "args"))]
        rt_corr = _i64(rt_args, name="correlation", path=ctx.path)
        rt_ts = us_to_ns(_f64(_col(rt, "ts")), base)
        rt_tid = _tids(_col(rt, "tid"))
        del rt
        order = np.argsort(rt_corr, kind="stable")
        sc = rt_corr[order]
        pos = np.minimum(np.searchsorted(sc, corr), len(sc) - 1)
        ok = (corr >= 0) & (sc[pos] == corr)
        launch[ok] = rt_ts[order[pos[ok]]]
        launch_tid[ok] = rt_tid[order[pos[ok]]]
    matched = int((launch >= 0).sum())

    cols: dict[str, Any] = {
        "start": start,
        "end": start + dur,
        "stream": stream,
        "kind": kind,
        "name": name_id,
        "bytes": nbytes,
        "launch": launch,
    }
    peer = np.full(n, -1, dtype=np.int32)
    direction = np.zeros(n, dtype=np.int8)
    seq = np.full(n, -1, dtype=np.int64)
    group = np.full(n, -1, dtype=np.int32)

    # comm kernels name themselves in the first characters (``ncclDevKernel_*``, ``void
    # ncclKernel_*``); searching only there keeps long templated kernel names cheap
    is_kernel = (gcodes == K_KERNEL).tolist()
    is_comm = np.fromiter(
        (
            k and ("ccl" in s[:48] or "CCL" in s[:48]) and _RE_COMM_KERNEL.search(s, 0, 48) is not None
            for k, s in zip(is_kernel, gname, strict=True)
        ),
        dtype=bool,
        count=n,
    )
    comm_idx = np.flatnonzero(is_comm)
    unclassified = 0
    if len(comm_idx):
        infos, unclassified = _classify_comm_kernels(comm_idx, gargs, gname, launch, launch_tid, host, ctx)
        for j, info in zip(comm_idx.tolist(), infos, strict=True):
            kind[j] = Kind.P2P if info.comm == C_P2P else Kind.COLLECTIVE
            peer[j] = info.peer
            direction[j] = info.direction
            seq[j] = info.seq
            group[j] = info.group
            if info.nbytes >= 0:
                nbytes[j] = info.nbytes
    if unclassified:
        ctx.warnings.append(
            f"{unclassified} communication kernel(s) had no launcher evidence (no comm args, no "
            "record_param_comms, no enclosing comm op): classified from the kernel name and the "
            "rank's other comm ops"
        )
    cols.update(peer=peer, direction=direction, seq=seq, group=group)
    cols["phase"] = _launch_phases(launch, launch_tid, host)
    del g, gargs
    extra = {
        "gpu_devices": devices.tolist(),
        "gpu_events": n,
        "kernels": int((gcodes == K_KERNEL).sum()),
        "launch_matched": matched,
        "comm_kernels": len(comm_idx),
        "comm_unclassified": unclassified,
    }
    return Intervals.from_columns(n, cols), device_name, extra


def _launch_phases(launch: I64A, launch_tid: I64A, host: _Host) -> npt.NDArray[np.int8]:
    """Phase of GPU work from what launched it: BWD inside an autograd backward op, OPTIM inside an
    ``Optimizer.*`` range of the same thread (the optimizer wins: it can run autograd ops too)."""
    phase = np.zeros(len(launch), dtype=np.int8)
    if host.bwd is not None:
        _mark_inside(phase, launch, launch_tid, *host.bwd, Phase.BWD)
    opt = [i for i, inf in enumerate(host.info) if inf.cls == N_OPTIM]
    if not opt:
        return phase
    o_start = np.array([host.start[i] for i in opt], dtype=np.int64)
    o_end = np.array([host.end[i] for i in opt], dtype=np.int64)
    o_tid = np.array([host.tid[i] for i in opt], dtype=np.int64)
    _mark_inside(phase, launch, launch_tid, o_start, o_end, o_tid, Phase.OPTIM)
    return phase


def _mark_inside(
    phase: npt.NDArray[np.int8],
    launch: I64A,
    launch_tid: I64A,
    o_start: I64A,
    o_end: I64A,
    o_tid: I64A,
    value: int,
) -> None:
    """Set ``phase`` to ``value`` for launches inside one of the ranges on the same thread."""
    for t in np.unique(o_tid):
        m = o_tid == t
        s, e = o_start[m], o_end[m]
        order = np.argsort(s)
        s, e = s[order], np.maximum.accumulate(e[order])
        q = (launch_tid == t) & (launch >= 0)
        qi = np.flatnonzero(q)
        k = np.searchsorted(s, launch[qi], side="right") - 1
        inside = (k >= 0) & (e[np.maximum(k, 0)] >= launch[qi])
        phase[qi[inside]] = value


def _parents(starts: I64A, ends: I64A) -> npt.NDArray[np.int64]:
    """Parent index of each range (sorted by start, longer first) in its nesting, -1 for roots."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    s_list, e_list = starts.tolist(), ends.tolist()
    for i in range(len(s_list)):
        while stack and e_list[stack[-1]] < s_list[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def _classify_comm_kernels(
    comm_idx: npt.NDArray[np.intp],
    gargs: list[Any],
    gname: list[str],
    launch: I64A,
    launch_tid: I64A,
    host: _Host,
    ctx: _Ctx,
) -> tuple[list[_CommInfo], int]:
    """Classify NCCL-style kernels P2P / collective by what launched them."""
    rank_has_a2a = any(c.alltoall for c in host.comm)
    # record_param_comms ops that carry comm metadata, by External id
    rpc_ext = {
        x: c
        for nm, c, x in zip(host.name, host.comm, host.ext, strict=True)
        if nm == "record_param_comms" and c.comm != C_NONE and x >= 0
    }

    infos: list[_CommInfo] = []
    pending: list[int] = []  # positions in comm_idx still unresolved
    for pos_, j in enumerate(comm_idx.tolist()):
        a = gargs[j]
        info = _args_comm(a, ctx) if (isinstance(a.coll, str) and a.coll) else _CommInfo()
        if info.comm == C_NONE:
            ext = _as_int(a.ext)
            if ext < 0:
                ext = _as_int(a.ext_lc)
            other = rpc_ext.get(ext) if ext >= 0 else None
            if other is not None and other.comm != C_NONE:
                info = _CommInfo(**other.__dict__)
        if info.comm == C_NONE or info.comm == C_COALESCED:
            pending.append(pos_)
        infos.append(info)

    if pending:
        _enclosing_comm(comm_idx, pending, infos, launch, launch_tid, host, ctx)

    # coalesced groups: the point-to-point ops issued since the previous comm launch on that thread
    coalesced = [pos_ for pos_, info in enumerate(infos) if info.comm == C_COALESCED]
    if coalesced:
        _resolve_coalesced(
            [infos[k] for k in coalesced], comm_idx[coalesced], comm_idx, launch, launch_tid, host
        )

    # no evidence at all: the kernel name and the rank's other comm ops decide
    unclassified = 0
    by_name: dict[str, list[int]] = {}
    for pos_, info in enumerate(infos):
        if info.comm not in (C_NONE, C_COALESCED):
            base_name = gname[int(comm_idx[pos_])].split("(")[0]
            by_name.setdefault(base_name, []).append(info.comm)
    for pos_, info in enumerate(infos):
        if info.comm not in (C_NONE, C_COALESCED):
            if info.peer < 0 and info.peer_grp >= 0:
                info.peer = ctx.to_global(info.peer_grp, info.group, info.my_grp)
            continue
        unclassified += 1
        nm = gname[int(comm_idx[pos_])]
        base_name = nm.split("(")[0]
        if _RE_KERNEL_SENDRECV.search(base_name):
            info.comm = C_COLL if rank_has_a2a else C_P2P
        elif _RE_KERNEL_COLL.search(base_name):
            info.comm = C_COLL
        else:
            seen = by_name.get(base_name, [])
            info.comm = C_P2P if seen and seen.count(C_P2P) > len(seen) / 2 else C_COLL
    return infos, unclassified


def _enclosing_comm(
    comm_idx: npt.NDArray[np.intp],
    pending: list[int],
    infos: list[_CommInfo],
    launch: I64A,
    launch_tid: I64A,
    host: _Host,
    ctx: _Ctx,
) -> None:
    """Fill ``infos[pending]`` from the innermost comm host ops enclosing each kernel's launch.

    Containment is vectorized per host thread: ops sorted by start with parent pointers; each
    launch finds the last op starting before it and climbs to the first ancestor that contains it,
    then facts are merged innermost-first along the ancestor chain.
    """
    ops = [i for i, inf in enumerate(host.info) if inf.cls in (N_COMM, N_PP_COMM)]
    if not ops:
        return
    o_start = np.array([host.start[i] for i in ops], dtype=np.int64)
    o_end = np.array([host.end[i] for i in ops], dtype=np.int64)
    o_tid = np.array([host.tid[i] for i in ops], dtype=np.int64)
    pend = np.array(pending, dtype=np.int64)
    k_launch = launch[comm_idx[pend]]
    k_tid = launch_tid[comm_idx[pend]]
    for t in np.unique(k_tid[k_launch >= 0]):
        sel_ops = np.flatnonzero(o_tid == t)
        if not len(sel_ops):
            continue
        order = sel_ops[np.lexsort((-o_end[sel_ops], o_start[sel_ops]))]
        s, e = o_start[order], o_end[order]
        parent = _parents(s, e)
        kq = np.flatnonzero((k_tid == t) & (k_launch >= 0))
        q = k_launch[kq]
        cur = np.searchsorted(s, q, side="right") - 1
        for _ in range(256):
            bad = (cur >= 0) & (e[np.maximum(cur, 0)] < q)
            if not bad.any():
                break
            cur[bad] = parent[cur[bad]]
        # merge facts innermost-first along the chain (chains are short: a few nested comm ops)
        for qi, c0 in zip(kq.tolist(), cur.tolist(), strict=True):
            info = infos[int(pend[qi])]
            c = c0
            depth = 0
            while c >= 0 and depth < 64:
                _merge(info, host.comm[ops[int(order[c])]])
                c = int(parent[c])
                depth += 1


def _merge(info: _CommInfo, other: _CommInfo) -> None:
    """Fill unknown fields of ``info`` from an enclosing op's facts."""
    if info.comm in (C_NONE, C_COALESCED) and other.comm != C_NONE:
        if not (info.comm == C_COALESCED and other.comm == C_COLL):
            info.comm = other.comm
        info.alltoall = info.alltoall or other.alltoall
    if not info.direction and other.direction:
        info.direction = other.direction
    if info.peer < 0 and other.peer >= 0:
        info.peer = other.peer
    if info.peer_grp < 0 and other.peer_grp >= 0:
        info.peer_grp = other.peer_grp
        info.my_grp = other.my_grp
    if info.nbytes < 0 and other.nbytes >= 0:
        info.nbytes = other.nbytes
    if info.seq < 0 and other.seq >= 0:
        info.seq = other.seq
    if info.group < 0 and other.group >= 0:
        info.group = other.group


def _resolve_coalesced(
    infos: list[_CommInfo],
    rows: npt.NDArray[np.intp],
    comm_idx: npt.NDArray[np.intp],
    launch: I64A,
    launch_tid: I64A,
    host: _Host,
) -> None:
    """A coalesced launch carries the p2p ops its thread issued since its previous comm launch:
    P2P with their direction (BOTH when sends and receives) and peer (when they agree), else a
    collective. Windows are found with searchsorted on per-thread sorted arrays."""
    p2p = [i for i, inf in enumerate(host.info) if inf.cls == N_COMM and host.comm[i].comm == C_P2P]
    p_tid = np.array([host.tid[i] for i in p2p], dtype=np.int64)
    p_start = np.array([host.start[i] for i in p2p], dtype=np.int64)
    p_dir = np.array([host.comm[i].direction for i in p2p], dtype=np.int64)
    p_peer = np.array([host.comm[i].peer for i in p2p], dtype=np.int64)
    order = np.lexsort((p_start, p_tid))
    p_tid, p_start, p_dir, p_peer = p_tid[order], p_start[order], p_dir[order], p_peer[order]
    c_l, c_t = launch[comm_idx], launch_tid[comm_idx]
    c_order = np.lexsort((c_l, c_t))
    c_l, c_t = c_l[c_order], c_t[c_order]
    for info, j in zip(infos, rows.tolist(), strict=True):
        t, q = int(launch_tid[j]), int(launch[j])
        if q < 0:
            info.comm = C_NONE
            continue
        # previous comm launch on this thread
        lo_t, hi_t = np.searchsorted(c_t, t, "left"), np.searchsorted(c_t, t, "right")
        k = int(np.searchsorted(c_l[lo_t:hi_t], q, "left"))
        lo = int(c_l[lo_t + k - 1]) if k > 0 else -(1 << 62)
        a_t, b_t = np.searchsorted(p_tid, t, "left"), np.searchsorted(p_tid, t, "right")
        seg = slice(
            int(a_t + np.searchsorted(p_start[a_t:b_t], lo, "right")),
            int(a_t + np.searchsorted(p_start[a_t:b_t], q, "right")),
        )
        dirs = set(p_dir[seg].tolist()) - {int(Direction.NONE)}
        peers = set(p_peer[seg].tolist())
        if seg.stop <= seg.start:
            info.comm = C_COLL
            continue
        info.comm = C_P2P
        info.direction = int(Direction.BOTH) if len(dirs) > 1 else (dirs.pop() if dirs else 0)
        info.peer = peers.pop() if len(peers) == 1 else -1


# ----------------------------------------------------------------------------------------------
# CPU mode
# ----------------------------------------------------------------------------------------------


def _cpu_mode(
    evs: list[Any],
    cpu_idx: npt.NDArray[np.intp],
    host: _Host,
    memo: _NameMemo,
    base: int,
    ctx: _Ctx,
    names: NameTable,
) -> tuple[Intervals, dict[str, Any]]:
    ops = [evs[i] for i in cpu_idx.tolist()]
    o_tid = _tids(_col(ops, "tid"))
    o_start = us_to_ns(_f64(_col(ops, "ts")), base)
    o_end = o_start + np.maximum(us_to_ns(_f64(_col(ops, "dur")), 0), 0)

    # main thread: the one with ProfilerStep# ranges, else the most CPU-op time
    step_tids = [host.tid[i] for i, inf in enumerate(host.info) if inf.cls == N_STEP]
    if step_tids:
        vals, cnt = np.unique(np.array(step_tids, dtype=np.int64), return_counts=True)
        main = int(vals[cnt.argmax()])
    else:
        vals, inv = np.unique(o_tid, return_inverse=True)
        main = int(vals[np.bincount(inv, weights=(o_end - o_start).astype(np.float64)).argmax()])

    on_main = np.flatnonzero(o_tid == main)
    m_ops = [ops[i] for i in on_main.tolist()]
    del ops
    infos = [memo[e.name] for e in m_ops]
    # Annotations recorded as CPU ops by old profilers are not work: they are not parents either.
    is_annot = np.fromiter(
        (i.cls in (N_STEP, N_LABEL, N_PP_COMM, N_PP_OTHER, N_OPTIM, N_DATA, N_MODULE) for i in infos),
        dtype=bool,
        count=len(infos),
    )
    sel = np.flatnonzero(~is_annot)
    s, e = o_start[on_main][sel], o_end[on_main][sel]
    order = np.lexsort((-e, s))
    sel, s, e = sel[order], s[order], e[order]
    prev_max = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(e)[:-1])) if len(e) else e
    top = s >= prev_max
    t_sel, t_s, t_e = sel[top], s[top], e[top]
    t_ops = [m_ops[i] for i in t_sel.tolist()]
    t_info = [infos[i] for i in t_sel.tolist()]
    n_top = len(t_ops)

    kind = np.zeros(n_top, dtype=np.int8)
    phase = np.zeros(n_top, dtype=np.int8)
    peer = np.full(n_top, -1, dtype=np.int32)
    direction = np.zeros(n_top, dtype=np.int8)
    nbytes = np.full(n_top, -1, dtype=np.int64)
    name_id = np.fromiter(
        (names.id(o.name if isinstance(o.name, str) else str(o.name)) for o in t_ops),
        dtype=np.int32,
        count=n_top,
    )
    comm_pos: list[int] = []
    comm_info: list[_CommInfo] = []
    op_args = iter(_decode_args([o.args for o, inf in zip(t_ops, t_info, strict=True) if inf.cls == N_COMM]))
    for k, inf in enumerate(t_info):
        if inf.cls == N_BWD_OP:
            phase[k] = Phase.BWD
        elif inf.cls == N_COMM:
            # the issuing op of a c10d call is communication, not compute
            c = _host_comm(inf, next(op_args), ctx)
            kind[k] = Kind.P2P if c.comm == C_P2P else Kind.COLLECTIVE
            peer[k], direction[k], nbytes[k] = c.peer, c.direction, c.nbytes
            comm_pos.append(k)
            comm_info.append(c)
    # optimizer: ops starting inside an Optimizer.* range on the main thread
    opt = [
        (host.start[i], host.end[i])
        for i, inf in enumerate(host.info)
        if inf.cls == N_OPTIM and host.tid[i] == main
    ]
    if opt:
        os_ = np.array(sorted(opt), dtype=np.int64)
        oe = np.maximum.accumulate(os_[:, 1])
        ki = np.searchsorted(os_[:, 0], t_s, side="right") - 1
        inside = (ki >= 0) & (oe[np.maximum(ki, 0)] >= t_s)
        phase[inside & (kind == Kind.COMPUTE)] = Phase.OPTIM
    del m_ops, t_ops

    cols: dict[str, Any] = {
        "start": t_s,
        "end": t_e,
        "stream": np.full(n_top, main, dtype=np.int64),
        "kind": kind,
        "name": name_id,
        "phase": phase,
        "peer": peer,
        "direction": direction,
        "bytes": nbytes,
        "launch": t_s,
    }
    parts = [Intervals.from_columns(n_top, cols)]
    blocked = _gloo_tails(t_s, t_e, host, main, names, comm_pos, comm_info)
    if blocked is not None:
        parts.append(blocked)
    extra = {
        "main_tid": main,
        "cpu_ops": len(cpu_idx),
        "top_level_ops": n_top,
        "blocked_pieces": len(blocked) if blocked is not None else 0,
    }
    return Intervals.concat(parts), extra


def _gloo_tails(
    t_s: I64A,
    t_e: I64A,
    host: _Host,
    main: int,
    names: NameTable,
    comm_pos: list[int],
    comm_info: list[_CommInfo],
) -> Intervals | None:
    """Blocked communication on the main thread: the tail of each ``gloo:*`` span after the last
    top-level op that started before the span's end; overlapping tails are split so that each
    piece belongs to the covering span that ends first (the work being waited on)."""
    spans = [
        i
        for i, inf in enumerate(host.info)
        if inf.cls == N_COMM and host.tid[i] == main and host.name[i].startswith("gloo:")
    ]
    if not spans:
        return None
    sp_s = np.array([host.start[i] for i in spans], dtype=np.int64)
    sp_e = np.array([host.end[i] for i in spans], dtype=np.int64)
    cummax = np.maximum.accumulate(t_e) if len(t_e) else t_e
    k = np.searchsorted(t_s, sp_e, side="left") - 1
    last_end = np.where(k >= 0, cummax[np.maximum(k, 0)] if len(cummax) else 0, np.iinfo(np.int64).min)
    tail_s = np.maximum(last_end, sp_s)
    has = tail_s < sp_e
    if not has.any():
        return None
    idx = np.flatnonzero(has)
    ts_, te_ = tail_s[idx], sp_e[idx]
    # elementary segments; paint them in order of span end, first painter wins
    bounds = np.unique(np.concatenate((ts_, te_)))
    owner = np.full(max(len(bounds) - 1, 0), -1, dtype=np.int64)
    a = np.searchsorted(bounds, ts_)
    b = np.searchsorted(bounds, te_)
    for j in np.argsort(te_, kind="stable").tolist():
        seg = owner[a[j] : b[j]]
        seg[seg < 0] = j
    seg_idx = np.flatnonzero(owner >= 0)
    if not len(seg_idx):
        return None
    own = owner[seg_idx]
    # merge adjacent segments of the same owner into one piece
    brk = np.flatnonzero((np.diff(seg_idx) != 1) | (np.diff(own) != 0)) + 1
    first = np.concatenate(([0], brk))
    last = np.concatenate((brk - 1, [len(seg_idx) - 1]))
    p_start = bounds[seg_idx[first]]
    p_end = bounds[seg_idx[last] + 1]
    p_span = idx[own[first]]  # index into `spans`
    n = len(p_start)

    # the issuing c10d op: the top-level comm op containing the span start
    c_s = t_s[comm_pos] if comm_pos else np.zeros(0, dtype=np.int64)
    c_e = t_e[comm_pos] if comm_pos else np.zeros(0, dtype=np.int64)
    kind = np.zeros(n, dtype=np.int8)
    peer = np.full(n, -1, dtype=np.int32)
    direction = np.zeros(n, dtype=np.int8)
    nbytes = np.full(n, -1, dtype=np.int64)
    name_id = np.zeros(n, dtype=np.int32)
    for r in range(n):
        hi = spans[int(p_span[r])]
        hc = host.comm[hi]
        kind[r] = Kind.P2P if hc.comm == C_P2P else Kind.COLLECTIVE
        name_id[r] = names.id(host.name[hi])
        direction[r] = hc.direction
        nbytes[r] = hc.nbytes
        pr = hc.peer
        if len(c_s):
            ci = int(np.searchsorted(c_s, host.start[hi], side="right")) - 1
            if ci >= 0 and c_e[ci] >= host.start[hi]:
                issuer = comm_info[ci]
                if pr < 0:
                    pr = issuer.peer
                if not direction[r]:
                    direction[r] = issuer.direction
                if nbytes[r] < 0:
                    nbytes[r] = issuer.nbytes
        peer[r] = pr
    cols: dict[str, Any] = {
        "start": p_start,
        "end": p_end,
        "stream": np.full(n, main, dtype=np.int64),
        "kind": kind,
        "name": name_id,
        "peer": peer,
        "direction": direction,
        "bytes": nbytes,
    }
    return Intervals.from_columns(n, cols)


def parse_file(path: str | Path, options: ParseOptions | None = None) -> RankTimeline:
    """Convenience: parse one Kineto file into its rank."""
    return PARSER.parse(Path(path), options or ParseOptions())[0]


PARSER = KinetoParser()
register(PARSER)

__all__ = [
    "PARSER",
    "KinetoParser",
    "classify_name",
    "decode_trace",
    "dtype_size",
    "gunzip",
    "looks_like_kineto",
    "parse_file",
    "parse_rank_list",
    "rank_from_filename",
    "read_bytes",
    "trace_decoder",
    "us_to_ns",
]
