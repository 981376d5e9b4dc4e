"""Real CUDA pipeline runs: ``torch.distributed.pipelining`` over NCCL on one GPU, recorded with
CUDA activities by ``tests/data/cuda/record.py`` (its docstring says how). Each run's
``truth.json`` says how it was built: schedule, ranks, micro-batches, stages per rank, the layers
of every stage and the fault it carries.

These traces are what the GPU side of a real run looks like, which no generator here writes:
``batch_isend_irecv`` fuses a rank's sends and receives into one ``ncclDevKernel_SendRecv``
launched through ``cuLaunchKernelEx`` inside ``nccl:coalesced``, its peers named only by the
``record_param_comms`` ops issued before it, and multi-stage schedules wrap it in their own
``PP:<stage>SEND_F<mb>`` ranges. The ranks share one GPU, so kernels of one rank stretch while
another's spin: costs are what the run measured, not what the config implies, and only facts
that hold whatever the sharing are asserted.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from ablate import COMM_ARGS, PARAM_COMMS, SHAPES, strip_kineto_dir
from conftest import TEST_DATA

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.demo.skew import Move, move_ranks

CUDA = TEST_DATA / "cuda"
RUNS = sorted(p.parent.name for p in CUDA.glob("*/truth.json"))
MS = 1_000_000
CAUSE_TOL = 0.015  # of the step


def traces(d: Path) -> list[Path]:
    return sorted(d.glob("rank*.pt.trace.json*"))


def truth(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((CUDA / name / "truth.json").read_text(encoding="utf-8"))
    return out


@cache
def analyzed(name: str) -> Analyzed:
    return diagnose(traces(CUDA / name), Options())


def structure(a: Analyzed) -> dict[str, object]:
    run = a.result.run
    return {
        "pp": run.pp,
        "schedule": str(run.schedule),
        "M": run.microbatches,
        "v": run.virtual_stages,
        "stage_of": {r.rank: r.stage for r in a.result.ranks},
    }


def findings(a: Analyzed) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((f.code, tuple(sorted(f.ranks))) for f in a.result.findings)


def test_every_recorded_run_is_here() -> None:
    assert len(RUNS) >= 9, RUNS
    for name in RUNS:
        t = truth(name)
        assert t["complete"], name
        assert len(traces(CUDA / name)) == t["pp"] * t.get("dp", 1), name


@pytest.mark.parametrize("name", RUNS)
def test_structure_is_how_the_run_was_built(name: str) -> None:
    t = truth(name)
    a = analyzed(name)
    run = a.result.run
    assert run.structure is not None and run.structure.established
    # every rank holds its first stage at its own rank number: looped (s mod P) or V-shaped
    want_stage = {r["rank"]: min(r["stages"]) for r in t["ranks"]}
    assert structure(a) == {
        "pp": t["pp"],
        "schedule": t["schedule"],
        "M": t["m"],
        "v": t["v"],
        "stage_of": want_stage,
    }
    # peers come from the NCCL metadata on the host ops, not from timing
    assert run.peer_source == "metadata"
    assert run.structure.peers.source == "metadata"


@pytest.mark.parametrize("name", RUNS)
def test_every_recorded_step_is_complete_and_every_transfer_matched(name: str) -> None:
    t = truth(name)
    a = analyzed(name)
    recorded = sorted({s[0] for r in t["ranks"] for s in r["steps"]})
    assert a.result.run.steps == recorded
    assert a.result.hang is None  # the run finished: no hang, no cut step
    assert "PP013" not in {f.code for f in a.result.findings}
    lost = [w for w in a.result.run.warnings if "unmatched" in w or "not in the traces" in w]
    assert lost == []


def test_the_stage_with_twice_the_layers_is_the_slow_stage() -> None:
    name = "nccl_gpipe_p4_m4_slow2"
    assert truth(name)["layers"] == [4, 4, 8, 4]
    a = analyzed(name)
    pp003 = [f for f in a.result.findings if f.code == "PP003"]
    assert [f.stages for f in pp003] == [[2]]
    # and it is the slowest stage by measured compute, by far
    compute = {s.stage: s.compute_ms or 0.0 for s in a.result.stages}
    others = [v for s, v in compute.items() if s != 2]
    assert compute[2] > 1.5 * max(others), compute


def test_a_host_stall_on_one_rank_is_named_on_that_rank_alone() -> None:
    name = "nccl_1f1b_p4_m8_hoststall1"
    assert truth(name)["host_stall"]["rank"] == 1
    a = analyzed(name)
    pp006 = [f for f in a.result.findings if f.code == "PP006"]
    assert [f.ranks for f in pp006] == [[1]]


def test_late_sends_of_one_rank_are_named_as_its_late_transfers() -> None:
    name = "nccl_1f1b_p4_m8_slowlink1"
    assert truth(name)["slow_link"]["rank"] == 1
    a = analyzed(name)
    pp004 = [f for f in a.result.findings if f.code == "PP004"]
    assert pp004 and 1 in pp004[0].ranks


# ------------------------------------------------------------------ metamorphic relations

MOVES: dict[str, dict[int, Move]] = {
    "one_ahead_20ms": {1: Move("host-b", 20 * MS)},
    "half_behind_2.5s": {r: Move("host-b", -2500 * MS) for r in (0, 1)},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nccl_1f1b_p4_m8", "nccl_zbv_p4_m8", "nccl_interleaved_p2_v2_m4"])
@pytest.mark.parametrize("move", list(MOVES))
def test_ranks_on_a_skewed_host_keep_the_diagnosis(name: str, move: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for p in traces(CUDA / name):
        (src / p.name).write_bytes(p.read_bytes())
    moves = MOVES[move]
    move_ranks(src, tmp_path / "moved", moves)
    moved = diagnose(traces(tmp_path / "moved"), Options())
    base = analyzed(name)
    assert structure(moved) == structure(base)
    # the clock alone: the same hosts without skew give the same findings and causes
    move_ranks(src, tmp_path / "control", {r: Move(m.host, 0) for r, m in moves.items()})
    control = diagnose(traces(tmp_path / "control"), Options())
    assert findings(moved) == findings(control)
    c = {r.rank: r.shares for r in control.result.ranks}
    for r in moved.result.ranks:
        for cause, v in r.shares.items():
            assert abs(v - c[r.rank][cause]) <= CAUSE_TOL, (r.rank, cause, c[r.rank][cause], v)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "nccl_1f1b_p4_m8",
        "nccl_1f1b_p4_m8_slowlink1",  # late sends: the timing fit finds rank 2's partners ambiguous
        "nccl_gpipe_p4_m4_slow2",
        "nccl_zbv_p4_m8",
        "nccl_izb_p4_m8",
    ],
)
def test_without_nccl_metadata_the_structure_stays(name: str, tmp_path: Path) -> None:
    """Profiler defaults of an older PyTorch: no record_param_comms, no comm args, no shapes. The
    peers are then found from the pipeline labels where a schedule leaves them, else from the data
    flow: single-stage schedules leave none, and their fused SendRecv kernels (a send and a receive
    to one peer, different peers over time on a middle rank, all on one NCCL stream) end together
    only to a few ms on a GPU the ranks share by time slices. The pipeline must stay the same."""
    src = tmp_path / "src"
    src.mkdir()
    for p in traces(CUDA / name):
        (src / p.name).write_bytes(p.read_bytes())
    counts = strip_kineto_dir(src, tmp_path / "bare", (PARAM_COMMS, COMM_ARGS, SHAPES))
    assert counts[PARAM_COMMS] > 0
    bare = diagnose(traces(tmp_path / "bare"), Options())
    assert structure(bare) == structure(analyzed(name))
