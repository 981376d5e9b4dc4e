"""Report writers, registered by name (``json``, ``html``, ``md``, ``perfetto``, ``terminal`` ...).

A new output is one module that defines a :class:`Reporter` and calls :func:`register`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed
    from ppdiag.report_types import Report


class Reporter(Protocol):
    """Writes one kind of report file from a diagnosis."""

    name: str
    suffix: str

    def write(self, diagnosis: Analyzed, path: Path) -> None:
        """Write the report to ``path`` (parent directories exist)."""
        ...


REPORTERS: dict[str, Reporter] = {}

BUILTIN = ("json_report", "html", "md", "perfetto", "terminal")
# the module of each built-in report, so that writing one imports that one alone (the other
# reports, jinja2 among them, were ~75 ms CPU of a run that wrote only JSON)
_MODULE_OF = {
    "json": "json_report",
    "html": "html",
    "md": "md",
    "perfetto": "perfetto",
    "terminal": "terminal",
}


def register(reporter: Reporter) -> Reporter:
    REPORTERS[reporter.name] = reporter
    return reporter


def load_builtin(name: str | None = None) -> None:
    """Import the built-in reporter modules so they register themselves: only report ``name``'s
    module when it is given and built in."""
    mods = BUILTIN if name is None or name not in _MODULE_OF else (_MODULE_OF[name],)
    for mod in mods:
        if name is not None and name in REPORTERS:
            return
        try:
            importlib.import_module(f"ppdiag.reports.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"ppdiag.reports.{mod}":
                raise


def run_inputs(diagnosis: Analyzed) -> list[str]:
    """The trace files a diagnosis was read from (a report must never overwrite one)."""
    from ppdiag.analysis import context_of

    srcs = [r.source for r in diagnosis.run.ranks if r.source]
    return [*srcs, *context_of(diagnosis).inputs]


def write_report(name: str, diagnosis: Analyzed, path: str | Path, inputs: Iterable[str | Path] = ()) -> Path:
    """Write report ``name`` to ``path`` atomically through :func:`ppdiag.io.write_output`.

    Refuses the run's trace files, ``inputs`` and any existing file ppdiag did not write; an
    ``OSError`` becomes an :class:`~ppdiag.errors.InputError` naming the path. Returns the path.
    """
    from ppdiag.io import write_output

    load_builtin(name)
    reporter = REPORTERS[name]
    return write_output(path, lambda tmp: reporter.write(diagnosis, tmp), [*run_inputs(diagnosis), *inputs])


def write_result_report(
    name: str, report: Report, path: str | Path, inputs: Iterable[str | Path] = ()
) -> Path:
    """Write report ``name`` from the typed report alone (``json``, ``md``: the reporters with a
    ``write_result``), as :func:`write_report` writes it; ``inputs`` are the run's trace files and
    any other input, which it refuses as :func:`write_report` does. For a re-run served by the
    result cache (:mod:`ppdiag.result_cache`), which has no diagnosis. Raises KeyError for a
    report drawn from more than the typed report (``html``, ``perfetto``)."""
    from ppdiag.io import write_output

    load_builtin(name)
    write = getattr(REPORTERS[name], "write_result", None)
    if write is None:
        raise KeyError(f"the {name} report needs the analysis, not the report alone")
    return write_output(path, lambda tmp: write(report, tmp), list(inputs))
