"""What every command module shares: the stderr console, the one-line error exit, the report
console.

``ppdiag.cli``, ``ppdiag.whatif.cli`` and ``ppdiag.demo.cli`` each own their typer commands and
import these from here, so no command module reaches into another's private names (and the main
CLI, which registers the others, is never imported back by them).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import typer
from rich.console import Console

from ppdiag.errors import PpdiagError

err = Console(stderr=True)


def report_console() -> Console:
    """Where the terminal report goes: the terminal's width, or 140 columns in logs (CI); plain
    text (no colour, no bold) under ``NO_COLOR`` and in a pipe."""
    tty = bool(getattr(sys.stdout, "isatty", None)) and sys.stdout.isatty()
    plain = bool(os.environ.get("NO_COLOR"))
    if not tty:
        return Console(width=140, color_system=None)
    return Console(color_system=None) if plain else Console()


def fail(exc: BaseException) -> NoReturn:
    """Turn a :class:`~ppdiag.errors.PpdiagError` into one clean line on stderr and its exit code;
    re-raise anything else (a bug keeps its traceback)."""
    if isinstance(exc, PpdiagError):
        from ppdiag.reports.sanitize import clean

        err.print(f"ppdiag: error: {clean(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    raise exc
