"""The nsys-schema writer: what it writes must read back as the synthetic run's ground truth,
have the tables and columns of real exports, and give the same timelines as the Kineto rendering
of the same run."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_TRACES

from ppdiag.model import Direction, Kind, RangeKind, RankTimeline
from ppdiag.parsers import ParseOptions
from ppdiag.parsers.nsys import NsysParser, resolve_nccl_peers
from ppsynth.faults import SlowLink
from ppsynth.nsys import DDL, write_nsys
from ppsynth.run import SynthRank, SynthRun
from ppsynth.scenario import make_scenario

US = 1000


def _parse(paths: list[Path]) -> list[RankTimeline]:
    tls = [t for p in paths for t in NsysParser().parse(p, ParseOptions())]
    assert resolve_nccl_peers(tls) == []
    return sorted(tls, key=lambda t: t.rank)


@pytest.fixture(scope="module")
def run() -> SynthRun:
    # two replicas of a 3-stage pipeline: p2p pairs, pipeline and data-parallel collectives
    return make_scenario("1f1b", pp=3, microbatches=4, dp=2, steps=2, clock_skew_ms=3.0, seed=3)


def _truth_rows(run: SynthRun, r: SynthRank) -> dict[str, np.ndarray]:
    g = r.gpu
    order = np.lexsort((g.end, g.start))
    off = run.epoch_ns + r.clock_skew_ns
    return {
        "start": g.start[order] + off,
        "end": g.end[order] + off,
        "launch": np.where(g.launch[order] >= 0, g.launch[order] + off, -1),
        "kind": g.kind[order],
        "stream": g.stream[order],
        "peer": g.peer[order],
        "direction": g.direction[order],
        "bytes": g.bytes[order],
        "name": np.array([run.names[i] for i in g.name[order]], dtype=object),
    }


def _check_against_truth(run: SynthRun, tls: list[RankTimeline]) -> None:
    assert [t.rank for t in tls] == [r.rank for r in run.ranks]
    for tl, r in zip(tls, run.ranks, strict=True):
        want = _truth_rows(run, r)
        iv = tl.intervals
        assert len(iv) == len(want["start"])
        for c in ("start", "end", "launch", "kind", "stream", "direction"):
            np.testing.assert_array_equal(getattr(iv, c), want[c], err_msg=f"rank {r.rank} column {c}")
        comm = np.isin(iv.kind, (Kind.P2P, Kind.COLLECTIVE))
        np.testing.assert_array_equal(iv.peer[iv.kind == Kind.P2P], want["peer"][want["kind"] == Kind.P2P])
        np.testing.assert_array_equal(iv.bytes[comm], want["bytes"][comm])
        assert [tl.names[i] for i in iv.name] == want["name"].tolist()
        steps = tl.ranges.take(tl.ranges.kind == RangeKind.STEP)
        off = run.epoch_ns + r.clock_skew_ns
        assert steps.num.tolist() == r.step_numbers
        np.testing.assert_array_equal(np.stack([steps.start, steps.end], axis=1), r.step_windows + off)
        assert tl.world_size in (None, run.world_size)


def test_per_rank_files_read_back_as_the_truth(run: SynthRun, tmp_path: Path) -> None:
    paths = write_nsys(run, tmp_path)
    assert [p.name for p in paths] == [f"report_{r.rank}.sqlite" for r in run.ranks]
    tls = _parse(paths)
    _check_against_truth(run, tls)
    assert all(t.rank_source == "env RANK" for t in tls)
    # p2p really goes both ways and the truth has both kinds of comm
    kinds = np.concatenate([t.intervals.kind for t in tls])
    dirs = np.concatenate([t.intervals.direction[t.intervals.kind == Kind.P2P] for t in tls])
    assert {Kind.P2P, Kind.COLLECTIVE} <= set(kinds.tolist())
    assert {Direction.SEND, Direction.RECV} <= set(dirs.tolist())
    # the communicator of a p2p pair is known with its members once both files are read
    t0 = tls[0]
    g = t0.intervals.group[t0.intervals.kind == Kind.P2P][0]
    assert sorted(t0.process_groups[g].ranks) == sorted(
        [0, int(t0.intervals.peer[t0.intervals.kind == Kind.P2P][0])]
    )


def test_one_report_with_every_process(run: SynthRun, tmp_path: Path) -> None:
    paths = write_nsys(run, tmp_path, per_rank_files=False)
    assert len(paths) == 1
    # every communicator's members are in the one file: peers are global without the run step
    alone = NsysParser().parse(paths[0], ParseOptions())
    assert all("nccl_pending" not in t.meta for t in alone)
    assert all((t.intervals.peer[t.intervals.kind == Kind.P2P] >= 0).all() for t in alone)
    tls = _parse(paths)
    _check_against_truth(run, tls)
    assert all("order of the GPU" in t.rank_source for t in tls)


def test_ts_normalize_and_capture_options(run: SynthRun, tmp_path: Path) -> None:
    tls = _parse(write_nsys(run, tmp_path / "norm", ts_normalize=True))
    _check_against_truth(run, tls)
    assert not any("session start" in w for t in tls for w in t.warnings)

    tls = [
        t
        for p in write_nsys(run, tmp_path / "noinit", comm_init=False)
        for t in NsysParser().parse(p, ParseOptions())
    ]
    resolve_nccl_peers(tls)
    for t in tls:
        p2p = t.intervals.kind == Kind.P2P
        assert (t.intervals.peer[p2p] == -1).all()
        assert (t.intervals.direction[p2p] != Direction.NONE).all()
        assert any("creation was not captured" in w for w in t.warnings)

    tls = [
        t
        for p in write_nsys(run, tmp_path / "noblob", nccl_payloads=False)
        for t in NsysParser().parse(p, ParseOptions())
    ]
    for t in tls:
        p2p = t.intervals.kind == Kind.P2P
        assert (t.intervals.peer[p2p] == -1).all() and (t.intervals.bytes[p2p] == -1).all()
        assert any("--include-blobs" in w for w in t.warnings)


def _real_columns(rel: str, table: str) -> list[str] | None:
    p = SHARED_TRACES / rel
    if not p.exists():
        return None
    conn = sqlite3.connect(f"file:{p}?mode=ro&immutable=1", uri=True)
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def test_tables_and_columns_match_real_exports(run: SynthRun, tmp_path: Path) -> None:
    path = write_nsys(run, tmp_path)[0]
    conn = sqlite3.connect(path)
    written = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    cols = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in written}
    conn.close()
    assert written <= set(DDL)
    # every table the writer knows, against the 2024.5 export, else the 2026.2 one (NVTX with its
    # payload schemas, memsets), whichever has it first
    order = ("nsys/pipit_cloverleaf_nsys2024.sqlite", "nsys/nsysai_h100_fsdp_2gpu.sqlite")
    if not all((SHARED_TRACES / rel).exists() for rel in order):
        pytest.skip("../shared/traces not available")
    ddl_cols = {t: [c.strip().split()[0] for c in d.split(",")] for t, d in DDL.items()}
    for t in DDL:
        real = next((c for rel in order if (c := _real_columns(rel, t))), None)
        assert real is not None, f"{t} is in no real export"
        assert ddl_cols[t] == real, t
        if t in written:
            assert cols[t] == real, t


def test_same_run_as_kineto_gives_the_same_timelines(tmp_path: Path) -> None:
    kineto_writer = pytest.importorskip("ppsynth.kineto")
    kineto_parser = pytest.importorskip("ppdiag.parsers.kineto")
    run = make_scenario("1f1b", pp=4, microbatches=6, steps=2, faults=(SlowLink(1, delay_ms=0.3),), seed=5)
    kt = sorted(
        (
            t
            for p in kineto_writer.write_kineto(run, tmp_path / "k")
            for t in kineto_parser.KinetoParser().parse(p, ParseOptions())
        ),
        key=lambda t: t.rank,
    )
    nt = _parse(write_nsys(run, tmp_path / "n"))
    assert [t.rank for t in kt] == [t.rank for t in nt]
    for k, n in zip(kt, nt, strict=True):
        a, b = k.intervals.sorted(), n.intervals.sorted()
        assert len(a) == len(b)
        for c in ("start", "end", "launch"):
            assert int(np.abs(getattr(a, c) - getattr(b, c)).max()) <= US, c
        for c in ("kind", "stream", "peer", "direction", "bytes", "phase"):
            np.testing.assert_array_equal(getattr(a, c), getattr(b, c), err_msg=f"rank {k.rank} column {c}")
        assert [k.names[i] for i in a.name] == [n.names[i] for i in b.name]
        ks, ns = (t.ranges.take(t.ranges.kind == RangeKind.STEP) for t in (k, n))
        assert ks.num.tolist() == ns.num.tolist()
        assert int(np.abs(ks.start - ns.start).max()) <= US and int(np.abs(ks.end - ns.end).max()) <= US


def test_same_run_as_kineto_gives_the_same_diagnosis(tmp_path: Path) -> None:
    kineto_writer = pytest.importorskip("ppsynth.kineto")
    api = pytest.importorskip("ppdiag.api")
    loader = pytest.importorskip("ppdiag.parsers.loader")
    run = make_scenario("1f1b", pp=4, microbatches=8, steps=3, faults=(SlowLink(0, delay_ms=0.5),), seed=1)
    kruns = loader.load_run(kineto_writer.write_kineto(run, tmp_path / "k"), progress=False, jobs=1)
    nruns = loader.load_run(write_nsys(run, tmp_path / "n"), progress=False, jobs=1)
    resolve_nccl_peers(nruns.ranks)  # no-op when the loader already did it
    kr = api.analyze_run(kruns).result
    nr = api.analyze_run(nruns).result
    for key in ("pp", "stage_map", "schedule", "microbatches"):
        assert getattr(kr.run, key) == getattr(nr.run, key), key
    step = kr.summary.step_ms
    assert abs(nr.summary.step_ms - step) <= 0.01 * step
    for cause, ms in kr.summary.lost_ms.items():
        assert abs(nr.summary.lost_ms[cause] - ms) <= 0.01 * step, cause
    assert nr.run.format == "nsys"


def test_copies_and_memsets_round_trip(tmp_path: Path) -> None:
    from ppsynth.run import GpuOps, RuntimeCalls

    run = make_scenario("gpipe", pp=2, microbatches=2, steps=1, seed=2)
    r = run.ranks[0]
    names = run.names
    for s in ("Memcpy HtoD (Pinned -> Device)", "Memset (Device)", "cudaMemcpyAsync", "cudaMemsetAsync"):
        names.append(s)
    t0 = int(r.gpu.start.max()) + 10 * US
    corr = int(r.runtime.correlation.max()) + 1
    extra = GpuOps.from_columns(
        2,
        {
            "start": [t0, t0 + 20 * US],
            "end": [t0 + 5 * US, t0 + 21 * US],
            "stream": [7, 7],
            "kind": [Kind.MEMCPY, Kind.MEMSET],
            "name": [len(names) - 4, len(names) - 3],
            "correlation": [corr, corr + 1],
            "launch": [t0 - 3 * US, t0 + 10 * US],
            "bytes": [1 << 20, 4096],
        },
    )
    calls = RuntimeCalls.from_columns(
        2,
        {
            "start": [t0 - 3 * US, t0 + 10 * US],
            "end": [t0 - 2 * US, t0 + 11 * US],
            "name": [len(names) - 2, len(names) - 1],
            "correlation": [corr, corr + 1],
            "tid": [r.tid, r.tid],
        },
    )
    r.gpu = GpuOps(**{c: np.concatenate([getattr(r.gpu, c), getattr(extra, c)]) for c in GpuOps.COLUMNS})
    r.runtime = RuntimeCalls(
        **{c: np.concatenate([getattr(r.runtime, c), getattr(calls, c)]) for c in RuntimeCalls.COLUMNS}
    )
    tl = _parse(write_nsys(run, tmp_path))[0]
    _check_against_truth(run, [tl, *_parse(write_nsys(run, tmp_path / "b"))[1:]])
    iv = tl.intervals
    m = np.isin(iv.kind, (Kind.MEMCPY, Kind.MEMSET))
    assert [tl.names[i] for i in iv.name[m]] == ["Memcpy HtoD (Pinned -> Device)", "Memset (Device)"]
    assert iv.bytes[m].tolist() == [1 << 20, 4096]
    off = run.epoch_ns + r.clock_skew_ns
    assert iv.launch[m].tolist() == [t0 - 3 * US + off, t0 + 10 * US + off]
