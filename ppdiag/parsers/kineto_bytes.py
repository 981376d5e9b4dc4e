"""The bytes of a Kineto trace file: gzip (and bzip2 / xz / zstd under a trace name), the
decompressed-size cap that refuses decompression bombs, and format sniffing."""

from __future__ import annotations

import math
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ppdiag.errors import InputError
from ppdiag.parsers.heap import text_buffer

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LZ4_MAGIC = b"\x04\x22\x4d\x18"
_BLANK = re.compile(rb"[\s\x00]*\Z")  # stops at the first other byte: no copy of big files


def read_bytes(path: Path) -> tuple[bytes | bytearray, list[str]]:
    """The file's JSON bytes (gunzipped when gzip), plus warnings (a cut gzip stream).

    A gzip stream cut short keeps everything that decompressed; corrupt gzip data is an error.
    A UTF-8 byte-order mark before the JSON (editors on Windows write one) is read as blanks.
    """
    data, warnings = _read_bytes(path)
    if data[:3] == _BOM:
        if isinstance(data, bytearray):
            data[:3] = b"   "  # in place: no copy of a multi-GB trace
        else:
            data = b"   " + data[3:]
    return data, warnings


_BOM = b"\xef\xbb\xbf"


def _read_bytes(path: Path) -> tuple[bytes | bytearray, list[str]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None
    if _BLANK.match(raw):
        raise InputError(str(path), "empty file")
    warnings: list[str] = []
    if raw[:4] == LZ4_MAGIC:
        raise InputError(str(path), "lz4-compressed data, not gzip or JSON; decompress it first (lz4 -d)")
    if raw[:3] == b"BZh" or raw[:6] == XZ_MAGIC or raw[:4] == ZSTD_MAGIC:
        # bzip2 / xz (standard library) or zstd (optional package) under a trace name: read, say so
        other, what = unpack_other(raw, str(path))
        warnings.append(f"{what}-compressed data under a {path.suffix or 'plain'} name: read as {what}")
        if _BLANK.match(other):
            raise InputError(str(path), f"empty file (after {what} decompression)")
        return other, warnings
    if raw[:2] == GZIP_MAGIC:
        data, cut = gunzip(raw, str(path))
        del raw
        if cut:
            warnings.append("gzip stream ends early (file cut short or damaged); kept what decompressed")
        if _BLANK.match(data):
            raise InputError(str(path), "empty file (after gunzip)")
        return data, warnings
    return raw, warnings


def zstd_module(path: str) -> Any:
    """The optional ``zstandard`` package, or an InputError naming the file and the package."""
    try:
        import zstandard
    except ImportError:
        raise InputError(
            path,
            "zstd-compressed data: reading it needs the optional 'zstandard' package "
            "(pip install zstandard), or decompress it first (zstd -d)",
        ) from None
    return zstandard


def _unzstd(raw: bytes, path: str, cap: int) -> bytes:
    """zstd data read 16 MiB at a time up to ``cap`` (a frame's claimed size is not trusted)."""
    zstandard = zstd_module(path)
    parts: list[bytes] = []
    total = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
            while True:
                out = reader.read(1 << 24)
                if not out:
                    break
                total += len(out)
                if total > cap:
                    raise InputError(
                        path,
                        f"zstd data expands past {_size(cap)} ({_size(len(raw))} compressed): refused "
                        "as a likely decompression bomb (raise the cap with PPDIAG_MAX_TRACE_GB)",
                    )
                parts.append(out)
    except zstandard.ZstdError as exc:
        raise InputError(path, f"corrupt zstd-compressed data ({exc})") from None
    return b"".join(parts)


def unpack_other(raw: bytes, path: str, limit: int | None = None) -> tuple[bytes, str]:
    """Decompress bzip2, xz or zstd data in chunks up to the cap of :func:`max_trace_bytes`;
    returns the data and the compressor's name. A cut or corrupt stream is an InputError naming
    the file."""
    import bz2
    import lzma

    cap = max_trace_bytes(len(raw)) if limit is None else limit
    if raw[:4] == ZSTD_MAGIC:
        return _unzstd(raw, path, cap), "zstd"
    what = "bzip2" if raw[:3] == b"BZh" else "xz"
    d: Any = bz2.BZ2Decompressor() if what == "bzip2" else lzma.LZMADecompressor()
    parts: list[bytes] = []
    total = 0
    try:
        out = d.decompress(raw, 1 << 24)
        while True:
            total += len(out)
            if total > cap:
                raise InputError(
                    path,
                    f"{what} data expands past {_size(cap)} ({_size(len(raw))} compressed): refused as "
                    "a likely decompression bomb (raise the cap with PPDIAG_MAX_TRACE_GB)",
                )
            parts.append(out)
            if d.eof or d.needs_input:
                break
            out = d.decompress(b"", 1 << 24)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise InputError(path, f"corrupt {what} data ({exc})") from None
    if not d.eof:
        raise InputError(path, f"{what} stream ends early (file cut short or damaged)")
    return b"".join(parts), what


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def max_trace_bytes(compressed: int) -> int:
    """The decompressed size a trace may reach: ``PPDIAG_MAX_TRACE_GB`` (default 32 GiB), and
    at most 200x its compressed size (JSON traces compress 5-50x; far more is a gzip bomb),
    never below 256 MiB. A value that is not a size (text, nan, inf, 1e400, 0 or less, over a
    million GB) is an :class:`InputError`."""
    raw = os.environ.get("PPDIAG_MAX_TRACE_GB", "").strip() or "32"
    try:
        gb = float(raw)
    except ValueError:
        gb = math.nan
    if not (math.isfinite(gb) and 0 < gb <= 1e6):
        raise InputError(None, f"PPDIAG_MAX_TRACE_GB={raw!r}: expected a size in GB, above 0 and at most 1e6")
    cap = int(gb * (1 << 30))
    return min(cap, max(1 << 28, 200 * compressed)) if compressed else cap


_IN_PIECE = 1 << 18  # compressed bytes fed per call (keeps unconsumed tails small)
_OUT_PIECE = 1 << 20  # decompressed bytes per call at most (zlib holds ~2x that while it runs)


class _Inflated:
    """The decompressed bytes, written into one buffer: sized from the gzip trailer's ISIZE when
    that is plausible (no copy of the whole trace when it is right), grown when it is not; the
    cap is checked on every write."""

    def __init__(self, raw: bytes, path: str, cap: int) -> None:
        self.path, self.cap, self.compressed = path, cap, len(raw)
        isize = int.from_bytes(raw[-4:], "little") if len(raw) >= 18 else 0
        # a cut stream's trailer is random bytes: trust it only within the cap and a ratio no
        # JSON reaches by far (the buffer is trimmed to what was written anyway)
        self.buf = text_buffer(isize if isize <= min(cap, 128 * len(raw)) else 0)
        self.n = 0

    def write(self, chunk: bytes) -> None:
        end = self.n + len(chunk)
        if end > self.cap:
            raise InputError(
                self.path,
                f"gzip data expands past {_size(self.cap)} ({_size(self.compressed)} compressed): "
                "refused as a likely gzip bomb (raise the cap with PPDIAG_MAX_TRACE_GB)",
            )
        self.buf[self.n : end] = chunk  # grows the buffer when the end is past it
        self.n = end

    def finish(self) -> bytearray:
        del self.buf[self.n :]
        return self.buf


#: Set to 1, gzip traces are inflated by zlib, not ISA-L: the two keep different tails of a cut
#: stream (a byte apart), which a truncated trace's warning counts, so both caches key it.
ISAL_ENV = "PPDIAG_NO_ISAL"
_INFLATER: tuple[Callable[[], Any], tuple[type[Exception], ...]] | None = None


def inflater() -> tuple[Callable[[], Any], tuple[type[Exception], ...]]:
    """(a gzip decompressobj factory, the errors it raises): ISA-L's (the optional ``isal``
    package, about twice zlib's speed) when it is installed, else the standard library's zlib.
    ``PPDIAG_NO_ISAL=1`` (:data:`ISAL_ENV`) keeps zlib."""
    global _INFLATER
    if _INFLATER is None:
        _INFLATER = (lambda: zlib.decompressobj(wbits=31)), (zlib.error,)
        if os.environ.get(ISAL_ENV, "") != "1":
            try:
                from isal import isal_zlib
            except ImportError:
                pass
            else:
                isal_error = cast("type[Exception]", isal_zlib.error)  # the stubs type it as an instance
                _INFLATER = (lambda: isal_zlib.decompressobj(wbits=31)), (zlib.error, isal_error)
    return _INFLATER


def _inflate_member(src: memoryview, pos: int, out: _Inflated) -> tuple[int, bool]:
    """Inflate the gzip member starting at ``src[pos]`` into ``out``; returns (offset after the
    member, whether it ended). Input goes in 256 KiB pieces, output comes out in 1 MiB pieces."""
    d = inflater()[0]()
    while pos < len(src):
        piece = src[pos : pos + _IN_PIECE]
        buf: bytes | memoryview = piece
        while True:
            chunk = d.decompress(buf, _OUT_PIECE)
            out.write(chunk)
            buf = d.unconsumed_tail
            if d.eof or (not buf and len(chunk) < _OUT_PIECE):
                break
        if d.eof:
            return pos + len(piece) - len(d.unused_data), True
        pos += len(piece)
    out.write(d.flush())
    return pos, False


def gunzip(raw: bytes, path: str, limit: int | None = None) -> tuple[bytearray, bool]:
    """Decompress all gzip members; returns (data, cut) where cut means the stream ended early.

    The data is decompressed piece by piece into one buffer (no join of parts, no second copy
    of the trace) and decompression stops at ``limit`` bytes (default :func:`max_trace_bytes`)
    with an InputError: memory stays bounded by the cap, whatever the stream claims."""
    cap = max_trace_bytes(len(raw)) if limit is None else limit
    out = _Inflated(raw, path, cap)
    src = memoryview(raw)
    pos = 0
    while pos < len(src):
        try:
            pos, ended = _inflate_member(src, pos, out)
        except inflater()[1] as exc:
            raise InputError(path, f"corrupt gzip data ({exc})") from None
        if not ended:
            return out.finish(), True
        # trailing zero padding (or other bytes) after the last member is not read
        if bytes(src[pos : pos + 2]) != GZIP_MAGIC:
            break
    return out.finish(), False


_SNIFF_KEYS = (b'"traceEvents"', b'"schemaVersion"')


def looks_like_kineto(head: bytes, name: str = "") -> bool:
    """True when ``head`` starts a JSON object that carries Kineto's top-level keys."""
    h = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not h.startswith(b"{"):
        return False
    if any(k in h for k in _SNIFF_KEYS):
        return True
    # Very long metadata (many devices / process groups) can push the keys past the head.
    return name.endswith((".pt.trace.json", ".pt.trace.json.gz"))
