"""The JSON report: the stable contract that ``check``, ``diff`` and dashboards read (docs/json.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ppdiag.report_types import Report
from ppdiag.report_types import dumps as dumps_report
from ppdiag.reports import register

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed


def dumps(report: Report) -> str:
    """The report file's text (marker first, indented), as :class:`JsonReporter` writes it."""
    from ppdiag.io import MARKER_KEY, json_marker

    # the marker goes first: later runs recognise the file as ppdiag's from its first bytes
    return dumps_report(report, {MARKER_KEY: json_marker("report")})


class JsonReporter:
    """Writes ``Diagnosis.result`` as indented JSON."""

    name = "json"
    suffix = ".json"

    def write(self, diagnosis: Analyzed, path: Path) -> None:
        self.write_result(diagnosis.result, path)

    def write_result(self, report: Report, path: Path) -> None:
        """The file from the report alone (a re-run served by the result cache has nothing else)."""
        # undecodable file-name bytes (legal on Linux) become \\udcXX escapes, not a crash
        path.write_text(dumps(report) + "\n", encoding="utf-8", errors="backslashreplace")


register(JsonReporter())
