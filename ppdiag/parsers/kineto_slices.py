"""Sliced decoding of a Kineto trace: the event array is decoded a slice at a time, and the host
events that no later step reads are dropped before the next slice is materialised.

The document is first decoded with its events as :class:`msgspec.Raw` (a view of the bytes, no
objects per field); then each slice of ``SLICE`` events is decoded into the typed event Structs of
:mod:`ppdiag.parsers.kineto`, filtered, turned into columns (:mod:`ppdiag.parsers.kineto_table`)
and freed with its text. What is dropped is exactly what a GPU
trace's parse never reads: CPU ops and Python functions whose name means nothing to ppdiag (not a
step, label, comm or optimizer range, not an autograd backward op), with usable times. Events that
are dropped are only counted (they take part in the counts of the time checks). Flow, metadata
and instant events are not host ranges and are dropped too; the hook where instant events are
classified is :func:`instant_event_hook` (the whole-document path calls the same hooks).

CPU-mode traces (no GPU event) are decoded the same way, keeping every row; a slice that breaks
the usual typing is decoded with the lenient types. Damaged JSON (or invalid UTF-8) returns None
and the caller decodes the whole document (:mod:`ppdiag.parsers.kineto_recovery`): the result is
the same either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.parsers.kineto_table import Decoded, Events, EventsBuilder, Select

SLICE = 1 << 12  # events per slice: ~1-3 MB of JSON, the extra memory one slice costs

# The GPU categories' spelling in the bytes (compact and spaced writers): a trace without any of
# them is parsed in CPU mode, which reads every CPU op, so nothing is dropped there.
_GPU_CAT = re.compile(rb'"cat"\s*:\s*"(?:kernel|Kernel|gpu_memcpy|Memcpy|gpu_memset|Memset|cuda_sync)"')
# Kineto writes the GPU activities after the host events, up to the end of the event array
_GPU_TAIL = 1 << 16


def has_gpu_category(data: bytes | bytearray) -> bool:
    """Whether the text spells a GPU category anywhere. The last 64 KiB are searched first: a
    GPU trace spells one there (its GPU activities run to the end of the array), where a search
    from the start crossed all the host events first (~8 ms per 56 MB rank); a miss there
    searches the whole text, so the answer is the same."""
    tail = _GPU_CAT.search(data, max(0, len(data) - _GPU_TAIL))
    return tail is not None or _GPU_CAT.search(data) is not None


class _Skeleton(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None


_SKELETON = msgspec.json.Decoder(_Skeleton)
_FREED = msgspec.Raw()  # stands for a raw event already decoded (one shared empty view)


@dataclass
class Sliced:
    """The kept events' columns, the document's other fields, and what was dropped."""

    events: Events
    total: int  # events in the document
    dropped_used: int  # host X events dropped (they count as used events in the time checks)
    top: _Skeleton


InstantHook = Callable[[list[Any]], None]
_INSTANT_HOOKS: list[InstantHook] = []


def instant_event_hook(hook: InstantHook) -> InstantHook:
    """Register ``hook``: it receives the instant (``ph`` ``i``/``I``) events of every slice before
    they are dropped (a later module reads e.g. ``[memory]`` events there)."""
    _INSTANT_HOOKS.append(hook)
    return hook


def run_instant_hooks(evs: list[Any]) -> None:
    """Hand the instant events among ``evs`` to the registered hooks (nothing when none is)."""
    if _INSTANT_HOOKS:
        inst = [e for e in evs if e.ph in ("i", "I")]
        for hook in _INSTANT_HOOKS:
            hook(inst)


def keep_all(
    cols: dict[str, npt.NDArray[Any]], built: EventsBuilder
) -> tuple[npt.NDArray[np.bool_], int, int]:
    """The filter of a CPU-mode parse, which reads every CPU op: every row is kept."""
    return np.ones(len(cols["ph"]), dtype=bool), 0, 0


@dataclass(frozen=True)
class SliceDecoders:
    """The per-slice event decoders: strictly typed, and the lenient one (any JSON type per field)
    a slice falls back to when it breaks the usual typing."""

    strict: msgspec.json.Decoder[Any]
    lenient: msgspec.json.Decoder[Any]
    # tagged on ``ph``: the events of phases no step reads decode as stubs (category and name)
    tagged: msgspec.json.Decoder[Any] | None = None

    def decode(self, blob: bytes | memoryview, stubs: bool = False) -> tuple[list[Any], Decoded]:
        """The events of one slice (a JSON array), and how they were decoded (``stubs``: try
        the tagged decoder first)."""
        if stubs and self.tagged is not None:
            try:
                tagged: list[Any] = self.tagged.decode(blob)
                return tagged, Decoded.STUBBED
            except msgspec.ValidationError:
                pass  # an unknown phase, or a field of the usual events mistyped
        try:
            evs: list[Any] = self.strict.decode(blob)
            return evs, Decoded.STRICT
        except msgspec.ValidationError:
            return self.lenient.decode(blob), Decoded.LENIENT


def decode_sliced(
    data: bytes | bytearray,
    decoders: SliceDecoders,
    make_select: Callable[[Any], Select],
    new_builder: Callable[[], EventsBuilder],
) -> Sliced | None:
    """Decode ``data`` slice by slice into a builder; None when the whole-document path must be
    taken (damaged JSON, invalid UTF-8, no events).

    A trace with GPU events is filtered by ``make_select(top)`` (given the document's other
    fields); one without (a CPU-mode parse, which reads every CPU op) keeps every row. Each
    slice's Structs are turned into columns and freed before the next slice is decoded, so the
    peak is the text, the skeleton and one slice whatever the mode. A trace that spells a GPU
    category but has no usable GPU event is decoded again keeping every row (it is parsed in
    CPU mode or refused, and both read every host op)."""
    try:
        top = _SKELETON.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    raws = top.traceEvents
    if not raws:
        return None
    top.traceEvents = None
    total = len(raws)
    gpu = has_gpu_category(data)
    try:
        builder = new_builder()
        builder.reserve(total)
        # no GPU category: one keep-all pass, which frees the raw views as it goes
        select = make_select(top) if gpu else keep_all
        dropped_used, n_gpu = _slices(data, raws, decoders, select, builder, hooks=True, consume=not gpu)
        if gpu and not n_gpu:
            builder = new_builder()
            builder.reserve(total)
            dropped_used, _ = _slices(data, raws, decoders, keep_all, builder, hooks=False, consume=True)
    except msgspec.DecodeError:
        return None
    del raws  # the skeleton's views go before the columns are joined
    return Sliced(builder.finish(), total, dropped_used, top)


class _Text:
    """The document's text, where each slice's events are decoded in place when they can be: the
    byte before the slice's first event and the one after its last (a comma, white space or the
    array's own bracket, never inside an event) are set to ``[`` and ``]`` while the slice is
    decoded, then put back, so that no slice is copied out of the text. Immutable text (a plain
    ``.json`` read as bytes), or views that do not point into it, take the copy (a join)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data
        self.base = np.frombuffer(data, np.uint8).ctypes.data if isinstance(data, bytearray) and data else -1

    def window(self, raws: list[msgspec.Raw]) -> tuple[int, int] | None:
        """(offset of the first event, offset after the last) of ``raws`` in the text, or None."""
        if self.base < 0 or not raws:
            return None
        first, last = raws[0], raws[-1]
        if not len(first) or not len(last):
            return None
        s = np.frombuffer(first, np.uint8).ctypes.data - self.base
        e = np.frombuffer(last, np.uint8).ctypes.data - self.base + len(last)
        data = self.data
        if not (0 < s < e < len(data)) or data[s] != 0x7B or data[e - 1] != 0x7D:  # { and }
            return None
        return s, e


def _slices(
    data: bytes | bytearray,
    raws: list[msgspec.Raw],
    decoders: SliceDecoders,
    select: Select,
    builder: EventsBuilder,
    *,
    hooks: bool,
    consume: bool,
) -> tuple[int, int]:
    """(dropped rows that count as used, usable GPU events) of the raw events (views into
    ``data``) decoded ``SLICE`` at a time into ``builder``; ``hooks``: hand each slice's instant
    events to the hooks; ``consume``: free each slice's raw views once decoded (no second pass
    will read them)."""
    dropped_used = n_gpu = 0
    text = _Text(data)
    for lo in range(0, len(raws), SLICE):
        part = raws[lo : lo + SLICE]
        win = text.window(part)
        if win is None:
            blob: bytes | memoryview = b"".join((b"[", b",".join(part), b"]"))
        else:
            s, e = win
            assert isinstance(data, bytearray)
            saved = data[s - 1], data[e]
            data[s - 1], data[e] = 0x5B, 0x5D  # [ and ]
            blob = memoryview(data)[s - 1 : e + 1]
        del part
        if consume:
            raws[lo : lo + SLICE] = repeat(_FREED, min(SLICE, len(raws) - lo))
        try:
            _, n, g = decode_slice(blob, decoders, select, builder, run_instant_hooks if hooks else None)
        finally:
            if win is not None:
                assert isinstance(data, bytearray)
                data[win[0] - 1], data[win[1]] = saved
        del blob  # with the last event views of the slice, the text's export goes
        dropped_used += n
        n_gpu += g
    return dropped_used, n_gpu


def decode_slice(
    blob: bytes | memoryview,
    decoders: SliceDecoders,
    select: Select,
    builder: EventsBuilder,
    on_events: InstantHook | None,
) -> tuple[int, int, int]:
    """Decode one slice (a JSON array) into ``builder``; returns (events in the slice, dropped
    rows that count as used, usable GPU events). ``on_events`` is handed the slice's events
    first (the instant-event hooks). The filtered pass decodes the events no step reads as stubs;
    a slice where the filter keeps one (a GPU category or the allocator's name on a flow or
    metadata event) is decoded again in full, so the columns are those of the untagged decode
    either way."""
    evs, how = decoders.decode(blob, stubs=select is not keep_all)
    if on_events is not None:
        on_events(evs)  # instant events are never stubs
    got = builder.add(evs, select, how)
    if got is None:
        evs, how = decoders.decode(blob)
        got = builder.add(evs, select, how)
        assert got is not None
    return len(evs), *got
