"""Writes ``ppdiag/report.schema.json``: the report's JSON schema with every rule's evidence type
(``python -m ppdiag.report_schema``). It sits above the rules, which register those types."""

from __future__ import annotations

import sys

from ppdiag.report_types import SCHEMA_PATH, schema_text
from ppdiag.rules import load_builtin


def shipped_schema_text() -> str:
    """The schema file's text with every built-in rule loaded (what the shipped file must hold)."""
    load_builtin()
    return schema_text()


def main() -> int:
    """Write the schema file next to :mod:`ppdiag.report_types`."""
    SCHEMA_PATH.write_text(shipped_schema_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {SCHEMA_PATH}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
