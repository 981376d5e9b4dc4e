"""Ablation: the diagnosis must not depend on metadata users often lack.

Each test diagnoses one recording twice, as recorded and with one source of structure stripped by
``tests/ablate.py`` (the generator and the recorder have no flags for it), and requires the same
stage map, schedule and M, and every rank's causes within 1 % of the step (same recording).
Synthetic GPU runs in both formats are fast; recorded demo runs are marked slow.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from ppdiag.api import Options, diagnose
from ppdiag.report_types import Report
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ablate as A

STRUCTURE = ("pp", "schedule", "microbatches", "virtual_stages", "stage_map")


def _report(path: Path) -> Report:
    return diagnose([path], Options()).result


def _same(rep: Report, other: Report, tol_pct: float) -> None:
    for k in STRUCTURE:
        assert getattr(other.run, k) == getattr(rep.run, k), (
            k,
            getattr(rep.run, k),
            getattr(other.run, k),
            other.run.warnings,
        )
    for a, b in zip(rep.ranks, other.ranks, strict=True):
        step = a.step_ms
        for k, v in a.lost_ms.items():
            assert abs(b.lost_ms[k] - v) <= tol_pct / 100 * step, (a.rank, k, v, b.lost_ms[k], step)


@pytest.fixture(scope="module")
def kineto_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """P=4, M=6 1F1B with a 1.5x stage, per-rank clock skews of several ms, every source present."""
    d = tmp_path_factory.mktemp("kineto_meta")
    run = make_scenario(
        steps=2,
        clock_skew_ms=5.0,
        gpus_per_node=1,
        schedule="1f1b",
        pp=4,
        microbatches=6,
        faults=[F.SlowStage(1, 1.5)],
    )
    write_kineto(run, d)
    return d


@pytest.mark.parametrize(
    "what",
    [
        [A.COMM_ARGS],
        [A.PARAM_COMMS],
        [A.PG],
        [A.NVTX_NAMES],
        [A.COMM_ARGS, A.PARAM_COMMS, A.NVTX_NAMES],
        A.ALL_KINETO,
    ],
    ids=["comm_args", "param_comms", "pg", "nvtx_names", "all_peer_sources", "all"],
)
def test_kineto_source_stripped(kineto_run: Path, tmp_path: Path, what: list[str]) -> None:
    counts = A.strip_kineto_dir(kineto_run, tmp_path / "bare", what)
    assert sum(counts.values()) > 0  # the run had that source
    _same(_report(kineto_run), _report(tmp_path / "bare"), 1.0)


def test_kineto_labels_stripped(tmp_path: Path) -> None:
    # a run with PP:<stage>F<mb> labels: without them the blocks come from the transfers
    run = make_scenario(
        steps=2, clock_skew_ms=5.0, gpus_per_node=1, schedule="1f1b", pp=4, microbatches=6, annotations="pp"
    )
    write_kineto(run, tmp_path / "meta")
    counts = A.strip_kineto_dir(tmp_path / "meta", tmp_path / "bare", A.ALL_KINETO)
    assert counts[A.LABELS] > 0
    _same(_report(tmp_path / "meta"), _report(tmp_path / "bare"), 1.0)


@pytest.fixture(scope="module")
def nsys_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("nsys_meta")
    run = make_scenario(
        steps=2,
        clock_skew_ms=5.0,
        gpus_per_node=1,
        schedule="interleaved_1f1b",
        virtual=2,
        pp=4,
        microbatches=4,
    )
    write_nsys(run, d)
    return d


@pytest.mark.parametrize(
    "what", [[A.PAYLOADS], [A.EMIT_NVTX], [A.PAYLOADS, A.EMIT_NVTX]], ids=["payloads", "emit_nvtx", "both"]
)
def test_nsys_source_stripped(nsys_run: Path, tmp_path: Path, what: list[str]) -> None:
    A.strip_nsys_dir(nsys_run, tmp_path / "bare", what)
    rep, bare = _report(nsys_run), _report(tmp_path / "bare")
    _same(rep, bare, 1.0)


def test_nsys_without_nccl_ranges_keeps_the_pipeline(nsys_run: Path, tmp_path: Path) -> None:
    # no NCCL domain at all: SendRecv kernels carry neither peer nor direction; both come from
    # timing. The collectives lose their group too (matched across ranks elsewhere), so only the
    # structure is compared here, and the run says what it lacked.
    counts = A.strip_nsys_dir(nsys_run, tmp_path / "bare", [A.NCCL_RANGES])
    assert counts[A.NCCL_RANGES] > 0
    rep, bare = _report(nsys_run), _report(tmp_path / "bare")
    for k in STRUCTURE:
        assert getattr(bare.run, k) == getattr(rep.run, k), k
    assert bare.run.peer_source == "timing"
    assert bare.run.peers is not None and bare.run.peers.undecided == 0
    assert any("NCCL" in w for w in bare.run.warnings)


# ---- recorded demo runs (slow) ----------------------------------------------------------------

DEMOS: dict[str, dict[str, Any]] = {
    "1f1b": {"schedule": "1f1b", "microbatches": 8},
    # M = 8 > P: GPipe's order (all forwards, then all backwards) differs from 1F1B's on every stage
    "gpipe": {"schedule": "gpipe", "microbatches": 8},
    "1f1b_slow": {"schedule": "1f1b", "microbatches": 8, "slow_stage": 2, "slow_factor": 2.0},
    "gpipe_slow": {"schedule": "gpipe", "microbatches": 8, "slow_stage": 1, "slow_factor": 2.0},
    # v=2 on a looped placement: the last rank sends to the first within a step (the wrap link),
    # once per two sends of the first rank to the second, so v is read off the chain's counts
    "interleaved": {"schedule": "interleaved_1f1b", "microbatches": 8},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEMOS))
def test_demo_recording_without_shapes(tmp_path: Path, name: str) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the demo recorder needs torch")
    from ppdiag.demo import DemoConfig, record

    rec = tmp_path / "rec"
    record(DemoConfig(pp=4, steps=2, record_shapes=True, **DEMOS[name]), rec)
    rep = _report(rec)
    assert rep.run.peer_source == "metadata"
    # record_shapes=False, as torch.profiler records by default: no peer on any host op
    A.strip_kineto_dir(rec, tmp_path / "bare", [A.SHAPES])
    bare = _report(tmp_path / "bare")
    assert "metadata" not in bare.run.peer_source
    _same(rep, bare, 1.0)
    # nothing left but names and timing: no shapes, labels or process groups
    A.strip_kineto_dir(rec, tmp_path / "none", [A.SHAPES, A.LABELS, A.PG])
    _same(rep, _report(tmp_path / "none"), 2.0)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_demo_v_recording_without_labels_claims_no_pipeline(tmp_path: Path, schedule: str) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the demo recorder needs torch")
    from ppdiag.demo import DemoConfig, record

    rec = tmp_path / "rec"
    record(DemoConfig(pp=4, steps=2, record_shapes=True, schedule=schedule, microbatches=8), rec)
    rep = _report(rec)
    assert (rep.run.pp, rep.run.virtual_stages, rep.run.schedule) == (4, 2, schedule)
    # a V placement (stages r and 2P-1-r on rank r) chains its ranks 0-1-2-3 as a plain pipeline
    # does, each link as busy both ways: without labels the counts cannot tell the two apart, and
    # the plain reading's dependencies contradict the measured order (3-step recordings: 361 of 504
    # for zbv, 243 of 333 for dualpipev), so no pipeline is claimed rather than a wrong one, and the
    # transfers' waits name no straggler
    A.strip_kineto_dir(rec, tmp_path / "none", [A.SHAPES, A.LABELS, A.PG])
    bare = _report(tmp_path / "none")
    assert bare.run.structure is not None and not bare.run.structure.established
    assert bare.run.pp == 1 and bare.whatif == []
    assert not {"PP001", "PP002", "PP003", "PP009"} & {f.code for f in bare.findings}


def test_demo_records_with_the_profilers_defaults_unless_asked() -> None:
    import subprocess

    from ppdiag.demo.config import DemoConfig

    assert DemoConfig().record_shapes is False
    assert DemoConfig.from_dict({"record_shapes": True}).record_shapes is True
    out = subprocess.run(
        [sys.executable, "-m", "ppdiag", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "COLUMNS": "200", "PATH": ""},
    ).stdout
    assert "--record-shapes" in out


def test_kineto_p2p_on_the_compute_stream_without_peers(tmp_path: Path) -> None:
    # sends are eager and receives cannot be posted ahead: a send and its receive rarely end
    # together, so the partners come from the data flow (forward/backward order per step)
    run = make_scenario(
        steps=2,
        clock_skew_ms=5.0,
        gpus_per_node=1,
        schedule="1f1b",
        pp=4,
        microbatches=6,
        faults=[F.CommOnCompute()],
    )
    write_kineto(run, tmp_path / "meta")
    A.strip_kineto_dir(tmp_path / "meta", tmp_path / "bare", A.ALL_KINETO)
    bare = _report(tmp_path / "bare")
    assert bare.run.peers is not None and bare.run.peers.undecided == 0
    _same(_report(tmp_path / "meta"), bare, 1.0)
