"""Output sanitising: trace strings (file names, process and kernel names) are data, never commands.

A trace can hold any bytes in its names. On a terminal an escape sequence in a kernel name would
recolour, retitle or rewrite the screen; in a Markdown PR comment ``@name`` pings a person and a
bare ``www.`` becomes a link. :func:`clean` strips control characters and escape sequences (and
makes undecodable file-name bytes printable); :func:`clean_tree` applies it to a JSON value and
:func:`clean_report` to a whole report; :func:`md_neutral` defuses mentions and autolinks in Markdown text.
"""

from __future__ import annotations

import re
from typing import Any

from ppdiag.report_types import Report, decode, encode, from_builtins, to_builtins

# ESC [ ... final byte (CSI), ESC ] ... BEL / ST (OSC), other two-byte ESC sequences
_ESC_SEQ = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|\x9b[0-?]*[ -/]*[@-~]"
)
# C0 controls but tab and newline, DEL, C1 controls, and the bidi overrides that reorder text
_CTRL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# in a report's JSON text, whatever may hold something :func:`clean` removes: any escape (the
# encoder escapes every C0 control), and the DEL, C1, bidi and surrogate code points as UTF-8
_UNCLEAN = re.compile(b"\\\\|\x7f|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]|\xed[\xa0-\xbf]")
_ZWSP = "\u200b"
_MENTION = re.compile(r"(?<![\w`])@(?=[A-Za-z0-9])")
_WWW = re.compile(r"(?i)\bwww\.")
_SCHEME = re.compile(r"(?i)\b(https?|ftp|mailto)(:)")


def clean(s: str) -> str:
    """``s`` without escape sequences and control characters (tab and newline kept); undecodable
    bytes of file names (lone surrogates) shown as U+FFFD."""
    if not s:
        return s
    if "\x1b" in s or "\x9b" in s:
        s = _ESC_SEQ.sub("", s)
    s = _CTRL.sub("", s)
    return _SURROGATE.sub("\ufffd", s)


def clean_tree(o: Any) -> Any:
    """A copy of a JSON-like value with every string (keys included) passed through :func:`clean`."""
    if isinstance(o, str):
        return clean(o)
    if isinstance(o, dict):
        return {clean(k) if isinstance(k, str) else k: clean_tree(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean_tree(v) for v in o]
    return o


def clean_report(report: Report) -> Report:
    """A copy of a report with every string (keys included) passed through :func:`clean`."""
    text = encode(report)
    if not _UNCLEAN.search(text):
        # no string holds anything :func:`clean` would remove: the copy is the decoded text (the
        # walk over every value of a report of millions of values takes seconds)
        return decode(text)
    return from_builtins(clean_tree(to_builtins(report)))


def md_neutral(s: str) -> str:
    """Markdown text in which ``@name`` mentions and ``www.`` / ``http:`` autolinks stay plain text
    (a zero-width space breaks them; the text reads the same)."""
    s = _MENTION.sub("@" + _ZWSP, s)
    s = _WWW.sub(lambda m: m.group(0)[:3] + _ZWSP + ".", s)
    return _SCHEME.sub(lambda m: m.group(1) + _ZWSP + m.group(2), s)


__all__ = ["clean", "clean_report", "clean_tree", "md_neutral"]
