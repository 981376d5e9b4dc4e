"""``ppdiag rules``: the rule catalogue, read without importing the analysis (start-up stays fast).
The text is :func:`ppdiag.cli.catalog_view.show_rules`, which the entry point also runs without
typer when there is no option to parse."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from ppdiag.cli.catalog_view import show_rules
from ppdiag.cli.support import fail


def rules(code: Annotated[str | None, typer.Argument(help="A rule code, e.g. PP003.")] = None) -> None:
    """The rule catalogue, or one rule's full explanation."""
    try:
        show_rules(code, Console())
    except Exception as exc:
        fail(exc)


def register(app: typer.Typer) -> None:
    """Add the ``rules`` command to the CLI."""
    app.command()(rules)
