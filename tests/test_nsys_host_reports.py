"""One nsys report per host (``nsys profile -o node%q{SLURM_NODEID} torchrun ...`` on each node):
every report numbers its GPU processes from 0, so the loader gives them global ranks from the
strongest evidence there is (README, "Nsight Systems")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ppdiag.api import analyze_run
from ppdiag.errors import InputError
from ppdiag.parsers import ParseOptions
from ppdiag.parsers.loader import find_traces, load_run, parse_files, resolve_ranks
from ppsynth.faults import SlowLink
from ppsynth.nsys import write_nsys
from ppsynth.run import SynthRun
from ppsynth.scenario import make_scenario


def _run(seed: int = 5) -> SynthRun:
    return make_scenario(
        schedule="1f1b",
        pp=4,
        microbatches=8,
        steps=2,
        gpus_per_node=2,
        faults=(SlowLink(1, delay_ms=0.5),),
        seed=seed,
    )


def test_host_reports_give_the_per_rank_diagnosis(tmp_path: Path) -> None:
    run = _run()
    hosts = write_nsys(run, tmp_path / "hosts", per_rank_files=False)
    assert len(hosts) == 2
    per_rank = write_nsys(run, tmp_path / "ranks", per_rank_files=True)
    h = load_run([tmp_path / "hosts"], progress=False, jobs=1)
    p = load_run([tmp_path / "ranks"], progress=False, jobs=1)
    assert [r.rank for r in h.ranks] == [0, 1, 2, 3]
    assert [Path(r.source).name for r in h.ranks] == [Path(x).name for x in sorted(hosts) for _ in (0, 1)]
    for a, b in zip(h.ranks, p.ranks, strict=True):
        assert a.intervals.peer.tolist() == b.intervals.peer.tolist(), a.rank
        assert [g.ranks for g in a.process_groups if g.ranks] == [
            g.ranks for g in b.process_groups if g.ranks
        ]
    hr, pr = analyze_run(h).result, analyze_run(p).result
    for key in ("pp", "stage_map", "schedule", "microbatches"):
        assert getattr(hr.run, key) == getattr(pr.run, key), key
    step, host_step = pr.summary.step_ms, hr.summary.step_ms
    assert step is not None and host_step is not None
    assert abs(host_step - step) <= 0.005 * step
    for cause, ms in pr.summary.lost_ms.items():
        assert abs(hr.summary.lost_ms[cause] - ms) <= 0.005 * step, cause
    found = [sorted((f.code, str(f.cause), f.stages, f.ranks) for f in x.findings) for x in (hr, pr)]
    assert found[0] == found[1] and any(code == "PP004" for code, *_ in found[1]), found
    assert len(per_rank) == 4


def test_file_names_state_the_node(tmp_path: Path) -> None:
    # no NCCL communicator creation captured: the names say the node (node%q{SLURM_NODEID})
    run = _run()
    d = tmp_path / "named"
    d.mkdir()
    written = sorted(write_nsys(run, tmp_path / "raw", per_rank_files=False, comm_init=False))
    for src, name in zip(written, ("b_node0", "a_node1"), strict=True):
        shutil.copy(src, d / f"{name}.sqlite")
    # node1's file sorts first by name; its node number puts it second
    loaded = load_run([d], progress=False, jobs=1)
    assert [(r.rank, Path(r.source).name) for r in loaded.ranks] == [
        (0, "b_node0.sqlite"),
        (1, "b_node0.sqlite"),
        (2, "a_node1.sqlite"),
        (3, "a_node1.sqlite"),
    ]
    assert not any("report order" in w for w in loaded.warnings)


def test_names_against_nccl_is_an_error(tmp_path: Path) -> None:
    run = _run()
    d = tmp_path / "swapped"
    d.mkdir()
    # node00's report named node1 and node01's named node0: the NCCL communicator of the world
    # says otherwise
    for src, name in zip(
        sorted(write_nsys(run, tmp_path / "raw", per_rank_files=False)), ("node1", "node0"), strict=True
    ):
        shutil.copy(src, d / f"{name}.sqlite")
    with pytest.raises(InputError, match=r"node0\.sqlite.*node1\.sqlite|node1\.sqlite.*node0\.sqlite"):
        load_run([d], progress=False, jobs=1)


def test_report_order_is_the_last_resort_and_says_so(tmp_path: Path) -> None:
    run = _run()
    d = tmp_path / "plain"
    d.mkdir()
    written = sorted(write_nsys(run, tmp_path / "raw", per_rank_files=False, comm_init=False))
    for src, name in zip(written, ("alpha", "beta"), strict=True):
        shutil.copy(src, d / f"{name}.sqlite")
    loaded = load_run([d], progress=False, jobs=1)
    assert [r.rank for r in loaded.ranks] == [0, 1, 2, 3]
    assert any("report order" in w and "beta.sqlite" in w for w in loaded.warnings), loaded.warnings


def test_a_communicator_between_reports_orders_them(tmp_path: Path) -> None:
    # without the world communicator, the p2p communicator between the hosts' edge ranks still
    # numbers its members in global-rank order: names that put the reports the other way round fail
    run = _run()
    d = tmp_path / "swapped"
    d.mkdir()
    for src, name in zip(
        sorted(write_nsys(run, tmp_path / "raw", per_rank_files=False)), ("node1", "node0"), strict=True
    ):
        shutil.copy(src, d / f"{name}.sqlite")
    files, _ = find_traces([d])
    parsed = parse_files(files, ParseOptions(), jobs=1, progress=False)
    for _, ranks in parsed:
        for r in ranks:
            comms = r.meta["nccl_comms"]
            r.meta["nccl_comms"] = {c: v for c, v in comms.items() if v["nranks"] == 2}
    with pytest.raises(
        InputError, match=r"node\d\.sqlite and node\d\.sqlite disagree with their NCCL communicator"
    ):
        resolve_ranks(parsed)


def test_communicators_between_reports_order_them_when_names_do_not(tmp_path: Path) -> None:
    # no world communicator and names that say nothing (the second host's report sorts first): the
    # p2p communicator between the hosts' edge ranks orders the reports, without a warning
    run = _run()
    d = tmp_path / "plain"
    d.mkdir()
    written = sorted(write_nsys(run, tmp_path / "raw", per_rank_files=False))
    for src, name in zip(written, ("beta", "alpha"), strict=True):
        shutil.copy(src, d / f"{name}.sqlite")
    parsed = parse_files(find_traces([d])[0], ParseOptions(), jobs=1, progress=False)
    for _, ranks in parsed:
        for r in ranks:
            r.meta["nccl_comms"] = {c: v for c, v in r.meta["nccl_comms"].items() if v["nranks"] == 2}
    ranks, warnings = resolve_ranks(parsed)
    assert [(r.rank, Path(r.source).name) for r in ranks] == [
        (0, "beta.sqlite"),
        (1, "beta.sqlite"),
        (2, "alpha.sqlite"),
        (3, "alpha.sqlite"),
    ]
    assert not any("report order" in w for w in warnings), warnings


def test_a_host_with_one_gpu_joins_the_others(tmp_path: Path) -> None:
    # 3 stages on 2 GPUs a node: node01's report holds one process with no rank of its own
    run = make_scenario(schedule="1f1b", pp=3, microbatches=6, steps=2, gpus_per_node=2, seed=3)
    written = write_nsys(run, tmp_path / "hosts", per_rank_files=False, comm_init=False)
    assert sorted(p.name for p in written) == ["report_node00.sqlite", "report_node01.sqlite"]
    loaded = load_run([tmp_path / "hosts"], progress=False, jobs=1)
    assert [(r.rank, Path(r.source).name) for r in loaded.ranks] == [
        (0, "report_node00.sqlite"),
        (1, "report_node00.sqlite"),
        (2, "report_node01.sqlite"),
    ]
