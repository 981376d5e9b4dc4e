"""Option values converted without pydantic (ppdiag/cli/coercion.py) against typer's own conversion:
for every parameter of every command and every input, the same value (and type), or the same
error message. Values the plain conversion does not take go to typer's, so both must agree on
everything, accepted or refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_coercion = pytest.importorskip("typer._coercion")  # typer < 0.2x converts through click types

import typer.main as typer_main  # noqa: E402
from typer._click.core import Context  # noqa: E402
from typer._click.exceptions import BadParameter  # noqa: E402

from ppdiag.cli import app  # noqa: E402
from ppdiag.cli.coercion import PlainParam  # noqa: E402


def _params() -> list[tuple[Any, Any]]:
    """(command, parameter) of every command and sub-command that takes a value."""
    out: list[tuple[Any, Any]] = []

    def walk(cmd: Any) -> None:
        for p in cmd.params:
            if hasattr(p, "type_descriptor"):
                out.append((cmd, p))
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(typer_main.get_command(app))
    return out


PARAMS = _params()


def _outcome(runtime: Any, value: Any, cmd: Any, param: Any) -> tuple[str, Any, Any]:
    """What a conversion gives: ('ok', value, type) or ('error', message, None)."""
    try:
        v = runtime.coerce(value, param=param, ctx=Context(cmd))
    except BadParameter as exc:
        return ("error", exc.format_message(), None)
    kinds = type(v), tuple(type(x) for x in v) if isinstance(v, list | tuple) else ()
    return ("ok", repr(v), kinds)  # repr: nan equals itself


def _check(value: Any) -> None:
    for cmd, param in PARAMS:
        desc = param.type_descriptor
        multi = param.multiple or param.nargs == -1
        given_value = (value,) if multi and value is not None else value
        mine = _outcome(PlainParam(desc, _coercion.build_runtime_param), given_value, cmd, param)
        typers = _outcome(_coercion.build_runtime_param(desc), given_value, cmd, param)
        assert mine == typers, (cmd.name, param.name, value)


def test_parameters_cover_every_plain_kind() -> None:
    # the check below is only as good as the annotations it meets: int with and without a range,
    # float, str, Path, list[Path], list[str]
    kinds = {repr(p.type_descriptor.annotation) for _, p in PARAMS}
    for k in ("<class 'int'>", "<class 'float'>", "<class 'str'>", "<class 'pathlib.Path'>"):
        assert k in kinds
    assert "list[pathlib.Path]" in kinds and "list[str]" in kinds


EXISTING = str(Path(__file__))


@pytest.mark.parametrize(
    "value",
    [
        None,
        "5",
        "1",
        "0",
        "007",
        "-1",
        "+5",
        " 5",
        "5 ",
        "4096",
        "4097",  # --pp's max: typer's range error
        "1_000",
        "1e3",
        "1.5",
        "1.",
        ".5",
        "nan",
        "inf",
        "abc",
        "",
        "x\udcff",  # an undecodable argument (surrogate escape)
        "a//b/",
        "/nonexistent/dir/x.json",
        EXISTING,
        os.path.dirname(EXISTING),
        "99999999999999999999999",
        "0.30000000000000004",
        # defaults of the annotation's own type (typer converts them too): in range, out of it,
        # not finite, a bool (an int subclass), paths
        4,
        0,
        5000,
        2.0,
        0.0,
        -1.5,
        float("nan"),
        float("inf"),
        True,
        Path("ppdiag-demo"),
        Path(EXISTING),
    ],
)
def test_same_as_typer(value: Any) -> None:
    _check(value)


def test_a_string_for_a_repeated_option_is_typers_error() -> None:
    # typer refuses a bare string where a sequence is expected; the plain path leaves it to typer
    for cmd, param in PARAMS:
        if param.multiple or param.nargs == -1:
            desc = param.type_descriptor
            mine = _outcome(PlainParam(desc, _coercion.build_runtime_param), "5", cmd, param)
            assert mine == _outcome(_coercion.build_runtime_param(desc), "5", cmd, param)
            assert mine[0] == "error"


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="0123456789.-+e_ abx/", max_size=8))
def test_same_as_typer_property(value: str) -> None:
    _check(value)


def test_plain_values_do_not_build_typers_conversion() -> None:
    # the point of the plain path: typer's conversion (a pydantic TypeAdapter) is never built for
    # the values a run usually gives. The probe can fail: every value used to go through typer's
    def refuse(_desc: Any) -> Any:
        raise AssertionError("typer's conversion built")

    plain: dict[str, Any] = {"<class 'int'>": "4", "<class 'float'>": "2.5", "<class 'str'>": "0,1"}
    plain |= {"<class 'pathlib.Path'>": EXISTING, "list[str]": ("4", "8")}
    plain |= {"list[pathlib.Path]": (EXISTING, "/nonexistent/x")}
    for cmd, param in PARAMS:
        default = param.default
        if default is not None and not isinstance(default, bool | str):  # pp: int = 4, out: Path = ...
            assert PlainParam(param.type_descriptor, refuse).coerce(default, param, Context(cmd)) == default
        value = plain.get(repr(param.type_descriptor.annotation))
        if value is not None and not (param.type_descriptor.parameter_info.min or 0) > 4:
            assert PlainParam(param.type_descriptor, refuse).coerce(value, param, Context(cmd)) is not None
        assert PlainParam(param.type_descriptor, refuse).coerce(None, param, Context(cmd)) in (None, ())
