"""Traces named by fsspec URLs (``s3://``, ``gs://``, ``file://`` ...), read where they lie.

A URL is recognised by its protocol when fsspec knows that protocol (``fsspec`` installed; the
protocol's own package, ``s3fs`` or ``gcsfs``, is needed only to read). Command-line paths arrive
as :class:`pathlib.Path`, which folds ``s3://b/k`` into ``s3:/b/k``: :func:`url_of` restores it.
``file://`` URLs become local paths (the parse cache and everything else then work as for any
local file). A directory URL is listed like a run directory (trace names only, one level). A
remote file is parsed from a copy in the worker's temporary folder, streamed from storage by the
process that parses it: the bytes never pass through the process that named them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError

_PROTO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+):/+(.*)$", re.DOTALL)
_HEAD = 1 << 16


def _known(proto: str) -> bool:
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return proto in ("s3", "gs", "gcs", "file", "az", "abfs", "http", "https", "hdfs")
    return proto in known_implementations or proto in registry


def url_of(path: str | os.PathLike[str]) -> str | None:
    """The URL ``path`` spells (restoring the ``//`` a :class:`Path` folded), or None for a plain
    local path. ``file://`` URLs are returned as URLs too (see :func:`local_path`)."""
    s = os.fspath(path)
    if os.path.exists(s):
        return None  # a local file or folder whose name merely looks like a URL
    m = _PROTO.match(s)
    if not m or not _known(m.group(1).lower()):
        return None
    proto, rest = m.group(1).lower(), m.group(2)
    if proto == "file":
        return "file:///" + rest.lstrip("/")
    return f"{proto}://{rest}"


def local_path(url: str) -> Path | None:
    """The local path of a ``file://`` URL, else None."""
    if url.startswith("file://"):
        return Path("/" + url[len("file://") :].lstrip("/"))
    return None


def _fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise InputError(
            url, "reading trace URLs needs fsspec: pip install fsspec (and s3fs / gcsfs)"
        ) from None
    try:
        fs_and_path: tuple[Any, str] = fsspec.core.url_to_fs(url)
        return fs_and_path
    except (ImportError, ValueError) as exc:
        raise InputError(url, f"cannot open this URL ({str(exc).splitlines()[0][:200]})") from None


def read_head(url: str, size: int = _HEAD) -> bytes:
    """First ``size`` bytes of the object, gunzipped when gzip (for format detection)."""
    fs, p = _fs(url)
    try:
        with fs.open(p, "rb") as fh:
            head: bytes = fh.read(size)
            if head[:2] != b"\x1f\x8b":
                return head
            d = zlib.decompressobj(wbits=31)
            out = d.decompress(head, size)
            while len(out) < size and not d.eof:
                chunk = fh.read(1 << 16)
                if not chunk:
                    break
                out += d.decompress(chunk, size - len(out))
            return out
    except zlib.error as exc:
        raise InputError(url, f"corrupt gzip data ({exc})") from None
    except (OSError, ValueError) as exc:
        raise InputError(url, f"cannot read ({str(exc).splitlines()[0][:200]})") from None


def expand(url: str, is_trace_name: Any) -> list[str]:
    """The trace URLs ``url`` names: itself when it is a file, else the trace-named files in it."""
    fs, p = _fs(url)
    proto = url.split("://", 1)[0]
    try:
        if not fs.exists(p):
            raise InputError(url, "no such file or directory")
        if not fs.isdir(p):
            return [url]
        names = sorted(str(x) for x in fs.ls(p, detail=False))
    except InputError:
        raise
    except (OSError, ValueError) as exc:
        raise InputError(url, f"cannot list ({str(exc).splitlines()[0][:200]})") from None
    out = [f"{proto}://{n.lstrip('/')}" if proto != "file" else f"file:///{n.lstrip('/')}" for n in names]
    return [u for u in out if is_trace_name(Path(u.rsplit("/", 1)[-1]))]


@contextlib.contextmanager
def fetched(url: str) -> Iterator[Path]:
    """A local path holding the object's bytes for the parsers: the file itself for ``file://``,
    else a copy streamed into a temporary folder and removed afterwards."""
    loc = local_path(url)
    if loc is not None:
        yield loc
        return
    fs, p = _fs(url)
    tmp = tempfile.mkdtemp(prefix="ppdiag-url-")
    try:
        dest = Path(tmp) / (p.rsplit("/", 1)[-1] or "trace")
        try:
            with fs.open(p, "rb") as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        except (OSError, ValueError) as exc:
            raise InputError(url, f"cannot read ({str(exc).splitlines()[0][:200]})") from None
        yield dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def any_url(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """True when one of ``paths`` is a URL other than ``file://``."""
    return any((u := url_of(p)) is not None and local_path(u) is None for p in paths)


__all__ = ["any_url", "expand", "fetched", "local_path", "read_head", "url_of"]
