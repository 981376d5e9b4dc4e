"""The inputs of the ``ppdiag`` commands: the option types every command shares, the options
builder that turns a command's analysis flags into :class:`ppdiag.api.Options` (checked by
:func:`ppdiag.api.check_options` before any work), the check of the output paths, and the one call
into the analysis every command makes (:func:`analyzed`).

Checks of the run itself (sizes the traces cannot hold, ranks from another run, flags that disagree
with the trace) belong to the analysis (:func:`ppdiag.api.analyze_run`); the commands only repeat
its override warnings (:func:`overrides_of`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ppdiag.errors import InputError
from ppdiag.limits import MAX_JOBS, MAX_MICROBATCHES, MAX_PP, MAX_SAMPLES
from ppdiag.model.schedule import SCHEDULE_NAMES

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed
    from ppdiag.api import Options

Paths = Annotated[
    list[Path],
    typer.Argument(
        help="Run directory (one trace per rank), trace files, or one op table / op timeline "
        "(CSV, JSONL, Parquet, Chrome JSON) holding all ranks."
    ),
]

PP = Annotated[
    int | None,
    typer.Option(
        "--pp",
        min=1,
        max=MAX_PP,
        help="Override: the pipeline stages, when the traces do not show them "
        "(whatif's --pp predicts instead).",
    ),
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
    typer.Option(
        "--microbatches",
        "-m",
        min=1,
        max=MAX_MICROBATCHES,
        help="Override: the micro-batches per step (M) the run used, when the traces do not show them "
        "(whatif's -m predicts other values instead).",
    ),
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
    bool,
    typer.Option(
        "--no-cache",
        help="Parse every trace and analyse the run again; do not read or write the parse or result cache.",
    ),
]


Scheduler = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="ADDRESS",
        help="Parse on a Dask cluster (an op table's rank-step accounting too): the scheduler's address "
        "(tcp://host:8786); also "
        "PPDIAG_DASK_SCHEDULER. Needs the dask extra (pip install 'dask[distributed]' fsspec).",
    ),
]


SchedulerTimeout = Annotated[
    float | None,
    typer.Option(
        "--scheduler-timeout",
        metavar="SECONDS",
        help="How long to wait for the --scheduler to answer (default 30; also PPDIAG_DASK_TIMEOUT).",
    ),
]


def use_scheduler(address: str | None, timeout: float | None = None) -> None:
    # environment variables, like --no-cache, so that every command's parse sees them
    if address:
        os.environ["PPDIAG_DASK_SCHEDULER"] = address
    if timeout is not None:
        if not (math.isfinite(timeout) and 0 < timeout <= 86_400):
            raise InputError(None, f"--scheduler-timeout {timeout:g}: expected seconds, above 0 and <= 86400")
        os.environ["PPDIAG_DASK_TIMEOUT"] = repr(timeout)


def use_no_cache(flag: bool) -> None:
    # an environment variable, so that the parse workers (child processes) see it too
    if flag:
        os.environ["PPDIAG_NO_CACHE"] = "1"


def analysis_options(
    quiet: bool,
    pp: int | None = None,
    stage_map: str | None = None,
    hosts: str | None = None,
    microbatches: int | None = None,
    schedule: str | None = None,
    steps: str | None = None,
    jobs: int | None = None,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    tp: int | None = None,
    checked: bool = True,
) -> Options:
    """The :class:`ppdiag.api.Options` of the run flags every analyzing command takes (the one
    place they map to the options; ``analyze`` adds the batch flags), with progress bars on a
    terminal unless ``quiet``; a bad ``--steps`` or ``--hosts`` is refused here, before any work
    (:func:`ppdiag.api.check_options`), unless not ``checked``: ``analyze`` looks the run up in the
    result cache first, which loads no analysis (a miss checks them before the parse, a hit was
    analysed with them)."""
    from ppdiag.cli.support import err
    from ppdiag.options import Options

    opts = Options(
        pp=pp,
        stage_map=stage_map,
        hosts=hosts,
        microbatches=microbatches,
        schedule=schedule,
        steps=steps,
        jobs=jobs,
        global_batch=global_batch,
        micro_batch=micro_batch,
        tp=tp,
        progress=not quiet and err.is_terminal,
    )
    if not checked:
        return opts
    from ppdiag.api import check_options

    return check_options(opts)


def analyzed(paths: list[Path], opts: Options) -> Analyzed:
    """The analysis of a run: :func:`ppdiag.api.diagnose`, the call every command and the notebook
    API make (the run checks and the override warnings happen there)."""
    from ppdiag.api import diagnose

    return diagnose(paths, opts)


def check_targets(outputs: list[Path | None], inputs: list[Path | None]) -> None:
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


def skipped_traces(diag: Analyzed) -> list[str]:
    """Trace files of the run that could not be read (the loader skipped them with a warning)."""
    run = getattr(diag, "run", None)
    return list(getattr(run, "skipped", None) or [])


def overrides_of(diag: Analyzed) -> list[str]:
    """The flags (--pp, --stage-map, -m, --schedule) that disagree with the trace, as the pipeline
    rebuild worded them (ppdiag/pipeline/overrides.py): the commands repeat them on stderr."""
    from ppdiag.analysis import context_of

    return list(context_of(diag).overrides)
