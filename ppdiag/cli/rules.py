"""``ppdiag rules``: the rule catalogue, read without importing the analysis (start-up stays fast)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from ppdiag.cli.support import fail
from ppdiag.errors import PpdiagError


def rules(code: Annotated[str | None, typer.Argument(help="A rule code, e.g. PP003.")] = None) -> None:
    """The rule catalogue, or one rule's full explanation."""
    try:
        from ppdiag.rules.catalog import cause_texts, rule_texts

        texts = {r.code: r for r in rule_texts()}
        con = Console()
        if code is None:
            from rich.table import Table

            t = Table(title="ppdiag rules")
            for c in ("code", "cause", "name", "summary"):
                t.add_column(c)
            for r in texts.values():
                t.add_row(r.code, r.cause or "-", r.name, r.summary)
            con.print(t)
            ct = Table(title="causes: the idle each kind of delay adds, in this order (they add up)")
            for c in ("cause", "definition"):
                ct.add_column(c)
            for k, definition in cause_texts():
                ct.add_row(k, definition)
            con.print(ct)
            return
        rule = texts.get(code.upper())
        if rule is None:
            raise PpdiagError(f"unknown rule {code!r}; known: {', '.join(sorted(texts))}")
        con.print(
            f"[bold]{rule.code}[/bold] {rule.name} ({rule.cause or 'configuration'})\n{rule.summary}\n",
            highlight=False,
        )
        con.print(rule.doc, markup=False, highlight=False)
    except Exception as exc:
        fail(exc)


def register(app: typer.Typer) -> None:
    """Add the ``rules`` command to the CLI."""
    app.command()(rules)
