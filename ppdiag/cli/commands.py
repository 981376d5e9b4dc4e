"""The typer application: every command registered, in the order ``--help`` lists them, and the
global options (``--version``, ``--no-cache``, ``--scheduler``). Imported by the entry point
(:func:`ppdiag.cli.main`) only when a command needs typer to parse its options.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ppdiag.cli import analyze, cache, calc, check, demo, diff, rules, whatif
from ppdiag.cli.coercion import plain_coercion
from ppdiag.cli.help import plain_help
from ppdiag.cli.options import NoCache, Scheduler, SchedulerTimeout, use_no_cache, use_scheduler
from ppdiag.cli.support import fail
from ppdiag.version import __version__

plain_help()  # values, not Python types, in --help (ppdiag/cli/help.py)
plain_coercion()  # plain option values converted without pydantic (ppdiag/cli/coercion.py)

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
