"""``ppdiag cache info`` and ``ppdiag cache clear``: the parse cache (:mod:`ppdiag.parsers.cache`)."""

from __future__ import annotations

import typer


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def register(app: typer.Typer) -> None:
    """Add the ``cache`` command group to the ppdiag app."""
    group = typer.Typer(
        help="The parse cache: parsed traces kept for re-runs (PPDIAG_CACHE_DIR sets where).",
        no_args_is_help=True,
        add_completion=False,
    )

    @group.command("info")
    def info_cmd() -> None:
        """Where the parse cache is, how many traces it holds, and its size."""
        from ppdiag.parsers import cache

        i = cache.info()
        state = "" if cache.enabled() else " (disabled: PPDIAG_NO_CACHE is set)"
        typer.echo(f"parse cache: {i.path}{state}")
        typer.echo(f"entries: {i.entries}, {_size(i.bytes)}")

    @group.command("clear")
    def clear_cmd() -> None:
        """Remove every parse-cache entry (the traces themselves are never touched)."""
        from ppdiag.parsers import cache

        n = cache.clear()
        typer.echo(f"removed {n} cached parse{'s' if n != 1 else ''} from {cache.cache_dir()}")

    app.add_typer(group, name="cache")
