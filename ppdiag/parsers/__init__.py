"""Trace parsers, registered by name. A new format is one new module that calls :func:`register`."""

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
    """A trace format: recognises its files and turns one file into one or more ranks."""

    name: str

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
    """Import the built-in parser modules so they register themselves."""
    import importlib

    for mod in ("kineto", "nsys", "optable"):
        try:
            importlib.import_module(f"ppdiag.parsers.{mod}")
        except ModuleNotFoundError as exc:  # a format module not written yet
            if exc.name != f"ppdiag.parsers.{mod}":
                raise
