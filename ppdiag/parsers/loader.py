"""Turn the paths a user names (files and run directories) into one :class:`Run`.

Finds the trace files, detects each file's format by content through the parser registry, parses
the files in parallel processes (one per file, a progress bar on a terminal), and resolves ranks
across files: duplicates and files without a rank in a multi-file run are input errors.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError
from ppdiag.model import RankTimeline, Run
from ppdiag.parsers import PARSERS, ParseOptions, Parser, load_builtin

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")
HEAD_BYTES = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"


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


def detect_format(path: Path) -> tuple[str | None, str]:
    """(parser name or None, reason when None) for one file, by content."""
    load_builtin()
    try:
        if path.stat().st_size == 0:
            return None, "empty file"
    except OSError as exc:
        return None, f"cannot read file ({exc.strerror or exc})"
    head = read_head(path)
    if not head.strip():
        return None, "empty file"
    for name, parser in PARSERS.items():
        try:
            if parser.sniff(path, head):
                return name, ""
        except Exception:  # a sniffer must never break the detection of other formats
            continue
    h = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if h.startswith(b"{"):
        return None, "JSON object without traceEvents: not a PyTorch Profiler trace"
    if h.startswith(b"["):
        return None, "a JSON array, not a PyTorch Profiler trace object"
    return None, "not a recognised trace format"


# ppdiag's own outputs that a run directory may hold next to the traces (demo runs, CI jobs)
OWN_OUTPUTS = ("groundtruth.json", "report.json", "summary.md", "report.html")


def _scan_dir(d: Path) -> list[Path]:
    files = _candidates(d)
    if files:
        return files
    # one level down (e.g. RUN/rank0/trace.json, or a tensorboard log dir)
    return [p for sub in sorted(d.iterdir()) if sub.is_dir() for p in _candidates(sub)]


def _candidates(d: Path) -> list[Path]:
    files = sorted(p for p in d.iterdir() if p.is_file() and is_trace_name(p) and p.name not in OWN_OUTPUTS)
    # an .nsys-rep next to its own SQLite export is the same rank twice
    names = {p.name for p in files}
    return [p for p in files if not (p.suffix == ".nsys-rep" and p.with_suffix(".sqlite").name in names)]


def find_traces(paths: Sequence[str | Path]) -> tuple[list[TraceFile], list[str]]:
    """Trace files among ``paths`` (files or run directories) with their formats, plus warnings.

    In a directory, files no parser recognises are skipped with a warning; a file named explicitly
    must be a trace. Corrupt gzip is an error either way: the file was meant to be a trace.
    """
    if not paths:
        raise InputError(None, "no input paths given")
    found: list[TraceFile] = []
    warnings: list[str] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(str(p), "no such file or directory")
        if p.is_dir():
            cands = _scan_dir(p)
            skipped: list[str] = []
            n_before = len(found)
            for f in cands:
                key = f.resolve()
                if key in seen:
                    n_before -= 1  # already named: the directory did hold a trace
                    continue
                fmt, why = detect_format(f)
                if fmt is None:
                    skipped.append(f"{f.name} ({why})")
                    warnings.append(f"{f}: skipped: {why}")
                    continue
                seen.add(key)
                found.append(TraceFile(f, fmt))
            if len(found) == n_before:
                detail = (
                    f" (skipped: {', '.join(skipped[:5])}{', ...' if len(skipped) > 5 else ''})"
                    if skipped
                    else ""
                )
                raise InputError(
                    str(p),
                    "no trace files found (expected *.json, *.json.gz, *.pt.trace.json, *.sqlite, "
                    f"*.nsys-rep){detail}",
                )
        else:
            key = p.resolve()
            if key in seen:
                continue
            fmt, why = detect_format(p)
            if fmt is None:
                raise InputError(str(p), f"{why} (expected a PyTorch Profiler JSON or Nsight Systems trace)")
            seen.add(key)
            found.append(TraceFile(p, fmt))
    formats = {t.format for t in found}
    if len(formats) > 1:
        by_fmt: dict[str, Path] = {}
        for t in found:
            by_fmt.setdefault(t.format, t.path)
        shown = ", ".join(f"{fmt}: {path}" for fmt, path in sorted(by_fmt.items()))
        raise InputError(None, f"mixed trace formats in one run ({shown}); analyze one format at a time")
    return found, warnings


@dataclass(frozen=True)
class _Outcome:
    """What a worker sends back: the ranks, or the InputError as plain data (its custom __init__
    does not survive pickling as an exception)."""

    ranks: list[RankTimeline] | None = None
    error_path: str | None = None
    error_message: str = ""


def _parse_one(path: str, fmt: str, options: ParseOptions) -> _Outcome:
    """Worker: parse one file."""
    load_builtin()
    parser: Parser = PARSERS[fmt]
    try:
        return _Outcome(ranks=parser.parse(Path(path), options))
    except InputError as exc:
        return _Outcome(error_path=exc.path, error_message=exc.message)


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


def parse_files(
    files: Sequence[TraceFile],
    options: ParseOptions,
    jobs: int | None = None,
    progress: bool = True,
) -> list[tuple[TraceFile, list[RankTimeline]]]:
    """Parse every file (parallel processes when more than one) in input order."""
    results: list[list[RankTimeline] | None] = [None] * len(files)
    if jobs is None:
        jobs = min(len(files), os.cpu_count() or 1)
    jobs = max(1, min(jobs, len(files)))

    def take(i: int, out: _Outcome) -> None:
        if out.ranks is None:
            raise InputError(out.error_path, out.error_message)
        results[i] = out.ranks

    if jobs == 1:
        with _progress(len(files), progress and len(files) > 1) as bar:
            for i, f in enumerate(files):
                take(i, _parse_one(str(f.path), f.format, options))
                bar.advance()
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context()) as pool:
            futs: dict[Future[_Outcome], int] = {
                pool.submit(_parse_one, str(f.path), f.format, options): i for i, f in enumerate(files)
            }
            # the bar starts after the workers exist: no display thread is running at fork time
            with _progress(len(files), progress) as bar:
                try:
                    for fut in as_completed(futs):
                        take(futs[fut], fut.result())
                        bar.advance()
                except BaseException:
                    for f2 in futs:
                        f2.cancel()
                    raise
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
) -> Run:
    """Load every trace under ``paths`` into one :class:`Run` (ranks sorted).

    Raises :class:`InputError` (one line, naming the file) for anything unusable.
    """
    opts = options or ParseOptions()
    files, warnings = find_traces(paths)
    parsed = parse_files(files, opts, jobs=jobs, progress=progress)
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
    return Run(ranks=ranks, format=fmt, warnings=warnings)


__all__ = [
    "TraceFile",
    "detect_format",
    "find_traces",
    "is_trace_name",
    "load_run",
    "parse_files",
    "read_head",
    "resolve_ranks",
]
