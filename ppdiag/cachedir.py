"""Where ppdiag's caches live, whether they are on, and how a file is keyed: shared by the parse
cache (:mod:`ppdiag.parsers.cache`) and the result cache (:mod:`ppdiag.result_cache`), and free of
numpy, so that a re-run served by the result cache never loads the analysis.

Where: ``$PPDIAG_CACHE_DIR``, else the user cache dir (``platformdirs``, else
``$XDG_CACHE_HOME/ppdiag`` or ``~/.cache/ppdiag``). ``PPDIAG_NO_CACHE=1`` (the CLI's ``--no-cache``)
turns both caches off. Also where the nsys reader keeps the SQLite exports of ``.nsys-rep`` reports
(:func:`nsys_export_path`), which the result cache keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

_HASH_CHUNK = 1 << 22
#: A SQLite file's companions that the nsys reader reads with it (committed rows a ``-wal`` holds
#: that the file lacks; a ``-journal`` is a write under way, which it warns of): their bytes are
#: not the file's, so a file beside one is not cached at all.
_SQLITE_SIDES = ("-wal", "-journal")
#: The libraries whose code a cached parse or result depends on (numbers, sorting, decoding, the
#: op-table and SQLite readers, decompression): an upgrade of any must miss every entry, as a
#: change of ppdiag's own sources does.
RUNTIME_LIBRARIES = (
    "numpy",
    "pandas",
    "msgspec",
    "pyarrow",
    "adbc_driver_sqlite",
    "adbc_driver_manager",
    # the optional decompressors: what they keep of a cut stream differs (ISA-L and zlib by a byte)
    "isal",
    "zstandard",
)
_RUNTIME: str | None = None


def runtime_identity() -> str:
    """The interpreter's version and, for each of :data:`RUNTIME_LIBRARIES`, where its package lies
    and its ``__init__``'s size and ``mtime_ns`` (``absent`` when not installed): what a reinstall
    or an upgrade changes. Found without importing any of them (``importlib.util.find_spec`` of a
    top-level package runs none of its code); computed once per process."""
    global _RUNTIME
    if _RUNTIME is None:
        parts = [sys.version, sys.platform]
        for name in RUNTIME_LIBRARIES:
            try:
                spec = importlib.util.find_spec(name)
                origin = spec.origin if spec is not None else None
                st = os.stat(origin) if origin else None
            except (ImportError, ValueError, OSError):
                origin, st = None, None
            found = f"{origin}:{st.st_size}:{st.st_mtime_ns}" if st is not None else "absent"
            parts.append(f"{name}={found}")
        _RUNTIME = "\n".join(parts)
    return _RUNTIME


def package_root() -> Path:
    """The folder of ppdiag's own sources (where its version module lies)."""
    import ppdiag.version

    return Path(ppdiag.version.__file__).resolve().parent


def source_digest(files: Iterable[Path]) -> str:
    """ppdiag's version and a BLAKE2b of ``files`` (each by its path below :func:`package_root` and
    its bytes, in name order; one that cannot be read counts as such): what a change of the code a
    cache entry was computed by changes."""
    import ppdiag.version

    root = package_root()
    h = hashlib.blake2b(ppdiag.version.__version__.encode(), digest_size=16)
    for p in sorted(files):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"?")
        h.update(b"\0")
    return h.hexdigest()


def cache_dir() -> Path:
    """The folder entries live in (not created here)."""
    env = os.environ.get("PPDIAG_CACHE_DIR")
    if env:
        return Path(env)
    try:
        import platformdirs
    except ImportError:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "ppdiag"
    return Path(platformdirs.user_cache_dir("ppdiag", appauthor=False))


def enabled() -> bool:
    """False when ``PPDIAG_NO_CACHE`` is set to anything but empty or ``0``."""
    return os.environ.get("PPDIAG_NO_CACHE", "") in ("", "0")


def file_identity(path: Path) -> tuple[Path, int, int, str] | None:
    """(resolved path, size, ``mtime_ns``, BLAKE2b of every byte) of ``path`` as it is now, or None
    when it is not a regular file, cannot be read or changed while it was hashed, or has a SQLite
    ``-wal`` or ``-journal`` beside it (then it must not be keyed at all). The hash makes a file
    rewritten in place with the same size and mtime a different file."""
    try:
        real = path.resolve()
        if any(os.path.lexists(f"{p}{side}") for p in {path, real} for side in _SQLITE_SIDES):
            return None
        st = real.stat()
        if not stat.S_ISREG(st.st_mode):
            # a device or a pipe (/dev/zero, <(zcat ...)): hashing would never end or would eat
            # the bytes the loader reads; the loader refuses it in its own words
            return None
        h = hashlib.blake2b(digest_size=20)
        with open(real, "rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                h.update(chunk)
        st2 = real.stat()
    except OSError:
        return None
    if (st2.st_size, st2.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        return None
    return real, st.st_size, st.st_mtime_ns, h.hexdigest()


# Nsight Systems reports are read through their SQLite export, which the nsys reader keeps in a
# cache of its own (ppdiag/parsers/nsys_rep.py): where it lies is here, free of numpy, so that the
# result cache keys the export a report is read through as well as the report.

#: The names of Nsight Systems reports (read through ``nsys export``).
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def is_nsys_report(path: Path) -> bool:
    """Whether ``path`` is named as an Nsight Systems report."""
    return path.name.lower().endswith(NSYS_REPORT_SUFFIXES)


def nsys_report_stem(path: Path) -> str:
    """The report's name without its suffix (``rank0`` of ``rank0.nsys-rep``)."""
    name = path.name
    for s in NSYS_REPORT_SUFFIXES:
        if name.lower().endswith(s):
            return name[: -len(s)]
    return path.stem


def nsys_user_cache_dir() -> Path:
    """Where exports go when neither a cache folder is given nor the report's folder is writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppdiag" / "nsys"


def nsys_export_path(report: Path, cache_dir: str | None) -> Path:
    """Where the SQLite export of ``report`` lives: in ``cache_dir`` when given, else beside the
    report when its folder is writable, else in :func:`nsys_user_cache_dir`."""
    stem = nsys_report_stem(report)
    if cache_dir:
        return Path(cache_dir) / f"{stem}-{_report_digest(report)}.sqlite"
    parent = report.resolve().parent
    if os.access(parent, os.W_OK):
        return parent / f"{stem}.sqlite"
    return nsys_user_cache_dir() / f"{stem}-{_report_digest(report)}.sqlite"


def _report_digest(report: Path) -> str:
    # Two reports with one name in different directories must not share a cache entry.
    return hashlib.sha1(str(report.resolve()).encode()).hexdigest()[:10]


def write_entry(path: Path, parts: Iterable[bytes]) -> bool:
    """Write ``parts`` as the file ``path`` in the cache folder, atomically (a temporary file beside
    it, then a rename: a reader sees the old entry or the whole new one, never half of it). False
    when the folder cannot be written (read-only, full): a cache is never needed for a result."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as fh:
                for part in parts:
                    fh.write(part)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except (OSError, ValueError):
        return False
    return True


def is_entry_name(name: str, suffixes: tuple[str, ...]) -> bool:
    """Whether ``name`` is a cache entry's: a 40-hex-digit key and one of ``suffixes``."""
    stem, dot, suffix = name.rpartition(".")
    return (
        bool(dot)
        and f".{suffix}" in suffixes
        and len(stem) == 40
        and all(c in "0123456789abcdef" for c in stem)
    )


def count_entries(suffixes: tuple[str, ...]) -> tuple[int, int]:
    """(entries, bytes) of the cache folder's entries named with one of ``suffixes``."""
    d = cache_dir()
    if not d.is_dir():
        return 0, 0
    sizes = []
    for p in d.iterdir():
        if is_entry_name(p.name, suffixes) and p.is_file():
            with contextlib.suppress(OSError):
                sizes.append(p.stat().st_size)
    return len(sizes), sum(sizes)


def remove_entries(suffixes: tuple[str, ...]) -> int:
    """Remove the entries named with one of ``suffixes`` and the stray temporary files of their
    writes (:func:`write_entry`); the number of entries removed. Only files so named are touched: a
    cache folder pointed at a folder of other files keeps them."""
    d = cache_dir()
    if not d.is_dir():
        return 0
    n = 0
    for p in d.iterdir():
        entry = is_entry_name(p.name, suffixes)
        if not (entry or (p.name.startswith(".tmp-") and p.name.endswith(suffixes))):
            continue
        try:
            p.unlink()
        except OSError:
            continue
        n += entry
    return n
