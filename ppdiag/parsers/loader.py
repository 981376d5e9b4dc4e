"""Turn the paths a user names (files and run directories) into one :class:`Run`.

Finds the trace files, detects each file's format by content through the parser registry, parses
the files in parallel processes (one per file, a progress bar on a terminal), and resolves ranks
across files: duplicates and files without a rank in a multi-file run are input errors.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import stat
import sys
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError
from ppdiag.io import is_own_output, qpath
from ppdiag.model import RankTimeline, Run
from ppdiag.model.invariants import freeze_run
from ppdiag.parsers import PARSERS, ParseOptions, Parser, load_builtin

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")
HEAD_BYTES = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"
# other compressors' magic bytes: data a user renamed (or a tool wrote) under a trace name
OTHER_COMPRESSION = {
    b"BZh": "bzip2",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\xfd7zXZ\x00": "xz",
    b"\x04\x22\x4d\x18": "lz4",
}


_UNPACK = {"bzip2": "bunzip2", "zstd": "zstd -d", "xz": "unxz", "lz4": "lz4 -d"}


def compression_of(head: bytes) -> str | None:
    """``"bzip2"``, ``"zstd"``, ``"xz"`` or ``"lz4"`` when ``head`` starts such a stream."""
    for magic, name in OTHER_COMPRESSION.items():
        if head.startswith(magic):
            if name == "bzip2" and not (len(head) > 3 and head[3:4].isdigit()):
                continue
            return name
    return None


@dataclass(frozen=True)
class TraceFile:
    """One input file and the parser that recognised it."""

    path: Path
    format: str


def is_trace_name(path: Path) -> bool:
    """True for names a profiler writes (``*.json``, ``*.json.gz``, ``*.sqlite``, ``*.nsys-rep``)."""
    return path.name.lower().endswith(TRACE_SUFFIXES)


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """First bytes of a file, gunzipped when gzip. Raises InputError for unreadable or corrupt gzip."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(size)
            if head[:4] == b"\x28\xb5\x2f\xfd" and _has_zstd():
                return _unzstd_head(head, fh, size)
            if head[:3] == b"BZh" or head[:6] == b"\xfd7zXZ\x00":
                out = _unpack_head(head, fh, size)
                if not out.strip():
                    what = "bzip2" if head[:3] == b"BZh" else "xz"
                    raise InputError(str(path), f"{what} data cut short or damaged (nothing decompressed)")
                return out
            if head[:2] != GZIP_MAGIC:
                return head
            d = zlib.decompressobj(wbits=31)
            out = d.decompress(head, size)
            while len(out) < size and not d.eof:
                if d.unconsumed_tail:
                    out += d.decompress(d.unconsumed_tail, size - len(out))
                    continue
                chunk = fh.read(1 << 16)
                if not chunk:
                    break
                out += d.decompress(chunk, size - len(out))
            return out
    except zlib.error as exc:
        raise InputError(str(path), f"corrupt gzip data ({exc})") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None


def _has_zstd() -> bool:
    """True when the optional ``zstandard`` package can be imported (it reads zstd traces)."""
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def _unzstd_head(head: bytes, fh: Any, size: int) -> bytes:
    """First ``size`` decompressed bytes of zstd data; the raw head when it is not zstd after all."""
    import io

    import zstandard

    src = io.BytesIO(head + fh.read(max(0, (1 << 20) - len(head))))
    try:
        with zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True) as reader:
            out: bytes = reader.read(size)
    except zstandard.ZstdError:
        return head  # corrupt: the parser names the damage
    return out or head


def _unpack_head(head: bytes, fh: Any, size: int) -> bytes:
    """First ``size`` decompressed bytes of bzip2 / xz data (the standard library reads both)."""
    import bz2
    import lzma

    d: Any = bz2.BZ2Decompressor() if head[:3] == b"BZh" else lzma.LZMADecompressor()
    try:
        out = d.decompress(head, size)
        while len(out) < size and not d.eof:
            data = fh.read(1 << 16) if d.needs_input else b""
            if d.needs_input and not data:
                break
            out += d.decompress(data, size - len(out))
    except (OSError, EOFError, lzma.LZMAError):
        return head  # not really that format: let the sniffers say what it is
    return out


def detect_format(path: Path) -> tuple[str | None, str]:
    """(parser name or None, reason when None) for one file, by content."""
    load_builtin()
    try:
        st = path.stat()
    except OSError as exc:
        return None, f"cannot read file ({exc.strerror or exc})"
    if stat.S_ISDIR(st.st_mode):
        return None, "is a directory"
    if not stat.S_ISREG(st.st_mode):
        # a pipe (/dev/stdin, <(...)) can be read once only, and the format is sniffed first
        return (
            None,
            "not a regular file (a pipe or device such as /dev/stdin); save the trace to a file first",
        )
    if st.st_size == 0:
        return None, "empty file"
    head = read_head(path)
    if not head.strip():
        return None, "empty file"
    for name, parser in PARSERS.items():
        try:
            if parser.sniff(path, head):
                return name, ""
        except Exception:  # a sniffer must never break the detection of other formats
            continue
    comp = compression_of(head)
    if comp == "zstd" and not _has_zstd():
        return None, (
            "zstd-compressed data: reading it needs the optional 'zstandard' package "
            "(pip install zstandard), or decompress it first (zstd -d)"
        )
    if comp in ("zstd", "lz4"):
        what = "damaged " if comp == "zstd" else ""
        return None, f"{what}{comp}-compressed data, not gzip or JSON; decompress it first ({_UNPACK[comp]})"
    h = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if h.startswith(b"{"):
        return None, "JSON object without traceEvents: not a PyTorch Profiler trace"
    if h.startswith(b"["):
        return None, "a JSON array, not a PyTorch Profiler trace object"
    return None, "not a recognised trace format"


# ppdiag's own outputs that a run directory may hold next to the traces (demo runs, CI jobs)
OWN_OUTPUTS = ("groundtruth.json", "report.json", "summary.md", "report.html")


def _scan_dir(d: Path, notes: list[str]) -> list[Path]:
    files = _candidates(d, notes)
    subs = [sub for sub in sorted(d.iterdir()) if sub.is_dir() and not sub.name.startswith(".")]
    if files:
        # traces one level down are another run, or the same run split: never drop them unsaid
        below = [sub.name for sub in subs if _candidates(sub, [])]
        if below:
            shown = ", ".join(qpath(b) + "/" for b in below[:5]) + (", ..." if len(below) > 5 else "")
            notes.append(
                f"{qpath(d)}: trace files in subdirectories not read ({shown}); name them to include them"
            )
        return files
    # one level down (e.g. RUN/rank0/trace.json, or a tensorboard log dir)
    return [p for sub in subs for p in _candidates(sub, notes)]


def _candidates(d: Path, notes: list[str]) -> list[Path]:
    try:
        entries = sorted(d.iterdir())
    except OSError as exc:
        raise InputError(qpath(d), f"cannot list the directory ({exc.strerror or exc})") from None
    files = []
    own = []
    for p in entries:
        if not (p.is_file() and is_trace_name(p)) or p.name in OWN_OUTPUTS:
            continue
        if p.name.lower().endswith((".json", ".json.gz")) and is_own_output(p):
            own.append(p.name)  # a report or Perfetto overlay ppdiag wrote, not a trace
            continue
        files.append(p)
    if own:
        notes.append(
            f"{qpath(d)}: skipped {len(own)} file(s) ppdiag wrote ({', '.join(map(qpath, own[:5]))}"
            f"{', ...' if len(own) > 5 else ''})"
        )
    # an .nsys-rep next to its own SQLite export is the same rank twice
    names = {p.name for p in files}
    return [p for p in files if not (p.suffix == ".nsys-rep" and p.with_suffix(".sqlite").name in names)]


def find_traces(
    paths: Sequence[str | Path], skipped: list[str] | None = None
) -> tuple[list[TraceFile], list[str]]:
    """Trace files among ``paths`` (files or run directories) with their formats, plus warnings.

    ``skipped`` receives the trace-like files of a directory that could not be read (another
    compression, cut gzip, unreadable): the run lacks their ranks.

    In a directory, files no parser recognises are skipped with a warning; a file named explicitly
    must be a trace. Corrupt gzip is an error either way: the file was meant to be a trace.
    """
    if not paths:
        raise InputError(None, "no input paths given")
    from ppdiag.parsers import urls

    # file:// URLs are local paths; object-store URLs are listed and sniffed where they lie
    paths = [urls.local_path(u) or p if (u := urls.url_of(p)) else p for p in paths]
    if urls.any_url(paths):
        return _find_remote(paths)
    found: list[TraceFile] = []
    warnings: list[str] = []
    seen: set[Path] = set()
    skipped_traces: list[str] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(qpath(p), "no such file or directory")
        if p.is_dir():
            cands = _scan_dir(p, warnings)
            not_read: list[str] = []
            n_before = len(found)
            for f in cands:
                key = f.resolve()
                if key in seen:
                    n_before -= 1  # already named: the directory did hold a trace
                    continue
                fmt, why = detect_format(f)
                if fmt is None:
                    not_read.append(f"{qpath(f.name)} ({why})")
                    warnings.append(f"{qpath(f)}: skipped: {why}")
                    if not why.startswith(("JSON object without", "a JSON array")):
                        # meant to be a trace (compressed otherwise, cut, unreadable): the run
                        # lacks a rank, which the gate must know
                        skipped_traces.append(f"{qpath(f)} ({why})")
                    continue
                seen.add(key)
                found.append(TraceFile(f, fmt))
            if len(found) == n_before:
                detail = (
                    f" (skipped: {', '.join(not_read[:5])}{', ...' if len(not_read) > 5 else ''})"
                    if not_read
                    else ""
                )
                raise InputError(
                    qpath(p),
                    "no trace files found (expected *.json, *.json.gz, *.pt.trace.json, *.sqlite, "
                    f"*.nsys-rep){detail}",
                )
        else:
            key = p.resolve()
            if key in seen:
                continue
            fmt, why = detect_format(p)
            if fmt is None:
                raise InputError(
                    qpath(p), f"{why} (expected a PyTorch Profiler JSON or Nsight Systems trace)"
                )
            seen.add(key)
            found.append(TraceFile(p, fmt))
    formats = {t.format for t in found}
    if len(formats) > 1:
        by_fmt: dict[str, Path] = {}
        for t in found:
            by_fmt.setdefault(t.format, t.path)
        shown = ", ".join(f"{fmt}: {path}" for fmt, path in sorted(by_fmt.items()))
        raise InputError(None, f"mixed trace formats in one run ({shown}); analyze one format at a time")
    if skipped is not None:
        skipped.extend(skipped_traces)
    return found, warnings


def _find_remote(paths: Sequence[str | Path]) -> tuple[list[TraceFile], list[str]]:
    """Trace files among URLs (all of ``paths`` must be URLs: one run lies in one place), plus
    warnings. As for local folders, a listed file no parser recognises is skipped with a warning;
    a file named explicitly must be a trace."""
    from ppdiag.parsers import urls

    load_builtin()
    found: list[TraceFile] = []
    warnings: list[str] = []
    for raw in paths:
        u = urls.url_of(raw)
        if u is None:
            raise InputError(qpath(raw), "mixes local paths with URLs; name one run in one place")
        names = urls.expand(u, is_trace_name)
        listed = names != [u]
        if not names:
            raise InputError(u, "no trace files found under this URL")
        for n in names:
            head = urls.read_head(n, HEAD_BYTES)
            fmt = next((name for name, ps in PARSERS.items() if _sniffs(ps, Path(n), head)), None)
            if fmt is None:
                if listed:
                    warnings.append(f"{n}: skipped: not a trace ppdiag reads")
                    continue
                raise InputError(
                    n, "not a trace ppdiag reads (expected a PyTorch Profiler JSON or Nsight Systems trace)"
                )
            found.append(TraceFile(Path(n), fmt))
    if not found:
        raise InputError(None, f"no trace files found under {', '.join(map(str, paths))}")
    if len({t.format for t in found}) > 1:
        raise InputError(None, "mixed trace formats in one run; analyze one format at a time")
    return found, warnings


def _sniffs(parser: Parser, path: Path, head: bytes) -> bool:
    try:
        return bool(parser.sniff(path, head))
    except Exception:  # a sniffer must never break the detection of other formats
        return False


@dataclass(frozen=True)
class _Outcome:
    """What a worker sends back: the ranks, or the InputError as plain data (its custom __init__
    does not survive pickling as an exception)."""

    ranks: list[RankTimeline] | None = None
    error_path: str | None = None
    error_message: str = ""


def _cached(path: str, fmt: str) -> tuple[str | None, list[RankTimeline] | None]:
    """(cache key, the cached ranks or None); the key is None when the cache is off."""
    from ppdiag.parsers import cache

    key = cache.entry_key(Path(path), fmt) if cache.enabled() else None
    hit = cache.get(key) if key is not None else None
    for tl in hit or []:  # the entry may come from another spelling of the same file
        tl.source = path
    return key, hit


def _parse_one(
    path: str, fmt: str, options: ParseOptions, looked_up: bool = False, key: str | None = None
) -> _Outcome:
    """Worker: parse one file through the parse cache. ``looked_up``: the caller already found no
    entry under ``key`` (None: the cache is off), so the file is not hashed again."""
    load_builtin()
    parser: Parser = PARSERS[fmt]
    from ppdiag.parsers import cache
    from ppdiag.parsers.urls import fetched, local_path, url_of

    url = url_of(path)
    if url is not None and local_path(url) is None:
        # an object-store URL: streamed to this process's temp folder, parsed, not cached
        try:
            with fetched(url) as local:
                ranks = parser.parse(local, options)
        except InputError as exc:
            return _Outcome(error_path=exc.path, error_message=exc.message)
        for tl in ranks:
            tl.source = url
        return _Outcome(ranks=ranks)
    if not looked_up:
        key, hit = _cached(path, fmt)
        if hit is not None:
            return _Outcome(ranks=hit)
    try:
        ranks = parser.parse(Path(path), options)
    except InputError as exc:
        return _Outcome(error_path=exc.path, error_message=exc.message)
    if key is not None:
        cache.put(key, ranks)
    return _Outcome(ranks=ranks)


class _Bar:
    """A rich progress bar on stderr when it is an interactive console, else nothing."""

    def __init__(self, prog: Any = None, task: Any = None) -> None:
        self.prog, self.task = prog, task

    def advance(self) -> None:
        if self.prog is not None:
            self.prog.advance(self.task)


@contextmanager
def _progress(total: int, enabled: bool) -> Iterator[_Bar]:
    if not enabled:
        yield _Bar()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield _Bar()
        return
    with Progress(
        TextColumn("parsing traces"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as prog:
        yield _Bar(prog, prog.add_task("parse", total=total))


def _mp_context() -> multiprocessing.context.BaseContext:
    # fork starts workers fastest; fall back to the platform default where fork is unavailable
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _worker_init() -> None:
    """Parse worker setup: Ctrl-C is the parent's to handle (it terminates the pool and says
    "interrupted"); SIGTERM kills; and on Linux the worker dies with its parent even when the
    parent is killed outright (no orphan holding gigabytes)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
            if os.getppid() == 1:  # the parent died before the call took effect
                os._exit(1)
        except (OSError, AttributeError):
            pass


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    """Terminate every worker of ``pool`` at once and drop the queued work."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for pr in procs:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            pr.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for pr in procs:
        try:
            pr.join(timeout=1.0)
            if pr.is_alive():
                pr.kill()
        except (OSError, AttributeError, ValueError, AssertionError):
            pass


def parse_files(
    files: Sequence[TraceFile],
    options: ParseOptions,
    jobs: int | None = None,
    progress: bool = True,
    scheduler: str | None = None,
) -> list[tuple[TraceFile, list[RankTimeline]]]:
    """Parse every file (parallel processes when more than one) in input order.

    ``scheduler`` (else ``$PPDIAG_DASK_SCHEDULER``): the address of a Dask scheduler whose workers
    run the map step (:func:`ppdiag.parsers.digest.map_file`) instead of the local pool."""
    from ppdiag.parsers.scaleout import parse_on_dask, scheduler_address

    address = scheduler_address(scheduler)
    if address:
        return parse_on_dask(files, options, address)
    results: list[list[RankTimeline] | None] = [None] * len(files)
    # cache hits are read here: a re-run of cached traces starts no worker process at all
    todo: list[int] = []
    keys: list[str | None] = []
    for i, f in enumerate(files):
        key, results[i] = _cached(str(f.path), f.format)
        keys.append(key)
        if results[i] is None:
            todo.append(i)
    if jobs is None:
        jobs = min(len(todo), os.cpu_count() or 1)
    jobs = max(1, min(jobs, len(todo)))

    def take(i: int, out: _Outcome) -> None:
        if out.ranks is None:
            raise InputError(out.error_path, out.error_message)
        results[i] = out.ranks

    if jobs == 1:
        with _progress(len(todo), progress and len(todo) > 1) as bar:
            for i in todo:
                take(i, _parse_one(str(files[i].path), files[i].format, options, True, keys[i]))
                bar.advance()
    else:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context(), initializer=_worker_init)
        try:
            futs: dict[Future[_Outcome], int] = {
                pool.submit(_parse_one, str(files[i].path), files[i].format, options, True, keys[i]): i
                for i in todo
            }
            # the bar starts after the workers exist: no display thread is running at fork time
            with _progress(len(todo), progress) as bar:
                for fut in as_completed(futs):
                    take(futs[fut], fut.result())
                    bar.advance()
        except BaseException:
            # an error, Ctrl-C or SIGTERM: stop the other parses now instead of waiting for them
            # (a worker can hold a multi-GB trace for minutes)
            _kill_pool(pool)
            raise
        pool.shutdown(wait=True)
    return [(f, r or []) for f, r in zip(files, results, strict=True)]


def resolve_ranks(parsed: list[tuple[TraceFile, list[RankTimeline]]]) -> tuple[list[RankTimeline], list[str]]:
    """Give every rank its number; duplicates and unranked files of multi-file runs are errors."""
    ranks: list[RankTimeline] = [r for _, rs in parsed for r in rs]
    warnings: list[str] = []
    unranked = [r for r in ranks if r.rank < 0]
    if unranked:
        if len(ranks) == 1:
            ranks[0].rank = 0
            ranks[0].rank_source = "single file"
        else:
            listed = ", ".join(r.source for r in unranked[:6]) + (", ..." if len(unranked) > 6 else "")
            raise InputError(
                None,
                f"cannot tell the rank of {len(unranked)} of {len(ranks)} traces (no distributedInfo, "
                f"no rank in the file name): {listed}; name the files rank<N>.json or pass --stage-map",
            )
    by_rank: dict[int, RankTimeline] = {}
    for r in ranks:
        other = by_rank.get(r.rank)
        if other is not None:
            raise InputError(
                None,
                f"duplicate rank {r.rank}: {other.source} and {r.source} (from {other.rank_source} / "
                f"{r.rank_source}); pass each rank's trace once",
            )
        by_rank[r.rank] = r
    ranks.sort(key=lambda r: r.rank)
    sizes = [r.world_size for r in ranks if r.world_size]
    world = max(sizes) if sizes else 0
    present = [r.rank for r in ranks]
    if world > len(ranks):
        shown = present if len(present) <= 32 else [*present[:32], "..."]
        warnings.append(f"ranks present: {shown} of world {world}")
    for r in ranks:
        if world and r.rank >= world:
            warnings.append(f"{r.source}: rank {r.rank} is outside world size {world}")
    return ranks, warnings


def load_run(
    paths: Sequence[str | Path],
    options: ParseOptions | None = None,
    jobs: int | None = None,
    progress: bool = True,
    scheduler: str | None = None,
) -> Run:
    """Load every trace under ``paths`` into one :class:`Run` (ranks sorted).

    ``scheduler``: a Dask scheduler address for the parse (see :func:`parse_files`).
    Raises :class:`InputError` (one line, naming the file) for anything unusable.
    """
    opts = options or ParseOptions()
    skipped: list[str] = []
    files, warnings = find_traces(paths, skipped)
    parsed = parse_files(files, opts, jobs=jobs, progress=progress, scheduler=scheduler)
    ranks, rank_warnings = resolve_ranks(parsed)
    fmt = files[0].format
    if fmt == "nsys":
        # NCCL p2p communicators name peers by their own ranks: global ranks are known only once
        # every rank's file has been read
        from ppdiag.parsers.nsys import resolve_nccl_peers

        rank_warnings.extend(resolve_nccl_peers(ranks))
    # the same warning from many files is said once, with the number of files
    counts: dict[str, list[str]] = {}
    for r in ranks:
        for w in r.warnings:
            counts.setdefault(w, []).append(Path(r.source).name)
    for w, names in counts.items():
        warnings.append(f"{names[0]}: {w}" if len(names) == 1 else f"{len(names)} files: {w}")
    warnings.extend(rank_warnings)
    doubts = cross_rank_warnings(ranks, fmt)
    warnings.extend(doubts)
    # parser output is read-only from here on: later layers keep their results beside it
    return freeze_run(Run(ranks=ranks, format=fmt, warnings=warnings, skipped=skipped, doubts=doubts))


# ranks of one run start their traces within minutes of each other: more is another run's trace
_FAR_NS = 3600 * 10**9


def _span(ns: int) -> str:
    s = abs(ns) / 1e9
    if s >= 86400:
        return f"{s / 86400:.1f} days"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s:.0f} s"


def cross_rank_warnings(ranks: Sequence[RankTimeline], fmt: str) -> list[str]:
    """Ranks checked against each other: ``world_size`` values that disagree, and (Kineto, whose
    clocks are absolute) a rank whose trace lies hours away from the others' (another run)."""
    out: list[str] = []
    sizes: dict[int, list[int]] = {}
    for r in ranks:
        if r.world_size:
            sizes.setdefault(int(r.world_size), []).append(r.rank)
    if len(sizes) > 1:
        shown = "; ".join(
            f"{w} on rank(s) {', '.join(map(str, rs[:8]))}{', ...' if len(rs) > 8 else ''}"
            for w, rs in sorted(sizes.items())
        )
        out.append(
            f"world_size differs between ranks ({shown}): traces from different jobs? the largest is used"
        )
    if fmt != "kineto" or len(ranks) < 2:
        return out
    starts = {r.rank: int(r.intervals.start.min()) for r in ranks if len(r.intervals)}
    if len(starts) < 2:
        return out
    import numpy as np

    med = int(np.median(list(starts.values())))
    for rank, t in starts.items():
        if abs(t - med) > _FAR_NS:
            side = "after" if t > med else "before"
            out.append(
                f"rank {rank}: its trace starts {_span(t - med)} {side} the other ranks' "
                "(a trace from another run?)"
            )
    return out


# the map step's parse of one file (local pool and Dask workers alike)
parse_one = _parse_one

__all__ = [
    "TraceFile",
    "cross_rank_warnings",
    "detect_format",
    "find_traces",
    "is_trace_name",
    "load_run",
    "parse_files",
    "parse_one",
    "read_head",
    "resolve_ranks",
]
