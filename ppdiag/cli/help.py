"""Help text that speaks of values, not of Python types.

typer 0.2x prints each parameter's annotation in ``--help``: ``ppdiag analyze [OPTIONS] {paths}...``,
``paths... <list[Path]>``, ``--pp <int range>``, ``-m <list[str]>``. :func:`plain_help` makes the
usage line name arguments as click did (``PATHS...``, ``[CODE]``) and options show a metavar for
their value (``N``, ``X``, ``PATH``, ``TEXT``, or the one the option sets). The ranges and defaults
stay in the help text (``[1<=x<=4096]``). An older typer prints click's metavars, which name the
click type (``--pp INTEGER RANGE``): there the option's ``make_metavar`` gives the same names.
``tests/test_cli_help.py`` reads every command's ``--help``.
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
    # the click type's own name ("integer", "integer range", "float", "path", "text"), not its class
    # name: typer has path types of its own (TyperPath)
    kind = str(getattr(getattr(param, "type", None), "name", ""))
    if kind.startswith("integer"):
        return "N"
    if kind.startswith("float"):
        return "X"
    return "PATH" if kind == "path" else "TEXT"


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
    elif hasattr(opt, "make_metavar"):
        # typer before 0.2x: click's help shows the click type's name (``--pp INTEGER RANGE``);
        # only the help line calls an option's make_metavar (``ctx`` from click 8.2 on)
        def option_metavar(self: Any, ctx: Any = None) -> str:
            if self.metavar is not None:
                return str(self.metavar)
            return _value_name(self) + ("..." if self.nargs != 1 else "")

        opt.make_metavar = option_metavar
    core._ppdiag_plain_help = True  # type: ignore[attr-defined]


__all__ = ["plain_help"]
