"""``ppdiag check``: the CI gate of a run against a bubble budget and a baseline."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ppdiag.cli.options import (
    PP,
    Hosts,
    HtmlOut,
    Jobs,
    JsonOut,
    MdOut,
    Micro,
    NoCache,
    Paths,
    Quiet,
    Sched,
    Scheduler,
    SchedulerTimeout,
    StageMap,
    Steps,
    analysis_options,
    check_targets,
    overrides_of,
    skipped_traces,
    use_no_cache,
    use_scheduler,
)
from ppdiag.cli.support import echo, err, fail, write_reports

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed
    from ppdiag.report_types import Report
    from ppdiag.reports.budget import Budget
    from ppdiag.reports.gate import GateResult
    from ppdiag.result_cache import Cached


def check(
    paths: Paths,
    budget: Annotated[
        Path, typer.Option("--budget", help="Budget TOML (or pyproject.toml with [tool.ppdiag]).")
    ],
    baseline: Annotated[Path | None, typer.Option("--baseline", help="Baseline JSON report.")] = None,
    json_out: JsonOut = None,
    html: HtmlOut = None,
    md: MdOut = None,
    pp: PP = None,
    stage_map: StageMap = None,
    hosts: Hosts = None,
    microbatches: Micro = None,
    schedule: Sched = None,
    steps: Steps = None,
    jobs: Jobs = None,
    allow_partial: Annotated[
        bool,
        typer.Option(
            "--allow-partial",
            help="Pass on partial data: missing ranks, steps or checks are noted instead of making "
            "the gate inconclusive.",
        ),
    ] = False,
    quiet: Quiet = False,
    no_cache: NoCache = False,
    scheduler: Scheduler = None,
    scheduler_timeout: SchedulerTimeout = None,
) -> None:
    """CI gate: check a run against a bubble budget and a baseline. Exit 0 pass, 1 fail, 3 inconclusive.

    Exit 0 only when every rank of the run (0..world_size-1) was traced and analysed and every
    configured check could be computed; otherwise the gate is inconclusive and says what is
    missing, unless --allow-partial.
    """
    try:
        use_no_cache(no_cache)
        use_scheduler(scheduler, scheduler_timeout)
        from ppdiag.reports import gate

        check_targets([json_out, html, md], [*paths, budget, baseline])
        bud = gate.load_budget(budget)
        base = gate.load_baseline(baseline) if baseline else None
        opts = analysis_options(quiet, pp, stage_map, hosts, microbatches, schedule, steps, jobs)
        from ppdiag.result_cache import Cached, analysis_of

        # the result cache serves a re-run (the gate judges what it keeps); --html draws the timelines
        diag = analysis_of(paths, opts, drawn=html is None)
        result = _judge(diag, bud, base, baseline, steps, allow_partial)
        import msgspec

        gated = msgspec.structs.replace(
            diag.report if isinstance(diag, Cached) else diag.result, gate=result.to_report()
        )
        diag = (
            dataclasses.replace(diag, report=gated)
            if isinstance(diag, Cached)
            else dataclasses.replace(diag, result=gated)
        )
        for line in gate.format_gate(result):
            echo(line)
        write_reports(diag, json_out, html, md, None, quiet, inputs=[*paths, budget, baseline])
    except Exception as exc:
        fail(exc)
    raise typer.Exit(result.exit_code)


def _judge(
    diag: Analyzed | Cached,
    bud: Budget,
    base: Report | None,
    baseline: Path | None,
    steps: str | None,
    allow_partial: bool,
) -> GateResult:
    """The gate's verdict on an analysis: its coverage (ranks, steps, lost events), every budget
    and baseline check, and the analysis's override warnings; partial data judged anyway is said."""
    from ppdiag.pipeline.coverage import run_coverage
    from ppdiag.reports import gate
    from ppdiag.result_cache import Cached

    if isinstance(diag, Cached):  # a re-run served by the result cache: what it kept of the run
        report, skipped, doubts, facts, overrides = (
            diag.report,
            list(diag.skipped),
            list(diag.doubts),
            diag.coverage,
            list(diag.overrides),
        )
    else:
        report, skipped, facts, overrides = (
            diag.result,
            skipped_traces(diag),
            run_coverage(diag.run),
            overrides_of(diag),
        )
        doubts = list(getattr(diag.run, "doubts", None) or [])
    cov = gate.coverage_of(report, skipped, steps)
    cov.doubts = doubts
    gate.run_gaps(cov, facts)
    result = gate.run_gate(
        report, bud, base, str(baseline) if baseline else None, coverage=cov, allow_partial=allow_partial
    )
    result.warnings += overrides
    if allow_partial and result.partial:
        note = f"the gate judged partial data ({len(result.partial)} gaps)"
        err.print(f"ppdiag: warning: --allow-partial: {note}", markup=False)
    return result


def register(app: typer.Typer) -> None:
    """Add the ``check`` command to the CLI."""
    app.command()(check)
