"""``ppdiag analyze``: the terminal report of a run, and its JSON, HTML, Markdown and Perfetto files.

The command maps its flags to :class:`ppdiag.api.Options` (:func:`ppdiag.cli.options.analysis_options`)
and calls :func:`ppdiag.result_cache.analysis_of`: the same run analysed again with the same flags
by the same code is served from the result cache without the analysis (unless ``--html`` or
``--perfetto`` asks for what only the analysis holds), any other run goes to
:func:`ppdiag.api.diagnose`, where everything the analysis checks and warns about happens.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ppdiag.cli.options import (
    PP,
    TP,
    GlobalBatch,
    Hosts,
    HtmlOut,
    Jobs,
    JsonOut,
    MdOut,
    Micro,
    MicroBatch,
    NoCache,
    Paths,
    PerfettoOut,
    Quiet,
    Sched,
    Scheduler,
    SchedulerTimeout,
    StageMap,
    Steps,
    analysis_options,
    check_targets,
    overrides_of,
    use_no_cache,
    use_scheduler,
)
from ppdiag.cli.support import err, fail, report_console, write_reports


def analyze(
    paths: Paths,
    json_out: JsonOut = None,
    html: HtmlOut = None,
    md: MdOut = None,
    perfetto: PerfettoOut = None,
    pp: PP = None,
    stage_map: StageMap = None,
    hosts: Hosts = None,
    microbatches: Micro = None,
    schedule: Sched = None,
    steps: Steps = None,
    global_batch: GlobalBatch = None,
    micro_batch: MicroBatch = None,
    tp: TP = None,
    jobs: Jobs = None,
    ranks: Annotated[bool, typer.Option("--ranks/--no-ranks", help="Show the per-rank table.")] = True,
    wide: Annotated[
        bool,
        typer.Option(
            "--wide", help="Every cause column in the terminal tables (default: when the terminal is wide)."
        ),
    ] = False,
    quiet: Quiet = False,
    no_cache: NoCache = False,
    scheduler: Scheduler = None,
    scheduler_timeout: SchedulerTimeout = None,
) -> None:
    """Analyze a run: time accounting per rank, lost time by cause, findings with fixes."""
    try:
        use_no_cache(no_cache)
        use_scheduler(scheduler, scheduler_timeout)
        check_targets([json_out, html, md, perfetto], list(paths))
        opts = analysis_options(
            quiet,
            pp,
            stage_map,
            hosts,
            microbatches,
            schedule,
            steps,
            jobs,
            global_batch,
            micro_batch,
            tp,
            checked=False,
        )
        from ppdiag.result_cache import Cached, analysis_of

        diag = analysis_of(paths, opts, drawn=html is None and perfetto is None)
        for w in diag.overrides if isinstance(diag, Cached) else overrides_of(diag):
            err.print(f"ppdiag: warning: {w}", markup=False, highlight=False, soft_wrap=True)
        if not quiet:
            from ppdiag.reports.terminal import render

            if isinstance(diag, Cached):
                render(diag.shown, report_console(), ranks=ranks, wide=wide or None, cleaned=True)
            else:
                render(diag.result, report_console(), ranks=ranks, wide=wide or None)
        write_reports(diag, json_out, html, md, perfetto, quiet, inputs=list(paths))
    except Exception as exc:
        fail(exc)


def register(app: typer.Typer) -> None:
    """Add the ``analyze`` command to the CLI."""
    app.command()(analyze)
