"""``ppdiag whatif``: what a change would buy, before GPU hours are spent on it (the calculators
``bubble`` and ``batch`` are :mod:`ppdiag.whatif.calc_cli`)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from ppdiag.errors import InputError
from ppdiag.limits import MAX_MICROBATCHES, MAX_PP, MAX_SIM_CELLS
from ppdiag.whatif.render import whatif_table

MultiStr = list[str] | None


def _ints(values: MultiStr, flag: str, lo: int = 1, unique: bool = True, hi: int | None = None) -> list[int]:
    """Values of a repeatable flag that also takes comma lists: ``-m 16 -m 32`` or ``-m 16,32``
    (repeated values dropped when ``unique``)."""
    out: list[int] = []
    for v in values or []:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                n = int(part)
            except ValueError:
                raise InputError(None, f"{flag}: {part!r} is not a whole number") from None
            if n < lo:
                raise InputError(None, f"{flag}: {n} must be >= {lo}")
            if hi is not None and n > hi:
                raise InputError(None, f"{flag}: {n} is above the supported maximum {hi}")
            out.append(n)
    return list(dict.fromkeys(out)) if unique else out


def _schedules(values: MultiStr) -> list[str]:
    from ppdiag.model.schedule import schedule_option

    out: list[str] = []
    for v in values or []:
        for part in str(v).split(","):
            s = schedule_option(part) if part.strip() else None
            if s is not None:
                out.append(s.value)
    return list(dict.fromkeys(out))


def _split_lines(pred: dict[str, Any]) -> list[str]:
    sp = pred.get("split") or {}
    out: list[str] = []
    if "slowest_stage_before" in sp:
        before = sp["slowest_before_ms"]
        mean = sp["mean_before_ms"] or 0.0
        ratio = before / mean if mean else 1.0
        out.append(
            f"slowest stage now: stage {sp['slowest_stage_before']} at {before:.2f} ms per micro-batch "
            f"(F+B), {ratio:.2f}x the mean {mean:.2f} ms; after the split the slowest stage costs "
            f"{sp['slowest_after_ms']:.2f} ms"
        )
    if sp.get("ideal"):
        out.append(
            "ideal balance only (every stage at the mean): the trace shows no per-block costs; pass "
            "--layers-per-stage N or --layer-costs FILE for a concrete layer split"
        )
    if sp.get("ranges"):
        cur = sp.get("current_layers_per_stage")
        if cur:
            out.append(
                f"current layers per stage: {'/'.join(map(str, cur))}  ->  proposed: "
                f"{'/'.join(map(str, sp['layers_per_stage']))}"
            )
        # at the measured micro-batch size, like the "before" figures
        stage_ms = sp.get("stage_ms_after") or pred.get("stage_ms") or []
        for s, ((a, b), (na, nb)) in enumerate(zip(sp["ranges"], sp["names"], strict=True)):
            names = f" ({na} .. {nb})" if na != f"layer {a}" else ""
            cost = f", {stage_ms[s]:.2f} ms per micro-batch" if s < len(stage_ms) else ""
            out.append(f"  stage {s}: layers {a}-{b}{names}{cost}")
    return out


def register(app: typer.Typer) -> None:
    """Add the ``whatif``, ``bubble`` and ``batch`` commands to the CLI."""

    @app.command()
    def whatif(
        paths: Annotated[
            list[Path] | None,
            typer.Argument(
                help="Run directory (one trace per rank) or trace files. Optional with --layer-costs."
            ),
        ] = None,
        microbatches: Annotated[
            MultiStr,
            typer.Option(
                "--microbatches", "-m", help="Micro-batches per step to predict; repeat or use a comma list."
            ),
        ] = None,
        schedule: Annotated[
            MultiStr,
            typer.Option(
                "--schedule",
                help="Schedule(s) to predict: gpipe, 1f1b, interleaved_1f1b, looped_bfs (predicted as "
                "interleaved 1F1B), zero_bubble, zbv, dualpipev.",
            ),
        ] = None,
        virtual: Annotated[
            MultiStr, typer.Option("--virtual", help="Virtual stages (chunks) per rank to predict.")
        ] = None,
        pp: Annotated[MultiStr, typer.Option("--pp", help="Pipeline stages to predict.")] = None,
        rebalance: Annotated[
            bool,
            typer.Option(
                "--rebalance", help="Propose the contiguous layer split with the cheapest slowest stage."
            ),
        ] = False,
        layers_per_stage: Annotated[
            str | None,
            typer.Option(
                "--layers-per-stage",
                help="Layers of each stage (N, or one per stage): estimates per-layer costs "
                "from the stage totals when the trace shows no layers.",
            ),
        ] = None,
        layer_costs: Annotated[
            Path | None,
            typer.Option(
                "--layer-costs",
                help="Per-block costs measured elsewhere: CSV or JSON with block, fwd_ms, bwd_ms "
                "and optionally activation_mb, wgrad_ms, stage.",
            ),
        ] = None,
        max_activation_mb: Annotated[
            float | None,
            typer.Option(
                "--max-activation-mb",
                help="Activation memory per rank the rebalanced split must fit "
                "(needs activation_mb in --layer-costs).",
            ),
        ] = None,
        fixed_microbatch_size: Annotated[
            bool,
            typer.Option(
                "--fixed-microbatch-size",
                help="Keep the micro-batch size when M changes (more samples per step); "
                "default: fixed global batch, micro-batch costs scale by M_old/M_new.",
            ),
        ] = False,
        no_comm_wait: Annotated[
            bool, typer.Option("--no-comm-wait", help="Predict with the measured recv/NCCL waits removed.")
        ] = False,
        no_host: Annotated[
            bool, typer.Option("--no-host", help="Predict with the measured host stalls removed.")
        ] = False,
        calibration: Annotated[
            str,
            typer.Option(
                "--calibration",
                help="How the simulator is matched to the measured step: per-block (an overhead "
                "on every block), per-step, ratio, none.",
            ),
        ] = "per-block",
        wgrad_fraction: Annotated[
            float,
            typer.Option(
                "--wgrad-fraction",
                help="Weight-gradient share of a backward, for zero-bubble predictions "
                "when the trace does not split it.",
            ),
        ] = 0.5,
        micro_batch: Annotated[
            int | None,
            typer.Option(
                "--micro-batch", help="Samples per micro-batch in the measured run (adds time per sample)."
            ),
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
        stage_map: Annotated[
            str | None,
            typer.Option("--stage-map", help="Rank of each stage, when the traces do not show them."),
        ] = None,
        steps: Annotated[str | None, typer.Option("--steps", help="Steps to analyze, e.g. 3:6.")] = None,
        run_pp: Annotated[
            int | None,
            typer.Option(
                "--run-pp", help="Pipeline stages of the measured run (or of --layer-costs without a trace)."
            ),
        ] = None,
        run_microbatches: Annotated[
            int | None, typer.Option("--run-microbatches", help="Micro-batches per step of the measured run.")
        ] = None,
        run_schedule: Annotated[
            str | None, typer.Option("--run-schedule", help="Schedule of the measured run.")
        ] = None,
        run_virtual: Annotated[
            int, typer.Option("--run-virtual", help="Chunks per rank without a trace (--layer-costs only).")
        ] = 1,
        p2p_ms: Annotated[
            float,
            typer.Option(
                "--p2p-ms", help="Stage-to-stage transfer time without a trace (--layer-costs only)."
            ),
        ] = 0.0,
        jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Parallel parse processes.")] = None,
    ) -> None:
        """Predict step time, bubble, lost time and activation memory for other M, schedules, v, P or a
        rebalanced layer split, from the measured per-stage costs of a run."""
        from ppdiag.cli_support import fail as _fail

        try:
            _whatif(
                paths or [],
                microbatches,
                schedule,
                virtual,
                pp,
                rebalance,
                layers_per_stage,
                layer_costs,
                max_activation_mb,
                fixed_microbatch_size,
                no_comm_wait,
                no_host,
                calibration,
                wgrad_fraction,
                micro_batch,
                json_out,
                stage_map,
                steps,
                run_pp,
                run_microbatches,
                run_schedule,
                run_virtual,
                p2p_ms,
                jobs,
            )
        except ValueError as exc:
            _fail(InputError(None, str(exc)))
        except Exception as exc:
            _fail(exc)


# ---- whatif ---------------------------------------------------------------------------------


def _whatif(
    paths: list[Path],
    microbatches: MultiStr,
    schedule: MultiStr,
    virtual: MultiStr,
    pp: MultiStr,
    rebalance: bool,
    layers_per_stage: str | None,
    layer_costs: Path | None,
    max_activation_mb: float | None,
    fixed_microbatch_size: bool,
    no_comm_wait: bool,
    no_host: bool,
    calibration: str,
    wgrad_fraction: float,
    micro_batch: int | None,
    json_out: bool,
    stage_map: str | None,
    steps: str | None,
    run_pp: int | None,
    run_microbatches: int | None,
    run_schedule: str | None,
    run_virtual: int,
    p2p_ms: float,
    jobs: int | None,
) -> None:
    from ppdiag.whatif.layers import measured_from_profile, read_layer_costs
    from ppdiag.whatif.scenarios import CALIBRATIONS, Scenario, WhatifModel, WhatifOptions, build_model

    if calibration not in CALIBRATIONS:
        raise InputError(None, f"--calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r}")
    if not 0.0 <= wgrad_fraction < 1.0:
        raise InputError(None, f"--wgrad-fraction must be in [0, 1), got {wgrad_fraction}")
    if max_activation_mb is not None and not max_activation_mb > 0:
        raise InputError(None, "--max-activation-mb must be > 0")
    if micro_batch is not None and micro_batch < 1:
        raise InputError(None, "--micro-batch must be >= 1")
    ms = _ints(microbatches, "--microbatches", hi=MAX_MICROBATCHES)
    scheds = _schedules(schedule)
    vs = _ints(virtual, "--virtual")
    pps = _ints(pp, "--pp", hi=MAX_PP)
    lps = _ints([layers_per_stage], "--layers-per-stage", unique=False) if layers_per_stage else None
    opts = WhatifOptions(
        calibration=calibration,
        wgrad_fraction=wgrad_fraction,
        micro_batch=micro_batch,
        max_activation_mb=max_activation_mb,
    )
    prof = read_layer_costs(layer_costs) if layer_costs is not None else None
    if paths:
        from ppdiag.api import Options, diagnose

        diag = diagnose(
            paths,
            Options(
                pp=run_pp,
                stage_map=stage_map,
                microbatches=run_microbatches,
                schedule=run_schedule,
                steps=steps,
                jobs=jobs,
            ),
        )
        model = build_model(diag, opts, prof, lps)
    else:
        if prof is None:
            raise InputError(
                None,
                "give a run directory, or --layer-costs FILE with --run-pp and "
                "--run-microbatches to predict without a trace",
            )
        if not run_pp or not run_microbatches:
            raise InputError(
                None,
                "without a trace, --layer-costs needs --run-pp and --run-microbatches "
                "(the configuration to start from)",
            )
        meas = measured_from_profile(
            prof, run_pp, run_microbatches, run_schedule or "1f1b", run_virtual, p2p_ms * 1e6
        )
        model = WhatifModel(meas, prof, opts)
    meas = model.meas
    dim_m: list[int | None] = list(ms) or [None]
    dim_s: list[str | None] = list(scheds) or [None]
    dim_v: list[int | None] = list(vs) or [None]
    dim_p: list[int | None] = list(pps) or [None]
    combos = list(itertools.product(dim_m, dim_s, dim_v, dim_p))
    for m_, _, v_, p_ in combos:
        # the simulator's time grows with P x M x v: refuse what would run for minutes
        cells = (p_ or meas.pp or 1) * (m_ or meas.microbatches or 1) * (v_ or meas.virtual or 1)
        if cells > MAX_SIM_CELLS:
            raise InputError(
                None,
                f"P x M x v = {cells} is above the simulated maximum {MAX_SIM_CELLS}; "
                "predict fewer stages, micro-batches or chunks",
            )
    scenarios: list[Scenario] = []

    def scn(
        m_: int | None = None,
        s_: str | None = None,
        v_: int | None = None,
        p_: int | None = None,
        reb: bool = rebalance,
    ) -> Scenario:
        return Scenario(
            m_,
            s_,
            v_,
            p_,
            rebalance=reb,
            fixed_microbatch_size=fixed_microbatch_size,
            no_comm_wait=no_comm_wait,
            no_host=no_host,
        )

    if combos != [(None, None, None, None)]:
        scenarios = [scn(*c) for c in combos]
        if rebalance:
            scenarios.append(scn())
    elif rebalance or no_comm_wait or no_host:
        scenarios.append(scn())
    else:
        from ppdiag.whatif.scenarios import default_scenarios

        scenarios = default_scenarios(meas, min_gain=0.0)
        for sc in scenarios:
            sc.fixed_microbatch_size = fixed_microbatch_size
    preds = [model.measured_row()] + [model.predict(s) for s in scenarios]
    cal = model.calibration(tuple(c for c, on in (("comm_wait", no_comm_wait), ("host", no_host)) if on))
    notes = list(dict.fromkeys(meas.notes + model.profile.notes))
    assumptions = _assumptions(fixed_microbatch_size, any(p.schedule != meas.schedule for p in preds))
    rows = [p.to_json() for p in preds]
    result: dict[str, Any] = {
        "measured": meas.to_json(),
        "calibration": cal.to_json(),
        "per_block_costs": model.profile.source,
        "scenarios": rows,
        "notes": notes,
        "assumptions": assumptions,
    }
    if json_out:
        typer.echo(json.dumps(result, indent=2))
        return
    con = Console()
    head = Text()
    head.append(
        f"{'measured' if meas.from_trace else 'from block costs'}: {meas.schedule}, P={meas.pp}"
        f"{f', v={meas.virtual}' if meas.virtual > 1 else ''}, M={meas.microbatches}, "
        f"step {meas.step_ns / 1e6:.2f} ms",
        style="bold",
    )
    stage = meas.stage_total_ns() / 1e6
    head.append(
        "\nstage compute per micro-batch (F+B): "
        + ", ".join(f"{x:.2f}" for x in stage)
        + f" ms; p2p {meas.p2p_ns / 1e6:.3f} ms"
    )
    head.append("\n" + cal.describe(), style="cyan")
    con.print(head)
    con.print(whatif_table(rows))
    for p in rows:
        if p.get("error"):
            con.print(Text(f"{p['scenario']}: not possible: {p['error']}", style="yellow"), highlight=False)
            continue
        lines = _split_lines(p) if (p.get("split") or {}).get("slowest_stage_before") is not None else []
        if p.get("note"):
            lines.insert(0, p["note"])
        if lines:
            con.print(Text(f"{p['scenario']}:", style="bold"), highlight=False)
            for ln in lines:
                con.print(Text("  " + ln), highlight=False)
    for n in notes + assumptions:
        con.print(Text("· " + n, style="dim"), highlight=False)


def _assumptions(fixed: bool, other_schedule: bool) -> list[str]:
    out = [
        "speed-up = throughput vs the measured run (samples per second); 'peak act.' = activations a "
        "rank holds at its peak vs the measured run (micro-batches in flight summed over its chunks)"
    ]
    if fixed:
        out.append(
            "--fixed-microbatch-size: per-micro-batch costs kept, a step processes M_new/M_old x the samples"
        )
    else:
        out.append(
            "fixed global batch: a new M changes the micro-batch size and per-micro-batch compute "
            "scales by M_old/M_new (linear in size: optimistic for small micro-batches); the "
            "per-block overhead and the p2p latency stay"
        )
    if other_schedule:
        out.append(
            "other schedules keep the measured per-stage costs; interleaving re-cuts each rank's "
            "layers into chunks and sends v times as many transfers"
        )
    return out


__all__ = ["register", "whatif_table"]
