"""Errors the CLI turns into one clear line and an exit code."""

from __future__ import annotations

import re

# characters a terminal acts on, or that split a line: a path holding one is shown repr-quoted
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\udc80-\udcff]")


def quote_path(path: str) -> str:
    """``path`` as it appears in a one-line message: ``repr``-quoted when it holds newlines,
    escapes, undecodable bytes or edge spaces (or is empty), else as is."""
    if path == "" or _UNSAFE.search(path) or path != path.strip():
        return repr(path)
    return path


class PpdiagError(Exception):
    """Base class of errors reported to the user without a traceback."""

    exit_code = 2


class InputError(PpdiagError):
    """Bad input: a file that is not a usable trace, a bad flag value, a bad budget file.

    ``str(err)`` is the one line shown to the user: ``"<path>: <problem>"``, the path quoted
    (:func:`quote_path`) when it holds anything that could split the line or drive a terminal.
    """

    def __init__(self, path: str | None, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{quote_path(path)}: {message}" if path else message)
