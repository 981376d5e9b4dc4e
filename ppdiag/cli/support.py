"""What every command module shares: the stderr console, the one-line error exit, the report
console, and the process guards of the entry point (signals, closed pipes).

Each command module of :mod:`ppdiag.cli` owns its typer command and imports these from here (and
its options from :mod:`ppdiag.cli.options`), so no command module reaches into another's private
names, and none imports the package that registers them.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from ppdiag.errors import PpdiagError

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed

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
    diag: Analyzed,
    json_out: Path | None,
    html: Path | None,
    md: Path | None,
    perfetto: Path | None,
    quiet: bool,
    inputs: list[Path | None] | None = None,
) -> None:
    """Write each report that has a path (json, html, md, perfetto), saying so unless ``quiet``."""
    from ppdiag.io import qpath
    from ppdiag.reports import REPORTERS, load_builtin, write_report

    ins = [p for p in inputs or [] if p is not None]
    for name, path in (("json", json_out), ("html", html), ("md", md), ("perfetto", perfetto)):
        if path is None:
            continue
        load_builtin(name)
        if name not in REPORTERS:
            raise PpdiagError(f"the {name} report is not available in this version")
        write_report(name, diag, path, ins)
        if not quiet:
            err.print(f"wrote {qpath(path)}", markup=False, highlight=False)


def fail(exc: BaseException) -> NoReturn:
    """Turn a :class:`~ppdiag.errors.PpdiagError` into one clean line on stderr and its exit code;
    re-raise anything else (a bug keeps its traceback)."""
    if isinstance(exc, PpdiagError):
        from ppdiag.reports.sanitize import clean

        err.print(f"ppdiag: error: {clean(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    raise exc


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. Not a KeyboardInterrupt: click would turn that into "Aborted!"
    and exit 1, the gate-failed code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def on_signal(signum: int, _frame: Any) -> None:
    # ignore repeats while the cleanup (terminating parse workers) runs
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


class SafeStream:
    """stdout/stderr that survive a closed pipe (``ppdiag check ... | head -1``): the first EPIPE
    points the descriptor at /dev/null and later writes are dropped, so the command still ends with
    its own exit code (click would exit 1, the gate-failed code). Text the stream's encoding cannot
    hold (an ASCII-only locale) is replaced, not raised."""

    def __init__(self, stream: Any) -> None:
        self._s = stream
        self._broken = False

    def _drop(self) -> None:
        self._broken = True
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, self._s.fileno())
            os.close(fd)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if self._broken:
            return len(text)
        try:
            return int(self._s.write(text))
        except UnicodeEncodeError:
            enc = getattr(self._s, "encoding", None) or "ascii"
            try:
                return int(self._s.write(text.encode(enc, "replace").decode(enc, "replace")))
            except BrokenPipeError:
                self._drop()
                return len(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        if self._broken:
            return
        try:
            self._s.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def guard_streams() -> None:
    """A closed stdout/stderr (``>&-``) becomes /dev/null; open ones get :class:`SafeStream`."""
    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if s is None or getattr(s, "closed", False):
            s = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        if not isinstance(s, SafeStream):
            setattr(sys, name, SafeStream(s))
