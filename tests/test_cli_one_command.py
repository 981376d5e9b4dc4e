"""The entry point's application with the named command alone (ppdiag/cli/commands.py: app_for):
which command the arguments name, and that what it prints and returns is the full
application's, for help, usage errors and bad values alike."""

from __future__ import annotations

import pytest
from conftest import TEST_DATA
from typer.testing import CliRunner

from ppdiag.cli import app
from ppdiag.cli.commands import app_for, command_named

TRACE = str(TEST_DATA / "gpu_pp_rank0.json")


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["analyze", "x"], "analyze"),
        (["--no-cache", "analyze"], "analyze"),
        (["--scheduler", "tcp://a:1", "bubble", "--pp", "2"], "bubble"),
        (["--scheduler=tcp://a:1", "--scheduler-timeout", "5", "cache", "info"], "cache"),
        (["batch"], "batch"),
        (["rules", "--help"], "rules"),
        # the full application: no command, not a command, or an option the scan does not know
        ([], None),
        (["--help", "analyze"], None),
        (["--version", "analyze"], None),
        (["analyz"], None),
        (["calc"], None),  # a module, not a command
        (["--scheduler"], None),
        (["-q", "analyze"], None),
        (["--", "analyze"], None),
    ],
)
def test_command_named(argv: list[str], name: str | None) -> None:
    assert command_named(argv) == name


def test_app_for_holds_the_named_command_alone() -> None:
    import typer
    import typer.main

    def names(application: typer.Typer) -> list[str]:
        return sorted(getattr(typer.main.get_command(application), "commands", {}))

    assert names(app_for(["bubble", "--pp", "2"])) == ["batch", "bubble"]  # calc.py registers both
    assert len(names(app)) == 9


ARGVS = [
    ["analyze", "--help"],
    ["analyze"],
    ["analyze", TRACE, "-q", "--pp", "0"],
    ["analyze", TRACE, "-q", "--jobs", "x"],
    ["analyze", TRACE, "--nope"],
    ["--no-cache", "check", "--help"],
    ["diff", TRACE],
    ["rules", "PP003"],
    ["rules", "--help"],
    ["whatif", "--help"],
    ["bubble", "--pp", "4", "-m", "8", "--json"],
    ["bubble", "--pp", "x", "-m", "8"],
    ["batch", "--help"],
    ["demo", "--help"],
    ["cache", "--help"],
    ["cache", "info", "--help"],
    ["--scheduler-timeout", "nan", "rules"],
    ["--scheduler-timeout", "5", "rules", "PP003"],
]


@pytest.mark.parametrize("argv", ARGVS, ids=[" ".join(a)[:40] for a in ARGVS])
def test_same_output_and_exit_as_the_full_application(argv: list[str]) -> None:
    runner = CliRunner()
    one = runner.invoke(app_for(argv), argv, prog_name="ppdiag")
    full = runner.invoke(app, argv, prog_name="ppdiag")
    assert (one.exit_code, one.output) == (full.exit_code, full.output)
