"""Command-line interface. It only maps flags to :mod:`ppdiag.api` and errors to exit codes.

Exit codes: 0 ok, 1 gate failed / regression, 2 bad input or usage, 3 inconclusive gate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from ppdiag.cli_help import plain_help
from ppdiag.cli_inputs import (
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
    check_targets,
    checked,
    override_warnings,
    skipped_traces,
    use_no_cache,
    use_scheduler,
)
from ppdiag.cli_support import Interrupted, err, guard_streams, on_signal, report_console
from ppdiag.cli_support import fail as _fail
from ppdiag.errors import PpdiagError
from ppdiag.version import __version__

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed
    from ppdiag.api import Options
    from ppdiag.report_types import Report
    from ppdiag.reports.budget import Budget
    from ppdiag.reports.gate import GateResult

plain_help()  # values, not Python types, in --help (ppdiag/cli_help.py)

app = typer.Typer(
    name="ppdiag",
    help=(
        "Pipeline-parallel training diagnosis from profiler traces: why do the GPUs wait, and what "
        "to fix first. Reads PyTorch Profiler (Kineto JSON) and Nsight Systems (SQLite) traces, one per "
        "rank. Exit codes: 0 ok, 1 gate failed, 2 bad input, 3 inconclusive gate."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def echo(line: str) -> None:
    """One line on stdout (a closed pipe is handled by the stream guard of :func:`main`)."""
    from ppdiag.reports.sanitize import clean

    sys.stdout.write(clean(line) + "\n")
    sys.stdout.flush()


def _progress_enabled(quiet: bool) -> bool:
    return not quiet and err.is_terminal


def _analyze(paths: list[Path], opts: Options, quiet: bool) -> Analyzed:
    from ppdiag.api import diagnose

    return diagnose(paths, opts)


def _write_reports(
    diag: Analyzed,
    json_out: Path | None,
    html: Path | None,
    md: Path | None,
    perfetto: Path | None,
    quiet: bool,
    inputs: list[Path | None] | None = None,
) -> None:
    from ppdiag.io import qpath
    from ppdiag.reports import REPORTERS, load_builtin, write_report

    load_builtin()
    ins = [p for p in inputs or [] if p is not None]
    for name, path in (("json", json_out), ("html", html), ("md", md), ("perfetto", perfetto)):
        if path is None:
            continue
        if name not in REPORTERS:
            raise PpdiagError(f"the {name} report is not available in this version")
        write_report(name, diag, path, ins)
        if not quiet:
            err.print(f"wrote {qpath(path)}", markup=False, highlight=False)


@app.command()
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
        from ppdiag.api import Options

        opts = checked(
            Options(
                pp=pp,
                stage_map=stage_map,
                hosts=hosts,
                microbatches=microbatches,
                schedule=schedule,
                steps=steps,
                global_batch=global_batch,
                micro_batch=micro_batch,
                tp=tp,
                jobs=jobs,
                progress=_progress_enabled(quiet),
            )
        )
        diag = _analyze(paths, opts, quiet)
        for w in override_warnings(diag):
            err.print(f"ppdiag: warning: {w}", markup=False, highlight=False, soft_wrap=True)
        if not quiet:
            from ppdiag.reports.terminal import render

            render(diag.result, report_console(), ranks=ranks, wide=wide or None)
        _write_reports(diag, json_out, html, md, perfetto, quiet, inputs=list(paths))
    except Exception as exc:
        _fail(exc)


@app.command()
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
        from ppdiag.api import Options

        opts = checked(
            Options(
                pp=pp,
                stage_map=stage_map,
                hosts=hosts,
                microbatches=microbatches,
                schedule=schedule,
                steps=steps,
                jobs=jobs,
                progress=_progress_enabled(quiet),
            )
        )
        diag = _analyze(paths, opts, quiet)
        result = _judge(diag, opts, bud, base, baseline, steps, allow_partial)
        import msgspec

        diag = dataclasses.replace(diag, result=msgspec.structs.replace(diag.result, gate=result.to_report()))
        for line in gate.format_gate(result):
            echo(line)
        _write_reports(diag, json_out, html, md, None, quiet, inputs=[*paths, budget, baseline])
    except Exception as exc:
        _fail(exc)
    raise typer.Exit(result.exit_code)


def _judge(
    diag: Analyzed,
    opts: Options,
    bud: Budget,
    base: Report | None,
    baseline: Path | None,
    steps: str | None,
    allow_partial: bool,
) -> GateResult:
    """The gate's verdict on an analysis: its coverage (ranks, steps, lost events), every budget
    and baseline check, and the analysis's override warnings; partial data judged anyway is said."""
    from ppdiag.reports import gate

    cov = gate.coverage_of(diag.result, skipped_traces(diag), steps)
    cov.doubts = list(getattr(diag.run, "doubts", None) or [])
    gate.run_gaps(cov, diag.run)
    result = gate.run_gate(
        diag.result, bud, base, str(baseline) if baseline else None, coverage=cov, allow_partial=allow_partial
    )
    result.warnings += override_warnings(diag)
    if allow_partial and result.partial:
        note = f"the gate judged partial data ({len(result.partial)} gaps)"
        err.print(f"ppdiag: warning: --allow-partial: {note}", markup=False)
    return result


@app.command()
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
        _fail(exc)
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


@app.command()
def rules(code: Annotated[str | None, typer.Argument(help="A rule code, e.g. PP003.")] = None) -> None:
    """The rule catalogue, or one rule's full explanation."""
    try:
        from ppdiag.rules.catalog import cause_texts, rule_texts

        texts = {r.code: r for r in rule_texts()}
        con = Console()
        if code is None:
            from rich.table import Table

            t = Table(title="ppdiag rules")
            for c in ("code", "cause", "name", "summary"):
                t.add_column(c)
            for r in texts.values():
                t.add_row(r.code, r.cause or "-", r.name, r.summary)
            con.print(t)
            ct = Table(title="causes: the idle each kind of delay adds, in this order (they add up)")
            for c in ("cause", "definition"):
                ct.add_column(c)
            for k, definition in cause_texts():
                ct.add_row(k, definition)
            con.print(ct)
            return
        rule = texts.get(code.upper())
        if rule is None:
            raise PpdiagError(f"unknown rule {code!r}; known: {', '.join(sorted(texts))}")
        con.print(
            f"[bold]{rule.code}[/bold] {rule.name} ({rule.cause or 'configuration'})\n{rule.summary}\n",
            highlight=False,
        )
        con.print(rule.doc, markup=False, highlight=False)
    except Exception as exc:
        _fail(exc)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ppdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
    no_cache: NoCache = False,
    scheduler: Scheduler = None,
    scheduler_timeout: SchedulerTimeout = None,
) -> None:
    """ppdiag: why do the GPUs of a pipeline-parallel run wait, and what to fix first."""
    use_no_cache(no_cache)  # before any command: whatif, bubble and diff parse traces too
    try:
        use_scheduler(scheduler, scheduler_timeout)
    except Exception as exc:
        _fail(exc)


def _register_optional() -> None:
    """Commands that live in their own modules (demo, what-if, calculators)."""
    import importlib

    for mod in ("ppdiag.demo.cli", "ppdiag.whatif.cli", "ppdiag.whatif.calc_cli", "ppdiag.cache_cli"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
            continue
        m.register(app)


_register_optional()


def main() -> None:
    """Console-script entry point."""
    guard_streams()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not the main thread (embedded use): keep the defaults
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, on_signal)
    try:
        app(prog_name="ppdiag")
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        with contextlib.suppress(Exception):
            err.print("ppdiag: interrupted", highlight=False)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # Leave now: the workers are gone and every partial output was removed while unwinding;
        # the interpreter's exit handlers would join the pool's helper threads, which on a loaded
        # host takes seconds and may report on the pipes closed under them.
        os._exit(128 + int(signum))
    except Exception as exc:
        if os.environ.get("PPDIAG_DEBUG"):
            raise
        err.print(
            f"ppdiag: internal error: {type(exc).__name__}: {exc} (set PPDIAG_DEBUG=1 for details)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(70)
