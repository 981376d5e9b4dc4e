"""``ppdiag whatif``: what a change would buy, before GPU hours are spent on it (the calculators
``bubble`` and ``batch`` are :mod:`ppdiag.cli.calc`)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from ppdiag.errors import InputError
from ppdiag.limits import MAX_MICROBATCHES, MAX_PP, MAX_SIM_CELLS

if TYPE_CHECKING:
    from ppdiag.whatif.costs import MeasuredRun
    from ppdiag.whatif.scenarios import Scenario, WhatifModel, WhatifOptions

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


# ---- the options of ``whatif`` (one line per parameter in the command below) ----------------

_Paths = Annotated[
    list[Path] | None,
    typer.Argument(help="Run directory (one trace per rank) or trace files. Optional with --layer-costs."),
]
_Micro = Annotated[
    MultiStr,
    typer.Option(
        "--microbatches",
        "-m",
        help="Predict: micro-batches per step to predict, not an override of the measured M "
        "(analyze's -m is); repeat or use a comma list.",
    ),
]
_Sched = Annotated[
    MultiStr,
    typer.Option(
        "--schedule",
        help="Schedule(s) to predict: gpipe, 1f1b, interleaved_1f1b, looped_bfs (predicted as "
        "interleaved 1F1B), zero_bubble, zbv, dualpipev.",
    ),
]
_Virtual = Annotated[MultiStr, typer.Option("--virtual", help="Virtual stages (chunks) per rank to predict.")]
_PP = Annotated[
    MultiStr,
    typer.Option("--pp", help="Predict: pipeline stages to predict, not an override (analyze's --pp is)."),
]
_Rebalance = Annotated[
    bool,
    typer.Option("--rebalance", help="Propose the contiguous layer split with the cheapest slowest stage."),
]
_LayersPerStage = Annotated[
    str | None,
    typer.Option(
        "--layers-per-stage",
        help="Layers of each stage (N, or one per stage): estimates per-layer costs "
        "from the stage totals when the trace shows no layers.",
    ),
]
_LayerCosts = Annotated[
    Path | None,
    typer.Option(
        "--layer-costs",
        help="Per-block costs measured elsewhere: CSV or JSON with block, fwd_ms, bwd_ms "
        "and optionally activation_mb, wgrad_ms, stage.",
    ),
]
_MaxAct = Annotated[
    float | None,
    typer.Option(
        "--max-activation-mb",
        help="Activation memory per rank the rebalanced split must fit "
        "(needs activation_mb in --layer-costs).",
    ),
]
_FixedMb = Annotated[
    bool,
    typer.Option(
        "--fixed-microbatch-size",
        help="Keep the micro-batch size when M changes (more samples per step); "
        "default: fixed global batch, micro-batch costs scale by M_old/M_new.",
    ),
]
_NoCommWait = Annotated[
    bool, typer.Option("--no-comm-wait", help="Predict with the measured recv/NCCL waits removed.")
]
_NoHost = Annotated[bool, typer.Option("--no-host", help="Predict with the measured host stalls removed.")]
_Calibration = Annotated[
    str,
    typer.Option(
        "--calibration",
        help="How the simulator is matched to the measured step: per-block (an overhead "
        "on every block), per-step, ratio, none.",
    ),
]
_WgradFraction = Annotated[
    float,
    typer.Option(
        "--wgrad-fraction",
        help="Weight-gradient share of a backward, for zero-bubble predictions "
        "when the trace does not split it.",
    ),
]
_MicroBatch = Annotated[
    int | None,
    typer.Option("--micro-batch", help="Samples per micro-batch in the measured run (adds time per sample)."),
]
_Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
_StageMap = Annotated[
    str | None, typer.Option("--stage-map", help="Rank of each stage, when the traces do not show them.")
]
_Steps = Annotated[str | None, typer.Option("--steps", help="Steps to analyze, e.g. 3:6.")]
_RunPP = Annotated[
    int | None,
    typer.Option(
        "--run-pp", help="Pipeline stages of the measured run (or of --layer-costs without a trace)."
    ),
]
_RunMicro = Annotated[
    int | None, typer.Option("--run-microbatches", help="Micro-batches per step of the measured run.")
]
_RunSched = Annotated[str | None, typer.Option("--run-schedule", help="Schedule of the measured run.")]
_RunVirtual = Annotated[
    int, typer.Option("--run-virtual", help="Chunks per rank without a trace (--layer-costs only).")
]
_P2p = Annotated[
    float, typer.Option("--p2p-ms", help="Stage-to-stage transfer time without a trace (--layer-costs only).")
]
_Jobs = Annotated[int | None, typer.Option("--jobs", "-j", help="Parallel parse processes.")]


@dataclass(frozen=True)
class WhatifArgs:
    """Every flag of ``ppdiag whatif``, as given (checked by :func:`_whatif`)."""

    paths: list[Path]
    microbatches: MultiStr = None
    schedule: MultiStr = None
    virtual: MultiStr = None
    pp: MultiStr = None
    rebalance: bool = False
    layers_per_stage: str | None = None
    layer_costs: Path | None = None
    max_activation_mb: float | None = None
    fixed_microbatch_size: bool = False
    no_comm_wait: bool = False
    no_host: bool = False
    calibration: str = "per-block"
    wgrad_fraction: float = 0.5
    micro_batch: int | None = None
    json_out: bool = False
    stage_map: str | None = None
    steps: str | None = None
    run_pp: int | None = None
    run_microbatches: int | None = None
    run_schedule: str | None = None
    run_virtual: int = 1
    p2p_ms: float = 0.0
    jobs: int | None = None


def whatif(
    paths: _Paths = None,
    microbatches: _Micro = None,
    schedule: _Sched = None,
    virtual: _Virtual = None,
    pp: _PP = None,
    rebalance: _Rebalance = False,
    layers_per_stage: _LayersPerStage = None,
    layer_costs: _LayerCosts = None,
    max_activation_mb: _MaxAct = None,
    fixed_microbatch_size: _FixedMb = False,
    no_comm_wait: _NoCommWait = False,
    no_host: _NoHost = False,
    calibration: _Calibration = "per-block",
    wgrad_fraction: _WgradFraction = 0.5,
    micro_batch: _MicroBatch = None,
    json_out: _Json = False,
    stage_map: _StageMap = None,
    steps: _Steps = None,
    run_pp: _RunPP = None,
    run_microbatches: _RunMicro = None,
    run_schedule: _RunSched = None,
    run_virtual: _RunVirtual = 1,
    p2p_ms: _P2p = 0.0,
    jobs: _Jobs = None,
) -> None:
    """Predict step time, bubble, lost time and activation memory for other M, schedules, v, P or a
    rebalanced layer split, from the measured per-stage costs of a run."""
    from ppdiag.cli.support import fail as _fail

    args = WhatifArgs(
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
    try:
        _whatif(args)
    except ValueError as exc:
        _fail(InputError(None, str(exc)))
    except Exception as exc:
        _fail(exc)


def register(app: typer.Typer) -> None:
    """Add the ``whatif`` command to the CLI."""
    app.command("whatif")(whatif)


# ---- whatif ---------------------------------------------------------------------------------


def _check(a: WhatifArgs) -> None:
    """Refuse flag values the prediction cannot take (one clear line each)."""
    from ppdiag.whatif.scenarios import CALIBRATIONS

    if a.calibration not in CALIBRATIONS:
        raise InputError(
            None, f"--calibration must be one of {', '.join(CALIBRATIONS)}, got {a.calibration!r}"
        )
    if not 0.0 <= a.wgrad_fraction < 1.0:
        raise InputError(None, f"--wgrad-fraction must be in [0, 1), got {a.wgrad_fraction}")
    if a.max_activation_mb is not None and not a.max_activation_mb > 0:
        raise InputError(None, "--max-activation-mb must be > 0")
    if a.micro_batch is not None and a.micro_batch < 1:
        raise InputError(None, "--micro-batch must be >= 1")


def _model(a: WhatifArgs, opts: WhatifOptions, lps: list[int] | None) -> WhatifModel:
    """The what-if model of the traced run, or of the block costs alone (no trace)."""
    from ppdiag.whatif.layers import measured_from_profile, read_layer_costs
    from ppdiag.whatif.scenarios import WhatifModel, build_model

    prof = read_layer_costs(a.layer_costs) if a.layer_costs is not None else None
    if a.paths:
        from ppdiag.cli.options import analysis_options, analyzed

        analysis = analysis_options(
            True,  # no progress bars: the prediction's table is the output
            a.run_pp,
            a.stage_map,
            None,  # no --hosts: the prediction does not place ranks
            a.run_microbatches,
            a.run_schedule,
            a.steps,
            a.jobs,
        )
        diag = analyzed(a.paths, analysis)
        return build_model(diag, opts, prof, lps)
    if prof is None:
        raise InputError(
            None,
            "give a run directory, or --layer-costs FILE with --run-pp and "
            "--run-microbatches to predict without a trace",
        )
    if not a.run_pp or not a.run_microbatches:
        raise InputError(
            None,
            "without a trace, --layer-costs needs --run-pp and --run-microbatches "
            "(the configuration to start from)",
        )
    meas = measured_from_profile(
        prof, a.run_pp, a.run_microbatches, a.run_schedule or "1f1b", a.run_virtual, a.p2p_ms * 1e6
    )
    return WhatifModel(meas, prof, opts)


_Combo = tuple[int | None, str | None, int | None, int | None]


def _dims(a: WhatifArgs) -> tuple[list[int | None], list[str | None], list[int | None], list[int | None]]:
    """The M, schedules, v and P asked for (checked before any work), [None] for a dimension not asked."""
    dim_m: list[int | None] = list(_ints(a.microbatches, "--microbatches", hi=MAX_MICROBATCHES)) or [None]
    dim_s: list[str | None] = list(_schedules(a.schedule)) or [None]
    dim_v: list[int | None] = list(_ints(a.virtual, "--virtual")) or [None]
    dim_p: list[int | None] = list(_ints(a.pp, "--pp", hi=MAX_PP)) or [None]
    return dim_m, dim_s, dim_v, dim_p


def _combos(
    dims: tuple[list[int | None], list[str | None], list[int | None], list[int | None]], meas: MeasuredRun
) -> list[_Combo]:
    """Every (M, schedule, v, P) asked for; refused when one would simulate for minutes."""
    dim_m, dim_s, dim_v, dim_p = dims
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
    return combos


def _scenarios(a: WhatifArgs, meas: MeasuredRun, combos: list[_Combo]) -> list[Scenario]:
    """The scenarios to predict: the combinations asked for (and the rebalanced run), or the
    defaults for the run when nothing was asked."""
    from ppdiag.whatif.scenarios import Scenario, default_scenarios

    def scn(c: _Combo = (None, None, None, None), reb: bool = a.rebalance) -> Scenario:
        return Scenario(
            *c,
            rebalance=reb,
            fixed_microbatch_size=a.fixed_microbatch_size,
            no_comm_wait=a.no_comm_wait,
            no_host=a.no_host,
        )

    if combos != [(None, None, None, None)]:
        return [scn(c) for c in combos] + ([scn()] if a.rebalance else [])
    if a.rebalance or a.no_comm_wait or a.no_host:
        return [scn()]
    scenarios = default_scenarios(meas, min_gain=0.0)
    for sc in scenarios:
        sc.fixed_microbatch_size = a.fixed_microbatch_size
    return scenarios


def _whatif(a: WhatifArgs) -> None:
    from ppdiag.whatif.scenarios import WhatifOptions

    _check(a)
    dims = _dims(a)
    lps = _ints([a.layers_per_stage], "--layers-per-stage", unique=False) if a.layers_per_stage else None
    opts = WhatifOptions(
        calibration=a.calibration,
        wgrad_fraction=a.wgrad_fraction,
        micro_batch=a.micro_batch,
        max_activation_mb=a.max_activation_mb,
    )
    model = _model(a, opts, lps)
    meas = model.meas
    scenarios = _scenarios(a, meas, _combos(dims, meas))
    preds = [model.measured_row()] + [model.predict(s) for s in scenarios]
    cal = model.calibration(tuple(c for c, on in (("comm_wait", a.no_comm_wait), ("host", a.no_host)) if on))
    notes = list(dict.fromkeys(meas.notes + model.profile.notes))
    assumptions = _assumptions(a.fixed_microbatch_size, any(p.schedule != meas.schedule for p in preds))
    rows = [p.to_json() for p in preds]
    if a.json_out:
        result: dict[str, Any] = {
            "measured": meas.to_json(),
            "calibration": cal.to_json(),
            "per_block_costs": model.profile.source,
            "scenarios": rows,
            "notes": notes,
            "assumptions": assumptions,
        }
        typer.echo(json.dumps(result, indent=2))
        return
    _print(meas, cal.describe(), rows, notes + assumptions)


def _print(meas: MeasuredRun, calibration: str, rows: list[dict[str, Any]], notes: list[str]) -> None:
    """The measured run, the scenarios' table, each scenario's notes and split, and the notes."""
    from ppdiag.reports.whatif_table import SECONDS_FROM_MS, typed_rows, whatif_table

    con = Console()
    head = Text()
    step_ms = meas.step_ns / 1e6
    step = f"{step_ms / 1e3:.2f} s" if step_ms >= SECONDS_FROM_MS else f"{step_ms:.2f} ms"
    head.append(
        f"{'measured' if meas.from_trace else 'from block costs'}: {meas.schedule}, P={meas.pp}"
        f"{f', v={meas.virtual}' if meas.virtual > 1 else ''}, M={meas.microbatches}, step {step}",
        style="bold",
    )
    stage = meas.stage_total_ns() / 1e6
    head.append(
        "\nstage compute per micro-batch (F+B): "
        + ", ".join(f"{x:.2f}" for x in stage)
        + f" ms; p2p {meas.p2p_ns / 1e6:.3f} ms"
    )
    head.append("\n" + calibration, style="cyan")
    con.print(head)
    con.print(whatif_table(typed_rows(rows)))
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
    for n in notes:
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


__all__ = ["WhatifArgs", "register", "whatif"]
