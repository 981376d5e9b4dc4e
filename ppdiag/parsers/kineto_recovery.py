"""Damaged Kineto JSON: keep every complete event before a cut, drop malformed elements, read
non-JSON numbers and invalid UTF-8 leniently; every loss is counted in a warning."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ppdiag.errors import InputError
from ppdiag.parsers.kineto_schema import _LENIENT, _STRICT, TraceTypes
from ppdiag.parsers.kineto_table import Events

Data = bytes | bytearray  # a trace's JSON text (gunzip fills a bytearray)

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
    events: Events | None = None  # the events' columns (sliced decoding builds them as it goes)
    dropped_items: int = 0  # items of traceEvents that were not JSON objects


def _error_pos(exc: msgspec.DecodeError, size: int) -> tuple[int, bool]:
    """(byte position, truncated) of a decode error."""
    msg = str(exc)
    if "truncated" in msg:
        return size, True
    m = _ERR_BYTE.search(msg)
    return (int(m.group(1)) if m else size), False


def _events_start(data: Data) -> int:
    """Offset just after the ``[`` that opens traceEvents, or -1."""
    key = data.find(b'"traceEvents"')
    if key < 0:
        return -1
    m = re.compile(rb'"traceEvents"\s*:\s*\[').match(data, key)
    return m.end() if m else -1


def _last_complete_element(data: Data, start: int, pos: int, types: TraceTypes) -> int:
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


def _close_after_events(data: Data, start: int, pos: int, types: TraceTypes) -> Any:
    """When the cut fell after traceEvents had closed (in trailing keys such as an on-demand
    ``distributedInfo``), the trace with every event, else None."""
    lo = max(start, pos - (1 << 16))
    for m in list(_ARRAY_CLOSED.finditer(data, lo, pos))[::-1][:3]:
        try:
            return types.decoder.decode(data[: m.end()] + b"}")
        except msgspec.DecodeError:
            continue
    return None


def _without_trailing(
    doc: Data, pos: int, types: TraceTypes, path: str, err: msgspec.DecodeError, rec: _Recovered
) -> _Recovered:
    """Junk after the top-level object (a second write, NUL padding) is ignored, and said."""
    end = doc.rfind(b"}", 0, pos) + 1
    try:
        trace = types.decoder.decode(doc[:end])
    except msgspec.DecodeError:
        raise InputError(path, f"not a PyTorch Profiler trace (invalid JSON: {err})") from None
    rec.warnings.append(f"ignored {len(doc) - end} bytes after the end of the JSON document")
    rec.trace, rec.kept_events = trace, len(trace.traceEvents or [])
    return rec


def _decode_damaged(data: Data, path: str, types: TraceTypes, first_error: msgspec.DecodeError) -> _Recovered:
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
            return _without_trailing(doc, pos, types, path, err, _Recovered(None, 0, lost_events, warnings))
        if not fixed_numbers and _NON_JSON_NUMBER.match(doc, pos):
            fixed_numbers, types = True, _LENIENT
            doc, got = _null_non_json_numbers(doc)
            if isinstance(got, msgspec.DecodeError):
                err = got
                continue
            warnings.append("non-JSON numbers (NaN / Infinity) read as unknown values")
            return _Recovered(got, _n_events(got), lost_events, warnings)
        if pos < start:
            raise InputError(path, f"not a PyTorch Profiler trace (invalid JSON: {err})")
        if truncated:
            closed = _close_after_events(doc, start, pos, types)
            if closed is not None:
                warnings.append(
                    "truncated after the event list: all events kept, some trailing metadata lost"
                )
                return _Recovered(closed, _n_events(closed), lost_events, warnings)
        p = _last_complete_element(doc, start, pos, types)
        if p < 0:
            # Nothing complete before the damage: maybe the event array itself had closed and the
            # damage is in trailing metadata.
            raise InputError(path, f"no complete trace event before the damage at byte {pos} ({err})")
        step = _drop_element(doc, p, pos, types) if not truncated and repairs < _MAX_REPAIRS else None
        if step is not None:
            doc, trace, n_bytes, n_events = step
            lost_bytes += n_bytes
            lost_events += n_events
            repairs += 1
            if isinstance(trace, msgspec.DecodeError):
                err = trace
                continue
            warnings.append(f"malformed JSON: dropped {lost_events} damaged event(s) ({lost_bytes} bytes)")
            return _Recovered(trace, _n_events(trace), lost_events, warnings)
        # Cut here: close the event array and the top-level object.
        got = _close_at_cut(doc, start, p, types, path)
        if isinstance(got, msgspec.DecodeError):  # damage further up: repeat from there
            err = got
            doc = doc[: p + 1]
            continue
        trace, kept, lost_here, dropped = got
        what = "truncated" if truncated else f"malformed at byte {pos}"
        warnings.append(
            f"{what}: kept {kept} complete events; dropped {dropped} bytes after the last complete "
            f"event (≈{lost_here} event(s)); anything after the cut is missing"
        )
        return _Recovered(trace, kept, lost_events + lost_here, warnings)


def _n_events(trace: Any) -> int:
    """The number of events a decoded trace holds (none when its list is null)."""
    return len(trace.traceEvents or [])


def _drop_element(doc: Data, p: int, pos: int, types: TraceTypes) -> tuple[Data, Any, int, int] | None:
    """Drop the malformed element between the last complete one (ending at ``p``) and the next
    element after the damage at ``pos``: the repaired document, its decode (or the error that
    remains), the bytes and (about) the events dropped. None when no element follows."""
    m = _NEXT_ELEMENT.search(doc, pos)
    if m is None:
        return None
    nxt = m.start(1)
    skipped = doc[p + 1 : nxt]
    fixed = doc[: p + 1] + b",\n" + doc[nxt:]
    try:
        got: Any = types.decoder.decode(fixed)
    except msgspec.DecodeError as exc:
        got = exc
    return fixed, got, len(skipped), max(1, skipped.count(b'"ph"'))


def _null_non_json_numbers(doc: Data) -> tuple[bytes, Any]:
    """NaN / Infinity, which some writers emit, are not JSON: the document with them read as null,
    and its lenient decode (or the error that remains)."""
    fixed = _NON_JSON_NUMBER_ANY.sub(b"null", doc)
    try:
        return fixed, _LENIENT.decoder.decode(fixed)
    except msgspec.DecodeError as exc:
        return fixed, exc


def _close_at_cut(
    doc: Data, start: int, p: int, types: TraceTypes, path: str
) -> tuple[Any, int, int, int] | msgspec.DecodeError:
    """The trace cut after the element that ends at ``p``: (trace, kept events, events lost
    (estimated from the mean event size), bytes dropped); the decode error when the damage lies
    further up."""
    tail = doc[p + 1 :]
    try:
        trace = types.decoder.decode(doc[: p + 1] + b"]}")
    except msgspec.DecodeError as exc:
        npos, _ = _error_pos(exc, p + 3)
        if npos <= p:
            return exc
        raise InputError(path, f"cannot recover the damaged trace ({exc})") from None
    kept = len(trace.traceEvents or [])
    dropped = len(tail.strip(b" \t\r\n,"))
    avg = max(1.0, (p + 1 - start) / max(1, kept))
    lost_here = math.ceil(dropped / avg) if dropped else 0
    return trace, kept, lost_here, dropped


def decode_trace(data: Data | bytearray, path: str) -> _Recovered:
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


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])


def _objects_only(data: Data) -> tuple[bytes, int] | None:
    """The document with only the JSON objects of ``traceEvents`` kept, and how many items were
    dropped; None when that is not what failed (no list of events, or nothing to drop)."""
    try:
        top = _TOP.decode(data)
        raw = top.get("traceEvents")
        items = _ITEMS.decode(raw) if raw is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not items:
        return None
    kept = [bytes(r) for r in items if bytes(r)[:1] == b"{"]
    if not kept or len(kept) == len(items):  # no event at all is no trace; none dropped is no help
        return None
    top["traceEvents"] = msgspec.Raw(b"[" + b",".join(kept) + b"]")
    return msgspec.json.encode(top), len(items) - len(kept)


def _invalid_utf8(data: Data) -> int:
    """Number of invalid UTF-8 sequences in ``data`` (0 when it is valid UTF-8)."""
    try:
        data.decode("utf-8")
        return 0
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace").count("\ufffd") - data.count("\ufffd".encode())


def _decode_typed(data: Data, path: str) -> _Recovered:
    types = _STRICT
    for attempt in range(2):
        try:
            trace = types.decoder.decode(data)
            return _Recovered(trace, len(trace.traceEvents or []), 0)
        except msgspec.ValidationError as exc:
            if attempt == 0:
                types = _LENIENT
                continue
            kept = _objects_only(data)
            if kept is not None:
                rec = _decode_typed(kept[0], path)
                rec.warnings.append(
                    f"dropped {kept[1]} item(s) of traceEvents that are not JSON objects (text, numbers, "
                    "lists or null mixed in among the events)"
                )
                rec.dropped_items += kept[1]
                return rec
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
