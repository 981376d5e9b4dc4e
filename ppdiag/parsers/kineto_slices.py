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

Anything unusual (no GPU category in the bytes, lenient typing, damaged JSON) returns None and
the caller decodes the whole document as before: the result is the same either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from ppdiag.parsers.kineto_table import Events, EventsBuilder, Select

SLICE = 1 << 12  # events per slice: ~1-3 MB of JSON, the extra memory one slice costs

# The GPU categories' spelling in the bytes (compact and spaced writers): a trace without any of
# them is parsed in CPU mode, which reads every CPU op, so nothing is dropped there.
_GPU_CAT = re.compile(rb'"cat"\s*:\s*"(?:kernel|Kernel|gpu_memcpy|Memcpy|gpu_memset|Memset|cuda_sync)"')


class _Skeleton(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None


_SKELETON = msgspec.json.Decoder(_Skeleton)


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


def decode_sliced(
    data: bytes | bytearray,
    event_decoder: msgspec.json.Decoder[Any],
    make_select: Callable[[Any], Select],
    builder: EventsBuilder,
) -> Sliced | None:
    """Decode ``data`` slice by slice into ``builder``; None when the whole-document path must be
    taken.

    ``make_select(top)`` (given the document's other fields) returns the per-slice filter. Each
    slice's Structs are turned into columns and freed before the next slice is decoded. When no
    usable GPU event is met the trace is parsed in CPU mode, which reads every CPU op: None."""
    if _GPU_CAT.search(data) is None:
        return None
    try:
        top = _SKELETON.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    raws = top.traceEvents
    if not raws:
        return None
    top.traceEvents = None
    select = make_select(top)
    dropped_used = n_gpu = 0
    try:
        for lo in range(0, len(raws), SLICE):
            blob = b"".join((b"[", b",".join(raws[lo : lo + SLICE]), b"]"))
            evs: list[Any] = event_decoder.decode(blob)
            del blob
            run_instant_hooks(evs)
            n, g = builder.add(evs, select)
            del evs
            dropped_used += n
            n_gpu += g
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not n_gpu:
        return None
    return Sliced(builder.finish(), len(raws), dropped_used, top)
