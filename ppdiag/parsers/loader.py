"""Turn the paths a user names (files and run directories) into one :class:`Run`.

Finds the trace files, detects each file's format by content through the parser registry, parses
the files in parallel processes (one per file, a progress bar on a terminal), and resolves ranks
across files: duplicates and files without a rank in a multi-file run are input errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ppdiag.errors import InputError
from ppdiag.io import is_own_output, qpath
from ppdiag.model import RankTimeline, Run
from ppdiag.model.invariants import freeze_run
from ppdiag.parsers import PARSERS, ParseOptions, RunResolver, load_builtin
from ppdiag.parsers.detect import (
    HEAD_BYTES,
    TraceFile,
    compression_of,
    detect_format,
    formats_read,
    is_table_name,
    is_trace_name,
    read_head,
    sniffs,
)
from ppdiag.parsers.pool import parse_files, parse_one
from ppdiag.parsers.report_ranks import needs_renumbering, renumber_reports

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
    broken = []  # trace-named links that lead nowhere (a loop, a missing target)
    for p in entries:
        if not (p.is_file() and is_trace_name(p)) or p.name in OWN_OUTPUTS:
            if is_trace_name(p) and p.is_symlink() and not p.exists():
                broken.append(p.name)
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
    if broken:
        notes.append(
            f"{qpath(d)}: skipped {len(broken)} link(s) that lead to no file (a symlink loop or a "
            f"missing target): {', '.join(map(qpath, broken[:10]))}{', ...' if len(broken) > 10 else ''}"
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
            _add_dir(p, found, seen, warnings, skipped_traces)
        elif (key := p.resolve()) not in seen:
            fmt, why = detect_format(p)
            if fmt is None:
                raise InputError(qpath(p), f"{why} (expected {formats_read()})")
            seen.add(key)
            found.append(TraceFile(p, fmt))
    _one_format(found)
    if skipped is not None:
        skipped.extend(skipped_traces)
    return found, warnings


def _add_dir(
    p: Path, found: list[TraceFile], seen: set[Path], warnings: list[str], skipped_traces: list[str]
) -> None:
    """The traces of one run directory into ``found``; the files no parser reads are skipped with a
    warning (and, when meant to be traces, listed in ``skipped_traces``). A directory with no trace
    at all is an error naming what was skipped."""
    not_read: list[str] = []
    n_before = len(found)
    for f in _scan_dir(p, warnings):
        key = f.resolve()
        if key in seen:
            n_before -= 1  # already named: the directory did hold a trace
            continue
        fmt, why = detect_format(f)
        if fmt is None:
            not_read.append(f"{qpath(f.name)} ({why})")
            warnings.append(f"{qpath(f)}: skipped: {why}")
            if not why.startswith(("JSON object without", "a JSON array")) and not is_table_name(f):
                # meant to be a trace (compressed otherwise, cut, unreadable): the run lacks a
                # rank, which the gate must know
                skipped_traces.append(f"{qpath(f)} ({why})")
            continue
        seen.add(key)
        found.append(TraceFile(f, fmt))
    if len(found) == n_before:
        detail = (
            f" (skipped: {', '.join(not_read[:5])}{', ...' if len(not_read) > 5 else ''})" if not_read else ""
        )
        raise InputError(qpath(p), f"no trace files found (expected {formats_read()}){detail}")
    _one_table(p, found[n_before:])


def _one_table(d: Path, found: list[TraceFile]) -> None:
    """A run directory holds one op table (every rank in one file) and nothing else: a second
    table, or per-rank traces beside it, is an error that names both."""
    tables = [t for t in found if PARSERS[t.format].holds_every_rank]
    if not tables:
        return
    others = [t for t in found if not PARSERS[t.format].holds_every_rank]
    if others:
        raise InputError(
            qpath(d),
            f"holds the op table {qpath(tables[0].path.name)} (every rank) beside the per-rank trace "
            f"{qpath(others[0].path.name)} ({others[0].format}); analyze one of them",
        )
    if len(tables) > 1:
        raise InputError(
            qpath(d),
            f"holds {len(tables)} op tables ({qpath(tables[0].path.name)}, {qpath(tables[1].path.name)}"
            f"{', ...' if len(tables) > 2 else ''}), each with every rank; name the one to analyze",
        )


def _one_format(found: list[TraceFile]) -> None:
    """Refuse a run whose files are of several formats, naming one file of each (two forms of one
    format, an op table and its Chrome timeline, are one format)."""
    formats = {PARSERS[t.format].format for t in found}
    if len(formats) > 1:
        by_fmt: dict[str, Path] = {}
        for t in found:
            by_fmt.setdefault(PARSERS[t.format].format, t.path)
        shown = ", ".join(f"{fmt}: {path}" for fmt, path in sorted(by_fmt.items()))
        raise InputError(None, f"mixed trace formats in one run ({shown}); analyze one format at a time")


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
            fmt = next((name for name, ps in PARSERS.items() if sniffs(ps, Path(n), head)), None)
            if fmt is None:
                if listed:
                    warnings.append(f"{n}: skipped: not a trace ppdiag reads")
                    continue
                raise InputError(n, f"not a trace ppdiag reads (expected {formats_read()})")
            found.append(TraceFile(Path(n), fmt))
    if not found:
        raise InputError(None, f"no trace files found under {', '.join(map(str, paths))}")
    if len({PARSERS[t.format].format for t in found}) > 1:
        raise InputError(None, "mixed trace formats in one run; analyze one format at a time")
    return found, warnings


def resolve_ranks(parsed: list[tuple[TraceFile, list[RankTimeline]]]) -> tuple[list[RankTimeline], list[str]]:
    """Give every rank its number; duplicates and unranked files of multi-file runs are errors."""
    ranks: list[RankTimeline] = [r for _, rs in parsed for r in rs]
    warnings: list[str] = []
    by_file = {str(tf.path): list(rs) for tf, rs in parsed if rs}
    if needs_renumbering(by_file):
        # one report per host, each numbering its processes from 0 (nsys)
        warnings.extend(renumber_reports(by_file))
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
    parser = PARSERS[files[0].format]
    fmt = parser.format
    if isinstance(parser, RunResolver):
        # what one file cannot decide alone (nsys: NCCL peers named by communicator ranks)
        rank_warnings.extend(parser.resolve_run(ranks))
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


__all__ = [
    "HEAD_BYTES",
    "TraceFile",
    "compression_of",
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
