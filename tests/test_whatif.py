"""What-if predictions: closed forms with equal stages, calibration, micro-batch size semantics,
memory, predictions on simulated GPU runs checked against simulated truths, per-layer costs from
module ranges, and the ``whatif`` / ``bubble`` / ``batch`` commands."""

from __future__ import annotations

import io
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.cli import app
from ppdiag.model import Intervals, Kind, NameTable, Phase, RangeKind, Ranges, RankTimeline
from ppdiag.pipeline.blocks import Blocks
from ppdiag.report_types import Cause
from ppdiag.reports.terminal import render
from ppdiag.whatif.batch import check_batch
from ppdiag.whatif.costs import MeasuredRun
from ppdiag.whatif.layers import module_layers, profile_from_stages
from ppdiag.whatif.scenarios import Scenario, WhatifModel, WhatifOptions, build_model
from ppsynth.faults import SlowLink, SlowStage
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

MS = 1_000_000


def equal_run(
    schedule: str = "1f1b",
    pp: int = 4,
    m: int = 4,
    fwd_ms: float = 1.0,
    bwd_ms: float = 2.0,
    step_ms: float | None = None,
    removable_ms: dict[str, float] | None = None,
    lost_ms: dict[str, float] | None = None,
) -> MeasuredRun:
    """A measured run with equal stages, free communication and nothing else (unless asked)."""
    n = pp
    return MeasuredRun(
        schedule=schedule,
        detected_schedule=schedule,
        pp=pp,
        virtual=1,
        microbatches=m,
        fwd_ns=np.full(n, fwd_ms * MS),
        bwd_ns=np.full(n, bwd_ms * MS),
        wgrad_ns=np.zeros(n),
        split_backward=False,
        p2p_ns=0.0,
        head_ns=0.0,
        tail_idle_ns=np.zeros(pp),
        tail_busy_ns=np.zeros(pp),
        step_ns=(step_ms if step_ms is not None else (m + pp - 1) * (fwd_ms + bwd_ms)) * MS,
        lost_ms=lost_ms or {},
        removable_ns={k: v * MS for k, v in (removable_ms or {}).items()},
        from_trace=step_ms is not None,
    )


def model(meas: MeasuredRun, **opts: Any) -> WhatifModel:
    return WhatifModel(meas, profile_from_stages(meas), WhatifOptions(**opts))


# ---- closed forms ------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp", [2, 4, 8])
def test_equal_stages_match_the_closed_form(schedule: str, pp: int) -> None:
    wm = model(equal_run(schedule, pp, m=pp))
    for m in (pp, 2 * pp, 3 * pp + 1, 8 * pp):
        p = wm.predict(Scenario(microbatches=m, fixed_microbatch_size=True))
        assert p.error is None
        # (M + P - 1) slots of one forward and one backward; idle share (P-1)/(M+P-1)
        assert p.step_ns == pytest.approx((m + pp - 1) * 3 * MS, rel=1e-12)
        assert p.bubble_ratio == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-12)
        assert p.lost_ns["bubble"] == pytest.approx((pp - 1) * 3 * MS, rel=1e-12)
        assert p.lost_ns["imbalance"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("pp", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (4, 2, 16), (8, 2, 16)])
def test_interleaving_matches_the_closed_form(pp: int, v: int, m: int) -> None:
    wm = model(equal_run("1f1b", pp, m=m))
    p = wm.predict(Scenario(schedule="interleaved", virtual=v))
    assert p.error is None and (p.schedule, p.virtual) == ("interleaved_1f1b", v)
    # each rank's stage re-cut into v chunks of (F+B)/v: v*M chunks of work and P-1 idle chunks
    assert p.step_ns == pytest.approx((v * m + pp - 1) * 3 * MS / v, rel=1e-12)
    assert p.bubble_ratio == pytest.approx((pp - 1) / (v * m + pp - 1), rel=1e-12)
    assert p.closed_form_bubble == pytest.approx(p.bubble_ratio, rel=1e-12)


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 16), (8, 16)])
def test_zero_bubble_matches_the_closed_form(pp: int, m: int) -> None:
    # F = 1, B = 2 split half input-gradient, half weight-gradient: F = I = W as the closed form needs
    p = model(equal_run("1f1b", pp, m=m)).predict(Scenario(schedule="zero_bubble"))
    assert p.error is None
    assert p.bubble_ratio == pytest.approx((pp - 1) / (3 * m + pp - 1), rel=1e-12)
    assert p.step_ns == pytest.approx((3 * m + pp - 1) * MS, rel=1e-12)


def test_impossible_scenarios_say_why() -> None:
    wm = model(equal_run("1f1b", 4, m=8))
    p = wm.predict(Scenario(microbatches=9, schedule="interleaved", virtual=2))
    assert p.step_ns is None and p.error and "multiple" in p.error
    p = wm.predict(Scenario(pp=16))  # 4 stage units cannot be cut into 16 layers? continuous: they can
    assert p.error is None
    lp = WhatifModel(wm.meas, profile_from_stages(wm.meas, [2]))
    p = lp.predict(Scenario(pp=16))
    assert p.error and "8 layers cannot fill 16 stages" in p.error


# ---- micro-batch size semantics, calibration, removals ---------------------------------------


def test_fixed_global_batch_scales_costs_and_fixed_size_counts_samples() -> None:
    base = equal_run("1f1b", 4, m=4)  # 7 slots of 3 ms = 21 ms
    wm = model(base)
    p = wm.predict(Scenario(microbatches=8))
    # micro-batches half the size: 11 slots of 1.5 ms
    assert p.step_ns == pytest.approx(16.5 * MS)
    assert p.speedup == pytest.approx(21 / 16.5) and p.samples_vs_measured == 1.0
    q = wm.predict(Scenario(microbatches=8, fixed_microbatch_size=True))
    assert q.step_ns == pytest.approx(33 * MS)
    assert q.samples_vs_measured == 2.0
    assert q.step_speedup == pytest.approx(21 / 33)
    assert q.speedup == pytest.approx(2 * 21 / 33)  # throughput: twice the samples in 33 ms


@pytest.mark.parametrize("mode", ["per-block", "per-step", "ratio"])
def test_calibration_reproduces_the_measured_step(mode: str) -> None:
    meas = equal_run("1f1b", 4, m=8, step_ms=40.0)  # the simulator alone says 33 ms
    wm = model(meas, calibration=mode)
    cal = wm.calibration()
    assert cal.sim_ns == pytest.approx(33 * MS) and cal.target_ns == pytest.approx(40 * MS)
    same = wm.predict(Scenario())
    assert same.step_ns == pytest.approx(40 * MS, abs=2000)
    m16 = wm.predict(Scenario(microbatches=16, fixed_microbatch_size=True)).step_ns
    sim16 = (16 + 3) * 3 * MS
    if mode == "per-step":
        assert m16 == pytest.approx(sim16 + 7 * MS)
        assert cal.offset_ns == pytest.approx(7 * MS)
    elif mode == "ratio":
        assert m16 == pytest.approx(sim16 * 40 / 33)
    else:
        # an overhead d on each of the 2M blocks of a rank: the critical path of 1F1B with equal
        # stages is (M + P - 1) forward/backward pairs, so 33 + 11 * 2d = 40
        d = 7 * MS / 22
        assert cal.delta_ns == pytest.approx(d, rel=1e-3)
        assert m16 == pytest.approx(sim16 + 19 * 2 * d, rel=1e-3)


def test_removing_a_cause_lowers_the_target_and_zeroes_it() -> None:
    meas = equal_run(
        "1f1b",
        4,
        m=8,
        step_ms=40.0,
        removable_ms={"comm_wait": 4.0, "host": 1.0},
        lost_ms={"comm_wait": 5.0, "host": 1.0},
    )
    wm = model(meas)
    same = wm.predict(Scenario())
    assert same.lost_ns["comm_wait"] == pytest.approx(4 * MS, rel=1e-3)
    assert same.lost_ns["host"] == pytest.approx(1 * MS, rel=1e-3)
    assert same.lost_ns["unexplained"] == pytest.approx(2 * MS, rel=1e-3)  # 40 - 33 - 4 - 1
    no_cw = wm.predict(Scenario(no_comm_wait=True))
    assert no_cw.step_ns == pytest.approx(36 * MS, abs=2000)
    assert no_cw.lost_ns["comm_wait"] == 0.0
    assert no_cw.lost_ns["host"] == pytest.approx(1 * MS, rel=1e-3)
    both = wm.predict(Scenario(no_comm_wait=True, no_host=True))
    assert both.step_ns == pytest.approx(35 * MS, abs=2000)
    for p in (same, no_cw, both):
        assert p.step_ns is not None
        # the causes add up to the lost time: step minus compute (24 ms of blocks per rank)
        assert sum(p.lost_ns[k] for k in Cause) == pytest.approx(p.step_ns - 24 * MS, rel=1e-9)


# ---- memory --------------------------------------------------------------------------------


def test_peak_activations() -> None:
    wm = model(equal_run("1f1b", 4, m=8))
    base = wm.measured_row()
    assert base.peak_inflight == 4  # 1F1B: rank 0 holds P micro-batches
    g = wm.predict(Scenario(schedule="gpipe"))
    assert g.peak_inflight == 8 and g.activation_vs_measured == pytest.approx(2.0)
    # interleaved (Megatron): rank 0 warms up with 2(P-1) + (v-1)P = 10 forwards, then one more
    # before its first backward; each chunk holds half a stage's activations
    i = wm.predict(Scenario(schedule="interleaved", virtual=2))
    assert i.peak_inflight == 11 and i.activation_vs_measured == pytest.approx(11 * 0.5 / 4)
    # fixed global batch: twice the micro-batches, half the size, same P in flight
    m = wm.predict(Scenario(microbatches=16))
    assert m.peak_inflight == 4 and m.activation_vs_measured == pytest.approx(0.5)


# ---- simulated GPU runs: predictions against the simulator's truth ----------------------------


@cache
def synth_run(root: str, name: str, **kw: Any) -> tuple[Analyzed, float]:
    d = Path(root) / name
    shutil.rmtree(d, ignore_errors=True)
    write_kineto(make_scenario(annotations="pp", steps=2, **kw), d)
    truth = json.loads((d / "groundtruth.json").read_text())
    return diagnose([d], Options()), float(np.median(truth["step_ms"]))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("whatif_synth"))


@pytest.mark.parametrize(
    ("base", "scn", "truth"),
    [
        (
            {"microbatches": 4, "faults": (SlowStage(2, 2.0),)},
            Scenario(microbatches=8, fixed_microbatch_size=True),
            {"microbatches": 8, "faults": (SlowStage(2, 2.0),)},
        ),
        (
            {"microbatches": 8},
            Scenario(schedule="interleaved", virtual=2),
            {"microbatches": 8, "schedule": "interleaved_1f1b", "virtual": 2, "fwd_ms": 0.5, "bwd_ms": 1.0},
        ),
        (
            {"microbatches": 8},
            Scenario(schedule="zero_bubble"),
            {"microbatches": 8, "schedule": "zero_bubble", "bwd_ms": 1.0, "wgrad_ms": 1.0},
        ),
        ({"microbatches": 8}, Scenario(schedule="gpipe"), {"microbatches": 8, "schedule": "gpipe"}),
        ({"faults": (SlowLink(1, delay_ms=0.4),)}, Scenario(no_comm_wait=True), {}),
    ],
)
def test_predictions_match_simulated_runs(
    root: str, base: dict[str, Any], scn: Scenario, truth: dict[str, Any]
) -> None:
    diag, _ = synth_run(root, "base" + str(abs(hash(repr(base)))), **base)
    _, want = synth_run(root, "truth" + str(abs(hash(repr(truth)))), **truth)
    p = build_model(diag).predict(scn)
    assert p.error is None
    assert p.step_ns is not None
    assert abs(p.step_ns / MS - want) <= 0.03 * want, (p.scenario, p.step_ns / MS, want)


def test_report_carries_the_whatif_table(root: str, test_data: Path) -> None:
    diag, _ = synth_run(root, "slow", faults=(SlowStage(2, 2.0),))
    rows = diag.result.whatif
    assert [r.scenario for r in rows][:3] == ["M=16 (M x 2)", "interleaved, v=2", "rebalanced stages"]
    step = diag.result.summary.step_mean_ms  # what the what-if is calibrated on
    assert step is not None
    for r in rows:
        assert r.step_ms is not None and r.step_ms > 0
        assert r.speedup == pytest.approx(step / r.step_ms, rel=1e-3)
        assert set(r.lost_ms) == set(Cause)
    reb = rows[2]
    assert reb.split is not None and reb.speedup is not None
    assert reb.split.slowest_stage_before == 2 and reb.split.ideal is True
    assert reb.speedup > 1.1
    out = io.StringIO()
    render(diag.result, Console(file=out, width=160), ranks=False)
    assert "What if" in out.getvalue() and "rebalanced stages" in out.getvalue()
    # no pipeline: no table
    assert diagnose([test_data / "cpu_gloo_rank0.json"], Options()).result.whatif == []


# ---- per-layer costs from module ranges ------------------------------------------------------


def _module_rank(cpu: bool) -> tuple[RankTimeline, Blocks]:
    """Two forward blocks of three layers each (the middle one with a nested Linear), then two
    backward blocks; layer i's work costs (i + 1) ms in micro-batch 0 and (i + 2) ms in micro-batch 1."""
    names = NameTable()
    ms = MS
    iv_rows: list[tuple[int, int, int]] = []  # start, end, launch
    rg_rows: list[tuple[int, int, int]] = []  # start, end, name
    blocks: list[tuple[int, int, int, int]] = []  # start, end, phase, mb
    t = 0
    for mb in (0, 1):
        b0 = t
        rg_start = t
        layer_ranges = []
        for i in range(3):
            cost = (i + 1 + mb) * ms
            ls = t
            # the host launches the work inside the range; on a GPU it runs later
            launch = t + 10_000
            start = launch if cpu else launch + 50_000
            iv_rows.append((start, start + cost, launch))
            t = start + cost + 20_000 if cpu else launch + 30_000
            layer_ranges.append((ls, t, names.id(f"nn.Module: Block_{i}")))
            if i == 1:
                rg_rows.append((ls + 1, ls + 20_000, names.id("nn.Module: Linear_0")))
        rg_rows.append((rg_start, t, names.id("nn.Module: Sequential_0")))
        rg_rows.extend(layer_ranges)
        if not cpu:
            t = max(t, iv_rows[-1][1])
        blocks.append((iv_rows[-3][0], iv_rows[-1][1], int(Phase.FWD), mb))
        t += ms
        b0 = t
        iv_rows.append((b0, b0 + 5 * ms, b0 - 1000))
        blocks.append((b0, b0 + 5 * ms, int(Phase.BWD), mb))
        t = b0 + 6 * ms
    iv = Intervals.from_columns(
        len(iv_rows),
        {
            "start": [r[0] for r in iv_rows],
            "end": [r[1] for r in iv_rows],
            "launch": [-1 if cpu else r[2] for r in iv_rows],
            "kind": [int(Kind.COMPUTE)] * len(iv_rows),
        },
    )
    rg = Ranges.from_columns(
        len(rg_rows),
        {
            "start": [r[0] for r in rg_rows],
            "end": [r[1] for r in rg_rows],
            "name": [r[2] for r in rg_rows],
            "kind": [int(RangeKind.MODULE)] * len(rg_rows),
        },
    )
    tl = RankTimeline(0, "x", "kineto", names.names, iv, rg, cpu_only=cpu)
    n = len(blocks)
    b = Blocks(
        np.zeros(n, np.int32),
        np.array([x[0] for x in blocks], np.int64),
        np.array([x[1] for x in blocks], np.int64),
        np.array([x[1] - x[0] for x in blocks], np.int64),
        np.full(n, -1, np.int64),
        np.array([x[2] for x in blocks], np.int8),
        np.array([x[3] for x in blocks], np.int32),
        np.zeros(n, np.int32),
    )
    return tl, b


@pytest.mark.parametrize("cpu", [True, False])
def test_layer_costs_from_module_ranges(cpu: bool) -> None:
    tl, b = _module_rank(cpu)
    got = module_layers(tl, b)
    assert list(got) == [0]
    names, fwd = got[0]
    assert names == ["Block_0", "Block_1", "Block_2"]
    # mean over the two micro-batches of (i + 1) and (i + 2) ms
    assert fwd.tolist() == pytest.approx([1.5 * MS, 2.5 * MS, 3.5 * MS])


# ---- commands --------------------------------------------------------------------------------

runner = CliRunner()


def test_bubble_command() -> None:
    res = runner.invoke(app, ["bubble", "--pp", "8", "--microbatches", "32", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["bubble_ratio"] == pytest.approx(7 / 39, abs=1e-6)
    assert [r["microbatches"] for r in out["table"]] == [8, 16, 32, 64]
    for r in out["table"]:
        assert r["simulated"] == pytest.approx((8 - 1) / (r["microbatches"] + 8 - 1), abs=1e-6)
        assert r["peak_inflight"] == 8
    res = runner.invoke(
        app, ["bubble", "--pp", "4", "-m", "8", "--schedule", "interleaved", "--virtual", "2", "--json"]
    )
    assert json.loads(res.output)["bubble_ratio"] == pytest.approx(3 / 19, abs=1e-6)
    res = runner.invoke(app, ["bubble", "--pp", "4", "-m", "6", "--schedule", "gpipe"])
    assert res.exit_code == 0 and "33.3%" in res.output  # 3 / 9
    res = runner.invoke(app, ["bubble", "--pp", "4", "-m", "9", "--schedule", "interleaved"])
    assert res.exit_code == 2 and "multiple" in res.output
    res = runner.invoke(app, ["bubble", "--pp", "4", "-m", "8", "--schedule", "nope"])
    assert res.exit_code == 2 and "unknown schedule" in res.output


def test_batch_command() -> None:
    res = runner.invoke(
        app,
        [
            "batch",
            "--world",
            "64",
            "--tp",
            "2",
            "--pp",
            "4",
            "--micro-batch",
            "2",
            "--global-batch",
            "512",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["dp"] == 8 and out["accumulation"] == 32 and out["microbatches_per_stage"] == 32
    assert out["bubble_ratio"] == pytest.approx(3 / 35, abs=1e-6)
    assert out["problems"] == []
    res = runner.invoke(
        app,
        ["batch", "--world", "64", "--tp", "2", "--pp", "4", "--micro-batch", "2", "--global-batch", "80"],
    )
    assert res.exit_code == 0 and "M=5 < 2 × pp = 8 (4 stages)" in res.output
    res = runner.invoke(app, ["batch", "--world", "60", "--tp", "2", "--pp", "4", "--strict"])
    assert res.exit_code == 1 and "not divisible" in res.output
    res = runner.invoke(app, ["batch", "--world", "0", "--pp", "4"])
    assert res.exit_code == 2 and "--world must be >= 1" in res.output


def test_check_batch_interleaved_constraint() -> None:
    def problems(m: int) -> list[str]:
        return [
            t
            for _, t in check_batch(None, 4, microbatches=m, schedule="interleaved_1f1b", virtual=2).problems
        ]

    assert problems(6)[-1].startswith("interleaved 1F1B with M=6")  # Megatron wants a multiple of pp
    assert any("cannot run M=9" in t for t in problems(9))  # 2 rounds do not divide 9
    assert problems(16) == []


def test_whatif_command_on_a_simulated_run(root: str) -> None:
    synth_run(root, "cli", microbatches=4, faults=(SlowStage(2, 2.0),))
    run_dir = str(Path(root) / "cli")
    res = runner.invoke(app, ["whatif", run_dir, "-m", "8,16", "--fixed-microbatch-size", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [s["scenario"] for s in out["scenarios"]] == [
        "measured",
        "M=8, same micro-batch size",
        "M=16, same micro-batch size",
    ]
    assert out["calibration"]["mode"] == "per-block"
    assert out["scenarios"][0]["step_ms"] == pytest.approx(out["measured"]["step_ms"])
    steps = [s["step_ms"] for s in out["scenarios"]]
    assert steps[0] < steps[1] < steps[2]
    res = runner.invoke(app, ["whatif", run_dir, "--rebalance", "--layers-per-stage", "2"])
    assert res.exit_code == 0, res.output
    assert "slowest stage now: stage 2" in res.output and "proposed: " in res.output
    res = runner.invoke(app, ["whatif", run_dir, "--rebalance", "--layers-per-stage", "2", "--json"])
    reb = json.loads(res.output)["scenarios"][-1]
    # layers of 1.5, 1.5 | 1.5, 1.5 | 3, 3 | 1.5, 1.5 ms: the best slowest stage is 4.5 ms
    assert sum(reb["split"]["layers_per_stage"]) == 8
    assert max(reb["stage_ms"]) == pytest.approx(4.5, rel=0.01)
    assert reb["split"]["slowest_before_ms"] == pytest.approx(6.0, rel=0.01)
    res = runner.invoke(app, ["whatif", run_dir])
    assert res.exit_code == 0 and "M=8 (M x 2)" in res.output


def test_whatif_command_bad_input(test_data: Path, root: str) -> None:
    res = runner.invoke(app, ["whatif", str(test_data / "cpu_gloo_rank0.json")])
    assert res.exit_code == 2 and "no pipeline parallelism" in res.output
    res = runner.invoke(app, ["whatif"])
    assert res.exit_code == 2 and "give a run directory" in res.output
    synth_run(root, "cli", microbatches=4, faults=(SlowStage(2, 2.0),))
    for args, msg in (
        (["-m", "x"], "not a whole number"),
        (["--schedule", "1f2b"], "unknown schedule"),
        (["--calibration", "magic"], "--calibration must be one of"),
        (["--layers-per-stage", "2,2"], "--layers-per-stage has 2 values"),
    ):
        res = runner.invoke(app, ["whatif", str(Path(root) / "cli"), *args, "--rebalance"])
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output and "Traceback" not in res.output


# ---- the demo option the recorded rebalancing check relies on --------------------------------


def test_demo_layer_factors_set_per_layer_costs() -> None:
    from ppdiag.demo.config import DemoConfig
    from ppdiag.errors import InputError

    cfg = DemoConfig(
        pp=4,
        fwd_ms=4.0,
        bwd_ms=8.0,
        layers_per_stage=2,
        stage_layers=[3, 2, 1, 2],
        layer_factors=[1, 1, 1, 1, 2, 2, 1, 1],
    ).validated()
    # layer costs 2 ms forward each, doubled for layers 4 and 5: stages hold 3, 1+2, 2 and 1+1 units
    assert [c["fwd"] for c in cfg.stage_costs_ms()] == [6.0, 6.0, 4.0, 4.0]
    assert [c["bwd"] for c in cfg.stage_costs_ms()] == [12.0, 12.0, 8.0, 8.0]
    assert cfg.layer_factor(1, 1) == 2.0 and cfg.layer_factor(0, 2) == 1.0
    assert DemoConfig().layer_factor(0, 0) == 1.0
    with pytest.raises(InputError, match="layer_factors has 3 entries but the model has 8 layers"):
        DemoConfig(layer_factors=[1, 1, 1]).validated()
    with pytest.raises(InputError, match="finite numbers > 0"):
        DemoConfig(layer_factors=[1, 1, 1, 1, 0, 1, 1, 1]).validated()


def test_whatif_table_says_what_its_memory_column_rests_on() -> None:
    from ppdiag.reports.whatif_table import _memory_caption, typed_rows

    base = {"scenario": "gpipe", "activation_vs_measured": 2.0}
    full = dict.fromkeys(
        ("step_ms", "speedup", "step_speedup", "bubble_ratio", "schedule_bubble_ratio", "closed_form_bubble")
    ) | {
        "measured": False,
        "schedule": "gpipe",
        "pp": 4,
        "virtual": 1,
        "microbatches": 8,
        "lost_ms": {},
        "samples_vs_measured": None,
        "ms_per_sample": None,
        "peak_inflight": None,
        "peak_activation_mb": None,
        "stage_ms": [],
        "split": None,
        "calibration": "",
        "note": "",
        "error": None,
    }
    pred = full | base | {"memory_basis": "predicted"}
    cal = full | base | {"memory_basis": "calibrated"}
    meas = full | base | {"scenario": "measured", "activation_vs_measured": 1.0, "memory_basis": "measured"}
    assert "not measured" in _memory_caption(typed_rows([pred, pred | {"scenario": "M=16"}]))
    assert "calibrated on the measured" in _memory_caption(typed_rows([meas, cal]))
    # no value in the column: no caption
    assert (
        _memory_caption(
            typed_rows([full | {"scenario": "x", "error": "too big", "activation_vs_measured": None}])
        )
        == ""
    )
