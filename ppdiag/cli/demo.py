"""``ppdiag demo``: record a real CPU pipeline run, then analyze it like any other run."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from ppdiag.demo.config import DemoConfig

DEMO_MARKER = ".ppdiag-demo"


def prepare_out(out: Path) -> None:
    """Make ``out`` a directory ppdiag demo may write into, or refuse it.

    A new or empty directory is marked with :data:`DEMO_MARKER`; a directory that holds that marker
    was made by an earlier demo and may be refreshed. Any other non-empty directory is refused:
    the demo replaces rank traces and reports, and they must never be a user's files.
    """
    import json

    from ppdiag.errors import InputError
    from ppdiag.io import MARKER_KEY, json_marker, qpath, write_text

    if str(out) == "":
        raise InputError(qpath(str(out)), "empty --out path")
    try:
        if out.exists() and not out.is_dir():
            raise InputError(qpath(out), "--out exists and is not a directory")
        if out.is_dir() and not (out / DEMO_MARKER).is_file():
            entries = [e.name for e in out.iterdir()]
            if entries:
                shown = ", ".join(qpath(e) for e in sorted(entries)[:3]) + (
                    ", ..." if len(entries) > 3 else ""
                )
                raise InputError(
                    qpath(out),
                    f"--out is not empty ({shown}) and was not made by ppdiag demo; the demo replaces "
                    "traces and reports there, so give a new or empty directory",
                )
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(qpath(out), f"cannot use the output directory ({exc.strerror or exc})") from None
    if not (out / DEMO_MARKER).is_file():
        doc = {MARKER_KEY: json_marker("demo-dir")}
        write_text(out / DEMO_MARKER, json.dumps(doc) + "\n")


_TRACE_NAME = re.compile(r"rank\d+\.pt\.trace\.json\.gz")


def _drop_partial_traces(out: Path, since: float) -> None:
    """Remove the rank traces this run started writing into ``out`` (modified after ``since``)."""
    for p in out.glob("rank*.pt.trace.json.gz"):
        try:
            if _TRACE_NAME.fullmatch(p.name) and p.stat().st_mtime >= since - 1.0:
                p.unlink()
        except OSError:
            continue


def check_flags(
    slow_stage: int | None,
    slow_factor: float,
    comm_delay_ms: float,
    comm_delay_rank: int | None,
    host_stall_ms: float,
    host_stall_rank: int | None,
    pp: int,
) -> None:
    """Refuse fault flags that would be silently ignored (a delay without its rank, a factor
    without its stage) or name a rank or stage the run does not have."""
    from ppdiag.errors import InputError

    if slow_stage is None and slow_factor != 2.0:
        raise InputError(None, f"--slow-factor {slow_factor:g} needs --slow-stage (which stage to slow)")
    if slow_stage is not None and not 0 <= slow_stage < pp:
        raise InputError(None, f"--slow-stage {slow_stage}: the run has stages 0..{pp - 1}")
    if slow_stage is not None and not (slow_factor > 0 and slow_factor < 1e6):
        raise InputError(None, f"--slow-factor must be a compute factor > 0 (and < 1e6), got {slow_factor:g}")
    for flag, ms, rank_flag, rank in (
        ("--comm-delay-ms", comm_delay_ms, "--comm-delay-rank", comm_delay_rank),
        ("--host-stall-ms", host_stall_ms, "--host-stall-rank", host_stall_rank),
    ):
        if ms and rank is None:
            raise InputError(None, f"{flag} {ms:g} needs {rank_flag} (which rank to delay)")
        if rank is not None and not 0 <= rank < pp:
            raise InputError(None, f"{rank_flag} {rank}: the run has ranks 0..{pp - 1}")


_Schedule = Annotated[
    str,
    typer.Option(
        "--schedule", help="gpipe, 1f1b, interleaved_1f1b, looped_bfs, zero_bubble, zbv, dualpipev."
    ),
]
_Micro = Annotated[int, typer.Option("--microbatches", "-m", help="Micro-batches per step.")]
_PP = Annotated[int, typer.Option("--pp", help="Processes (pipeline ranks).")]
_Steps = Annotated[int, typer.Option("--steps", help="Profiled training steps.")]
_Compute = Annotated[
    str,
    typer.Option(
        "--compute", help="sleep (exact timings: a custom op holds for fixed times) or real (matmuls)."
    ),
]
_Fwd = Annotated[float, typer.Option("--fwd-ms", help="Forward cost per micro-batch and stage (sleep).")]
_Bwd = Annotated[float, typer.Option("--bwd-ms", help="Backward cost per micro-batch and stage (sleep).")]
_SlowStage = Annotated[int | None, typer.Option("--slow-stage", help="Stage whose compute is slowed.")]
_SlowFactor = Annotated[float, typer.Option("--slow-factor", help="Compute factor of the slow stage.")]
_CommDelay = Annotated[
    float, typer.Option("--comm-delay-ms", help="Delay of the sends of --comm-delay-rank (slow link).")
]
_CommRank = Annotated[int | None, typer.Option("--comm-delay-rank")]
_CommSync = Annotated[
    bool,
    typer.Option(
        "--comm-delay-sync",
        help="Hold each delayed send in the send call itself (the rank blocks until its data leaves); "
        "default: the sends leave late while the rank computes on.",
    ),
]
_HostStall = Annotated[
    float, typer.Option("--host-stall-ms", help="Host work before each micro-batch on --host-stall-rank.")
]
_HostRank = Annotated[int | None, typer.Option("--host-stall-rank")]
_Out = Annotated[Path, typer.Option("--out", "-o", help="Output directory.")]
_RecordOnly = Annotated[bool, typer.Option("--record-only", help="Record the traces, do not analyze.")]
_Timeout = Annotated[float, typer.Option("--timeout", help="Seconds before the run is stopped.")]
_Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No terminal report.")]
_RecordShapes = Annotated[
    bool,
    typer.Option(
        "--record-shapes",
        help="Record op inputs (torch.profiler record_shapes=True; gives the p2p peers). "
        "Default: the profiler's defaults, as most users record.",
    ),
]


_Hosts = Annotated[
    int,
    typer.Option(
        "--hosts",
        help="Hosts to spread the ranks over after recording (consecutive ranks per host): each "
        "host's traces get its name and a clock --skew-ms further ahead, as a multi-node run records "
        "them (docs/clocks.md).",
    ),
]
_SkewMs = Annotated[float, typer.Option("--skew-ms", help="Clock skew between consecutive hosts (--hosts).")]


def _spread(out: Path, cfg: DemoConfig, hosts: int, skew_ms: float, quiet: bool) -> None:
    """Rewrite the recorded traces onto ``hosts`` hosts with skewed clocks (ground truth updated)."""
    from ppdiag.demo.skew import spread_over_hosts

    placed = spread_over_hosts(out, cfg.pp, hosts, round(skew_ms * 1e6))
    if not quiet:
        where = "; ".join(f"{p['host']}: ranks {p['ranks']}, clock {p['skew_ns']} ns ahead" for p in placed)
        Console(stderr=True).print(f"moved to {len(placed)} hosts ({where})", highlight=False)


def _show_clocks(out: Path) -> None:
    """The fitted host clocks next to the skews the demo applied."""
    import json

    err = Console(stderr=True)
    truth = {h["host"]: h for h in json.loads((out / "groundtruth.json").read_text()).get("hosts", [])}
    rep = json.loads((out / "report.json").read_text())
    for c in rep["run"].get("clocks", []):
        applied = truth.get(c["host"], {}).get("offset_ns")
        res = c["residual_us"]
        err.print(
            f"clock of {c['host']} (ranks {c['ranks']}): fitted offset {c['offset_us'] / 1000:.3f} ms"
            + (f" +- {res / 1000:.3f} ms" if res is not None else "")
            + (f", applied {-int(applied) / 1e6:.3f} ms skew" if applied is not None else "")
            + f" ({c['method']})",
            highlight=False,
        )


def _record(cfg: DemoConfig, out: Path, quiet: bool) -> None:
    """Record the run into ``out`` with a progress bar; a failed or interrupted run leaves no
    half-written trace behind."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ppdiag.demo.recorder import record

    err = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=quiet,
    ) as bar:
        task = bar.add_task("starting ranks", total=1.0)

        def progress(msg: str, frac: float) -> None:
            bar.update(task, description=msg, completed=max(0.0, min(frac, 1.0)))

        cfg.validated()  # a bad setting is refused before --out is touched
        prepare_out(out)
        t0 = time.time()
        try:
            record(cfg, out, progress)
        except BaseException:
            # the directory is the demo's own: prepare_out checked its marker
            _drop_partial_traces(out, t0)
            raise
    if not quiet:
        err.print(f"recorded {cfg.pp} ranks into {out}", highlight=False)


def _analyze(out: Path, quiet: bool) -> None:
    """Analyze the recorded run like any other, and write its reports next to the traces."""
    from ppdiag.cli.options import analysis_options, analyzed
    from ppdiag.cli.support import report_console
    from ppdiag.reports import REPORTERS, load_builtin, write_report

    err = Console(stderr=True)
    diag = analyzed([out], analysis_options(True))
    if not quiet:
        from ppdiag.reports.terminal import render

        render(diag.result, report_console())
    for name, fname in (("json", "report.json"), ("html", "report.html"), ("md", "summary.md")):
        load_builtin(name)
        if name in REPORTERS:
            write_report(name, diag, out / fname)
            if not quiet:
                err.print(f"wrote {out / fname}", highlight=False)


def demo(
    schedule: _Schedule = "1f1b",
    microbatches: _Micro = 8,
    pp: _PP = 4,
    steps: _Steps = 3,
    compute: _Compute = "sleep",
    fwd_ms: _Fwd = 4.0,
    bwd_ms: _Bwd = 8.0,
    slow_stage: _SlowStage = None,
    slow_factor: _SlowFactor = 2.0,
    comm_delay_ms: _CommDelay = 0.0,
    comm_delay_rank: _CommRank = None,
    comm_delay_sync: _CommSync = False,
    host_stall_ms: _HostStall = 0.0,
    host_stall_rank: _HostRank = None,
    out: _Out = Path("ppdiag-demo"),
    record_only: _RecordOnly = False,
    timeout: _Timeout = 120.0,
    quiet: _Quiet = False,
    record_shapes: _RecordShapes = False,
    hosts: _Hosts = 1,
    skew_ms: _SkewMs = 0.0,
) -> None:
    """Record a real multi-process pipeline-parallel training run on CPU (torch, gloo) and analyze it.

    Writes one trace per rank and groundtruth.json into --out, then report.html, report.json
    and summary.md next to them. --out must be new, empty, or a directory an earlier demo made
    (it holds a .ppdiag-demo marker): the demo never replaces files it did not write.
    """
    from ppdiag.cli.support import fail as _fail

    try:
        from ppdiag.demo.config import DemoConfig
        from ppdiag.errors import InputError

        check_flags(
            slow_stage, slow_factor, comm_delay_ms, comm_delay_rank, host_stall_ms, host_stall_rank, pp
        )
        if comm_delay_sync and not comm_delay_ms:
            raise InputError(None, "--comm-delay-sync needs --comm-delay-ms (how long each send is held)")
        cfg = DemoConfig(
            schedule=schedule,
            pp=pp,
            microbatches=microbatches,
            steps=steps,
            compute=compute,
            fwd_ms=fwd_ms,
            bwd_ms=bwd_ms,
            slow_stage=slow_stage,
            slow_factor=slow_factor if slow_stage is not None else 1.0,
            comm_delay_ms=comm_delay_ms,
            comm_delay_rank=comm_delay_rank,
            comm_delay_sync=comm_delay_sync,
            host_stall_ms=host_stall_ms,
            host_stall_rank=host_stall_rank,
            timeout_s=timeout,
            record_shapes=record_shapes,
        )
        if not 1 <= hosts <= max(pp, 1):  # a bad --pp is refused by the config, with its own message
            raise InputError(None, f"--hosts must be 1..{pp} (at least one rank per host), got {hosts}")
        _record(cfg, out, quiet)
        if hosts > 1:
            _spread(out, cfg, hosts, skew_ms, quiet)
        if not record_only:
            _analyze(out, quiet)
            if hosts > 1 and not quiet:
                _show_clocks(out)
    except Exception as exc:
        _fail(exc)


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to the CLI."""
    app.command("demo")(demo)
