"""Command-line interface. It only maps flags to :mod:`ppdiag.api` and errors to exit codes.

Exit codes: 0 ok, 1 gate failed / regression, 2 bad input or usage, 3 inconclusive gate.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ppdiag import __version__
from ppdiag.errors import PpdiagError

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

err = Console(stderr=True)

Paths = Annotated[list[Path], typer.Argument(help="Run directory (one trace per rank) or trace files.")]
PP = Annotated[
    int | None, typer.Option("--pp", min=1, help="Pipeline stages, when the traces do not show them.")
]
StageMap = Annotated[
    str | None,
    typer.Option(
        "--stage-map", help="Rank of each stage, e.g. 0,1,2,3 (';' between pipelines of a data-parallel run)."
    ),
]
Micro = Annotated[int | None, typer.Option("--microbatches", "-m", min=1, help="Micro-batches per step (M).")]
Sched = Annotated[
    str | None,
    typer.Option(
        "--schedule", help="gpipe, 1f1b, interleaved_1f1b, looped_bfs, zero_bubble, zbv, dualpipev."
    ),
]
Steps = Annotated[
    str | None,
    typer.Option("--steps", help="Steps to analyze: 'a:b' (ProfilerStep numbers a..b, inclusive) or '5,6'."),
]
Jobs = Annotated[int | None, typer.Option("--jobs", "-j", help="Parallel parse processes (default: cores).")]
GlobalBatch = Annotated[int | None, typer.Option("--global-batch", help="Global batch size (samples).")]
MicroBatch = Annotated[int | None, typer.Option("--micro-batch", help="Micro-batch size (samples).")]
TP = Annotated[int | None, typer.Option("--tp", help="Tensor-parallel size.")]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Write the JSON report here.")]
HtmlOut = Annotated[Path | None, typer.Option("--html", help="Write the self-contained HTML report here.")]
MdOut = Annotated[Path | None, typer.Option("--md", help="Write a Markdown summary here.")]
PerfettoOut = Annotated[
    Path | None,
    typer.Option("--perfetto", help="Write a Perfetto/chrome://tracing trace with cause tracks here."),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No terminal report.")]


def report_console() -> Console:
    """Where the terminal report goes: the terminal's width, or 140 columns in logs (CI)."""
    return Console() if sys.stdout.isatty() else Console(width=140)


def _fail(exc: BaseException) -> None:
    if isinstance(exc, PpdiagError):
        err.print(f"ppdiag: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    raise exc


def _options(**kw: Any) -> Any:
    from ppdiag.api import Options

    return Options(**{k: v for k, v in kw.items() if v is not None})


def _progress_enabled(quiet: bool) -> bool:
    return not quiet and err.is_terminal


def _analyze(paths: list[Path], opts: Any, quiet: bool) -> Any:
    from ppdiag.api import diagnose

    return diagnose(paths, opts)


def _write_reports(
    diag: Any,
    json_out: Path | None,
    html: Path | None,
    md: Path | None,
    perfetto: Path | None,
    quiet: bool,
    extra: dict[str, Any] | None = None,
) -> None:
    from ppdiag.reports import REPORTERS, load_builtin, write_report

    load_builtin()
    if extra:
        diag.context.update(extra)
    for name, path in (("json", json_out), ("html", html), ("md", md), ("perfetto", perfetto)):
        if path is None:
            continue
        if name not in REPORTERS:
            raise PpdiagError(f"the {name} report is not available in this version")
        write_report(name, diag, path)
        if not quiet:
            err.print(f"wrote {path}", highlight=False)


@app.command()
def analyze(
    paths: Paths,
    json_out: JsonOut = None,
    html: HtmlOut = None,
    md: MdOut = None,
    perfetto: PerfettoOut = None,
    pp: PP = None,
    stage_map: StageMap = None,
    microbatches: Micro = None,
    schedule: Sched = None,
    steps: Steps = None,
    global_batch: GlobalBatch = None,
    micro_batch: MicroBatch = None,
    tp: TP = None,
    jobs: Jobs = None,
    ranks: Annotated[bool, typer.Option("--ranks/--no-ranks", help="Show the per-rank table.")] = True,
    quiet: Quiet = False,
) -> None:
    """Analyze a run: time accounting per rank, lost time by cause, findings with fixes."""
    try:
        opts = _options(
            pp=pp,
            stage_map=stage_map,
            microbatches=microbatches,
            schedule=schedule,
            steps=steps,
            global_batch=global_batch,
            micro_batch=micro_batch,
            tp=tp,
            jobs=jobs,
            progress=_progress_enabled(quiet),
        )
        diag = _analyze(paths, opts, quiet)
        if not quiet:
            from ppdiag.reports.terminal import render

            render(diag.report, report_console(), ranks=ranks)
        _write_reports(diag, json_out, html, md, perfetto, quiet)
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
    microbatches: Micro = None,
    schedule: Sched = None,
    steps: Steps = None,
    jobs: Jobs = None,
    quiet: Quiet = False,
) -> None:
    """CI gate: check a run against a bubble budget and a baseline. Exit 0 pass, 1 fail, 3 inconclusive."""
    try:
        from ppdiag.reports import gate

        bud = gate.load_budget(budget)
        base = gate.load_baseline(baseline) if baseline else None
        opts = _options(
            pp=pp,
            stage_map=stage_map,
            microbatches=microbatches,
            schedule=schedule,
            steps=steps,
            jobs=jobs,
            progress=_progress_enabled(quiet),
        )
        diag = _analyze(paths, opts, quiet)
        result = gate.run_gate(diag.report, bud, base)
        diag.report["gate"] = result.to_json()
        for line in gate.format_gate(result):
            typer.echo(line)
        _write_reports(diag, json_out, html, md, None, quiet, {"gate": result})
    except Exception as exc:
        _fail(exc)
    raise typer.Exit(result.exit_code)


@app.command()
def diff(
    base: Annotated[Path, typer.Argument(help="Baseline: run directory or JSON report.")],
    new: Annotated[Path, typer.Argument(help="New run: run directory or JSON report.")],
    json_out: JsonOut = None,
) -> None:
    """What changed between two runs: step time and each cause, per stage, before vs after."""
    try:
        from ppdiag.reports import diff as diffmod

        a = _report_of(base)
        b = _report_of(new)
        result = diffmod.diff_reports(a, b)
        Console().print(diffmod.render_diff(result))
        if json_out:
            import json

            json_out.write_text(json.dumps(result.to_json(), indent=2))
    except Exception as exc:
        _fail(exc)


def _report_of(path: Path) -> dict[str, Any]:
    """A JSON report as is, or a run directory analyzed now."""
    if path.is_file() and path.suffix == ".json":
        from ppdiag.reports.gate import load_baseline

        return load_baseline(path)
    from ppdiag.api import Options, diagnose

    return diagnose([path], Options()).report


@app.command()
def rules(code: Annotated[str | None, typer.Argument(help="A rule code, e.g. PP003.")] = None) -> None:
    """The rule catalogue, or one rule's full explanation."""
    try:
        from ppdiag.rules import RULES, load_builtin

        load_builtin()
        con = Console()
        if code is None:
            from rich.table import Table

            t = Table(title="ppdiag rules")
            for c in ("code", "cause", "name", "summary"):
                t.add_column(c)
            for c in sorted(RULES):
                r = RULES[c]
                t.add_row(r.code, r.cause or "-", r.name, r.summary)
            con.print(t)
            from ppdiag.diagnosis import CAUSE_CHAIN, CAUSE_DEFINITIONS

            ct = Table(title="causes: the idle each kind of delay adds, in this order (they add up)")
            for c in ("cause", "definition"):
                ct.add_column(c)
            for k in CAUSE_CHAIN:
                ct.add_row(k, CAUSE_DEFINITIONS[k])
            con.print(ct)
            return
        rule = RULES.get(code.upper())
        if rule is None:
            raise PpdiagError(f"unknown rule {code!r}; known: {', '.join(sorted(RULES))}")
        r = rule
        import inspect

        con.print(
            f"[bold]{r.code}[/bold] {r.name} ({r.cause or 'configuration'})\n{r.summary}\n", highlight=False
        )
        con.print(inspect.cleandoc(type(r).__doc__ or ""), markup=False, highlight=False)
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
) -> None:
    """ppdiag: why do the GPUs of a pipeline-parallel run wait, and what to fix first."""


def _register_optional() -> None:
    """Commands that live in their own modules (demo, what-if, calculators)."""
    import importlib

    for mod in ("ppdiag.demo.cli", "ppdiag.whatif.cli"):
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
    try:
        app(prog_name="ppdiag")
    except KeyboardInterrupt:
        err.print("ppdiag: interrupted")
        sys.exit(130)
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
