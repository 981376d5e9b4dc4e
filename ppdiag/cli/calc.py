"""``ppdiag bubble`` and ``ppdiag batch``: the schedule's bubble and the batch arithmetic, no trace
needed."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from ppdiag.errors import InputError
from ppdiag.limits import MAX_MICROBATCHES, MAX_PP, MAX_SIM_CELLS


def register(app: typer.Typer) -> None:
    """Add the ``bubble`` and ``batch`` commands to the CLI."""

    @app.command()
    def bubble(
        pp: Annotated[int, typer.Option("--pp", min=1, max=MAX_PP, help="Pipeline stages (P).")],
        microbatches: Annotated[
            int,
            typer.Option(
                "--microbatches", "-m", min=1, max=MAX_MICROBATCHES, help="Micro-batches per step (M)."
            ),
        ],
        schedule: Annotated[str, typer.Option("--schedule", help="Schedule.")] = "1f1b",
        virtual: Annotated[
            int | None, typer.Option("--virtual", help="Chunks per rank (interleaved).")
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    ) -> None:
        """Bubble ratio of a schedule for P stages and M micro-batches (equal stages, free communication),
        and how it falls with M."""
        from ppdiag.cli.support import fail as _fail

        try:
            res = bubble_table(pp, microbatches, schedule, virtual)
            if json_out:
                typer.echo(json.dumps(res, indent=2))
                return
            _print_bubble(res)
        except ValueError as exc:
            _fail(InputError(None, str(exc)))
        except Exception as exc:
            _fail(exc)

    @app.command()
    def batch(
        world: Annotated[int | None, typer.Option("--world", help="World size (GPUs).")] = None,
        tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")] = 1,
        pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")] = 1,
        cp: Annotated[int, typer.Option("--cp", help="Context-parallel size.")] = 1,
        micro_batch: Annotated[
            int | None, typer.Option("--micro-batch", help="Samples per micro-batch.")
        ] = None,
        global_batch: Annotated[int | None, typer.Option("--global-batch", help="Samples per step.")] = None,
        microbatches: Annotated[
            int | None,
            typer.Option("--microbatches", "-m", help="Micro-batches per step you run (cross-checked)."),
        ] = None,
        schedule: Annotated[str | None, typer.Option("--schedule", help="Pipeline schedule.")] = None,
        virtual: Annotated[int, typer.Option("--virtual", help="Chunks per rank (interleaved).")] = 1,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
        strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when a problem is found.")] = False,
    ) -> None:
        """Batch arithmetic: dp = world / (tp x pp x cp), accumulation steps (M) = global / (micro x dp),
        the bubble that M gives, and every inconsistency."""
        from ppdiag.cli.support import fail as _fail

        code = 0
        try:
            if world is None and micro_batch is None and global_batch is None and microbatches is None:
                # nothing to check: "no problems found" would pass a CI step that checked nothing
                raise InputError(
                    None, "nothing to check: give --world, --global-batch, --micro-batch or --microbatches"
                )
            res = batch_report(world, tp, pp, cp, micro_batch, global_batch, microbatches, schedule, virtual)
            if json_out:
                typer.echo(json.dumps(res, indent=2))
            else:
                _print_batch(res)
            code = 1 if strict and res["problems"] else 0
        except ValueError as exc:
            _fail(InputError(None, str(exc)))
        except Exception as exc:
            _fail(exc)
        raise typer.Exit(code)


def bubble_table(
    pp: int, microbatches: int, schedule: str = "1f1b", virtual: int | None = None
) -> dict[str, Any]:
    """Bubble ratio of ``schedule`` for ``pp`` stages and ``microbatches`` micro-batches, and for
    M = P, 2P, 4P, 8P: the closed form, the simulator with equal stage costs, and the peak number
    of micro-batches the first rank holds activations for."""
    from ppdiag.model.schedule import SIMULATED_AS, parse_schedule
    from ppdiag.simulate import SimConfig, canonical_schedule, closed_form_bubble, simulate, splits_backward
    from ppdiag.simulate.schedules import default_virtual
    from ppdiag.whatif.scenarios import rank_peaks

    if pp < 1 or microbatches < 1:
        raise ValueError("--pp and --microbatches must be >= 1")
    named = parse_schedule(schedule)
    # looped BFS has no simulator model: its bubble is interleaved 1F1B's (same chunks)
    sched = canonical_schedule(SIMULATED_AS.get(named, named))
    v = default_virtual(sched, virtual if virtual is not None else (2 if sched == "interleaved_1f1b" else 1))
    split = splits_backward(sched)
    fwd, bwd, wg = (1.0, 1.0, 1.0) if split else (1.0, 2.0, 0.0)
    rows = []
    for m in sorted({pp, 2 * pp, 4 * pp, 8 * pp, microbatches}):
        row: dict[str, Any] = {"microbatches": m, "given": m == microbatches}
        if pp * m * v > MAX_SIM_CELLS:
            # the simulator's time grows with P x M x v: past the bound only the formula is cheap
            row.update(
                {
                    "simulated": None,
                    "closed_form": None,
                    "peak_inflight": None,
                    "error": f"P x M x v = {pp * m * v} is above the simulated maximum {MAX_SIM_CELLS}",
                }
            )
            rows.append(row)
            continue
        try:
            res = simulate(SimConfig(sched, pp, m, v, fwd_ns=fwd, bwd_ns=bwd, wgrad_ns=wg))
            row["simulated"] = round(float(res.bubble_ratio), 6)
            row["closed_form"] = round(float(closed_form_bubble(sched, pp, m, v)), 6)
            peak, _ = rank_peaks(sched, pp, m, v, _ones(pp * v))
            row["peak_inflight"] = peak
            row["error"] = None
        except ValueError as exc:
            row.update({"simulated": None, "closed_form": None, "peak_inflight": None, "error": str(exc)})
        rows.append(row)
    given = next(r for r in rows if r["given"])
    if given["error"]:
        raise ValueError(given["error"])
    formula = {"gpipe": "(P-1)/(M+P-1)", "1f1b": "(P-1)/(M+P-1)", "interleaved_1f1b": "(P-1)/(v*M+P-1)"}.get(
        sched, "(P-1)/(3*v*M+P-1) with F = B = W"
    )
    return {
        "schedule": sched,
        "pp": pp,
        "virtual": v,
        "microbatches": microbatches,
        "bubble_ratio": given["simulated"],
        "closed_form": given["closed_form"],
        "formula": formula,
        "note": _formula_note(rows, given),
        "costs": {"fwd": fwd, "bwd": bwd, "wgrad": wg},
        "table": rows,
    }


def _formula_note(rows: list[dict[str, Any]], given: dict[str, Any]) -> str | None:
    """Why the simulated bubble of the asked M differs from the formula, when it does: the formula
    is the steady state's, which the simulated schedule reaches only from some M on (read from the
    table, not assumed)."""
    if abs(given["simulated"] - given["closed_form"]) < 5e-4:
        return None
    ok = [r for r in rows if not r["error"] and abs(r["simulated"] - r["closed_form"]) < 5e-4]
    agree = [r["microbatches"] for r in ok if r["microbatches"] > given["microbatches"]]
    where = f"; in this table they agree from M={min(agree)}" if agree else ""
    return (
        f"the formula assumes the schedule's steady state; with M={given['microbatches']} the simulated "
        "schedule (equal stages, free communication) cannot fill its warm-up and cool-down, so its "
        f"bubble is {given['simulated'] * 100:.1f}%, not {given['closed_form'] * 100:.1f}%{where}"
    )


def _ones(n: int) -> Any:
    import numpy as np

    return np.ones(n)


def _print_bubble(res: dict[str, Any]) -> None:
    from ppdiag.reports.whatif_table import fmt_pct

    con = Console()
    v = f", v={res['virtual']}" if res["virtual"] > 1 else ""
    con.print(
        Text(
            f"{res['schedule']}, P={res['pp']}{v}, M={res['microbatches']}: bubble "
            f"{res['bubble_ratio'] * 100:.1f}% of the step  ({res['formula']} = "
            f"{res['closed_form'] * 100:.1f}%)",
            style="bold",
        ),
        highlight=False,
    )
    if res.get("note"):
        con.print(Text(str(res["note"]), style="yellow"), highlight=False)
    from rich.table import Table  # here: the other commands' start-up does not load it

    t = Table(title="bubble vs M (equal stages, free communication)", title_justify="left")
    for c in ("M", "bubble", "formula", "peak in-flight (mb, rank 0)"):
        t.add_column(c, justify="right")
    for r in res["table"]:
        if r["error"]:
            t.add_row(str(r["microbatches"]), "n/a", "", Text(r["error"], style="yellow"))
            continue
        t.add_row(
            str(r["microbatches"]),
            fmt_pct(r["simulated"]),
            fmt_pct(r["closed_form"]),
            str(r["peak_inflight"]),
            style="bold" if r["given"] else None,
        )
    con.print(t)
    if res["schedule"] in ("gpipe",):
        con.print(
            Text(
                "GPipe holds all M micro-batches' activations; 1F1B has the same bubble with at most P "
                "in flight.",
                style="dim",
            )
        )


# ---- batch ----------------------------------------------------------------------------------


def batch_report(
    world: int | None,
    tp: int,
    pp: int,
    cp: int,
    micro_batch: int | None,
    global_batch: int | None,
    microbatches: int | None,
    schedule: str | None,
    virtual: int,
) -> dict[str, Any]:
    """:func:`ppdiag.whatif.batch.check_batch` plus the bubble the resulting M gives."""
    from ppdiag.model.schedule import SIMULATED_AS, parse_schedule
    from ppdiag.simulate import canonical_schedule, closed_form_bubble
    from ppdiag.whatif.batch import check_batch

    for name, val in (
        ("--world", world),
        ("--micro-batch", micro_batch),
        ("--global-batch", global_batch),
        ("--microbatches", microbatches),
    ):
        if val is not None and val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    for name, val in (("--tp", tp), ("--pp", pp), ("--cp", cp), ("--virtual", virtual)):
        if val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    named = parse_schedule(schedule) if schedule else None
    sched = canonical_schedule(SIMULATED_AS.get(named, named)) if named is not None else None
    chk = check_batch(
        world, pp, tp, micro_batch, global_batch, microbatches, cp, schedule=sched, virtual=virtual
    )
    out = chk.to_json()
    m = chk.accumulation if chk.accumulation is not None else microbatches
    out["cp"] = cp
    out["microbatches_per_stage"] = m
    out["schedule"] = sched
    out["virtual"] = virtual
    bub = None
    if m and pp > 1:
        try:
            bub = closed_form_bubble(sched or "1f1b", pp, m, virtual)
        except ValueError:
            bub = None
    out["bubble_ratio"] = round(bub, 6) if bub is not None else None
    return out


def _print_batch(res: dict[str, Any]) -> None:
    from rich.table import Table

    from ppdiag.reports.whatif_table import fmt_pct

    con = Console()
    t = Table(title="batch arithmetic", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")

    def v(x: Any) -> str:
        return "?" if x is None else str(x)

    t.add_row("world size", v(res["world"]))
    t.add_row("tp x pp x cp", f"{res['tp']} x {res['pp']} x {res['cp']}")
    t.add_row("data-parallel size (dp)", v(res["dp"]))
    t.add_row("micro-batch size", v(res["micro_batch"]))
    t.add_row("global batch", v(res["global_batch"]))
    t.add_row("accumulation steps = micro-batches per stage (M)", v(res["microbatches_per_stage"]))
    if res.get("bubble_ratio") is not None:
        t.add_row(f"bubble ({res.get('schedule') or '1f1b'})", fmt_pct(res["bubble_ratio"]))
    con.print(t)
    probs = res["problems"]
    if not probs:
        con.print(Text("no problems found", style="green"))
    for p in probs:
        con.print(
            Text(f"[{p['severity']}] {p['text']}", style="red" if p["severity"] == "high" else "yellow"),
            highlight=False,
        )


__all__ = ["batch_report", "bubble_table", "register"]
