"""``ppdiag demo``: record a real CPU pipeline run, then analyze it like any other run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to the CLI."""

    @app.command()
    def demo(
        schedule: Annotated[
            str,
            typer.Option(
                "--schedule", help="gpipe, 1f1b, interleaved_1f1b, looped_bfs, zero_bubble, zbv, dualpipev."
            ),
        ] = "1f1b",
        microbatches: Annotated[
            int, typer.Option("--microbatches", "-m", help="Micro-batches per step.")
        ] = 8,
        pp: Annotated[int, typer.Option("--pp", help="Processes (pipeline ranks).")] = 4,
        steps: Annotated[int, typer.Option("--steps", help="Profiled training steps.")] = 3,
        compute: Annotated[
            str,
            typer.Option(
                "--compute",
                help="sleep (exact timings: a custom op holds for fixed times) or real (matmuls).",
            ),
        ] = "sleep",
        fwd_ms: Annotated[
            float, typer.Option("--fwd-ms", help="Forward cost per micro-batch and stage (sleep).")
        ] = 4.0,
        bwd_ms: Annotated[
            float, typer.Option("--bwd-ms", help="Backward cost per micro-batch and stage (sleep).")
        ] = 8.0,
        slow_stage: Annotated[
            int | None, typer.Option("--slow-stage", help="Stage whose compute is slowed.")
        ] = None,
        slow_factor: Annotated[
            float, typer.Option("--slow-factor", help="Compute factor of the slow stage.")
        ] = 2.0,
        comm_delay_ms: Annotated[
            float,
            typer.Option("--comm-delay-ms", help="Delay of the sends of --comm-delay-rank (slow link)."),
        ] = 0.0,
        comm_delay_rank: Annotated[int | None, typer.Option("--comm-delay-rank")] = None,
        host_stall_ms: Annotated[
            float,
            typer.Option("--host-stall-ms", help="Host work before each micro-batch on --host-stall-rank."),
        ] = 0.0,
        host_stall_rank: Annotated[int | None, typer.Option("--host-stall-rank")] = None,
        out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("ppdiag-demo"),
        record_only: Annotated[
            bool, typer.Option("--record-only", help="Record the traces, do not analyze.")
        ] = False,
        timeout: Annotated[
            float, typer.Option("--timeout", help="Seconds before the run is stopped.")
        ] = 120.0,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No terminal report.")] = False,
        record_shapes: Annotated[
            bool,
            typer.Option(
                "--record-shapes",
                help="Record op inputs (torch.profiler record_shapes=True; gives the p2p peers). "
                "Default: the profiler's defaults, as most users record.",
            ),
        ] = False,
    ) -> None:
        """Record a real multi-process pipeline-parallel training run on CPU (torch, gloo) and analyze it.

        Writes one trace per rank and groundtruth.json into --out, then report.html, report.json
        and summary.md next to them.
        """
        from ppdiag.cli import _fail, report_console

        try:
            from ppdiag.demo.config import DemoConfig
            from ppdiag.demo.recorder import record

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
                host_stall_ms=host_stall_ms,
                host_stall_rank=host_stall_rank,
                timeout_s=timeout,
                record_shapes=record_shapes,
            )
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

                record(cfg, out, progress)
            if not quiet:
                err.print(f"recorded {pp} ranks into {out}", highlight=False)
            if record_only:
                return
            from ppdiag.api import Options, diagnose
            from ppdiag.reports import REPORTERS, load_builtin, write_report

            diag = diagnose([out], Options())
            if not quiet:
                from ppdiag.reports.terminal import render

                render(diag.report, report_console())
            load_builtin()
            for name, fname in (("json", "report.json"), ("html", "report.html"), ("md", "summary.md")):
                if name in REPORTERS:
                    write_report(name, diag, out / fname)
                    if not quiet:
                        err.print(f"wrote {out / fname}", highlight=False)
        except Exception as exc:
            _fail(exc)
