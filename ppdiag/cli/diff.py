"""``ppdiag diff``: what changed between two runs (run directories or JSON reports)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from ppdiag.cli.options import JsonOut, check_targets
from ppdiag.cli.support import err, fail

if TYPE_CHECKING:
    from ppdiag.report_types import Report


def diff(
    base: Annotated[Path, typer.Argument(help="Baseline: run directory or JSON report.")],
    new: Annotated[Path, typer.Argument(help="New run: run directory or JSON report.")],
    json_out: JsonOut = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            min=0.0,
            help="Step-time growth (%) beyond which the new run is a regression: exit 1 "
            "(default: the gate's step_pct, 5).",
        ),
    ] = None,
) -> None:
    """What changed between two runs: step time and each cause, per stage, before vs after.
    Exit 1 when the step time grew beyond --threshold %, else 0."""
    try:
        from ppdiag.reports import diff as diffmod
        from ppdiag.reports.gate import DEFAULT_STEP_PCT

        if json_out is not None:
            check_targets([json_out], [base, new])
        a = _report_of(base)
        b = _report_of(new)
        result = diffmod.diff_reports(
            a, b, threshold_pct=threshold if threshold is not None else DEFAULT_STEP_PCT
        )
        Console().print(diffmod.render_diff(result))
        if json_out is not None:
            import json

            from ppdiag.io import MARKER_KEY, json_marker, write_text

            doc = {MARKER_KEY: json_marker("diff"), **result.to_json()}
            write_text(json_out, json.dumps(doc, indent=2, ensure_ascii=False) + "\n", [base, new])
    except Exception as exc:
        fail(exc)
    if result.regression is not None:
        err.print(f"ppdiag: regression: {result.regression}", markup=False, highlight=False)
        raise typer.Exit(1)


def _report_of(path: Path) -> Report:
    """A JSON report (decoded into its types), or a run directory analyzed now."""
    if path.is_file() and path.suffix == ".json":
        from ppdiag.reports.gate import load_report

        return load_report(path)
    from ppdiag.api import Options, diagnose

    return diagnose([path], Options()).result


def register(app: typer.Typer) -> None:
    """Add the ``diff`` command to the CLI."""
    app.command()(diff)
