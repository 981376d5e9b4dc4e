"""Command-line interface. It only maps flags to :mod:`ppdiag.api` and errors to exit codes.

Exit codes: 0 ok, 1 gate failed / regression, 2 bad input or usage, 3 inconclusive gate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console

from ppdiag import __version__
from ppdiag.cli_support import Interrupted, err, guard_streams, on_signal, report_console
from ppdiag.cli_support import fail as _fail
from ppdiag.errors import InputError, PpdiagError
from ppdiag.limits import MAX_JOBS, MAX_MICROBATCHES, MAX_PP, MAX_SAMPLES
from ppdiag.model.schedule import SCHEDULE_NAMES
from ppdiag.report_types import Report
from ppdiag.reports.context import context_of

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


Paths = Annotated[
    list[Path],
    typer.Argument(
        help="Run directory (one trace per rank), trace files, or one op table / op timeline "
        "(CSV, JSONL, Parquet, Chrome JSON) holding all ranks."
    ),
]

PP = Annotated[
    int | None,
    typer.Option("--pp", min=1, max=MAX_PP, help="Pipeline stages, when the traces do not show them."),
]
StageMap = Annotated[
    str | None,
    typer.Option(
        "--stage-map", help="Rank of each stage, e.g. 0,1,2,3 (';' between pipelines of a data-parallel run)."
    ),
]
Hosts = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        help="Where the ranks run, over what the traces say: ranks per node (e.g. 8: ranks 0-7 on one "
        "node) or HOST=RANKS,... (e.g. a=0-7,b=8-15). Links between hosts are inter-node.",
    ),
]
Micro = Annotated[
    int | None,
    typer.Option("--microbatches", "-m", min=1, max=MAX_MICROBATCHES, help="Micro-batches per step (M)."),
]
Sched = Annotated[
    str | None,
    typer.Option("--schedule", help=f"{', '.join(SCHEDULE_NAMES)} (aliases such as 'interleaved' accepted)."),
]
Steps = Annotated[
    str | None,
    typer.Option("--steps", help="Steps to analyze: 'a:b' (ProfilerStep numbers a..b, inclusive) or '5,6'."),
]
Jobs = Annotated[
    int | None,
    typer.Option("--jobs", "-j", min=1, max=MAX_JOBS, help="Parallel parse processes (default: cores)."),
]
GlobalBatch = Annotated[
    int | None, typer.Option("--global-batch", min=1, max=MAX_SAMPLES, help="Global batch size (samples).")
]
MicroBatch = Annotated[
    int | None, typer.Option("--micro-batch", min=1, max=MAX_SAMPLES, help="Micro-batch size (samples).")
]
TP = Annotated[int | None, typer.Option("--tp", min=1, max=MAX_PP, help="Tensor-parallel size.")]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Write the JSON report here.")]
HtmlOut = Annotated[Path | None, typer.Option("--html", help="Write the self-contained HTML report here.")]
MdOut = Annotated[Path | None, typer.Option("--md", help="Write a Markdown summary here.")]
PerfettoOut = Annotated[
    Path | None,
    typer.Option("--perfetto", help="Write a Perfetto/chrome://tracing trace with cause tracks here."),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No terminal report.")]
NoCache = Annotated[
    bool, typer.Option("--no-cache", help="Parse every trace again; do not read or write the parse cache.")
]


Scheduler = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="ADDRESS",
        help="Parse on a Dask cluster: the scheduler's address (tcp://host:8786); also "
        "PPDIAG_DASK_SCHEDULER. Needs the dask extra: pip install 'ppdiag[dask]'.",
    ),
]


def _scheduler(address: str | None) -> None:
    # an environment variable, like --no-cache, so that every command's parse sees it
    if address:
        os.environ["PPDIAG_DASK_SCHEDULER"] = address


def _no_cache(flag: bool) -> None:
    # an environment variable, so that the parse workers (child processes) see it too
    if flag:
        os.environ["PPDIAG_NO_CACHE"] = "1"


def echo(line: str) -> None:
    """One line on stdout (a closed pipe is handled by the stream guard of :func:`main`)."""
    from ppdiag.reports.sanitize import clean

    sys.stdout.write(clean(line) + "\n")
    sys.stdout.flush()


_STEPS_RANGE = re.compile(r"^\s*(-?\d+)?\s*:\s*(-?\d+)?\s*$")
_STEPS_LIST = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*,?\s*$")


def check_steps(spec: str | None) -> None:
    """Refuse a ``--steps`` value that is neither ``a:b`` nor ``5,6`` before any work is done."""
    if spec is None:
        return
    m = _STEPS_RANGE.match(spec)
    if m:
        a, b = m.group(1), m.group(2)
        if a is not None and b is not None and int(a) > int(b):
            raise InputError(None, f"--steps {spec!r}: the range is empty ({a} > {b})")
        return
    if _STEPS_LIST.match(spec):
        return
    hint = ""
    if re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", spec):
        hint = f" (for a range write {spec.replace('-', ':').replace(' ', '')})"
    raise InputError(
        None, f"--steps {spec!r}: expected 'a:b' (step numbers a..b, either may be empty) or '5,6'{hint}"
    )


def _options(**kw: Any) -> Any:
    from ppdiag.api import Options

    check_steps(kw.get("steps"))
    if kw.get("hosts") is not None:
        from ppdiag.pipeline.links import parse_hosts

        try:
            parse_hosts(kw["hosts"])
        except ValueError as exc:
            raise InputError(None, f"--hosts {kw['hosts']!r}: {exc}") from None
    return Options(**{k: v for k, v in kw.items() if v is not None})


def _targets(outputs: list[Path | None], inputs: list[Path | None]) -> None:
    """Check every output path before the analysis starts (no work lost on a refused path)."""
    from ppdiag.io import check_target, qpath

    ins = [p for p in inputs if p is not None]
    seen: set[str] = set()
    for o in outputs:
        if o is None:
            continue
        key = os.path.realpath(o) if str(o) else ""
        if key and key in seen:
            raise InputError(qpath(o), "named for two reports; give each report its own path")
        seen.add(key)
        check_target(o, ins)


def _progress_enabled(quiet: bool) -> bool:
    return not quiet and err.is_terminal


def _analyze(paths: list[Path], opts: Any, quiet: bool) -> Any:
    from ppdiag.api import analyze_run, load

    run = load(paths, opts)
    check_sizes(run, opts)
    overlap = step_overlap_warnings(run)
    run.warnings.extend(overlap)
    run.doubts.extend(overlap)
    return analyze_run(run, opts)


def step_overlap_warnings(run: Any) -> list[str]:
    """A rank whose ProfilerStep numbers share none with the other ranks' (steps 100-102 against
    5-7) holds another run's trace, or another part of the run: merging them by position is wrong."""
    from ppdiag.pipeline.steps import host_steps

    nums = {tl.rank: {n for n, _, _ in host_steps(tl) if n >= 0} for tl in run.ranks}
    nums = {r: v for r, v in nums.items() if v}
    if len(nums) < 2:
        return []
    out = []
    for r, mine in nums.items():
        others = set().union(*(v for q, v in nums.items() if q != r))
        if others and not (mine & others):
            out.append(
                f"rank {r}: its steps {min(mine)}-{max(mine)} share none with the other ranks' "
                f"({min(others)}-{max(others)}): a trace from another run?"
            )
    return out


def check_sizes(run: Any, opts: Any) -> None:
    """Refuse -m / --pp values the traces cannot hold: every micro-batch of a step runs at least
    one device interval on each rank, and every stage needs a rank of the job."""
    ranks = list(getattr(run, "ranks", []) or [])
    if not ranks:
        return
    if opts.microbatches is not None:
        most = max(len(tl.intervals) for tl in ranks)
        if opts.microbatches > max(most, 1):
            raise InputError(
                None,
                f"--microbatches {opts.microbatches}: the traces hold at most {most} device intervals "
                "per rank, fewer than one per micro-batch",
            )
    if opts.pp is not None:
        world = max(run.world_size, len(ranks))
        if opts.pp > world:
            raise InputError(None, f"--pp {opts.pp} is more than the job's {world} ranks")


def _write_reports(
    diag: Any,
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
) -> None:
    """Analyze a run: time accounting per rank, lost time by cause, findings with fixes."""
    try:
        _no_cache(no_cache)
        _scheduler(scheduler)
        _targets([json_out, html, md, perfetto], list(paths))
        opts = _options(
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
        diag = _analyze(paths, opts, quiet)
        for w in override_warnings(diag, opts):
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
) -> None:
    """CI gate: check a run against a bubble budget and a baseline. Exit 0 pass, 1 fail, 3 inconclusive.

    Exit 0 only when every rank of the run (0..world_size-1) was traced and analysed and every
    configured check could be computed; otherwise the gate is inconclusive and says what is
    missing, unless --allow-partial.
    """
    try:
        _no_cache(no_cache)
        _scheduler(scheduler)
        from ppdiag.reports import gate

        _targets([json_out, html, md], [*paths, budget, baseline])
        bud = gate.load_budget(budget)
        base = gate.load_baseline(baseline) if baseline else None
        opts = _options(
            pp=pp,
            stage_map=stage_map,
            hosts=hosts,
            microbatches=microbatches,
            schedule=schedule,
            steps=steps,
            jobs=jobs,
            progress=_progress_enabled(quiet),
        )
        diag = _analyze(paths, opts, quiet)
        cov = gate.coverage_of(diag.result, skipped_traces(diag), steps)
        cov.doubts = list(getattr(diag.run, "doubts", None) or [])
        result = gate.run_gate(
            diag.result,
            bud,
            base,
            str(baseline) if baseline else None,
            coverage=cov,
            allow_partial=allow_partial,
        )
        result.warnings += override_warnings(diag, opts)
        diag = dataclasses.replace(diag, result=msgspec.structs.replace(diag.result, gate=result.to_report()))
        for line in gate.format_gate(result):
            echo(line)
        _write_reports(diag, json_out, html, md, None, quiet, inputs=[*paths, budget, baseline])
    except Exception as exc:
        _fail(exc)
    raise typer.Exit(result.exit_code)


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
            _targets([json_out], [base, new])
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


def skipped_traces(diag: Any) -> list[str]:
    """Trace files of the run that could not be read (the loader skipped them with a warning)."""
    run = getattr(diag, "run", None)
    return list(getattr(run, "skipped", None) or [])


def override_warnings(diag: Any, opts: Any) -> list[str]:
    """Warn when --pp / -m / --schedule override what the traces show: the theoretical bubble (and
    the gate's bubble_excess) then follow the flag, not the run."""
    out: list[str] = []
    pipe = context_of(diag).pipeline
    if pipe is None:
        return out
    if opts.pp is not None and not opts.stage_map:
        from ppdiag.pipeline.topology import infer_topology

        try:
            seen_pp = infer_topology(diag.run, None, None).pp
        except Exception:  # detection is best effort here: the override stands either way
            seen_pp = 0
        if seen_pp > 1 and seen_pp != opts.pp:
            out.append(
                f"--pp {opts.pp} overrides the {seen_pp} pipeline stages the traces show; "
                "the theoretical bubble and the stage checks use the flag"
            )
    if pipe.topology.pp <= 1:
        return out
    from ppdiag.pipeline.schedule import detect_schedule, microbatch_count

    ranks = diag.run.by_rank()
    if opts.microbatches is not None:
        try:
            seen = microbatch_count(pipe.blocks, pipe.topology.virtual, ranks)
        except Exception:  # detection is best effort here: the override stands either way
            seen = None
        if seen and seen != opts.microbatches:
            out.append(
                f"-m {opts.microbatches} overrides the {seen} micro-batches per step the traces show; "
                "the theoretical bubble and the bubble_excess check use the flag"
            )
    if opts.schedule is not None:
        try:
            sched = detect_schedule(pipe.topology, pipe.blocks, ranks)
        except Exception:
            sched = None
        if sched and sched != opts.schedule:
            out.append(
                f"--schedule {opts.schedule} overrides the {sched} schedule the traces show; "
                "the theoretical bubble uses the flag"
            )
    return out


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
    no_cache: NoCache = False,
    scheduler: Scheduler = None,
) -> None:
    """ppdiag: why do the GPUs of a pipeline-parallel run wait, and what to fix first."""
    _no_cache(no_cache)  # before any command: whatif, bubble and diff parse traces too
    _scheduler(scheduler)


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
