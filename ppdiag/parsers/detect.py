"""What a trace file is, by content: the head of the file (decompressed when gzip, bzip2, xz or
zstd) offered to every registered parser's ``sniff``, and a one-line reason when none takes it.
"""

from __future__ import annotations

import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError
from ppdiag.parsers import PARSERS, Parser, load_builtin

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


def formats_read() -> str:
    """Every format ppdiag reads, for the messages that say what was expected: the registered
    parsers' ``describe``, in registry order ("A, B, C or D")."""
    load_builtin()
    said = [p.describe for p in PARSERS.values()]
    return ", ".join(said[:-1]) + f" or {said[-1]}" if len(said) > 1 else "".join(said)


def trace_suffixes() -> tuple[str, ...]:
    """The file names any registered format carries (``*.json``, ``*.sqlite``, ``*.csv`` ...)."""
    load_builtin()
    return tuple(dict.fromkeys(s for p in PARSERS.values() for s in p.suffixes))


def is_trace_name(path: Path) -> bool:
    """True for names a profiler or an op table writer gives (``*.json``, ``*.json.gz``,
    ``*.sqlite``, ``*.nsys-rep``, ``*.csv``, ``*.jsonl``, ``*.parquet`` ...)."""
    return path.name.lower().endswith(trace_suffixes())


def is_table_name(path: Path) -> bool:
    """True for names only a format that holds every rank in one file gives (an op table's CSV,
    JSON Lines, Parquet): a file so named that no parser takes is not a rank the run lacks. Names
    a per-rank format shares (the Chrome op timeline's ``*.json``) are not table names."""
    load_builtin()
    name = path.name.lower()
    per_rank = tuple(s for p in PARSERS.values() if not p.holds_every_rank for s in p.suffixes)
    whole = tuple(s for p in PARSERS.values() if p.holds_every_rank for s in p.suffixes)
    return name.endswith(whole) and not name.endswith(per_rank)


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
        out: bytes = d.decompress(head, size)
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


def sniffs(parser: Parser, path: Path, head: bytes) -> bool:
    try:
        return bool(parser.sniff(path, head))
    except Exception:  # a sniffer must never break the detection of other formats
        return False
