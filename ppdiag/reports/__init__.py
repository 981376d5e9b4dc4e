"""Report writers, registered by name (``json``, ``html``, ``md``, ``perfetto``, ...).

A new output is one module that defines a :class:`Reporter` and calls :func:`register`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ppdiag.diagnosis import Diagnosis


class Reporter(Protocol):
    """Writes one kind of report file from a diagnosis."""

    name: str
    suffix: str

    def write(self, diagnosis: Diagnosis, path: Path) -> None:
        """Write the report to ``path`` (parent directories exist)."""
        ...


REPORTERS: dict[str, Reporter] = {}

BUILTIN = ("json_report", "html", "md", "perfetto")


def register(reporter: Reporter) -> Reporter:
    REPORTERS[reporter.name] = reporter
    return reporter


def load_builtin() -> None:
    """Import the built-in reporter modules so they register themselves."""
    for mod in BUILTIN:
        try:
            importlib.import_module(f"ppdiag.reports.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"ppdiag.reports.{mod}":
                raise


def write_report(name: str, diagnosis: Diagnosis, path: str | Path) -> Path:
    """Write report ``name`` to ``path``; returns the path."""
    load_builtin()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    REPORTERS[name].write(diagnosis, p)
    return p
