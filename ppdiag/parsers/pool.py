"""The parse of a run's files: one process per file (a progress bar on a terminal), through the
parse cache, or on a Dask cluster when a scheduler is named. Workers die with their parent and
an error, Ctrl-C or SIGTERM stops every parse at once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError
from ppdiag.model import RankTimeline
from ppdiag.parsers import PARSERS, ParseOptions, Parser, load_builtin
from ppdiag.parsers.detect import TraceFile


@dataclass(frozen=True)
class _Outcome:
    """What a worker sends back: the ranks, or the InputError as plain data (its custom __init__
    does not survive pickling as an exception)."""

    ranks: list[RankTimeline] | None = None
    error_path: str | None = None
    error_message: str = ""


#: Why the cache entry of a file was damaged (cache key -> note), for the warning of its new parse.
_DAMAGED: dict[str, str] = {}


def _cached(path: str, fmt: str) -> tuple[str | None, list[RankTimeline] | None]:
    """(cache key, the cached ranks or None); the key is None when the cache is off. A damaged
    entry is removed (:func:`ppdiag.parsers.cache.get`) and noted for the new parse's warning."""
    from ppdiag.parsers import cache

    key = cache.entry_key(Path(path), fmt) if cache.enabled() else None
    damaged: list[str] = []
    hit = cache.get(key, damaged) if key is not None else None
    if key is not None and damaged:
        _DAMAGED[key] = damaged[0]
    for tl in hit or []:  # the entry may come from another spelling of the same file
        tl.source = path
    return key, hit


def _note_damage(key: str | None, ranks: list[RankTimeline], note: str = "") -> None:
    """Say on the first rank that its cache entry was damaged and the file parsed again."""
    why = note or (_DAMAGED.pop(key, "") if key is not None else "")
    if why and ranks:
        ranks[0].warnings.append(f"{why}; the trace was parsed again")


def _parse_one(
    path: str,
    fmt: str,
    options: ParseOptions,
    looked_up: bool = False,
    key: str | None = None,
    note: str = "",
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
    _note_damage(key, ranks, note)
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
    if hasattr(signal, "pthread_sigmask"):
        # forked with both blocked (see _forking): a SIGTERM that came before this point ends the
        # worker now, under SIG_DFL, instead of raising the parent's handler in fork hooks
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
            if os.getppid() == 1:  # the parent died before the call took effect
                os._exit(1)
        except (OSError, AttributeError):
            pass


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _forking() -> Iterator[None]:
    """SIGINT and SIGTERM blocked while the pool forks its workers: a forked worker holds the
    parent's handler until :func:`_worker_init` replaces it, and a SIGTERM in that window (the
    parent ending the pool on an error or Ctrl-C) raised the parent's ``Interrupted`` inside the
    child's fork hooks ("Exception ignored ... Interrupted: 15" on stderr). The parent gets any
    signal that came meanwhile when this block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _preload(files: Sequence[TraceFile], todo: list[int]) -> None:
    """Import in the parent, before the fork, what every parse worker would import on its first
    file: otherwise each worker imports it again. ``numpy.ma`` (numpy 2's ``np.unique`` loads it
    on its first call; the analysis loads it in the parent anyway), a parser's ``preload()`` where
    it has one (the reader it imports on its first parse), and the gzip inflater (ISA-L when
    installed) when a file is gzip."""
    import numpy.ma  # noqa: F401

    for fmt in sorted({files[i].format for i in todo}):
        preload = getattr(PARSERS.get(fmt), "preload", None)
        if preload is not None:  # a parser whose reader is imported on its first parse
            preload()
    if any(str(files[i].path).endswith(".gz") for i in todo):
        from ppdiag.parsers.kineto_bytes import inflater

        inflater()


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
                note = _DAMAGED.pop(keys[i] or "", "")
                take(i, _parse_one(str(files[i].path), files[i].format, options, True, keys[i], note))
                bar.advance()
    else:
        _preload(files, todo)
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context(), initializer=_worker_init)
        try:
            with _forking():  # (the workers are forked by the first submit)
                futs: dict[Future[_Outcome], int] = {
                    pool.submit(
                        _parse_one,
                        str(files[i].path),
                        files[i].format,
                        options,
                        True,
                        keys[i],
                        _DAMAGED.pop(keys[i] or "", ""),
                    ): i
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


# the map step's parse of one file (local pool and Dask workers alike)
parse_one = _parse_one
