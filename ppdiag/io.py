"""Every file ppdiag writes goes through :func:`write_output`; :func:`is_own_output` recognises them.

A report must never cost the user a file: the writer refuses the run's own inputs and any existing
file that ppdiag did not write, writes a temporary file in the target's directory and renames it
over the target only once it is complete (a full disk or a crash leaves the old file intact), and
turns every ``OSError`` into one :class:`~ppdiag.errors.InputError` line naming the path.

ppdiag's outputs carry a marker so that later runs can tell them from user files and traces:
``"ppdiag": {"kind": ...}`` as the first key of a JSON object, ``<meta name="generator"
content="ppdiag ...">`` in HTML, and a ``<!-- ppdiag:KIND -->`` first line in Markdown. This module
sits below every layer (parsers read the markers to skip ppdiag's outputs in a run directory).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError, quote_path

MARKER_KEY = "ppdiag"
HTML_GENERATOR = "ppdiag"
# how far into a file the marker may sit (HTML head, gzip-compressed JSON)
_SNIFF_BYTES = 1 << 14
_JSON_MARK = re.compile(rb'^\s*\{\s*"ppdiag"\s*:\s*\{\s*"kind"\s*:\s*"([A-Za-z0-9_.-]+)"')
_HTML_MARK = re.compile(rb'<meta\s+name="generator"\s+content="ppdiag[ "]')
_MD_MARK = re.compile(rb"(?:^|\n)<!-- ppdiag:([A-Za-z0-9_.-]+) -->\s*\Z")


def json_marker(kind: str) -> dict[str, Any]:
    """The value of the ``"ppdiag"`` key that marks a JSON output of ``kind``."""
    return {"kind": kind}


def md_marker(kind: str = "md") -> str:
    """The last line of a Markdown output (an HTML comment: invisible once rendered)."""
    return f"<!-- ppdiag:{kind} -->"


def html_marker() -> str:
    """The ``<meta>`` tag that marks an HTML output."""
    from ppdiag.version import __version__

    return f'<meta name="generator" content="{HTML_GENERATOR} {__version__}">'


def qpath(path: str | os.PathLike[str] | None) -> str:
    """A path as it appears in a one-line message: ``repr``-quoted when it holds anything a terminal
    would act on (newlines, escapes, undecodable bytes), else as is (see
    :func:`ppdiag.errors.quote_path`)."""
    s = os.fspath(path) if path is not None else ""
    if isinstance(s, bytes):  # pragma: no cover - ppdiag passes str paths only
        s = os.fsdecode(s)
    return quote_path(s)


def _tail(path: Path, size: int = 256) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        fh.seek(max(0, end - size))
        return fh.read(size)


def _head(path: Path, size: int = _SNIFF_BYTES) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(size)
    if head[:2] == b"\x1f\x8b":
        try:
            d = zlib.decompressobj(wbits=31)
            return d.decompress(head, size)
        except zlib.error:
            return b""
    return head


def output_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind of ppdiag output ``path`` is (``"report"``, ``"perfetto"``, ``"html"``, ...), or None
    when it is not one (or cannot be read)."""
    try:
        p = Path(path)
        if not p.is_file():
            return None
        head = _head(p).removeprefix(b"\xef\xbb\xbf")
        m = _JSON_MARK.match(head)
        if m:
            return m.group(1).decode()
        if _HTML_MARK.search(head):
            return "html"
        m = _MD_MARK.search(_tail(p))
        if m:
            return m.group(1).decode()
    except OSError:
        return None
    return None


def is_own_output(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a file that ppdiag wrote (it carries ppdiag's marker)."""
    return output_kind(path) is not None


def _same_file(a: Path, b: Path) -> bool:
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _oserror(path: Path, exc: OSError, what: str = "cannot write") -> InputError:
    why = exc.strerror or type(exc).__name__
    if isinstance(exc, IsADirectoryError):
        why = "is a directory"
    elif isinstance(exc, NotADirectoryError):
        why = "a parent of the path is not a directory"
    return InputError(qpath(path), f"{what}: {why}")


def check_target(path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Validate an output path before any work: not empty, not an option's spelling, not an input
    of this run, not a directory, not an existing file that ppdiag did not write. Returns it as a
    :class:`Path`."""
    raw = os.fspath(path)
    if raw == "":
        raise InputError(qpath(raw), "empty output path")
    if raw.startswith("-"):
        # ``--json --no-cache`` gives --json the next option as its file: refuse it rather than
        # write a report named after an option and silently drop the option the user meant
        raise InputError(
            qpath(raw),
            "looks like an option, not an output path: the option before it takes a file "
            f"(write ./{raw} for a file of that name)",
        )
    p = Path(raw)
    for src in inputs:
        if src is not None and _same_file(p, Path(src)):
            raise InputError(
                qpath(p), "is an input of this run; refusing to overwrite it (choose another output path)"
            )
    try:
        st = p.stat()
    except FileNotFoundError:
        return p
    except OSError as exc:
        raise _oserror(p, exc) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(qpath(p), "is a directory; give a file path for the report")
    if stat.S_ISREG(st.st_mode) and st.st_size > 0 and not is_own_output(p):
        raise InputError(
            qpath(p),
            "exists and was not written by ppdiag; refusing to overwrite it (remove it or choose "
            "another path)",
        )
    return p


def write_output(
    path: str | os.PathLike[str],
    fill: Callable[[Path], Any],
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Write one output file through ``fill(tmp_path)`` and rename it onto ``path`` atomically.

    ``fill`` writes the complete file at the temporary path it is given (same directory as
    ``path``, so the rename never crosses file systems). Paths that are not regular files
    (``/dev/null``, a FIFO) are written in place. Raises :class:`InputError` naming ``path`` for a
    refused target or any ``OSError``; the temporary file never survives a failure.
    """
    p = check_target(path, inputs)
    parent = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _oserror(p, exc, "cannot create the output directory") from None
    try:
        special = p.exists() and not p.is_file()
    except OSError:
        special = False
    if special:
        try:
            fill(p)
        except OSError as exc:
            raise _oserror(p, exc) from None
        return p
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(dir=parent, prefix=f".{p.name[:64]}.", suffix=".ppdiag-tmp")
        os.close(fd)
        tmp = Path(name)
        fill(tmp)
        # mkstemp makes the file 0600: give it the mode an ordinary new file would have
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        raise _oserror(p, exc) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return p


def write_text(
    path: str | os.PathLike[str], text: str, inputs: Iterable[str | os.PathLike[str]] = ()
) -> Path:
    """:func:`write_output` for a text already in memory (UTF-8; undecodable file-name bytes that
    reached the text are written as ``\\udcXX`` escapes instead of failing)."""

    def fill(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(text)

    return write_output(path, fill, inputs)


__all__ = [
    "MARKER_KEY",
    "check_target",
    "html_marker",
    "is_own_output",
    "json_marker",
    "md_marker",
    "output_kind",
    "qpath",
    "write_output",
    "write_text",
]
