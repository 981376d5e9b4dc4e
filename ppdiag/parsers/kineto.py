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

The parse is split along its seams: :mod:`~ppdiag.parsers.kineto_bytes` (gzip and other
compressors, the size cap, sniffing), :mod:`~ppdiag.parsers.kineto_schema` (typed decoding,
category codes, column helpers), :mod:`~ppdiag.parsers.kineto_slices` (sliced decoding),
:mod:`~ppdiag.parsers.kineto_recovery` (damaged JSON), :mod:`~ppdiag.parsers.kineto_events` (B/E
pairs, unusable times), :mod:`~ppdiag.parsers.kineto_names` (the name grammar),
:mod:`~ppdiag.parsers.kineto_meta` (rank, process groups), :mod:`~ppdiag.parsers.kineto_comm`
(comm facts), :mod:`~ppdiag.parsers.kineto_host` (kept host ranges), then
:mod:`~ppdiag.parsers.kineto_gpu` and :mod:`~ppdiag.parsers.kineto_cpu`; this module ties them
together and keeps the names other modules import from it.

Format facts (timestamp generations, arg keys, pid/tid meaning) follow ``formats/KINETO.md`` and
``formats/CPU_PIPELINE.md`` of the project material.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.model import (
    NameTable,
    RankTimeline,
)
from ppdiag.parsers import ParseOptions, register
from ppdiag.parsers.kineto_bytes import gunzip, looks_like_kineto, read_bytes, unpack_other
from ppdiag.parsers.kineto_comm import _Ctx
from ppdiag.parsers.kineto_cpu import _cpu_mode
from ppdiag.parsers.kineto_cuts import decode_cut
from ppdiag.parsers.kineto_events import _drop_bad_times, _event_codes, _read_begin_end
from ppdiag.parsers.kineto_gpu import _gpu_mode
from ppdiag.parsers.kineto_host import _build_ranges, _collect_host
from ppdiag.parsers.kineto_memory import memory_meta
from ppdiag.parsers.kineto_meta import _check_fields, _process_groups, parse_rank_list, rank_from_filename
from ppdiag.parsers.kineto_names import N_BWD_OP, N_MODULE, _NameMemo, classify_name
from ppdiag.parsers.kineto_recovery import _LEADING_OBJECT, _Recovered, decode_trace
from ppdiag.parsers.kineto_schema import (
    _LENIENT,
    _MAX_DUR_US,
    _MAX_US,
    _STRICT,
    K_ANNOT,
    K_CPUOP,
    K_KERNEL,
    K_OTHER,
    K_PYFUNC,
    K_SYNC,
    MEMORY_EVENT,
    TAGGED_EVENTS,
    _as_int,
    dtype_size,
    trace_decoder,
    us_to_ns,
)
from ppdiag.parsers.kineto_slices import SliceDecoders, decode_sliced, run_instant_hooks
from ppdiag.parsers.kineto_table import PH_X, Events, EventsBuilder, Select, events_from_structs


class KinetoParser:
    """PyTorch Profiler / Kineto Chrome-trace JSON (``.json``, ``.json.gz``)."""

    name = "kineto"
    format = "kineto"
    suffixes: tuple[str, ...] = (".json", ".json.gz")
    describe = "PyTorch Profiler JSON (*.json, *.json.gz, *.pt.trace.json)"
    holds_every_rank = False

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
        except RecursionError:  # msgspec decodes nesting on Python's stack: a bounded decode
            raise InputError(
                str(path), "JSON nested too deeply to decode (no profiler writes such nesting)"
            ) from None
        except (ValueError, TypeError, IndexError, KeyError, OverflowError, AttributeError) as exc:
            if os.environ.get("PPDIAG_DEBUG"):
                raise
            raise InputError(str(path), f"unsupported trace content ({type(exc).__name__}: {exc})") from None


_SLICE_DECODERS = SliceDecoders(
    msgspec.json.Decoder(list[_STRICT.event]),  # type: ignore[name-defined]
    msgspec.json.Decoder(list[_LENIENT.event]),  # type: ignore[name-defined]
    TAGGED_EVENTS,
)


def _decode_sliced(data: bytes | bytearray, memo: _NameMemo, path: str = "") -> _Recovered | None:
    """The trace decoded a slice at a time (see :mod:`ppdiag.parsers.kineto_slices`), without the
    host ops a GPU trace's parse never reads; None when the whole document must be decoded."""

    def builder() -> EventsBuilder:
        return EventsBuilder(memo, path)

    # slices cut in the text (the array parsed once), else the skeleton's slices: the same events
    got = decode_cut(data, _SLICE_DECODERS, _slice_select, builder)
    if got is None:
        got = decode_sliced(data, _SLICE_DECODERS, _slice_select, builder)
    if got is None:
        return None
    top = got.top
    trace = _STRICT.trace(
        traceEvents=[],
        distributedInfo=top.distributedInfo,
        deviceProperties=top.deviceProperties,
        baseTimeNanoseconds=top.baseTimeNanoseconds,
        host_name=top.host_name,
    )
    return _Recovered(trace, got.total, 0, dropped_used=got.dropped_used, sliced=True, events=got.events)


def _slice_select(top: Any) -> Select:
    """The per-slice filter: keep every used event except the host ops no later step reads
    (those with usable times are dropped and counted), and count the usable GPU events."""
    b = top.baseTimeNanoseconds
    base = _as_int(b, 0) if b is not None else 0
    lim = _MAX_US - abs(base) / 1000.0

    def select(
        cols: dict[str, npt.NDArray[Any]], built: EventsBuilder
    ) -> tuple[npt.NDArray[np.bool_], int, int]:
        ph, cat, nid = cols["ph"], cols["cat"], cols["name"]
        # the times _drop_bad_times would neither drop nor alter
        with np.errstate(invalid="ignore"):
            usable = cols["ts_ok"] & (np.abs(cols["ts"]) < lim) & cols["dur_ok"]
            usable &= (cols["dur"] >= 0) & (cols["dur"] <= _MAX_DUR_US)
        is_x = ph == PH_X
        gpu = (cat >= K_KERNEL) & (cat <= K_SYNC)
        n_gpu = int((gpu & is_x & usable).sum())
        keep = (is_x & (cat != K_OTHER)) | (gpu & ~is_x)
        # the allocator's instant events: ppdiag/parsers/kineto_memory.py reads them
        if built.memory_id >= 0:
            keep |= nid == built.memory_id
        hi = np.flatnonzero(is_x & ((cat == K_CPUOP) | (cat == K_ANNOT) | (cat == K_PYFUNC)))
        if not len(hi):
            return keep, 0, n_gpu
        cls_of, rk_of = built.name_info()
        rk, cl, hc = rk_of[nid[hi]], cls_of[nid[hi]], cat[hi]
        # what _collect_host reads: named ranges, every annotation, module Python functions, and
        # the autograd backward ops
        needed = ((rk >= 0) | (hc == K_ANNOT)) & ~((hc == K_PYFUNC) & (cl != N_MODULE))
        needed |= cl == N_BWD_OP
        drop = hi[~needed & usable[hi]]
        keep[drop] = False
        return keep, len(drop), n_gpu

    return select


@dataclass(frozen=True)
class _RankInfo:
    """Who wrote a trace: its rank (and where that came from), world size, backend, time base."""

    rank: int
    rank_source: str
    world: int
    backend: str | None
    base: int
    warnings: list[str]


def _rank_info(trace: Any, path: Path) -> _RankInfo:
    """The rank facts of a decoded trace; top-level numbers no profiler writes are refused."""
    spath = str(path)
    dist = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    _check_fields(dist, trace.baseTimeNanoseconds, spath)
    rank = _as_int(dist.get("rank"), -1)
    rank_source = "distributedInfo"
    if rank < 0:
        fr = rank_from_filename(path)
        rank, rank_source = (fr, "file name") if fr is not None else (-1, "none")
    world = _as_int(dist.get("world_size"), -1)
    backend = dist.get("backend") if isinstance(dist.get("backend"), str) else None
    b = trace.baseTimeNanoseconds
    base = _as_int(b, 0) if b is not None else 0
    warnings: list[str] = []
    if b is not None and (isinstance(b, bool) or _as_int(b, -1) < 0):
        warnings.append(f"baseTimeNanoseconds {b!r} is not a number of ns: timestamps read as absolute µs")
    return _RankInfo(rank, rank_source, world, backend, base, warnings)


def _no_gpu_error(
    spath: str, devprops: list[Any], backend: str | None, changed: list[str], rec: _Recovered, noted: bool
) -> InputError | None:
    """The error for a trace that should have GPU events and has none usable, or None when a
    CPU-mode parse is right (no device listed, not an nccl run)."""
    if not (devprops or (backend or "").lower() == "nccl"):
        return None
    why = "the trace lists CUDA devices" if devprops else "the backend is nccl"
    if changed:
        # GPU events are there, in a form ppdiag cannot place: say that, not "enable CUDA"
        return InputError(spath, f"no usable GPU events ({'; '.join(changed)})")
    if rec.lost_events or rec.warnings or noted:
        # Kineto writes GPU events after the CPU events: a cut can take all of them
        return InputError(
            spath,
            f"no GPU events in the {rec.kept_events} events before the file was cut ({why}); "
            "the trace is truncated",
        )
    return InputError(
        spath,
        f"no GPU events ({why}, but no kernel/memcpy/memset was recorded: profile with "
        "ProfilerActivity.CUDA)",
    )


def _cut_before_gpu(err: InputError) -> bool:
    """Whether :func:`_no_gpu_error` blamed a cut (the GPU events were after it)."""
    return "before the file was cut" in err.message


def _decode(held: list[bytes | bytearray], spath: str) -> tuple[_Recovered, Events, _NameMemo]:
    """The decoded trace (sliced when it can be), its events' columns, and the name memo."""
    data = held.pop()  # the only reference from here on: ``del data`` below frees the bytes
    if not _LEADING_OBJECT.match(data, 0, 4096):
        raise InputError(spath, "not a PyTorch Profiler trace (not a JSON object)")
    memo = _NameMemo()
    rec = _decode_sliced(data, memo, spath) or decode_trace(data, spath)
    del data
    if rec.events is not None:
        return rec, rec.events, memo
    evs = rec.trace.traceEvents
    if evs is None:
        raise InputError(spath, "not a PyTorch Profiler trace (no traceEvents)")
    if not evs:
        raise InputError(spath, "empty trace (traceEvents is empty)")
    run_instant_hooks(evs)
    table = events_from_structs(evs, memo, spath)
    rec.trace.traceEvents = None  # the Structs are freed: the columns hold what is read
    del evs
    return rec, table, memo


def _parse_bytes(held: list[bytes | bytearray], path: Path, warnings: list[str]) -> RankTimeline:
    spath = str(path)
    rec, ev, memo = _decode(held, spath)
    warnings = warnings + rec.warnings
    trace = rec.trace
    ri = _rank_info(trace, path)
    warnings += ri.warnings
    ctx = _Ctx(
        spath,
        ri.rank,
        _process_groups(trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}),
    )
    base = ri.base
    devprops = trace.deviceProperties if isinstance(trace.deviceProperties, list) else []

    codes = _event_codes(ev)
    # every dropped or altered event of this file in one warning (the loader names the file)
    changed, damaged = _read_begin_end(ev, codes)
    bad_times, altered = _drop_bad_times(ev, codes, base, rec.dropped_used)
    changed, damaged = changed + bad_times, damaged + altered + rec.dropped_items
    if changed:
        warnings = [*warnings, "; ".join(changed)]
    gpu_idx = np.flatnonzero((codes >= K_KERNEL) & (codes <= K_SYNC))
    host_idx = np.flatnonzero((codes == K_CPUOP) | (codes == K_ANNOT) | (codes == K_PYFUNC))

    names = NameTable()
    host = _collect_host(ev, host_idx, codes, memo, base, ctx)

    meta: dict[str, Any] = {
        "time_base_ns": base,
        "ts_format": "relative+baseTimeNanoseconds" if base else "absolute µs",
    }
    if isinstance(trace.host_name, str) and trace.host_name:
        meta["host_name"] = trace.host_name  # ranks on one host share its cores (contention)
    meta.update(
        memory_meta(ev.mem_ts, ev.mem_args, base, devprops)
    )  # allocator events (ppdiag/parsers/kineto_memory.py)
    if len(gpu_idx):
        intervals, device, extra = _gpu_mode(ev, gpu_idx, codes, host, base, ctx, names, devprops)
    else:
        err = _no_gpu_error(spath, devprops, ri.backend, changed, rec, bool(warnings))
        cpu_idx = np.flatnonzero(codes == K_CPUOP)
        if err is not None and _cut_before_gpu(err) and len(cpu_idx):
            # Kineto writes the GPU events after the host ones: a cut took them all. The host ops
            # before the cut are still this rank's work: read them (CPU mode) and say what is lost.
            warnings = [
                *warnings,
                f"the file was cut before its GPU events ({rec.kept_events} events kept, none on "
                "the GPU): its host ops are read as the rank's timeline (CPU mode)",
            ]
            err = None
        if err is not None:
            raise err
        if not len(cpu_idx):
            raise InputError(spath, "no GPU events and no CPU ops: nothing to analyze")
        intervals, extra = _cpu_mode(ev, cpu_idx, host, memo, base, ctx, names)
        device = "cpu"
    meta.update(extra)
    del ev, trace
    ranges = _build_ranges(host, names)
    return RankTimeline(
        rank=ri.rank,
        source=spath,
        format="kineto",
        names=names.names,
        intervals=intervals.sorted(),
        ranges=ranges,
        world_size=ri.world if ri.world > 0 else None,
        backend=ri.backend,
        device=device,
        cpu_only=not len(gpu_idx),
        process_groups=ctx.groups,
        rank_source=ri.rank_source,
        events_total=rec.kept_events,
        events_lost=rec.lost_events,
        events_damaged=damaged,
        warnings=warnings + ctx.warnings,
        meta=meta,
    )


def parse_file(path: str | Path, options: ParseOptions | None = None) -> RankTimeline:
    """Convenience: parse one Kineto file into its rank."""
    return PARSER.parse(Path(path), options or ParseOptions())[0]


PARSER = KinetoParser()
register(PARSER)

__all__ = [
    "MEMORY_EVENT",
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
    "unpack_other",
    "us_to_ns",
]
