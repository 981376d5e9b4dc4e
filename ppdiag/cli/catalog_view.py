"""The rule catalogue on the terminal (``ppdiag rules [CODE]``), without typer: the entry point
runs it directly when the command has no option to parse, so that start-up loads neither typer
nor the other commands (:mod:`ppdiag.cli.rules` is its typer command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ppdiag.errors import PpdiagError

if TYPE_CHECKING:
    from rich.console import Console


def show_rules(code: str | None, con: Console) -> None:
    """Print the catalogue of every rule and cause, or one rule's full explanation; an unknown
    ``code`` is a :class:`~ppdiag.errors.PpdiagError` (exit 2)."""
    from ppdiag.rules.catalog import cause_texts, rule_texts

    texts = {r.code: r for r in rule_texts()}
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
