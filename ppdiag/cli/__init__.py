"""Command-line interface: one module per command, each mapping its flags to :mod:`ppdiag.api`
(through the shared options of :mod:`ppdiag.cli.options`) and errors to exit codes.

Exit codes: 0 ok, 1 gate failed / regression, 2 bad input or usage, 3 inconclusive gate.

Commands, in the order ``--help`` lists them: :mod:`~ppdiag.cli.analyze`, :mod:`~ppdiag.cli.check`,
:mod:`~ppdiag.cli.diff`, :mod:`~ppdiag.cli.rules`, :mod:`~ppdiag.cli.demo`,
:mod:`~ppdiag.cli.whatif`, :mod:`~ppdiag.cli.calc` (``bubble``, ``batch``) and
:mod:`~ppdiag.cli.cache`. Each imports what its work needs when it runs, so ``ppdiag rules`` and
``--help`` load neither numpy nor the analysis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Annotated

import typer

from ppdiag.cli import analyze, cache, calc, check, demo, diff, rules, whatif
from ppdiag.cli.help import plain_help
from ppdiag.cli.options import NoCache, Scheduler, SchedulerTimeout, use_no_cache, use_scheduler
from ppdiag.cli.support import Interrupted, err, fail, guard_streams, on_signal
from ppdiag.version import __version__

plain_help()  # values, not Python types, in --help (ppdiag/cli/help.py)

app = typer.Typer(
    name="ppdiag",
    help=(
        "Pipeline-parallel training diagnosis from profiler traces: why do the GPUs wait, and what "
        "to fix first. Reads PyTorch Profiler (Kineto JSON) and Nsight Systems (SQLite) traces, one per "
        "rank. Exit codes: 0 ok, 1 gate failed, 2 bad input, 3 inconclusive gate."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


for _command in (analyze, check, diff, rules):
    _command.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ppdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    no_cache: NoCache = False,
    scheduler: Scheduler = None,
    scheduler_timeout: SchedulerTimeout = None,
) -> None:
    """ppdiag: why do the GPUs of a pipeline-parallel run wait, and what to fix first."""
    use_no_cache(no_cache)  # before any command: whatif, bubble and diff parse traces too
    try:
        use_scheduler(scheduler, scheduler_timeout)
    except Exception as exc:
        fail(exc)


for _command in (demo, whatif, calc, cache):
    _command.register(app)


def _run_plain_rules(argv: list[str]) -> bool:
    """Run ``ppdiag rules [CODE]`` without typer when it has no option to parse: typer converts
    every parameter through pydantic, whose import (~0.15 s) was half of the command's start-up.
    False where typer must parse (any option, ``--help``, extra arguments)."""
    if not argv or argv[0] != "rules" or len(argv) > 2 or any(a.startswith("-") for a in argv[1:]):
        return False
    try:
        rules.rules(argv[1] if len(argv) == 2 else None)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    return True


def main() -> None:
    """Console-script entry point."""
    guard_streams()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not the main thread (embedded use): keep the defaults
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, on_signal)
    try:
        if not _run_plain_rules(sys.argv[1:]):
            app(prog_name="ppdiag")
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        with contextlib.suppress(Exception):
            err.print("ppdiag: interrupted", highlight=False)
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
        err.print(
            f"ppdiag: internal error: {type(exc).__name__}: {exc} (set PPDIAG_DEBUG=1 for details)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(70)
