"""``ppdiag cache info`` and ``ppdiag cache clear``: the parse cache (:mod:`ppdiag.parsers.cache`)
and the result cache (:mod:`ppdiag.result_cache`), which share one folder."""

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
        help="The caches of re-runs: parsed traces (the parse cache) and the reports of whole analyses "
        "(the result cache), in one folder (PPDIAG_CACHE_DIR sets where; --no-cache or PPDIAG_NO_CACHE=1 "
        "turns both off).",
        no_args_is_help=True,
        add_completion=False,
    )

    @group.command("info")
    def info_cmd() -> None:
        """Where the caches are, how many parsed traces and reports they hold, and their size."""
        import ppdiag.result_cache as result_cache
        from ppdiag.parsers import cache

        i = cache.info()
        state = "" if cache.enabled() else " (disabled: PPDIAG_NO_CACHE is set)"
        typer.echo(f"parse cache: {i.path}{state}")
        typer.echo(f"entries: {i.entries}, {_size(i.bytes)}")
        n, size = result_cache.info()
        typer.echo(f"result cache: {n} report{'s' if n != 1 else ''}, {_size(size)}")

    @group.command("clear")
    def clear_cmd() -> None:
        """Remove every parse-cache and result-cache entry (the traces themselves are never touched)."""
        import ppdiag.result_cache as result_cache
        from ppdiag.parsers import cache

        n = cache.clear()
        typer.echo(f"removed {n} cached parse{'s' if n != 1 else ''} from {cache.cache_dir()}")
        r = result_cache.clear()
        typer.echo(f"removed {r} cached report{'s' if r != 1 else ''}")

    app.add_typer(group, name="cache")
