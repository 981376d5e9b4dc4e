"""Trace parsers, registered by name. A new format is one new module that calls :func:`register`.

A parser module is named for its format with no underscore (``kineto``, ``nsys``, ``optable``,
``optimeline``); :func:`load_builtin` imports every such module of this package, in name order,
which is the order sniffers are offered a file. A format's helpers are named ``<format>_<part>``
and are imported by their parser; the package's own machinery (``loader``, ``detect``, ``pool``,
``cache`` ...) registers nothing. What the rest of ppdiag needs to know of a format (the file
names a directory scan picks up, the words of an "expected ..." message, whether one file holds
the whole run, the run format the report names) is read off the registered parsers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ppdiag.model import RankTimeline


@dataclass(frozen=True)
class ParseOptions:
    """What a parser may need beyond the file itself."""

    nsys_cache_dir: str | None = None


class Parser(Protocol):
    """A trace format: recognises its files and turns one file into one or more ranks.

    ``name`` is the registry key; ``format`` the run format the report names
    (``run.format``, checked against this registry; two forms of one format share it, as the op table and
    its Chrome timeline do). ``suffixes`` are the file names a run directory is scanned for (lower
    case; the sniffer still decides), ``describe`` says the format and its names in the messages
    that list what ppdiag reads, and ``holds_every_rank`` is true when one file is the whole run (a
    directory then holds that file alone)."""

    name: str
    format: str
    suffixes: tuple[str, ...]
    describe: str
    holds_every_rank: bool

    def sniff(self, path: Path, head: bytes) -> bool:
        """True when ``head`` (the first bytes of the file, gunzipped when gzip) is this format."""
        ...

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        """Parse one file. Raises :class:`ppdiag.errors.InputError` on unusable input."""
        ...


@runtime_checkable
class RunResolver(Protocol):
    """A parser whose files cannot decide everything alone: once every file of a run is parsed and
    ranked, the loader hands it the run's ranks (nsys: NCCL peers named by communicator ranks).
    Parsers without this method need no run-level step."""

    def resolve_run(self, ranks: list[RankTimeline]) -> list[str]:
        """Fix up ``ranks`` (sorted by rank, not yet frozen) in place; returns run-level warnings."""
        ...


PARSERS: dict[str, Parser] = {}


def register(parser: Parser) -> Parser:
    """Add ``parser`` to the registry under its name (formats are offered to sniffers in this order)."""
    PARSERS[parser.name] = parser
    return parser


def load_builtin() -> None:
    """Import every parser module of this package (a name without ``_``) so it registers itself."""
    import importlib
    import pkgutil

    import ppdiag.parsers as pkg

    global _loaded
    if _loaded:
        return
    mods = [f"ppdiag.parsers.{m}" for m in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__))]
    mods = [m for m in mods if "_" not in m.rsplit(".", 1)[-1]]
    for mod in mods:
        importlib.import_module(mod)
    # sniffed in module-name order, whichever module a caller imported first; others after
    order = {m: i for i, m in enumerate(mods)}
    ranked = sorted(PARSERS.items(), key=lambda kv: order.get(type(kv[1]).__module__, len(order)))
    PARSERS.clear()
    PARSERS.update(ranked)
    _loaded = True


_loaded = False
