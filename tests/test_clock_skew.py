"""Clock metamorphic tests: ranks moved to other hosts whose clocks are skewed must give the same
diagnosis (docs/clocks.md).

The traces are rewritten by :mod:`ppdiag.demo.skew` (host name and every timestamp, nothing else),
never generated with a flag. Inputs: synthetic Kineto and nsys runs with and without peer
metadata and the multi-rank real traces in ``../shared/traces`` (every skew and placement on
every input family, recorded demo runs of every schedule included: ``test_clock_matrix.py``).
Required: the same pp, stage map, schedule, M and findings (codes and ranks), causes within 1.5 %
of the step, and the fitted offset of a moved host within its residual of the skew applied.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from ablate import strip_kineto_dir, strip_nsys_dir
from clock_relations import clock_structure
from conftest import shared_trace

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.demo.skew import Move, move_ranks, rewrite_kineto, rewrite_nsys, spread_over_hosts
from ppdiag.model import Intervals, Ranges, RankTimeline, Run
from ppdiag.pipeline.clock_bounds import _consistent
from ppdiag.pipeline.clocks import Pairs
from ppdiag.pipeline.host_clocks import clock_domains, fit_host_clocks
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

MS = 1_000_000
CAUSE_TOL = 0.015  # of the step


def _diagnose(d: Path) -> Analyzed:
    return diagnose([d], Options())


def assert_same(base: Analyzed, moved: Analyzed) -> None:
    """The relations every clock transformation must keep."""
    assert clock_structure(moved) == clock_structure(base)
    b = {r.rank: r.shares for r in base.result.ranks}
    for r in moved.result.ranks:
        for cause, v in r.shares.items():
            assert abs(v - b[r.rank][cause]) <= CAUSE_TOL, (r.rank, cause, b[r.rank][cause], v)


def assert_offsets(base: Analyzed, moved: Analyzed, moves: dict[int, Move], floor_us: float = 0.0) -> None:
    """Each moved rank's fitted offset changed by minus its skew, within the residual of its host
    (the device fit's residual where device transfers aligned the ranks), or ``floor_us``."""
    ob = base.result.run.clock_offsets_us
    om = moved.result.run.clock_offsets_us
    resid = {r: c.residual_us for c in moved.result.run.clocks for r in c.ranks}
    ref = min(om, key=int)  # the reference rank's host keeps its clock
    for r, mv in moves.items():
        # relative to the reference rank, whose host may have moved too
        want = -(mv.skew_ns - moves.get(int(ref), Move("", 0)).skew_ns) / 1000.0
        got = (om[str(r)] - om[ref]) - (ob[str(r)] - ob[ref])
        tol = max(resid.get(r) or moved.result.run.clock_residual_us or 0.0, floor_us)
        assert abs(got - want) <= tol + 1.0, (r, got, want, tol)


# ------------------------------------------------------------------ the rewriter itself


def test_rewrite_kineto_shifts_every_timestamp_and_renames(tmp_path: Path) -> None:
    trace = {
        "host_name": "a",
        "traceEvents": [{"ph": "X", "name": "x", "ts": 100.5, "dur": 3}, {"ph": "M", "ts": 7, "name": "m"}],
    }
    src = tmp_path / "src"
    src.mkdir()
    p = src / "a_123.1700000000.pt.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps(trace).encode()))
    out = rewrite_kineto(p, tmp_path, Move("b", 20 * MS))
    assert out.name == "b_123.1700000000.pt.trace.json.gz"
    got = json.loads(gzip.decompress(out.read_bytes()))
    assert got["host_name"] == "b"
    # 20 ms = 20000 µs added to each ts; whole µs stay integers
    assert [e["ts"] for e in got["traceEvents"]] == [20100.5, 20007]
    assert [e["dur"] for e in got["traceEvents"][:1]] == [3]


def test_rewrite_nsys_moves_the_session_clock(tmp_path: Path) -> None:
    run = make_scenario(pp=2, microbatches=2, steps=2, clock_skew_ms=0.0)
    (p,) = [x for x in write_nsys(run, tmp_path / "src") if x.name == "report_1.sqlite"]
    out = rewrite_nsys(p, tmp_path, Move("elsewhere", -2500 * MS))
    with sqlite3.connect(p) as c0, sqlite3.connect(out) as c1:
        q = "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME"
        assert c1.execute(q).fetchone()[0] - c0.execute(q).fetchone()[0] == -2500 * MS
        h = "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'"
        assert c1.execute(h).fetchone()[0] == "elsewhere"


def test_consistent_offset_outvotes_a_mispaired_bound() -> None:
    # bounds on D = o_b - o_a (µs): transfers a->b give D >= -5, -3 and a mispaired -> D >= 40;
    # b->a give D <= 2, 4. Every D in [-3, 2] breaks only the mispaired one: the answer.
    lo, hi, broken = _consistent(np.array([-5.0, -3.0, 40.0]), np.array([2.0, 4.0]))
    assert broken == 1
    assert lo is not None and hi is not None
    assert lo <= -0.5 <= hi  # the middle of [-3, 2]
    assert (lo + hi) / 2 == pytest.approx(-0.5)
    # all consistent: the intersection itself
    assert _consistent(np.array([-5.0, -3.0]), np.array([2.0, 4.0])) == (-3.0, 2.0, 0)


def _bare(rank: int, host: str) -> RankTimeline:
    return RankTimeline(
        rank, f"rank{rank}", "kineto", [""], Intervals.empty(), Ranges.empty(), cpu_only=True,
        meta={"host_name": host},
    )  # fmt: skip


def test_host_offset_from_transfers_both_ways() -> None:
    # rank 0 on host a, rank 1 on host b whose clock reads 5 ms ahead (times below in µs, own
    # clocks). Per step (every 20 ms): rank 0 sends an activation at 4000, which arrives at
    # 4300 true = 9300 on b's clock; b sends the gradient at 16300 true = 21300 on b's clock, and
    # it arrives at 16500 on a's. Bounds on D = o_b - o_a: D >= 4000 - 9300 = -5300 and
    # D <= 16500 - 21300 = -4800: the middle -5050 µs, half-width 250 µs (the truth -5000
    # inside). Every receive waited (posted before its send), and their quartiles give the same
    # middle. No pair shares a host to measure the spans' jitter (0.5 ms then): any bound may be
    # broken by as much, so the residual is the half-width plus it, 250 + 500 = 750 µs.
    steps = np.arange(3) * 20_000
    us = 1000
    pairs = Pairs(
        np.array([0, 0, 0, 1, 1, 1], np.int32),
        np.array([1, 1, 1, 0, 0, 0], np.int32),
        np.r_[4000 + steps, 21300 + steps] * us,  # send start (own clock)
        np.r_[4100 + steps, 21400 + steps] * us,
        np.r_[5200 + steps, 16000 + steps] * us,  # receive start, posted early
        np.r_[9300 + steps, 16500 + steps] * us,  # receive end (own clock)
        False,
    )
    run = Run([_bare(0, "a"), _bare(1, "b")], "kineto")
    assert clock_domains(run) == {0: "a", 1: "b"}
    got = fit_host_clocks(run, pairs)
    assert got is not None
    off, clocks, warnings = got
    assert off == {0: 0, 1: -5_050_000}
    assert [(c.host, c.residual_ns) for c in clocks] == [("a", 0), ("b", 750_000)]
    assert not warnings
    # one host named on both: one clock, nothing to fit
    assert fit_host_clocks(Run([_bare(0, "a"), _bare(1, "a")], "kineto"), pairs) is None


# ------------------------------------------------------------------ synthetic GPU runs

SKEWS_MS = (20.0, -2500.0)


@pytest.fixture(scope="module")
def synth_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=3, clock_skew_ms=0.0, seed=3)
    root = tmp_path_factory.mktemp("synth")
    write_kineto(run, root / "kineto")
    write_nsys(run, root / "nsys")
    strip_kineto_dir(root / "kineto", root / "kineto_bare")
    strip_nsys_dir(root / "nsys", root / "nsys_bare")
    return {n: root / n for n in ("kineto", "kineto_bare", "nsys", "nsys_bare")}


@pytest.mark.parametrize("fmt", ["kineto", "kineto_bare", "nsys", "nsys_bare"])
@pytest.mark.parametrize("skew_ms", SKEWS_MS)
def test_synthetic_half_the_ranks_on_a_skewed_host(
    synth_dirs: dict[str, Path], tmp_path: Path, fmt: str, skew_ms: float
) -> None:
    src = synth_dirs[fmt]
    moves = {r: Move("other-node", int(skew_ms * MS)) for r in (2, 3)}
    move_ranks(src, tmp_path, moves)
    base, moved = _diagnose(src), _diagnose(tmp_path)
    assert base.result.run.pp == 4
    assert_same(base, moved)
    assert_offsets(base, moved, moves)


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_device_ranks_of_one_host_share_one_offset(tmp_path: Path, fmt: str) -> None:
    # 2 hosts x 2 GPU ranks (gpus_per_node=2), each host's ranks on one clock, moved to two other
    # hosts with different skews: every rank of a host gets the same fitted offset (one unknown per
    # host, fitted from every transfer between hosts), and the hosts' offsets move by the skews
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=3, gpus_per_node=2, seed=5)
    (write_kineto if fmt == "kineto" else write_nsys)(run, tmp_path / "raw")
    # the hosts named (the synthetic Kineto traces name none), clocks as simulated but for rank 1's
    # events, 40 µs late: timing jitter that a fit per rank would read as a clock of its own
    src = tmp_path / "src"
    move_ranks(tmp_path / "raw", src, {r: Move(f"node{r // 2}", 40_000 if r == 1 else 0) for r in range(4)})
    moves = {0: Move("hostA", 20 * MS), 1: Move("hostA", 20 * MS)}
    moves |= {2: Move("hostB", -2500 * MS), 3: Move("hostB", -2500 * MS)}
    move_ranks(src, tmp_path / "moved", moves)
    base, moved = _diagnose(src), _diagnose(tmp_path / "moved")
    for a in (base, moved):
        off = a.result.run.clock_offsets_us
        assert off["0"] == off["1"] and off["2"] == off["3"], off
        assert sorted(tuple(c.ranks) for c in a.result.run.clocks) == [(0, 1), (2, 3)]
    # the true offsets up to one constant (each rank's clock reads true time + its host's skew),
    # within the jitter
    true = {int(r): v / 1000.0 for r, v in run.truth["clock_offset_ns"].items()}
    off = base.result.run.clock_offsets_us
    assert abs((off["2"] - off["0"]) - (true[2] - true[0])) <= 40.0
    assert_same(base, moved)
    assert_offsets(base, moved, moves)


def test_spread_over_hosts_puts_the_skew_in_the_ground_truth(
    synth_dirs: dict[str, Path], tmp_path: Path
) -> None:
    # what ppdiag demo --hosts 2 --skew-ms 20 does after recording, on a copy of a synthetic run
    d = tmp_path / "run"
    shutil.copytree(synth_dirs["kineto"], d)
    placed = spread_over_hosts(d, 4, 2, 20 * MS)
    assert [(p["host"], p["ranks"], p["skew_ns"]) for p in placed] == [
        ("host0", [0, 1], 0),
        ("host1", [2, 3], 20 * MS),
    ]
    truth = json.loads((d / "groundtruth.json").read_text())
    assert truth["hosts"] == placed
    clocks = {c.host: c for c in _diagnose(d).result.run.clocks}
    assert set(clocks) == {"host0", "host1"}
    c1 = clocks["host1"]
    assert c1.ranks == [2, 3]
    # the offset an aligner should find is -20 ms; the device fit's spread is the residual
    assert abs(c1.offset_us + 20_000.0) <= (c1.residual_us or 0.0) + 1.0


# ------------------------------------------------------------------ real traces nobody here wrote


@pytest.mark.parametrize(
    "rel",
    [
        # sends one way only: the all_reduce bounds give the other side to ~0.4 ms, so the offset
        # comes from the receive that waited for its data (its end meets its send's)
        "kineto/gloo_cpu_2rank",
        "kineto/hta_sampled_2rank",
    ],
)
@pytest.mark.parametrize("skew_ms", (1.0, -60_000.0))
def test_real_two_rank_traces_keep_their_diagnosis(rel: str, skew_ms: float, tmp_path: Path) -> None:
    src = shared_trace(rel)
    moves = {1: Move("second-host", int(skew_ms * MS))}
    move_ranks(src, tmp_path, moves)
    base, moved = _diagnose(src), _diagnose(tmp_path)
    assert moved.result.run.pp == 1  # no pipeline in these, skewed or not
    assert_same(base, moved)
    assert_offsets(base, moved, moves)


def test_real_nsys_report_on_a_skewed_host(tmp_path: Path) -> None:
    src = shared_trace("nsys/nsysai_h100_fsdp_2gpu.sqlite")
    d0, d1 = tmp_path / "a", tmp_path / "b"
    d0.mkdir()
    d1.mkdir()
    shutil.copyfile(src, d0 / src.name)
    # both processes live in one report, so the report (its one host) moves as a whole
    rewrite_nsys(d0 / src.name, d1, Move("other", 20 * MS))
    base, moved = _diagnose(d0), _diagnose(d1)
    assert moved.result.run.pp == base.result.run.pp
    assert_same(base, moved)


def test_demo_refuses_more_hosts_than_ranks(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "ppdiag", "demo", "--pp", "2", "--hosts", "3", "-o", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "--hosts must be 1..2" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was recorded
