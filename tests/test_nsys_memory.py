"""GPU memory from nsys exports (``--cuda-memory-usage=true``: ``CUDA_GPU_MEMORY_USAGE_EVENTS``,
ppdiag/parsers/nsys_memory.py) read into the same memory model as Kineto's [memory] events."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import SHARED_TRACES

from ppdiag.api import Options, diagnose, load
from ppdiag.model.memory import MB, MemoryRow
from ppdiag.report_types import Report
from ppsynth.memory import with_memory
from ppsynth.nsys import write_nsys
from ppsynth.nsys_memory import add_memory_table
from ppsynth.nsys_tables import global_pid
from ppsynth.scenario import make_scenario

MIB = 1024 * 1024


def _memory(rep: Report) -> list[MemoryRow]:
    """The report's ``memory[]`` rows (an analysis always writes the section)."""
    assert rep.memory is not None
    return rep.memory


# the columns nsys writes, without NOT NULL: a damaged export may hold anything
COLUMNS = (
    "start, globalPid, deviceId, contextId, address, pc, bytes, memKind, memoryOperationType, name, "
    "correlationId"
)


def _tiny_export(tmp_path: Path) -> tuple[list[Path], int, int, int]:
    """A 2-rank nsys run with hand-written memory rows on rank 0: (files, its pid, device, t0)."""
    run = make_scenario("1f1b", pp=2, microbatches=2, steps=1, seed=0)
    paths = write_nsys(run, tmp_path)
    rk = run.ranks[0]
    path = next(p for p in paths if p.name == "report_0.sqlite")
    conn = sqlite3.connect(path)
    gpid = global_pid(rk.pid)
    (t0,) = conn.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    dev = int(rk.device_index)
    conn.execute(f"CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS ({COLUMNS})")
    rows = [
        # (dt, bytes, memKind, operation); written out of time order on purpose
        (4000, 200 * MIB, 2, 0),  # device allocation
        (0, 100 * MIB, 2, 0),  # device allocation
        (1000, 50 * MIB, 5, 0),  # device static (a __device__ variable): on the GPU too
        (2000, 400 * MIB, 1, 0),  # pinned host memory: not device memory
        (3000, 100 * MIB, 2, 1),  # the first allocation freed
        (5000, None, 2, 0),  # no size: dropped
        (6000, 10 * MIB, 2, 7),  # neither allocation nor deallocation: dropped
    ]
    values = "?, ?, ?, 1, ?, 0, ?, ?, ?, NULL, NULL"
    conn.executemany(
        f"INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS ({COLUMNS}) VALUES ({values})",
        [(t0 + dt, gpid, dev, 1 << 40 | i, b, k, op) for i, (dt, b, k, op) in enumerate(rows)],
    )
    conn.commit()
    conn.close()
    return paths, rk.pid, dev, int(t0)


def test_hand_built_table_levels_and_peak(tmp_path: Path) -> None:
    # device levels in time order: +100 -> 100, +50 -> 150, (pinned skipped), -100 -> 50,
    # +200 -> 250 MiB: the peak is 250 MiB at t0 + 4000 ns, the median level (100, 150, 50, 250)
    # 125 MiB; 2 rows dropped, 1 host row not counted
    _, _, dev, t0 = _tiny_export(tmp_path)
    run = load([tmp_path], Options(progress=False, jobs=1))
    r0 = next(t for t in run.ranks if t.rank == 0)
    mem = r0.meta["memory"]
    assert mem["source"] == "cuda" and mem["events"] == 4
    assert mem["bytes"] == [100 * MIB, 50 * MIB, -100 * MIB, 200 * MIB]
    assert mem["device"] == [dev] * 4
    off = r0.meta["time_base_ns"]
    assert [t - off for t in mem["t_ns"]] == [t0, t0 + 1000, t0 + 3000, t0 + 4000]
    # the synthetic GPU's TARGET_INFO_GPU.totalMemory
    assert mem["capacity"] == {str(dev): 85520809984}
    assert "memory" not in next(t for t in run.ranks if t.rank == 1).meta
    said = [w for w in run.warnings if "CUDA_GPU_MEMORY_USAGE_EVENTS" in w]
    assert len(said) == 1 and "1 host" in said[0] and "2 row(s) dropped" in said[0]
    rep = diagnose([tmp_path], Options(progress=False, jobs=1)).result
    (row,) = _memory(rep)
    assert row.rank == 0 and row.source == "cuda" and row.events == 4
    assert row.peak_allocated_mb == pytest.approx(250.0)
    assert row.peak_reserved_mb is None
    assert row.steady_allocated_mb == pytest.approx(125.0)
    assert row.peak_ts_us == pytest.approx((t0 + 4000) / 1000.0)
    assert row.capacity_mb == pytest.approx(85520809984 / MB, abs=0.1)
    assert "nsys" in row.note and "relative to the capture" in row.note


@pytest.mark.parametrize("per_rank_files", [True, False])
def test_synthetic_pipeline_peaks_and_pp012(tmp_path: Path, per_rank_files: bool) -> None:
    # weights 1000 MiB, 100 MiB of activations per micro-batch, P = 4, M = 8: GPipe holds all 8 on
    # every stage (peak 1000 + 8 x 100 = 1800 MiB), 1F1B holds min(P - s, M) = 4 - s on stage s
    # (1400, 1300, 1200, 1100 MiB); from the 1F1B run the GPipe peak is predicted as 1800
    pp, m, w, a = 4, 8, 1000.0, 100.0
    reps = {}
    for sch in ("gpipe", "1f1b"):
        d = tmp_path / sch
        run = with_memory(make_scenario(schedule=sch, pp=pp, microbatches=m, steps=2), w, a)
        assert add_memory_table(write_nsys(run, d, per_rank_files=per_rank_files), run) > 0
        reps[sch] = diagnose([d], Options(progress=False)).result
    stage_of: dict[int, int] = {}
    for r in reps["1f1b"].ranks:
        assert r.stage is not None
        stage_of[r.rank] = r.stage
    rows = {sch: {r.rank: r for r in _memory(rep)} for sch, rep in reps.items()}
    assert sorted(rows["1f1b"]) == sorted(stage_of) == [0, 1, 2, 3]
    for rank, row in rows["1f1b"].items():
        s = stage_of[rank]
        assert row.source == "cuda"
        assert row.peak_allocated_mb == pytest.approx(w + (pp - s) * a)
        assert row.inflight_at_peak == pp - s
        assert row.activation_per_mb_mb == pytest.approx(a, rel=0.05)
        assert row.predicted_peak_mb["gpipe"] == pytest.approx(w + m * a, rel=0.10)
        assert rows["gpipe"][rank].peak_allocated_mb == pytest.approx(w + m * a)
        assert rows["gpipe"][rank].inflight_at_peak == m
    assert not [f for f in reps["1f1b"].findings if f.code == "PP012"]
    (f,) = [f for f in reps["gpipe"].findings if f.code == "PP012"]
    assert f.evidence.as_dict()["inflight_at_peak"] == m and f.evidence.as_dict()["inflight_needed"] == pp


def test_export_without_memory_rows_has_no_memory_section(tmp_path: Path) -> None:
    # the 2022 MPI export has the table but no rows; a synthetic export has no table at all
    saxpy = SHARED_TRACES / "nsys" / "pipit_saxpy_mpi_nsys2022.sqlite"
    if saxpy.exists():
        run = load([saxpy], Options(progress=False))
        assert all("memory" not in t.meta for t in run.ranks)
    write_nsys(make_scenario("1f1b", pp=2, microbatches=2, steps=1), tmp_path)
    assert diagnose([tmp_path], Options(progress=False)).result.memory == []
