"""Help text that speaks of values, not of Python types.

typer 0.2x prints each parameter's annotation in ``--help``: ``ppdiag analyze [OPTIONS] {paths}...``,
``paths... <list[Path]>``, ``--pp <int range>``, ``-m <list[str]>``. :func:`plain_help` makes the
usage line name arguments as click did (``PATHS...``, ``[CODE]``) and options show a metavar for
their value (``N``, ``X``, ``PATH``, ``TEXT``, or the one the option sets). The ranges and defaults
stay in the help text (``[1<=x<=4096]``). It changes typer's help methods when they exist and
leaves an older typer, which printed click's metavars, as it is. ``tests/test_cli_help.py`` reads
every command's ``--help``.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin


def _value_name(param: Any) -> str:
    """The metavar of an option's value, from its annotation (typer 0.2x, which has no click
    underneath) or, in an older typer, from the name of its click type."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        ann = desc.annotation
        inner = get_args(ann)[0] if get_origin(ann) is list and get_args(ann) else ann
        if desc.is_path:
            return "PATH"
        if inner is int:
            return "N"
        if inner is float:
            return "X"
        return "TEXT"
    kind = type(getattr(param, "type", None)).__name__  # IntParamType, IntRange, Path, ...
    if kind.startswith("Int"):
        return "N"
    if kind.startswith("Float"):
        return "X"
    return "PATH" if kind == "Path" else "TEXT"


def plain_help() -> None:
    """Patch typer's help rendering once (idempotent)."""
    import typer.core as core

    arg, opt = getattr(core, "TyperArgument", None), getattr(core, "TyperOption", None)
    if arg is None or opt is None or getattr(core, "_ppdiag_plain_help", False):
        return
    if hasattr(arg, "display_type_rich"):
        arg.display_type_rich = lambda self, ctx: None  # the help text says what the argument is

    if hasattr(arg, "_usage_display_name"):

        def usage_name(self: Any) -> str:
            name = str(self.metavar or self.name).upper()
            name = name if self.required else f"[{name}]"
            return name + ("..." if self.nargs != 1 else "")

        arg._usage_display_name = usage_name
        arg._rich_display_name = lambda self: (
            str(self.metavar or self.name).upper() + ("..." if self.nargs != 1 else "")
        )
    if hasattr(opt, "display_type_rich"):

        def option_value(self: Any, ctx: Any) -> str | None:
            if self.is_flag or self.count:
                return None
            if self.metavar is not None:
                return str(self.metavar)
            return _value_name(self)

        opt.display_type_rich = option_value
    core._ppdiag_plain_help = True  # type: ignore[attr-defined]


__all__ = ["plain_help"]
