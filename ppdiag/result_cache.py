"""Result cache: the report of an analysis, kept so that the same run analysed again with the same
options by the same code is not analysed again.

A hit of ``ppdiag analyze`` loads neither numpy nor any analysis layer: the key is computed from
the files and the flags alone, and the entry holds everything the command prints or writes from the
report (the terminal report, the JSON and Markdown files). ``ppdiag check`` is served from the same
entries, which keep what its gate judges besides the report (the skipped traces, the loader's
doubts, the run's coverage evidence). The HTML report and the Perfetto overlay draw from the
rebuilt pipeline and the timelines, which are not kept: a run that asks for them is analysed (the
parse cache still spares it the parse).

**Key** (BLAKE2b of one JSON document): the entry form, ppdiag's version and a hash of every ``.py``
of the package and the report's schema (:func:`source_version`, once per process), and the installs
of the interpreter and the libraries a result depends on (:func:`ppdiag.cachedir.runtime_identity`);
every option that changes the result (:data:`KEYED_OPTIONS`; ``jobs``, ``progress`` and
``scheduler`` only decide how and where the parse runs); the environment variables that can
change it (:data:`KEYED_ENV`); and every input as the user spelled it plus what the loader would
read there: a file's resolved path, size, ``mtime_ns`` and BLAKE2b of all its bytes
(:func:`ppdiag.cachedir.file_identity`), for an ``.nsys-rep`` also those of the SQLite export it is
read through (where ``nsys_cache_dir`` puts it, :func:`_export_of`), and for a directory each
trace-named entry of it and of its sub-directories (:func:`_dir_listing`, a superset of the files
the loader reads: a trace added or removed misses). A file ppdiag wrote (a report in the run
directory) counts by its name only, as the loader only names it. URLs, missing paths, devices,
pipes and unreadable files are not keyed: no result cache. The key is taken again after a miss's
analysis: an entry is stored only when the inputs did not change while they were read.

**Entry**: ``<key>.report`` in the parse cache's folder (:func:`ppdiag.cachedir.cache_dir`): a
magic line, a BLAKE2b of the rest, then msgpack (no pickle, nothing executed on read) of the
report, the report as the terminal shows it, the override warnings, the trace sources (a report
may never be written over one), the skipped traces, and what ``ppdiag check`` judges besides the
report (the run's coverage evidence and the loader's doubts). An entry is stored only once decoding it
gives back the same encoded reports (every float, every evidence field); a damaged or foreign entry
is a miss and is removed. Writes are atomic (temporary file and rename); a cache that cannot be
written is skipped without a word.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ppdiag.cachedir import (
    cache_dir,
    count_entries,
    enabled,
    file_identity,
    is_nsys_report,
    nsys_export_path,
    package_root,
    remove_entries,
    runtime_identity,
    source_digest,
    write_entry,
)
from ppdiag.model.run_coverage import RunCoverage
from ppdiag.report_evidence import EVIDENCE, Evidence
from ppdiag.report_types import Report

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed
    from ppdiag.options import Options

SUFFIX = ".report"
_MAGIC = b"PPDIAG-RESULT-3\n"
_DIGEST = 32
_FORM = "ppdiag-result-3"

#: The :class:`~ppdiag.options.Options` fields that change a result.
KEYED_OPTIONS = (
    "pp",
    "stage_map",
    "microbatches",
    "schedule",
    "steps",
    "global_batch",
    "micro_batch",
    "tp",
    "hosts",
)
#: Environment variables that can change a result: the invariant check's strictness, the trace
#: size limit, the nsys reader's choice of SQLite reader and its time budget, the gzip inflater.
KEYED_ENV = (
    "PPDIAG_STRICT_CHECK",
    "PPDIAG_MAX_TRACE_GB",
    "PPDIAG_NO_ADBC",
    "PPDIAG_SQL_BUDGET_S",
    "PPDIAG_NO_ISAL",
)
#: Every name a trace format carries (the parsers' ``suffixes``; a test holds them equal): the
#: directory entries that are keyed. The parser registry itself is not loaded (it loads numpy).
TRACE_SUFFIXES = (
    ".json",
    ".json.gz",
    ".sqlite",
    ".nsys-rep",
    ".csv",
    ".csv.gz",
    ".jsonl",
    ".jsonl.gz",
    ".ndjson",
    ".parquet",
)
#: The loader's ``OWN_OUTPUTS`` (a test holds them equal): names it passes over unread.
OWN_NAMES = ("groundtruth.json", "report.json", "summary.md", "report.html")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")

_SOURCE_VERSION: str | None = None


def source_version() -> str:
    """ppdiag's version and a hash of every ``.py`` file of the package and the report's schema
    (hashed once per process): any code change misses every entry."""
    global _SOURCE_VERSION
    if _SOURCE_VERSION is None:
        root = package_root()
        _SOURCE_VERSION = source_digest([*root.rglob("*.py"), root / "report.schema.json"])
    return _SOURCE_VERSION


# ----------------------------------------------------------------------------------------------
# the key
# ----------------------------------------------------------------------------------------------


def _is_trace_name(name: str) -> bool:
    return name.lower().endswith(TRACE_SUFFIXES)


def _export_of(report: Path, nsys_cache_dir: str | None) -> list[Any] | None:
    """The SQLite export the nsys reader reads an Nsight Systems ``report`` through
    (:func:`ppdiag.cachedir.nsys_export_path`), which the report's bytes do not pin (another export
    written over it, by another nsys): by its bytes when it is there; when it is not, the parse
    makes it, the key after the parse differs and the next run is stored. None when it cannot be
    keyed."""
    try:
        target = nsys_export_path(report, nsys_cache_dir)
        if not (target.exists() or target.is_symlink()):
            return ["export", None]
    except OSError:
        return None
    ident = file_identity(target)
    if ident is None:
        return None
    real, size, mtime_ns, digest = ident
    return ["export", os.fsdecode(real), size, mtime_ns, digest]


def _file_of(p: Path, nsys_cache_dir: str | None) -> list[Any] | None:
    """A file the loader reads: resolved path, size, mtime_ns and hash, and for an Nsight Systems
    report the export it is read through; None when it cannot be keyed."""
    ident = file_identity(p)
    if ident is None:
        return None
    real, size, mtime_ns, digest = ident
    out: list[Any] = [os.fsdecode(real), size, mtime_ns, digest]
    if is_nsys_report(p):
        export = _export_of(p, nsys_cache_dir)
        if export is None:
            return None
        out.append(export)
    return out


def _entry_of(p: Path, nsys_cache_dir: str | None) -> list[Any] | None:
    """One trace-named directory entry as the key holds it, or None when it cannot be keyed."""
    from ppdiag.io import is_own_output

    if p.name in OWN_NAMES:
        return ["own-name", p.name, p.is_symlink() and not p.exists()]
    if p.is_symlink() and not p.exists():
        return ["broken", p.name]
    if not p.is_file():
        return ["other", p.name, p.is_dir()]
    if p.name.lower().endswith((".json", ".json.gz")) and is_own_output(p):
        return ["own", p.name]  # a report ppdiag wrote: the loader names it and reads no further
    if p.suffix == ".nsys-rep" and p.with_suffix(".sqlite").is_file():
        return ["shadowed", p.name]  # its SQLite export beside it is read instead
    ident = _file_of(p, nsys_cache_dir)
    return None if ident is None else ["file", p.name, *ident]


def _dir_listing(d: Path, nsys_cache_dir: str | None, depth: int = 0) -> list[Any] | None:
    """Each trace-named entry of ``d`` and (at the top) of its non-hidden sub-directories, in name
    order: every file the loader could read there. None when one cannot be keyed."""
    try:
        entries = sorted(d.iterdir())
    except OSError:
        return None
    out: list[Any] = []
    for p in entries:
        if depth == 0 and p.is_dir() and not p.name.startswith("."):
            sub = _dir_listing(p, nsys_cache_dir, 1)
            if sub is None:
                return None
            out.append(["dir", p.name, sub])
        elif _is_trace_name(p.name):
            entry = _entry_of(p, nsys_cache_dir)
            if entry is None:
                return None
            out.append(entry)
    return out


def _input_of(raw: str | os.PathLike[str], nsys_cache_dir: str | None) -> list[Any] | None:
    """One input path, spelled as given and expanded as the loader reads it; None for a URL, a
    missing path or an unreadable file (the normal path reports or handles those)."""
    s = os.fspath(raw)
    p = Path(s)
    if not p.exists():
        return None  # a URL (or an error the analysis words)
    if _URL.match(s):
        return None  # a local name that looks like a URL: the loader's choice, not keyed here
    if p.is_dir():
        listing = _dir_listing(p, nsys_cache_dir)
        return None if listing is None else ["dir", s, os.fsdecode(p.resolve()), listing]
    ident = _file_of(p, nsys_cache_dir)
    return None if ident is None else ["file", s, *ident]


def key_of(paths: Sequence[str | os.PathLike[str]], opts: Options) -> str | None:
    """The result cache key of analysing ``paths`` with ``opts`` now, or None when the cache is off
    or the inputs cannot be keyed soundly."""
    if not enabled() or not paths:
        return None
    inputs = []
    for raw in paths:
        one = _input_of(raw, opts.nsys_cache_dir)
        if one is None:
            return None
        inputs.append(one)
    doc = {
        "form": _FORM,
        "code": source_version(),
        "runtime": runtime_identity(),
        "options": {f: getattr(opts, f) for f in KEYED_OPTIONS},
        "env": {v: os.environ.get(v) for v in KEYED_ENV},
        "inputs": inputs,
    }
    text = json.dumps(doc, sort_keys=True, ensure_ascii=True, default=str, allow_nan=True)
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=20).hexdigest()


# ----------------------------------------------------------------------------------------------
# entries
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cached:
    """What a hit gives back: the report and what the command prints or checks besides it."""

    report: Report
    # the report as the terminal shows it (:func:`ppdiag.reports.sanitize.clean_report`): cleaning
    # decodes each finding's evidence by its rule's type, which a hit has not loaded, so it is kept
    shown: Report
    overrides: tuple[str, ...]  # the override warnings the command repeats on stderr
    sources: tuple[str, ...]  # the run's trace files (and other inputs): never written over
    skipped: tuple[str, ...]  # trace files the loader skipped
    # what ``ppdiag check`` judges besides the report: the run's own evidence of its completeness
    # (:func:`ppdiag.pipeline.coverage.run_coverage`) and the loader's doubts about the run
    coverage: RunCoverage
    doubts: tuple[str, ...]


def _entry_path(key: str) -> Path:
    return cache_dir() / f"{key}{SUFFIX}"


class _Doc(msgspec.Struct):
    """An entry's body (after its magic and hash)."""

    overrides: list[str]
    sources: list[str]
    skipped: list[str]
    coverage: RunCoverage
    doubts: list[str]
    report: msgspec.msgpack.Ext  # msgpack of the report (:func:`encode_msgpack`)
    shown: msgspec.msgpack.Ext  # and of the report the terminal shows


def _number(o: object) -> object:
    """numpy scalars and arrays (in free-form evidence) as Python numbers and lists, as the JSON
    report writes them."""
    item = getattr(o, "item", None)
    if callable(item):
        tolist = getattr(o, "tolist", None)
        return tolist() if callable(tolist) and bool(getattr(o, "ndim", None)) else item()
    raise NotImplementedError(f"cannot encode {type(o).__name__}")


def encode_msgpack(report: Report) -> bytes:
    """``report`` as msgpack: every float as it is (NaN and infinities too, which JSON loses)."""
    return msgspec.msgpack.encode(report, enc_hook=_number)


class _RawFinding(msgspec.Struct):
    code: str
    evidence: msgspec.Raw


class _RawFindings(msgspec.Struct):
    findings: list[_RawFinding] = msgspec.field(default_factory=list)


_SHAPES: dict[tuple[str, tuple[str, ...]], type[Evidence]] = {}


def _shaped(code: str, doc: dict[str, Any]) -> Evidence:
    """Evidence of a rule whose type is not loaded (a re-run served from the cache loads no rule):
    a type with the evidence's own fields, in order, holding their values as they are, so that it
    encodes and renders as the rule's own type did."""
    common = set(Evidence.__struct_fields__)
    own = tuple(k for k in doc if k not in common)
    kind = _SHAPES.get((code, own))
    if kind is None:
        made: type[Evidence] = msgspec.defstruct(  # type: ignore[assignment]
            f"Evidence{code}", [(k, object) for k in own], bases=(Evidence,), frozen=True
        )
        kind = _SHAPES[(code, own)] = made
    shaped: Evidence = msgspec.convert(doc, kind)
    return shaped


def decode_msgpack(data: bytes, typed: bool = True) -> Report:
    """The report of :func:`encode_msgpack`'s bytes; each finding's evidence as its rule's type when
    that rule is loaded and ``typed``, else as :func:`_shaped`."""
    report = msgspec.msgpack.decode(data, type=Report)
    if not report.findings:
        return report
    raw = msgspec.msgpack.decode(data, type=_RawFindings).findings
    evidence: list[Evidence] = []
    for f in raw:
        doc = msgspec.msgpack.decode(f.evidence)
        if not isinstance(doc, dict):
            raise TypeError(f"{f.code}: the evidence is not an object")
        kind = EVIDENCE.get(f.code) if typed else None
        evidence.append(msgspec.convert(doc, kind) if kind is not None else _shaped(f.code, doc))
    typed_findings = [
        msgspec.structs.replace(f, evidence=e) for f, e in zip(report.findings, evidence, strict=True)
    ]
    return msgspec.structs.replace(report, findings=typed_findings)


def _pack(c: Cached) -> bytes:
    body = msgspec.msgpack.encode(
        {
            "overrides": list(c.overrides),
            "sources": list(c.sources),
            "skipped": list(c.skipped),
            "coverage": c.coverage,
            "doubts": list(c.doubts),
            "report": msgspec.msgpack.Ext(1, encode_msgpack(c.report)),
            "shown": msgspec.msgpack.Ext(1, encode_msgpack(c.shown)),
        }
    )
    return _MAGIC + hashlib.blake2b(body, digest_size=_DIGEST).digest() + body


def _unpack(data: bytes, typed: bool = True) -> Cached:
    """The entry of ``data`` (ValueError, TypeError or a msgspec error for bytes :func:`_pack`
    did not write)."""
    head = len(_MAGIC) + _DIGEST
    if len(data) < head or not data.startswith(_MAGIC):
        raise ValueError("not a result cache entry of this form")
    body = data[head:]
    if hashlib.blake2b(body, digest_size=_DIGEST).digest() != data[len(_MAGIC) : head]:
        raise ValueError("the entry's bytes do not match its hash")
    doc = msgspec.msgpack.decode(body, type=_Doc)
    return Cached(
        decode_msgpack(bytes(doc.report.data), typed=typed),
        decode_msgpack(bytes(doc.shown.data), typed=typed),
        tuple(doc.overrides),
        tuple(doc.sources),
        tuple(doc.skipped),
        doc.coverage,
        tuple(doc.doubts),
    )


def get(key: str) -> Cached | None:
    """The entry under ``key``, or None. A damaged or foreign entry, or one whose report fails its
    invariant check (:meth:`Report.check`), is removed and is a miss."""
    p = _entry_path(key)
    try:
        data = p.read_bytes()
    except OSError:
        return None
    try:
        hit = _unpack(data)
        if hit.report.check():
            raise ValueError("the report fails its invariant check")
    except Exception:  # any failure to read an entry back is a miss, never an error
        with contextlib.suppress(OSError):
            p.unlink()
        return None
    return hit


def cached_of(diag: Analyzed) -> Cached:
    """The entry of an analysis: its report, override warnings, sources and skipped traces."""
    from ppdiag.analysis import context_of
    from ppdiag.pipeline.coverage import run_coverage
    from ppdiag.reports import run_inputs
    from ppdiag.reports.sanitize import clean_report

    return Cached(
        diag.result,
        clean_report(diag.result),
        tuple(context_of(diag).overrides),
        tuple(run_inputs(diag)),
        tuple(getattr(diag.run, "skipped", None) or ()),
        run_coverage(diag.run),
        tuple(getattr(diag.run, "doubts", None) or ()),
    )


def put(key: str, c: Cached) -> bool:
    """Store ``c`` under ``key`` (atomically); False when not stored: its report does not come back
    exactly from the entry (then a hit would be a different answer), it warns of a damaged parse
    cache entry (true of this run alone), or the cache cannot be written."""
    from ppdiag.parsers.cache import DAMAGED_NOTE

    if any(DAMAGED_NOTE in w for w in c.report.run.warnings):
        return False  # says what happened to the parse cache on this run only
    data = _pack(c)
    want = encode_msgpack(c.report), encode_msgpack(c.shown)
    try:
        # as this process reads it (the rules' evidence types loaded) and as a bare re-run does
        for typed in (True, False):
            back = _unpack(data, typed)
            if (encode_msgpack(back.report), encode_msgpack(back.shown)) != want:
                return False
            if (back.coverage, back.doubts, back.skipped) != (c.coverage, c.doubts, c.skipped):
                return False
    except Exception:  # a report the entry cannot carry is not cached
        return False
    return write_entry(_entry_path(key), [data])


def analysis_of(paths: Sequence[str | Path], opts: Options, drawn: bool = True) -> Analyzed | Cached:
    """The run's entry in the result cache when there is one and ``drawn`` (every output asked for
    is drawn from the report alone: no HTML, no Perfetto, which draw the timelines); else its
    analysis (:func:`ppdiag.api.diagnose`), stored for the next run. What ``ppdiag analyze`` calls:
    a hit loads no analysis."""
    key = key_of(paths, opts)
    hit = get(key) if key is not None and drawn else None
    if hit is not None:
        return hit
    from ppdiag.api import diagnose

    diag = diagnose(paths, opts)
    # the key was taken before the parse: a trace rewritten, added or removed in between was
    # analysed as it is now, which that key does not describe (a later run with the old files,
    # e.g. restored with their mtimes, would be served this report); store only when the inputs
    # still give the same key (their bytes were just read: hashing them again is cheap)
    if key is not None and key_of(paths, opts) == key:
        put(key, cached_of(diag))
    return diag


# ----------------------------------------------------------------------------------------------
# info / clear
# ----------------------------------------------------------------------------------------------


def info() -> tuple[int, int]:
    """(entries, bytes) of the result cache."""
    return count_entries((SUFFIX,))


def clear() -> int:
    """Remove every result entry (and stray temporary files); the number of entries removed."""
    return remove_entries((SUFFIX,))


__all__ = [
    "KEYED_ENV",
    "KEYED_OPTIONS",
    "SUFFIX",
    "TRACE_SUFFIXES",
    "Cached",
    "analysis_of",
    "cached_of",
    "clear",
    "decode_msgpack",
    "encode_msgpack",
    "get",
    "info",
    "key_of",
    "put",
    "source_version",
]
