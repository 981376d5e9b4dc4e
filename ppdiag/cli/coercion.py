"""Option values converted without pydantic where the conversion is plain.

typer 0.2x converts every parameter through a pydantic ``TypeAdapter`` that it builds on first use,
for an option left at its default as much as for one given: importing pydantic and building the
adapters of ``analyze``'s options was about 0.05 s of every command's start-up (a third of a warm
``analyze`` before the analysis). :func:`plain_coercion` makes typer's parameters convert the
values whose result is not in doubt themselves, the same value pydantic returns:

- an option not given (``None``: ``None``, or ``()`` for a repeated option or variadic argument),
  or left at a default of its own type (``4``, ``2.0``, ``Path("out")``) within its range;
- ``str``, as given; ``int``, written in decimal digits, within the option's ``min``/``max``;
  ``float``, written as ``123`` or ``1.5``; ``Path``, a non-empty name that is missing, or present
  and readable (typer's path checks with the defaults ppdiag uses); a ``list`` of these.

Anything else (a bad number, one out of range, an unreadable file, an unusual spelling) goes to
typer's own conversion, which builds the adapter then: its error messages and exit codes are
typer's, unchanged. A typer without this conversion layer (``typer < 0.2x``, which converts through
click types) is left as it is. ``tests/test_cli_coercion.py`` checks both paths against typer's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# what `_plain` returns for a value it leaves to typer
_TYPER = object()


def _digits(text: str) -> bool:
    """``0`` or up to 18 ASCII digits without a leading zero (no sign, space, ``_`` or exponent)."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit() and (text == "0" or text[0] != "0")


def _decimal(text: str) -> bool:
    """Digits as :func:`_digits`, optionally a point and up to 17 more digits (``30``, ``1.5``)."""
    whole, point, frac = text.partition(".")
    return _digits(whole) and (not point or (0 < len(frac) <= 17 and frac.isascii() and frac.isdigit()))


def _plain_path(path: Path, info: Any) -> Any:
    """``path`` where typer's path checks would pass with ppdiag's (default) path flags."""
    try:
        os.stat(path)
    except OSError:
        return path  # a missing path is accepted: no option asks it to exist
    # typer's default readable=True: an unreadable one is its error message
    return path if os.access(path, os.R_OK) or not info.readable else _TYPER


def _in_range(number: float, info: Any) -> bool:
    lo, hi = info.min, info.max
    return not ((lo is not None and number < lo) or (hi is not None and number > hi))


def _plain_default(annotation: Any, info: Any, value: Any) -> Any:
    """A default of the annotation's own type (``pp: int = 4``, ``out: Path = Path(...)``): the
    value itself where typer's adapter returns it unchanged, else ``_TYPER``."""
    if annotation is int and type(value) is int:  # not a bool, an int subclass
        return value if _in_range(value, info) else _TYPER
    if annotation is float and type(value) is float:
        return value if math.isfinite(value) and _in_range(value, info) else _TYPER
    if annotation is Path and isinstance(value, Path):
        return _plain_path(value, info) if "\x00" not in str(value) else _TYPER
    return _TYPER


def _plain_leaf(annotation: Any, info: Any, value: Any) -> Any:
    """The value typer's adapter gives ``value`` (a command-line string, or a default of the
    annotation's type) for a plain annotation, or ``_TYPER``."""
    if not isinstance(value, str):
        return _plain_default(annotation, info, value)
    try:
        value.encode("utf-8")  # surrogate escapes of undecodable arguments: typer's to convert
    except UnicodeEncodeError:
        return _TYPER
    if annotation is str:
        return value
    if annotation is int:
        if not _digits(value):
            return _TYPER
        number = int(value)
        return number if _in_range(number, info) else _TYPER
    if annotation is float:
        if not _decimal(value):
            return _TYPER
        real = float(value)
        return real if _in_range(real, info) else _TYPER
    if annotation is Path:
        return _plain_path(Path(value), info) if value and "\x00" not in value else _TYPER
    return _TYPER


def _is_plain(descriptor: Any) -> bool:
    """Whether the parameter has none of the settings that change typer's conversion (a parser,
    click type, clamp, file or path flags other than the defaults)."""
    info = descriptor.parameter_info
    if descriptor.file_annotation is not None or getattr(info, "parser", None) is not None:
        return False
    if getattr(info, "click_type", None) is not None or getattr(info, "clamp", False):
        return False
    path_flags = ("exists", "writable", "resolve_path", "allow_dash", "path_type")
    if any(getattr(info, flag, None) for flag in path_flags):
        return False
    return getattr(info, "file_okay", True) is True and getattr(info, "dir_okay", True) is True


def _plain(descriptor: Any, value: Any) -> Any:
    """The converted ``value`` of a given parameter, or ``_TYPER``."""
    annotation = descriptor.annotation
    if getattr(annotation, "__origin__", None) is list:
        (item,) = annotation.__args__
        if not isinstance(value, (list, tuple)):
            return _TYPER
        out = [_plain_leaf(item, descriptor.parameter_info, v) for v in value]
        return _TYPER if any(v is _TYPER for v in out) else out
    return _plain_leaf(annotation, descriptor.parameter_info, value)


class PlainParam:
    """A parameter's conversion: plain values here, the rest by typer's own (built on first need)."""

    def __init__(self, descriptor: Any, build: Callable[[Any], Any]) -> None:
        self._descriptor = descriptor
        self._build = build
        self._typer: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        """What typer's ``RuntimeParam.coerce`` returns for ``value``."""
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None  # typer's RuntimeParam.coerce, before any conversion
        if not (multi and isinstance(value, str)):
            plain = _plain(self._descriptor, value)
            if plain is not _TYPER:
                return plain
        if self._typer is None:
            self._typer = self._build(self._descriptor)
        return self._typer.coerce(value, param=param, ctx=ctx)


def plain_coercion() -> None:
    """Make typer's parameters convert plain values without pydantic (once; idempotent). Leaves a
    typer without ``get_runtime_param`` (older versions, click types) as it is."""
    try:
        import typer.core as core
        from typer._coercion import build_runtime_param
    except ImportError:
        return
    cls = getattr(core, "_TyperParameter", None)
    if cls is None or not hasattr(cls, "get_runtime_param") or getattr(core, "_ppdiag_plain_coercion", False):
        return

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            desc, build = self.type_descriptor, build_runtime_param
            self._runtime_param = PlainParam(desc, build) if _is_plain(desc) else build(desc)
        return self._runtime_param

    cls.get_runtime_param = get_runtime_param
    core._ppdiag_plain_coercion = True  # type: ignore[attr-defined]


__all__ = ["PlainParam", "plain_coercion"]
