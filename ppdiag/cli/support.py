"""What every command module shares: the stderr console, the one-line error exit and the report
console (the process guards of the entry point, signals and closed pipes, are in
:mod:`ppdiag.cli.guards`).

Each command module of :mod:`ppdiag.cli` owns its typer command and imports these from here (and
its options from :mod:`ppdiag.cli.options`), so no command module reaches into another's private
names, and none imports the package that registers them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console

from ppdiag.cli.guards import error_line
from ppdiag.errors import PpdiagError

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed
    from ppdiag.result_cache import Cached

err = Console(stderr=True)


def report_console() -> Console:
    """Where the terminal report goes: the terminal's width, or 140 columns in logs (CI); plain
    text (no colour, no bold) under ``NO_COLOR`` and in a pipe."""
    tty = bool(getattr(sys.stdout, "isatty", None)) and sys.stdout.isatty()
    plain = bool(os.environ.get("NO_COLOR"))
    if not tty:
        return Console(width=140, color_system=None)
    return Console(color_system=None) if plain else Console()


def echo(line: str) -> None:
    """One line on stdout (a closed pipe is handled by the stream guard of :func:`main`)."""
    from ppdiag.reports.sanitize import clean

    sys.stdout.write(clean(line) + "\n")
    sys.stdout.flush()


def write_reports(
    diag: Analyzed | Cached,
    json_out: Path | None,
    html: Path | None,
    md: Path | None,
    perfetto: Path | None,
    quiet: bool,
    inputs: list[Path | None] | None = None,
) -> None:
    """Write each report that has a path (json, html, md, perfetto), saying so unless ``quiet``;
    from a result cache hit (``diag`` a :class:`~ppdiag.result_cache.Cached`), only those drawn
    from the report alone (json, md)."""
    from ppdiag.io import qpath
    from ppdiag.reports import REPORTERS, load_builtin, write_report, write_result_report
    from ppdiag.result_cache import Cached

    ins = [p for p in inputs or [] if p is not None]
    for name, path in (("json", json_out), ("html", html), ("md", md), ("perfetto", perfetto)):
        if path is None:
            continue
        load_builtin(name)
        if name not in REPORTERS:
            raise PpdiagError(f"the {name} report is not available in this version")
        if isinstance(diag, Cached):
            write_result_report(name, diag.report, path, [*diag.sources, *ins])
        else:
            write_report(name, diag, path, ins)
        if not quiet:
            err.print(f"wrote {qpath(path)}", markup=False, highlight=False)


def fail(exc: BaseException) -> NoReturn:
    """Turn a :class:`~ppdiag.errors.PpdiagError` into one clean line on stderr and its exit code;
    re-raise anything else (a bug keeps its traceback)."""
    if isinstance(exc, PpdiagError):
        err.print(error_line(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    raise exc
