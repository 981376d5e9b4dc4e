"""The report's JSON text as the standard library writes it, from msgspec's compact text.

msgspec and ``json.dumps`` write the same compact text for everything a report holds but some
floats: msgspec writes ``1e16``, ``1.5e-7`` and ``0.00004`` where the standard library (``repr``)
writes ``1e+16``, ``1.5e-07`` and ``4e-05``. :func:`stdlib_floats` rewrites those number tokens
only, found by a scan for their marks and told apart from string contents by the parity of the
unescaped quotes before them, so that the report need not be decoded and encoded again (the
decode and re-encode cost twice the encoding on a report of tens of MB).
"""

from __future__ import annotations

import re

# the characters of a JSON number token
_NUM = frozenset(b"0123456789.eE+-")
# a digit before an exponent mark; a run of backslashes before a quote
_MARK = re.compile(rb"[0-9][eE]")
_ESCAPES = re.compile(rb'(\\+)"')


def _in_string(text: bytes, at: list[int]) -> list[bool]:
    """Whether each offset ``at`` (ascending) of the JSON ``text`` lies inside a string: an odd
    number of unescaped quotes before it (a quote is escaped after an odd run of backslashes).
    Counted between one offset and the next with ``bytes.count`` and one regular expression: the
    scan runs in C, and numpy is not loaded (a re-run served from the result cache renders the
    JSON report without it). An offset is a number's first byte, never inside a backslash run."""
    out: list[bool] = []
    pos = quotes = 0
    for p in at:
        quotes += text.count(b'"', pos, p)
        # a quote right after a backslash is rare (a quote or a backslash inside a string)
        quotes -= sum(len(m.group(1)) % 2 for m in _ESCAPES.finditer(text, pos, p))
        out.append(quotes % 2 == 1)
        pos = p
    return out


def _candidates(text: bytes) -> list[tuple[int, int]]:
    """(start, end) of every number-like token the two libraries may write differently: one
    with a digit before an exponent mark, or a plain ``0.0000d`` (a magnitude in [1e-5, 1e-4)).
    Strings are not told apart here."""
    at = [m.start() for m in _MARK.finditer(text)]
    i = text.find(b"0.0000")
    while i >= 0:
        at.append(i)
        i = text.find(b"0.0000", i + 6)
    spans: list[tuple[int, int]] = []
    last = 0  # the end of the last span: a mark inside it belongs to it (each byte walked once)
    for p in sorted(at):
        if p < last:
            continue
        s = p
        while s > last and text[s - 1] in _NUM:
            s -= 1
        e = p
        while e < len(text) and text[e] in _NUM:
            e += 1
        spans.append((s, e))
        last = e
    return spans


def stdlib_floats(compact: bytes) -> bytes:
    """``compact`` (msgspec's compact JSON) with every float token written as the standard
    library writes it (``repr``): ``json.dumps(json.loads(compact), separators=(",", ":"),
    ensure_ascii=False)`` for the texts msgspec writes, without decoding them."""
    spans = _candidates(compact)
    if not spans:
        return compact
    inside = _in_string(compact, [s for s, _ in spans])
    parts: list[bytes] = []
    last = 0
    for (s, e), skip in zip(spans, inside, strict=True):
        if skip:
            continue
        parts.append(compact[last:s])
        parts.append(repr(float(compact[s:e])).encode("ascii"))
        last = e
    parts.append(compact[last:])
    return b"".join(parts)


__all__ = ["stdlib_floats"]
