"""Slices of a Kineto trace cut in its text: the event array parsed once, not twice.

The skeleton path of :mod:`ppdiag.parsers.kineto_slices` decodes the whole document with its events
as :class:`msgspec.Raw` views to know where each event lies, then decodes the events again slice by
slice: the text is parsed twice. Here the slices are cut in the text itself, at element
boundaries (``}``, a comma, ``{``, white space allowed) every ``SLICE`` typical events' worth of
bytes, and the document around the array is decoded on its own; the array is parsed once.

A cut is a guess (those bytes may sit inside an event's args, or after the array), which the
decode proves: the slices tile the array's text, each one must decode as a JSON array, and the
document with an empty array in place of the events must decode with that very array as its
``traceEvents``. Then the document is the array's elements in that order, exactly what the
skeleton path reads. Anything else (a cut inside an event, damaged JSON, a second
``traceEvents`` key) returns None and the caller takes the skeleton path, whose result is the
same; the events handed to the instant-event hooks are held until every slice has decoded, so
that a fallback never shows them twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from ppdiag.parsers import kineto_slices
from ppdiag.parsers.kineto_slices import (
    Sliced,
    SliceDecoders,
    decode_slice,
    has_gpu_category,
    keep_all,
    run_instant_hooks,
)
from ppdiag.parsers.kineto_table import EventsBuilder, Select

# bytes of a typical event (Kineto writes ~150-400): a slice spans SLICE of them, ~1 MB
EVENT_BYTES = 256

_EVENTS_OPEN = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_TAIL_OPEN = b'{"traceEvents":['


class _Top(msgspec.Struct, gc=False):
    """The document's fields other than the events (whose raw text proves where they are)."""

    traceEvents: msgspec.Raw = msgspec.Raw()
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None


class _Tail(msgspec.Struct, gc=False):
    traceEvents: msgspec.Raw = msgspec.Raw()


_TOP = msgspec.json.Decoder(_Top)
_TAIL = msgspec.json.Decoder(_Tail)


def _addr(buf: Any) -> int:
    """Address of the first byte of a buffer (a Raw view, bytes, a memoryview)."""
    return int(np.frombuffer(buf, np.uint8).ctypes.data)


@dataclass(frozen=True)
class _Plan:
    """Where the slices lie: ``(s, e)``, the text ``data[s:e]`` holds whole events, with a comma
    or white space (or the array's own ``[`` and ``]``) at ``s - 1`` and at ``e``."""

    windows: list[tuple[int, int]]
    top: _Top


def _array_end(data: bytes | bytearray, start: int, step: int) -> int | None:
    """Offset of the ``]`` that closes the array whose first element may start at ``start``: the
    text from an element boundary near the end is read as ``{"traceEvents":[`` + that text, whose
    array ends where the document's does (looked for further back when that fails)."""
    back = step
    view = memoryview(data)
    while True:
        lo = max(start, len(data) - back)
        s = start
        if lo > start:
            m = _BOUNDARY.search(data, lo)
            if m is None:
                back *= 4
                continue
            s = m.end() - 1
        blob = b"".join((_TAIL_OPEN, view[s:]))
        try:
            raw = _TAIL.decode(blob).traceEvents
        except msgspec.DecodeError:
            if lo == start:
                return None
            back *= 4
            continue
        if len(raw) < 2 or _addr(raw) - _addr(blob) != len(_TAIL_OPEN) - 1:
            return None  # a later "traceEvents" key, not this array's text
        end = s + len(raw) - 2
        return end if data[end] == 0x5D else None


def plan(data: bytes | bytearray, step: int) -> _Plan | None:
    """The slices of ``data``'s event array, about ``step`` bytes each, and the document's other
    fields; None when the text does not allow it (then the skeleton path decides)."""
    m = _EVENTS_OPEN.search(data)
    if m is None:
        return None
    start = m.end()
    end = _array_end(data, start, step)
    if end is None:
        return None
    view = memoryview(data)
    outside = b"".join((view[:start], b"]", view[end + 1 :]))
    try:
        top = _TOP.decode(outside)
    except msgspec.DecodeError:
        return None
    # the document's own events (the last traceEvents key) are the array at ``start``
    if len(top.traceEvents) != 2 or _addr(top.traceEvents) - _addr(outside) != start - 1:
        return None
    top.traceEvents = msgspec.Raw()
    windows = []
    s = start
    while s + step < end:
        m = _BOUNDARY.search(data, s + step, end)
        if m is None:
            break
        windows.append((s, m.start() + 1))
        s = m.end() - 1
    windows.append((s, end))
    return _Plan(windows, top)


def _pass(
    data: bytes | bytearray,
    p: _Plan,
    decoders: SliceDecoders,
    select: Select,
    builder: EventsBuilder,
    on_events: Callable[[list[Any]], None] | None,
) -> tuple[int, int, int]:
    """(events, dropped rows that count as used, usable GPU events) of every slice of ``p``
    decoded into ``builder``: in place in gunzipped text (the bytes before and after a slice are
    set to ``[`` and ``]`` while it is decoded, then put back), else copied out."""
    total = dropped_used = n_gpu = 0
    in_place = isinstance(data, bytearray)
    for i, (s, e) in enumerate(p.windows):
        if in_place:
            assert isinstance(data, bytearray)
            saved = data[s - 1], data[e]
            data[s - 1], data[e] = 0x5B, 0x5D  # [ and ]
            blob: bytes | memoryview = memoryview(data)[s - 1 : e + 1]
        else:
            blob = b"".join((b"[", memoryview(data)[s:e], b"]"))
        try:
            n, d, g = decode_slice(blob, decoders, select, builder, on_events)
        finally:
            if in_place:
                assert isinstance(data, bytearray)
                data[s - 1], data[e] = saved
        del blob
        if not i and n:
            # room for the events the first slice's density predicts (the builder grows past it)
            whole = p.windows[-1][1] - p.windows[0][0]
            builder.reserve(int(whole * n / max(e - s, 1) * 1.1) + 1)
        total, dropped_used, n_gpu = total + n, dropped_used + d, n_gpu + g
    return total, dropped_used, n_gpu


def decode_cut(
    data: bytes | bytearray,
    decoders: SliceDecoders,
    make_select: Callable[[Any], Select],
    new_builder: Callable[[], EventsBuilder],
) -> Sliced | None:
    """:func:`ppdiag.parsers.kineto_slices.decode_sliced`'s result from slices cut in the text
    (the same filter, the same second keep-all pass of a trace that spells a GPU category without
    a usable GPU event); None when the cuts are not proven (see the module docstring)."""
    p = plan(data, kineto_slices.SLICE * EVENT_BYTES)
    if p is None:
        return None
    held: list[list[Any]] = []
    on_events = None
    if kineto_slices._INSTANT_HOOKS:
        on_events = lambda evs: held.append([e for e in evs if e.ph in ("i", "I")])  # noqa: E731
    gpu = has_gpu_category(data)
    try:
        builder = new_builder()
        select = make_select(p.top) if gpu else keep_all
        total, dropped_used, n_gpu = _pass(data, p, decoders, select, builder, on_events)
        if gpu and not n_gpu:
            builder = new_builder()
            total, dropped_used, _ = _pass(data, p, decoders, keep_all, builder, None)
    except msgspec.DecodeError:
        return None
    if not total:
        return None
    for evs in held:
        run_instant_hooks(evs)
    t = p.top
    top = kineto_slices._Skeleton(
        distributedInfo=t.distributedInfo,
        deviceProperties=t.deviceProperties,
        baseTimeNanoseconds=t.baseTimeNanoseconds,
        host_name=t.host_name,
    )
    return Sliced(builder.finish(), total, dropped_used, top)
