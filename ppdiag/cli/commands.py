"""The typer application: every command registered, in the order ``--help`` lists them, and the
global options (``--version``, ``--no-cache``, ``--scheduler``). Imported by the entry point
(:func:`ppdiag.cli.main`) only when a command needs typer to parse its options.

``app`` holds every command (``from ppdiag.cli import app``: the tests, ``--help``). The entry
point asks :func:`app_for` instead, which registers only the command the arguments name when
they name one plainly (``ppdiag [GLOBAL OPTIONS] COMMAND ...``): typer converts every registered
command's signature into a click command before it parses anything (about 20 ms for all nine), and
each command module loads its own imports. Its parse, help, errors and exit codes are the full
application's: the group, its callback and the command are the same objects; anything else
(no command, a name that is not a command, ``--help`` or another option before the command) gets
the full application.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ppdiag.cli.coercion import plain_coercion
from ppdiag.cli.help import plain_help
from ppdiag.cli.options import NoCache, Scheduler, SchedulerTimeout, use_no_cache, use_scheduler
from ppdiag.cli.support import fail
from ppdiag.version import __version__

if TYPE_CHECKING:
    app: typer.Typer

plain_help()  # values, not Python types, in --help (ppdiag/cli/help.py)
plain_coercion()  # plain option values converted without pydantic (ppdiag/cli/coercion.py)

# the command modules in the order --help lists their commands; the group callback (the global
# options) is registered between them, where typer has always had it
_BEFORE_CALLBACK = ("analyze", "check", "diff", "rules")
_AFTER_CALLBACK = ("demo", "whatif", "calc", "cache")
# the module of each command name
_MODULE_OF = {name: name for name in (*_BEFORE_CALLBACK, *_AFTER_CALLBACK)} | {
    "bubble": "calc",
    "batch": "calc",
}
_MODULE_OF.pop("calc")
# the global options that take a value (``--scheduler ADDRESS``) and the flags that do not
_GLOBAL_VALUED = ("--scheduler", "--scheduler-timeout")
_GLOBAL_FLAGS = ("--no-cache",)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ppdiag {__version__}")
        raise typer.Exit()


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


def _build(modules: Sequence[str] | None = None) -> typer.Typer:
    """The application with the commands of ``modules`` (every command when None)."""
    new = typer.Typer(
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

    def register(names: Sequence[str]) -> None:
        for name in names:
            if modules is None or name in modules:
                importlib.import_module(f"ppdiag.cli.{name}").register(new)

    register(_BEFORE_CALLBACK)
    new.callback()(_main)
    register(_AFTER_CALLBACK)
    return new


def command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` (the arguments after ``ppdiag``) runs, when only the global options
    come before it; None when anything else does, or when it names no command."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _GLOBAL_VALUED:
            i += 2
        elif arg in _GLOBAL_FLAGS or any(arg.startswith(f"{o}=") for o in _GLOBAL_VALUED):
            i += 1
        else:
            return arg if arg in _MODULE_OF else None
    return None


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The application that runs ``argv``: the named command's module alone where
    :func:`command_named` finds it, else every command."""
    name = command_named(argv)
    return _build(None if name is None else (_MODULE_OF[name],))


_APP: typer.Typer | None = None


def __getattr__(name: str) -> Any:
    # the application with every command, built when first named
    global _APP
    if name == "app":
        if _APP is None:
            _APP = _build()
        return _APP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
