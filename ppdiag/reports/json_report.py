"""The JSON report: the stable contract that ``check``, ``diff`` and dashboards read (docs/json.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppdiag.reports import register

if TYPE_CHECKING:
    from ppdiag.diagnosis import Diagnosis


def _clean(o: Any) -> Any:
    """Plain JSON values: NaN/inf become null, numpy scalars become Python numbers."""
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(_clean(report), indent=2, ensure_ascii=False)


class JsonReporter:
    """Writes ``Diagnosis.report`` as indented JSON."""

    name = "json"
    suffix = ".json"

    def write(self, diagnosis: Diagnosis, path: Path) -> None:
        from ppdiag.io import MARKER_KEY, json_marker

        # the marker goes first: later runs recognise the file as ppdiag's from its first bytes
        doc = {MARKER_KEY: json_marker("report"), **diagnosis.report}
        # undecodable file-name bytes (legal on Linux) become \\udcXX escapes, not a crash
        path.write_text(dumps(doc) + "\n", encoding="utf-8", errors="backslashreplace")


register(JsonReporter())
