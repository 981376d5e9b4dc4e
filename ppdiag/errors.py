"""Errors the CLI turns into one clear line and an exit code."""

from __future__ import annotations


class PpdiagError(Exception):
    """Base class of errors reported to the user without a traceback."""

    exit_code = 2


class InputError(PpdiagError):
    """Bad input: a file that is not a usable trace, a bad flag value, a bad budget file.

    ``str(err)`` is the one line shown to the user: ``"<path>: <problem>"``.
    """

    def __init__(self, path: str | None, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)
