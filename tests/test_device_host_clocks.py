"""One offset per host for device runs, where the host's name is evidence of one clock
(docs/clocks.md): a generic name or one name over different clocks keeps one offset per rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdiag.api import Options, diagnose
from ppdiag.demo.skew import Move, move_ranks
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_one_name_over_different_clocks_keeps_per_rank_offsets(tmp_path: Path, fmt: str) -> None:
    # every GPU on a host of its own (per-rank skews up to 5 ms), then every rank renamed to one
    # host: the name says one clock, the transfers say four. The fit keeps four, with a warning
    run = make_scenario(
        schedule="1f1b", pp=4, microbatches=8, steps=3, gpus_per_node=1, clock_skew_ms=5.0, seed=5
    )
    (write_kineto if fmt == "kineto" else write_nsys)(run, tmp_path / "raw")
    move_ranks(tmp_path / "raw", tmp_path / "one", dict.fromkeys(range(4), Move("nodeA", 0)))
    rep = diagnose([tmp_path / "one"], Options()).result
    off = rep.run.clock_offsets_us
    true = {int(r): v / 1000.0 for r, v in run.truth["clock_offset_ns"].items()}
    assert max(true.values()) - min(true.values()) > 1000.0  # the clocks do differ
    for r in range(1, 4):
        assert abs((off[str(r)] - off["0"]) - (true[r] - true[0])) <= 10.0, (r, off, true)
    assert any("is not one clock" in w for w in rep.run.warnings), rep.run.warnings
    (host,) = rep.run.clocks
    assert list(host.ranks) == [0, 1, 2, 3] and host.method.endswith(
        "(one offset per rank)"
    )  # nsys: name hashed


@pytest.mark.parametrize(("name", "shared"), [("localhost", False), ("gpu-node-7", True)])
@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_a_generic_host_name_is_no_clock(tmp_path: Path, fmt: str, name: str, shared: bool) -> None:
    # 4 GPU ranks on one clock, rank 1's events 40 µs late (conversion jitter): a named host fits
    # one offset for all (the jitter stays in the residual); "localhost" names no machine, so each
    # rank is fitted on its own and rank 1 gets its 40 µs
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=3, gpus_per_node=4, seed=5)
    (write_kineto if fmt == "kineto" else write_nsys)(run, tmp_path / "raw")
    move_ranks(tmp_path / "raw", tmp_path / "src", {r: Move(name, 40_000 if r == 1 else 0) for r in range(4)})
    rep = diagnose([tmp_path / "src"], Options()).result
    off = rep.run.clock_offsets_us
    assert (off["0"] == off["1"] == off["2"] == off["3"]) is shared, off
    if not shared:
        assert abs(abs(off["1"] - off["0"]) - 40.0) <= 10.0, off
    (host,) = rep.run.clocks
    assert host.residual_us is not None and host.method.endswith(
        "(one offset for the host)" if shared else "(one offset per rank)"
    )
    assert not any("is not one clock" in w for w in rep.run.warnings)


def test_one_report_per_host_on_its_clock(tmp_path: Path) -> None:
    # without per-rank files the writer makes one report per host (one capture per node), and all
    # of a host's processes read its clock (one skew per host); one report never mixes clocks
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=2, gpus_per_node=2, seed=5)
    paths = write_nsys(run, tmp_path, per_rank_files=False)
    assert sorted(p.name for p in paths) == ["report_node00.sqlite", "report_node01.sqlite"]
    skews = {h: {r.clock_skew_ns for r in run.ranks if r.host_name == h} for h in ("node00", "node01")}
    assert all(len(v) == 1 for v in skews.values()) and skews["node00"] != skews["node01"], skews
    single = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=2, seed=5)  # 8 GPUs a node
    assert [p.name for p in write_nsys(single, tmp_path / "one", per_rank_files=False)] == ["report.sqlite"]
