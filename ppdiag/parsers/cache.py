"""Parse cache: the columnar timelines of one trace file, stored once, read back on a re-run.

One entry per trace file, keyed by the file's resolved path, size, ``mtime_ns``, a BLAKE2b hash of
all its on-disk bytes (so a file rewritten in place with the same size and mtime still misses), the
format name and the parser version (ppdiag's version plus a hash of the parser and model sources:
any code change invalidates every entry). An entry is one ``.cols`` file: a magic line, a CRC-32 of
the rest, then every column array of every rank back to back (8-byte aligned, after a JSON header of
their names, dtypes, shapes and offsets), the interned names as one UTF-8 blob with offsets, and
the rest of each :class:`RankTimeline` as JSON. It is read with one ``readinto`` and every column is
a view of that one buffer (the ``.npz`` it replaces read thousands of small zip members one at a
time: 0.27 s CPU of a 3.5 s warm re-run of a 128-rank op table, 0.055 s now). Nothing is pickled,
nothing is executed when an entry is read; entries of the old ``.npz`` form are never read (a
miss) and ``cache clear`` removes them.

Where: ``$PPDIAG_CACHE_DIR``, else the user cache dir (``platformdirs``, else
``$XDG_CACHE_HOME/ppdiag`` or ``~/.cache/ppdiag``). ``PPDIAG_NO_CACHE=1`` (the CLI's ``--no-cache``)
turns it off. A damaged or unreadable entry is a miss and is removed; a cache that cannot be
written (read-only disk, full disk) is skipped without a word: it is never needed for a result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ppdiag.cachedir import cache_dir as cache_dir
from ppdiag.cachedir import (
    count_entries,
    file_identity,
    package_root,
    remove_entries,
    runtime_identity,
    source_digest,
    write_entry,
)
from ppdiag.cachedir import enabled as enabled
from ppdiag.model import Intervals, ProcessGroup, Ranges, RankTimeline
from ppdiag.parsers.kineto_bytes import ISAL_ENV

_ENTRY_SUFFIX = ".cols"
#: How the warning of a trace parsed again after its entry was damaged begins (a warning of this one
#: run, which the result cache must not repeat on a later run).
DAMAGED_NOTE = "its parse cache entry was damaged"
# the suffix of entries written before the flat form: never read, counted and removed as entries
_OLD_SUFFIXES = (".npz",)
_ENTRY_MAGIC = b"PPDIAG-CACHE-1\n\0"
# RankTimeline fields stored as JSON (the rest are the column tables and the names)
_META_FIELDS = (
    "rank",
    "source",
    "format",
    "world_size",
    "backend",
    "device",
    "cpu_only",
    "clock_offset_ns",
    "rank_source",
    "events_total",
    "events_lost",
    "events_damaged",
    "warnings",
    "meta",
)


_VERSION: str | None = None


def parser_version() -> str:
    """ppdiag's version plus a hash of the sources that decide a parse's output, and of the
    interpreter and libraries they run on (:func:`ppdiag.cachedir.runtime_identity`)."""
    global _VERSION
    if _VERSION is None:
        root = package_root()
        # every module a parser's output can depend on: the parsers, the model, and the helpers
        # the parsers import
        srcs = [*(root / "parsers").glob("*.py"), *(root / "model").glob("*.py")]
        srcs += [root / n for n in ("errors.py", "io.py", "limits.py")]
        h = hashlib.blake2b(source_digest(srcs).encode(), digest_size=12)
        h.update(runtime_identity().encode("utf-8", "surrogateescape"))
        _VERSION = h.hexdigest()
    return _VERSION


def entry_key(path: Path, fmt: str) -> str | None:
    """The cache key of ``path`` as it is now (its bytes and the names a rank may be read from), or
    None when the file cannot be read."""
    ident = file_identity(path)
    if ident is None:
        return None
    real, size, mtime_ns, digest = ident
    k = hashlib.blake2b(digest_size=20)
    # the parse reads the name as spelled besides the bytes: a rank from the file or folder name
    # (rank3.json, rank3/trace.json) when the trace has none, so a link rank5.json to rank3.json
    # is another entry (the source path itself is set on every hit)
    spelled = (os.fsencode(path.name), os.fsencode(path.parent.name))
    # and the gzip inflater it uses (they keep different tails of a cut stream)
    inflater = "zlib" if os.environ.get(ISAL_ENV, "") == "1" else "default"
    for part in (os.fsencode(str(real)), *spelled, str(size), str(mtime_ns), digest, fmt, inflater):
        k.update(part if isinstance(part, bytes) else part.encode())
        k.update(b"\0")
    k.update(parser_version().encode())
    return k.hexdigest()


def _entry_path(key: str) -> Path:
    return cache_dir() / f"{key}{_ENTRY_SUFFIX}"


# ----------------------------------------------------------------------------------------------
# encoding
# ----------------------------------------------------------------------------------------------


def _pack_names(names: list[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    # surrogatepass: a name is stored exactly as the parser produced it, whatever it holds
    enc = [s.encode("utf-8", "surrogatepass") for s in names]
    ends = np.cumsum(np.fromiter((len(b) for b in enc), dtype=np.int64, count=len(enc)))
    return np.frombuffer(b"".join(enc), dtype=np.uint8), ends


def _unpack_names(blob: np.ndarray[Any, Any], ends: np.ndarray[Any, Any]) -> list[str]:
    raw = blob.tobytes()
    starts = np.concatenate(([0], ends[:-1])).tolist()
    return [raw[a:b].decode("utf-8", "surrogatepass") for a, b in zip(starts, ends.tolist(), strict=True)]


def _encode(ranks: list[RankTimeline]) -> dict[str, np.ndarray[Any, Any]] | None:
    """The arrays of one entry, or None when a timeline holds something JSON cannot carry
    exactly (then it is not cached: a lossy entry would be a wrong answer later)."""
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    metas: list[dict[str, Any]] = []
    for k, tl in enumerate(ranks):
        m = {f: getattr(tl, f) for f in _META_FIELDS}
        m["process_groups"] = [[g.name, g.desc, list(g.ranks), g.backend] for g in tl.process_groups]
        metas.append(m)
        for c in Intervals.COLUMNS:
            arrays[f"r{k}.iv.{c}"] = getattr(tl.intervals, c)
        for c in Ranges.COLUMNS:
            arrays[f"r{k}.rg.{c}"] = getattr(tl.ranges, c)
        arrays[f"r{k}.names"], arrays[f"r{k}.name_ends"] = _pack_names(tl.names)
    try:
        text = json.dumps(metas, allow_nan=True)
        if json.loads(text) != metas:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    arrays["meta"] = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    return arrays


def _decode(z: Any) -> list[RankTimeline]:
    metas = json.loads(z["meta"].tobytes().decode("utf-8", "surrogatepass"))
    out: list[RankTimeline] = []
    if not isinstance(metas, list):
        raise TypeError("the entry's metadata is not a list")
    for k, m in enumerate(metas):
        iv = _table(Intervals, z, f"r{k}.iv")
        rg = _table(Ranges, z, f"r{k}.rg")
        groups = [ProcessGroup(n, d, list(r), b) for n, d, r, b in m.pop("process_groups")]
        blob, ends = z[f"r{k}.names"], z[f"r{k}.name_ends"]
        if (
            blob.ndim != 1
            or ends.ndim != 1
            or (len(ends) and not 0 <= int(ends.min()) <= int(ends.max()) <= len(blob))
        ):
            raise ValueError(f"rank {k}: name offsets beyond the name bytes")
        names = _unpack_names(blob, ends)
        for t in (iv.name, rg.name):
            if len(t) and not -1 <= int(t.min()) <= int(t.max()) < len(names):
                raise IndexError(f"rank {k}: a name id beyond the {len(names)} names")
        out.append(RankTimeline(names=names, intervals=iv, ranges=rg, process_groups=groups, **m))
    return out


_T = TypeVar("_T", Intervals, Ranges)


def _table(cls: type[_T], z: Any, prefix: str) -> _T:
    """One column table of an entry, every column 1-D, of its dtype and of one length."""
    cols = {c: z[f"{prefix}.{c}"] for c in cls.COLUMNS}
    n = len(cols[cls.COLUMNS[0]])
    for c, a in cols.items():
        if a.shape != (n,) or a.dtype != np.dtype(cls.DTYPES[c]):
            raise ValueError(
                f"{prefix}.{c}: {a.dtype}{list(a.shape)}, expected {np.dtype(cls.DTYPES[c])}[{n}]"
            )
    return cls(**cols)


# ----------------------------------------------------------------------------------------------
# get / put
# ----------------------------------------------------------------------------------------------


def get(key: str, damaged: list[str] | None = None) -> list[RankTimeline] | None:
    """The ranks stored under ``key``, or None. A damaged entry (unreadable, shorter than it says,
    its bytes not those its checksum was taken of, a column shorter than its table, a name id out
    of range) is removed, and ``damaged`` receives why."""
    p = _entry_path(key)
    if not p.is_file():
        return None
    try:
        return _decode(_unpack(_read_entry(p), _ENTRY_HEAD))
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        IndexError,
        AttributeError,
        MemoryError,
        OverflowError,
        RecursionError,
        UnicodeDecodeError,
        EOFError,
    ) as exc:
        with contextlib.suppress(OSError):
            p.unlink()
        if damaged is not None:
            why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            damaged.append(f"{DAMAGED_NOTE} ({type(exc).__name__}: {why}) and was removed")
        return None


# magic, then the CRC-32 of everything after these 24 bytes (little-endian, in 8 bytes)
_ENTRY_HEAD = len(_ENTRY_MAGIC) + 8


def _read_entry(p: Path) -> np.ndarray[Any, Any]:
    """The bytes of one entry, in one read into one writable buffer, its checksum verified."""
    with open(p, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        # np.empty, not bytearray: no zero fill of a buffer that is about to be overwritten
        buf = np.empty(size, np.uint8)
        if fh.readinto(buf.data) != size:
            raise EOFError("the entry ended before its size")
    if size < _ENTRY_HEAD or bytes(buf[: len(_ENTRY_MAGIC)]) != _ENTRY_MAGIC:
        raise ValueError("not a cache entry of this form")
    if zlib.crc32(buf.data[_ENTRY_HEAD:]) != int.from_bytes(
        bytes(buf[len(_ENTRY_MAGIC) : _ENTRY_HEAD]), "little"
    ):
        raise ValueError("the entry's bytes do not match its checksum")
    return buf


def put(key: str, ranks: list[RankTimeline]) -> bool:
    """Store ``ranks`` under ``key`` (atomically: temp file + rename). False when not stored."""
    parts = _pack(ranks)
    if parts is None:
        return False
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return write_entry(_entry_path(key), [_ENTRY_MAGIC + crc.to_bytes(8, "little"), *parts])


@dataclass(frozen=True)
class CacheInfo:
    """What ``ppdiag cache info`` prints."""

    path: Path
    entries: int
    bytes: int


# the suffixes this cache's entries are named with: this form's and an old one's (which ``info``
# counts and ``clear`` removes, as they take room, though no lookup reads them)
_SUFFIXES = (_ENTRY_SUFFIX, *_OLD_SUFFIXES)


def info() -> CacheInfo:
    """Where the cache is, how many entries, how many bytes."""
    return CacheInfo(cache_dir(), *count_entries(_SUFFIXES))


def clear() -> int:
    """Remove every entry (and stray temp files); returns the number of entries removed. Only
    files this module names are touched: a cache dir pointed at a folder of other files keeps them."""
    return remove_entries(_SUFFIXES)


_PACK_MAGIC = b"PPDIAG-RANKS-1\n"


def _pack(ranks: list[RankTimeline]) -> list[bytes] | None:
    """The parts of :func:`encode_ranks`' bytes (to be joined or written one after another), or
    None when a timeline holds something an entry cannot carry exactly."""
    arrays = _encode(ranks)
    if arrays is None:
        return None
    head: list[list[Any]] = []
    parts: list[bytes] = []
    off = 0
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr)
        if a.dtype.hasobject:
            return None
        head.append([name, a.dtype.str, list(a.shape), off])
        raw = a.tobytes()
        pad = -len(raw) % 8
        parts.append(raw + b"\0" * pad)
        off += len(raw) + pad
    h = json.dumps(head).encode()
    # the header padded so that the arrays start 8-byte aligned (the entry's own head is 24 bytes)
    h += b" " * (-(len(_PACK_MAGIC) + 8 + len(h)) % 8)
    return [_PACK_MAGIC, len(h).to_bytes(8, "little"), h, *parts]


def _unpack(buf: np.ndarray[Any, Any], start: int) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays packed from ``buf[start]`` on, each a view of ``buf``. Raises ValueError or
    TypeError for bytes :func:`_pack` did not write (a header that is not a list of arrays, an
    object dtype, an array beyond the end)."""
    n0 = start + len(_PACK_MAGIC)
    if bytes(buf[start:n0]) != _PACK_MAGIC:
        raise ValueError("not encoded ranks")
    body = n0 + 8 + int.from_bytes(bytes(buf[n0 : n0 + 8]), "little")
    if body > len(buf):
        raise ValueError("the header runs past the end")
    head = json.loads(bytes(buf[n0 + 8 : body]))
    if not isinstance(head, list):
        raise TypeError("the header is not a list")
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for name, dt, shape, off in head:
        dtype = np.dtype(dt)
        if dtype.hasobject or not isinstance(off, int) or off < 0:
            raise ValueError(f"{name}: an object dtype or a bad offset")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"{name}: a bad shape")
        count = math.prod(shape)
        if body + off + count * dtype.itemsize > len(buf):
            raise ValueError(f"{name}: beyond the end of the data")
        arrays[name] = (
            np.frombuffer(buf, dtype=dtype, count=count, offset=body + off).reshape(shape)
            if count
            else np.zeros(shape, dtype)
        )
    return arrays


def encode_ranks(ranks: list[RankTimeline]) -> bytes | None:
    """``ranks`` as one flat byte string (the entry's arrays back to back, 8-byte aligned, after a
    JSON header of their names, dtypes and shapes; no pickle, no zip), or None when a timeline
    holds something an entry cannot carry exactly. For moving parsed ranks between processes or
    machines (the scale-out's per-rank digests): a few hundred bytes of overhead, and decoding is
    one copy plus a view per column."""
    parts = _pack(ranks)
    return None if parts is None else b"".join(parts)


def decode_ranks(data: bytes) -> list[RankTimeline]:
    """The ranks of :func:`encode_ranks`' bytes (writable arrays over one copy of ``data``).
    Raises ValueError for bytes it did not write."""
    if not data.startswith(_PACK_MAGIC):
        raise ValueError("not encoded ranks")
    return _decode(_unpack(np.frombuffer(data, np.uint8).copy(), 0))


__all__ = [
    "DAMAGED_NOTE",
    "CacheInfo",
    "cache_dir",
    "clear",
    "decode_ranks",
    "enabled",
    "encode_ranks",
    "entry_key",
    "get",
    "info",
    "parser_version",
    "put",
]
