"""Demo config, layout and ground-truth file: fast tests that need no torch and start no process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppdiag.demo import DemoConfig, DemoError, canonical_schedule, load_groundtruth, record, recorder
from ppdiag.demo import groundtruth as gt
from ppdiag.demo.worker import _one_line
from ppdiag.errors import InputError, PpdiagError

REPO = Path(__file__).resolve().parents[1]


# ---- layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_stage_placement_follows_each_schedule_family(pp: int) -> None:
    for name in ("gpipe", "1f1b"):
        cfg = DemoConfig(schedule=name, pp=pp)
        assert cfg.num_stages == pp
        assert cfg.stage_to_rank() == list(range(pp))
    for name in ("interleaved_1f1b", "looped_bfs", "zero_bubble"):
        cfg = DemoConfig(schedule=name, pp=pp)
        assert cfg.num_stages == 2 * pp
        for r in range(pp):
            assert cfg.stages_of_rank(r) == [r, r + pp]
    for name in ("zbv", "dualpipev"):
        cfg = DemoConfig(schedule=name, pp=pp)
        for r in range(pp):
            assert cfg.stages_of_rank(r) == [r, 2 * pp - 1 - r]
        # the V's turn sits on the last rank: its two stages are adjacent
        assert cfg.stages_of_rank(pp - 1) == [pp - 1, pp]


def test_neighbours_are_the_ranks_that_exchange_tensors() -> None:
    assert DemoConfig(schedule="1f1b", pp=4).neighbours(0) == [1]
    assert DemoConfig(schedule="1f1b", pp=4).neighbours(2) == [1, 3]
    # interleaved: rank 0 holds stages 0 and 4; stage 4 receives from rank 3 (stage 3)
    assert DemoConfig(schedule="interleaved_1f1b", pp=4).neighbours(0) == [1, 3]
    # V shape: rank 3 holds stages 3 and 4, which talk to each other locally, and to rank 2
    assert DemoConfig(schedule="zbv", pp=4).neighbours(3) == [2]


def test_costs_scale_with_layers_and_slow_factor() -> None:
    cfg = DemoConfig(
        schedule="1f1b",
        pp=4,
        fwd_ms=4,
        bwd_ms=8,
        layers_per_stage=2,
        stage_layers=[1, 2, 3, 2],
        slow_stage=3,
        slow_factor=3.0,
        wgrad_fraction=0.25,
    )
    costs = cfg.validated().stage_costs_ms()
    assert [c["fwd"] for c in costs] == [2.0, 4.0, 6.0, 12.0]
    assert [c["bwd"] for c in costs] == [4.0, 8.0, 12.0, 24.0]
    for c in costs:
        assert c["bwd_input"] + c["wgrad"] == pytest.approx(c["bwd"])
        assert c["wgrad"] == pytest.approx(0.25 * c["bwd"])


def test_faults_are_listed_with_their_ranks() -> None:
    cfg = DemoConfig(
        schedule="zbv",
        pp=4,
        microbatches=8,
        slow_stage=6,
        slow_factor=2.0,
        comm_delay_ms=5,
        comm_delay_rank=1,
        host_stall_ms=3,
        host_stall_rank=2,
    ).validated()
    kinds = {f["kind"]: f for f in cfg.faults()}
    assert kinds["slow_stage"] == {"kind": "slow_stage", "stage": 6, "rank": 1, "factor": 2.0}
    assert kinds["comm_delay"]["peers"] == [0, 2]
    assert kinds["comm_delay"]["sync"] is False
    assert DemoConfig(comm_delay_ms=5, comm_delay_rank=1, comm_delay_sync=True).faults()[0]["sync"] is True
    assert kinds["host_stall"]["rank"] == 2
    assert DemoConfig().faults() == []
    # a factor of 1 or a zero delay is no fault
    assert DemoConfig(slow_stage=1, slow_factor=1.0, comm_delay_rank=1, comm_delay_ms=0).faults() == []


def test_total_iterations_include_profiler_wait_and_warmup() -> None:
    assert DemoConfig(steps=3).total_iterations == 5


def test_schedule_aliases() -> None:
    assert canonical_schedule("Interleaved") == "interleaved_1f1b"
    assert canonical_schedule("ZB") == "zero_bubble"
    assert canonical_schedule("dualpipe-v") == "dualpipev"
    assert DemoConfig(schedule="1F1B").validated().schedule == "1f1b"


# ---- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"schedule": "pipedream"}, "unknown schedule"),
        ({"pp": 1}, "pp must be"),
        ({"schedule": "1f1b", "pp": 4, "microbatches": 3}, "microbatches >= pp"),
        ({"schedule": "interleaved_1f1b", "pp": 4, "microbatches": 9}, "multiple of the number of rounds"),
        ({"schedule": "dualpipev", "pp": 4, "microbatches": 6}, "dualpipev needs microbatches"),
        ({"stage_layers": [2, 2, 2]}, "stage_layers has 3 entries"),
        ({"stage_layers": [2, 0, 2, 2]}, "at least one layer"),
        ({"slow_stage": 4}, "slow_stage 4 is not a stage"),
        ({"slow_factor": 0.0, "slow_stage": 1}, "slow_factor"),
        ({"comm_delay_rank": 7, "comm_delay_ms": 1}, "comm_delay_rank 7 is not a rank"),
        ({"host_stall_rank": -1, "host_stall_ms": 1}, "host_stall_rank -1"),
        ({"fwd_ms": -1.0}, "fwd_ms"),
        ({"bwd_ms": float("nan")}, "bwd_ms"),
        ({"compute": "gpu"}, "compute must be"),
        ({"batch": 30, "microbatches": 8}, "multiple of microbatches"),
        ({"wgrad_fraction": 1.5}, "wgrad_fraction"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"steps": 0}, "steps must be"),
    ],
)
def test_bad_config_is_one_clear_input_error(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(InputError) as ei:
        DemoConfig(**kwargs).validated()
    msg = str(ei.value)
    assert needle in msg
    assert "\n" not in msg
    assert msg.startswith("demo: ")


def test_record_rejects_a_bad_config_before_starting_anything(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown schedule"):
        record(DemoConfig(schedule="nope"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_record_without_torch_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder, "torch_available", lambda: False)
    with pytest.raises(InputError) as ei:
        record(DemoConfig(), tmp_path)
    assert str(ei.value) == "ppdiag demo needs torch: pip install torch (the ppdiag[demo] extra)"
    assert ei.value.exit_code == 2


def test_importing_the_demo_package_does_not_import_torch() -> None:
    # torch is made unimportable: any import of it inside ppdiag.demo would fail loudly.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import ppdiag.demo, ppdiag.demo.recorder, ppdiag.demo.groundtruth, ppdiag.demo.config\n"
        "cfg = ppdiag.demo.DemoConfig(schedule='zbv').validated()\n"
        "print(cfg.stage_to_rank())"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[0, 1, 2, 3, 3, 2, 1, 0]"


def test_config_round_trips_through_a_dict() -> None:
    cfg = DemoConfig(schedule="zbv", stage_layers=[1] * 8, slow_stage=3, slow_factor=1.5)
    assert DemoConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(InputError, match="unknown config keys bogus"):
        DemoConfig.from_dict({**cfg.to_dict(), "bogus": 1})


# ---- errors -------------------------------------------------------------------------------


def test_demo_error_is_a_one_line_ppdiag_error() -> None:
    err = DemoError("demo run failed on rank 2: RuntimeError: boom", rank=2)
    assert isinstance(err, PpdiagError)
    assert err.rank == 2
    assert str(err) == "demo run failed on rank 2: RuntimeError: boom"


def test_one_line_digs_out_the_root_cause() -> None:
    try:
        try:
            raise ValueError("shape mismatch\nsecond line")
        except ValueError as inner:
            raise RuntimeError("\n   stage 2 failed to run forward:\n   args: ...") from inner
    except RuntimeError as exc:
        assert _one_line(exc) == "ValueError: shape mismatch"
    assert _one_line(KeyboardInterrupt()) == "KeyboardInterrupt"


def test_monitor_blames_the_earliest_error_and_reports_progress() -> None:
    seen: list[tuple[str, float]] = []
    cfg = DemoConfig(pp=2, steps=1)  # 3 iterations per rank
    mon = recorder._Monitor(cfg, lambda m, f: seen.append((m, f)))
    lines = [
        {"event": "imported", "rank": -1, "torch_version": "x"},
        {"event": "step", "rank": 0, "step": 0},
        {"event": "step", "rank": 1, "step": 0},
        {"event": "step", "rank": 1, "step": 1},
        # rank 3's error arrives first on the pipe but happened later (a peer losing its connection)
        {"event": "error", "rank": 1, "message": "RuntimeError: Connection closed by peer", "t": 200},
        {"event": "error", "rank": 0, "message": "RuntimeError: injected", "t": 100},
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    mon.feed(data[:37])  # split mid-line, as pipe reads may
    mon.feed(data[37:])
    fracs = [f for _, f in seen]
    assert fracs == sorted(fracs)
    assert fracs[-1] == pytest.approx(0.05 + 0.9 * 3 / 6)
    assert seen[-1][0] == "1/3 steps done on all 2 ranks"
    failure = mon.first_failure()
    assert failure is not None
    assert str(failure) == "demo run failed on rank 0: RuntimeError: injected"
    assert failure.rank == 0


def test_monitor_reports_a_rank_killed_by_a_signal() -> None:
    mon = recorder._Monitor(DemoConfig(pp=2), None)
    mon.feed(b'{"event": "exit", "rank": 1, "code": -9}\n')
    assert str(mon.first_failure()) == "demo run failed: rank 1 died (signal 9)"


# ---- ground-truth file --------------------------------------------------------------------


def _part(rank: int, stages: list[int]) -> dict[str, Any]:
    log = gt.IntervalLog()
    # two steps; per step one forward (3 ms), one backward (6 ms), one 2 ms wait on rank-1's data
    for step, base in ((2, 1_000_000_000), (3, 2_000_000_000)):
        log.add("fwd", step, stages[0], 0, base, base + 3_000_000, held_ns=2_900_000)
        log.add(
            "wait",
            step,
            stages[0],
            0,
            base + 3_000_000,
            base + 5_000_000,
            peer=rank - 1,
            direction="recv",
            payload="grad",
        )
        log.add("bwd", step, stages[0], 0, base + 5_000_000, base + 11_000_000, held_ns=5_900_000)
    return {
        "rank": rank,
        "stages": stages,
        "pid": 100 + rank,
        "trace": gt.trace_name(rank),
        "steps": {
            "step": [2, 3],
            "start_ns": [1_000_000_000, 2_000_000_000],
            "end_ns": [1_020_000_000, 2_020_000_000],
        },
        "intervals": log.to_json(),
    }


def _header() -> dict[str, Any]:
    return {
        "schedule": "1f1b",
        "pp": 2,
        "microbatches": 1,
        "stage_to_rank": [0, 1],
        "steps": [2, 3],
        "faults": [{"kind": "host_stall", "rank": 1, "stall_ms": 3.0}],
    }


def test_ground_truth_round_trip(tmp_path: Path) -> None:
    path = gt.write(tmp_path / gt.FILENAME, _header(), [_part(1, [1]), _part(0, [0])])
    truth = load_groundtruth(tmp_path)  # a directory works too
    assert truth.schedule == "1f1b" and truth.pp == 2 and truth.steps == [2, 3]
    assert [r.rank for r in truth.ranks] == [0, 1]
    assert truth.trace_path(1) == tmp_path / "rank1.pt.trace.json.gz"
    assert truth.faults[0]["kind"] == "host_stall"
    r1 = truth.rank(1)
    assert len(r1) == 6
    assert r1.total_ns("fwd") == 2 * 3_000_000
    assert r1.compute_ns() == 2 * (3_000_000 + 6_000_000)
    assert r1.compute_ns(step=3) == 9_000_000
    assert r1.total_ns(("wait", "bwd"), step=2) == 2_000_000 + 6_000_000
    waits = r1.mask("wait")
    assert list(r1.cols["peer"][waits]) == [0, 0]
    assert set(r1.cols["direction"][waits]) == {"recv"}
    assert int(r1.cols["held_ns"].sum()) == 2 * (2_900_000 + 5_900_000)
    assert np.array_equal(r1.step, [2, 3])
    assert json.loads(path.read_text())["schema_version"] == gt.SCHEMA_VERSION


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such ground-truth file"),
        ("{not json", "not a readable ground-truth JSON file"),
        ('{"schema": "other"}', "not a ppdiag demo ground-truth file"),
        ('{"schema": "ppdiag.demo.groundtruth", "schema_version": 99}', "schema_version 99"),
        ('{"schema": "ppdiag.demo.groundtruth", "schema_version": 1, "schedule": "1f1b"}', "lacks 'pp'"),
    ],
)
def test_unusable_ground_truth_is_one_input_error(tmp_path: Path, content: str | None, needle: str) -> None:
    p = tmp_path / gt.FILENAME
    if content is not None:
        p.write_text(content)
    with pytest.raises(InputError) as ei:
        load_groundtruth(p)
    assert needle in str(ei.value)
    assert str(p) in str(ei.value)
    assert "\n" not in str(ei.value)


def test_ground_truth_with_ragged_columns_is_rejected(tmp_path: Path) -> None:
    part = _part(0, [0])
    part["intervals"]["end_ns"].pop()
    gt.write(tmp_path / gt.FILENAME, _header(), [part])
    with pytest.raises(InputError, match="column end_ns has 5 rows, expected 6"):
        load_groundtruth(tmp_path)
