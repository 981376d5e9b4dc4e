"""Device memory from the allocator's [memory] events (ppdiag/parsers/kineto_memory.py,
ppdiag/model/memory.py, report ``memory[]``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import shared_trace

from ppdiag.api import Options, diagnose, load
from ppdiag.model import Intervals, Phase, Ranges, RankTimeline
from ppdiag.model.memory import MB, memory_row
from ppsynth.kineto import write_kineto
from ppsynth.memory import with_memory
from ppsynth.scenario import make_scenario

MS = 1_000_000


def _mem_events(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with gzip.open(path, "rt") as fh:
        d = json.load(fh)
    ev = [e for e in d["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]
    return ev, d


def test_real_trace_peak_is_the_max_total_allocated() -> None:
    p = shared_trace("kineto/tracelens_h100_single.json.gz")
    ev, _ = _mem_events(p)
    top = max(ev, key=lambda e: e["args"]["Total Allocated"])
    rows = diagnose([p], Options()).result.memory
    assert rows is not None and len(rows) == 1 and rows[0].source == "totals"
    assert rows[0].peak_allocated_mb == pytest.approx(top["args"]["Total Allocated"] / MB, abs=1e-3)
    assert rows[0].peak_ts_us == pytest.approx(top["ts"], abs=1e-3)
    assert rows[0].peak_reserved_mb == pytest.approx(
        max(e["args"]["Total Reserved"] for e in ev) / MB, abs=1e-3
    )
    assert rows[0].capacity_mb == pytest.approx(85018279936 / MB, abs=0.1)


def test_real_trace_without_totals_integrates_the_bytes() -> None:
    p = shared_trace("kineto/kineto_2021_resnet50_worker0.pt.trace.json.gz")
    ev, _ = _mem_events(p)
    ev.sort(key=lambda e: e["ts"])
    level = np.cumsum([e["args"]["Bytes"] for e in ev])
    i = int(np.argmax(level))
    rows = diagnose([p], Options()).result.memory
    assert rows is not None and rows[0].source == "bytes" and "relative" in rows[0].note
    assert rows[0].peak_allocated_mb == pytest.approx(level[i] / MB, abs=1e-3)
    assert rows[0].peak_ts_us == pytest.approx(ev[i]["ts"], abs=1e-3)
    assert rows[0].peak_reserved_mb is None


def test_trace_without_memory_events_has_no_rows(test_data: Path) -> None:
    assert diagnose([test_data / "gpu_pp_rank0.json"], Options()).result.memory == []


def test_parser_keeps_cuda_events_only(tmp_path: Path, test_data: Path) -> None:
    d = json.loads((test_data / "gpu_pp_rank0.json").read_text())
    t0 = min(e["ts"] for e in d["traceEvents"] if "ts" in e)
    for k, (dev_type, b) in enumerate([(1, 50), (0, 999), (1, 30), (1, -20), (1, 40)]):
        d["traceEvents"].append(
            {
                "ph": "i",
                "s": "t",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "ts": t0 + k,
                "args": {"Device Type": dev_type, "Device Id": 0 if dev_type else -1, "Bytes": b},
            }
        )
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d))
    mem = load([p]).ranks[0].meta["memory"]
    assert mem["source"] == "bytes" and mem["events"] == 4 and mem["bytes"] == [50, 30, -20, 40]


def test_inflight_and_activation_on_a_hand_built_stage() -> None:
    # one stage: F0 0..1 ms, F1 1..2 ms, B0 3..5 ms, B1 5..7 ms. The allocator holds 1000 MiB of
    # weights from t=0; each forward leaves 100 MiB of activations at its end (t=1, 2 ms) and
    # each backward frees them (t=5, 7 ms). Peak 1200 MiB at t=2 ms, with F0 and F1 done and no
    # backward started: 2 micro-batches in flight; each forward raises the level by 100 MiB.
    t = [0, 1 * MS, 2 * MS, 5 * MS, 7 * MS]
    alloc = [int(v * MB) for v in (1000, 1100, 1200, 1100, 1000)]
    mem = {
        "source": "totals",
        "events": 5,
        "dropped": 0,
        "capacity": {"0": int(1500 * MB)},
        "t_ns": t,
        "device": [0] * 5,
        "bytes": [0] * 5,
        "allocated": alloc,
        "reserved": [int(2000 * MB)] * 5,
    }
    tl = RankTimeline(0, "r0", "kineto", [""], Intervals.empty(), Ranges.empty(), meta={"memory": mem})
    bs = np.array([0, 1, 3, 5], np.int64) * MS
    be = np.array([1, 2, 5, 7], np.int64) * MS
    ph = np.array([Phase.FWD, Phase.FWD, Phase.BWD, Phase.BWD], np.int8)
    mb = np.array([0, 1, 0, 1], np.int32)
    st = np.zeros(4, np.int32)
    row = memory_row(tl, 0, (bs, be, ph, mb, st))
    assert row is not None
    assert row.peak_allocated_mb == pytest.approx(1200.0)
    assert row.peak_t_ms == pytest.approx(2.0)
    assert row.inflight_at_peak == 2 and row.inflight_microbatches == [0, 1]
    assert row.activation_per_mb_mb == pytest.approx(100.0)
    assert row.peak_of_capacity == pytest.approx(1200 / 1500)
    # ablation: with B0 done before the peak (1.2..1.8 ms) only F1 stays in flight; a backward
    # still running at the peak (2..5 ms) holds its micro-batch
    bs2 = (np.array([0, 1, 1.2, 5]) * MS).astype(np.int64)
    be2 = (np.array([1, 2, 1.8, 7]) * MS).astype(np.int64)
    row2 = memory_row(tl, 0, (bs2, be2, ph, mb, st))
    assert row2 is not None and row2.inflight_microbatches == [1]
    row3 = memory_row(tl, 0, (np.array([0, 1, 2, 5]) * MS, be, ph, mb, st))
    assert row3 is not None and row3.inflight_microbatches == [0, 1]


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (3, 6)])
def test_synthetic_activation_and_gpipe_peak_from_1f1b(tmp_path: Path, pp: int, m: int) -> None:
    # weights 1000 MiB, 100 MiB of activations per micro-batch: 1F1B holds min(P - s, M)
    # micro-batches on stage s, GPipe M
    w, a = 1000.0, 100.0
    reps = {}
    for sch in ("1f1b", "gpipe"):
        d = tmp_path / sch
        write_kineto(with_memory(make_scenario(schedule=sch, pp=pp, microbatches=m, steps=2), w, a), d)
        rows = diagnose([d], Options()).result.memory
        assert rows is not None
        reps[sch] = {r.rank: r for r in rows}
    rep = diagnose([tmp_path / "1f1b"], Options()).result
    stage_of = {int(r.rank): r.stage for r in rep.ranks}
    for rank, row in reps["1f1b"].items():
        s = stage_of[rank]
        assert s is not None
        assert row.activation_per_mb_mb == pytest.approx(a, rel=0.05)
        assert row.peak_allocated_mb == pytest.approx(w + min(pp - s, m) * a, rel=1e-6)
        gp = reps["gpipe"][rank].peak_allocated_mb
        assert gp == pytest.approx(w + m * a, rel=1e-6)
        assert row.predicted_peak_mb["gpipe"] == pytest.approx(gp, rel=0.10)


def test_synthetic_bytes_only_is_relative(tmp_path: Path) -> None:
    write_kineto(with_memory(make_scenario(steps=2), 1000.0, 100.0, totals=False), tmp_path)
    rows = diagnose([tmp_path], Options()).result.memory
    assert rows and all(r.source == "bytes" and "relative" in r.note for r in rows)
    assert rows[0].peak_allocated_mb == pytest.approx(1000.0 + 4 * 100.0)


def test_pp012_fires_on_gpipe_not_on_1f1b(tmp_path: Path) -> None:
    # GPipe P=4 M=8: stage 0 holds 8 micro-batches at its peak (1000 + 8 x 100 = 1800 MiB) where
    # 1F1B holds 4 (1400 MiB); a 1F1B run holds what it needs and has no finding
    found = {}
    for sch in ("gpipe", "1f1b"):
        d = tmp_path / sch
        write_kineto(with_memory(make_scenario(schedule=sch, steps=2), 1000.0, 100.0), d)
        found[sch] = [f for f in diagnose([d], Options()).result.findings if f.code == "PP012"]
    assert not found["1f1b"]
    (f,) = found["gpipe"]
    ev: dict[str, Any] = f.evidence.as_dict()
    assert ev["inflight_at_peak"] == 8 and ev["inflight_needed"] == 4
    assert ev["peak_allocated_mb"] == pytest.approx(1800.0)
    assert ev["predicted_peak_mb"]["1f1b"] == pytest.approx(1400.0, rel=0.05)
    assert any("1F1B" in x for x in f.fixes)
