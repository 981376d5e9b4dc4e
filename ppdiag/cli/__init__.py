"""Command-line interface: one module per command, each mapping its flags to :mod:`ppdiag.api`
(through the shared options of :mod:`ppdiag.cli.options`) and errors to exit codes.

Exit codes: 0 ok, 1 gate failed / regression, 2 bad input or usage, 3 inconclusive gate.

Commands, in the order ``--help`` lists them: :mod:`~ppdiag.cli.analyze`, :mod:`~ppdiag.cli.check`,
:mod:`~ppdiag.cli.diff`, :mod:`~ppdiag.cli.rules`, :mod:`~ppdiag.cli.demo`,
:mod:`~ppdiag.cli.whatif`, :mod:`~ppdiag.cli.calc` (``bubble``, ``batch``) and
:mod:`~ppdiag.cli.cache`, registered on the typer application ``app`` in
:mod:`ppdiag.cli.commands` (:func:`main` registers the one command its arguments name, see
:func:`ppdiag.cli.commands.app_for`). Each imports what its work needs when it runs, so ``ppdiag rules`` and
``--help`` load neither numpy nor the analysis. This package itself loads nothing of typer: its
``app`` is imported on first use, and :func:`main` runs ``ppdiag rules [CODE]`` without typer
(there is nothing to parse), so that command starts without typer, pydantic or the other commands.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from ppdiag.cli.guards import Interrupted, guard_streams, on_signal

if TYPE_CHECKING:
    from ppdiag.cli.commands import app as app


def __getattr__(name: str) -> Any:
    # the typer application, built when first named (``from ppdiag.cli import app``)
    if name == "app":
        from ppdiag.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _run_plain_rules(argv: list[str]) -> bool:
    """Run ``ppdiag rules [CODE]`` without typer when it has no option to parse: typer converts
    every parameter through pydantic, and typer with the other commands was most of the command's
    start-up. False where typer must parse (any option, ``--help``, extra arguments)."""
    if not argv or argv[0] != "rules" or len(argv) > 2 or any(a.startswith("-") for a in argv[1:]):
        return False
    from rich.console import Console

    from ppdiag.cli.catalog_view import show_rules
    from ppdiag.cli.guards import error_line
    from ppdiag.errors import PpdiagError

    try:
        show_rules(argv[1] if len(argv) == 2 else None, Console())
    except PpdiagError as exc:
        Console(stderr=True).print(error_line(exc), markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    return True


def _stderr_line(text: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(text, markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    """Console-script entry point."""
    guard_streams()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not the main thread (embedded use): keep the defaults
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, on_signal)
    try:
        if not _run_plain_rules(sys.argv[1:]):
            from ppdiag.cli.commands import app_for

            app_for(sys.argv[1:])(prog_name="ppdiag")
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        with contextlib.suppress(Exception):
            _stderr_line("ppdiag: interrupted")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # Leave now: the workers are gone and every partial output was removed while unwinding;
        # the interpreter's exit handlers would join the pool's helper threads, which on a loaded
        # host takes seconds and may report on the pipes closed under them.
        os._exit(128 + int(signum))
    except Exception as exc:
        if os.environ.get("PPDIAG_DEBUG"):
            raise
        _stderr_line(f"ppdiag: internal error: {type(exc).__name__}: {exc} (set PPDIAG_DEBUG=1 for details)")
        sys.exit(70)
