"""Perfetto overlay: valid Chrome trace JSON, every device interval on the common clock, cause tracks."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

from diag_fixture import EVIL, build_nopp_diagnosis, build_pipeline_diagnosis

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.reports import write_report
from ppdiag.reports.perfetto import TID_LOST, write_perfetto
from ppdiag.reports.style import CAUSE_LABELS


def _load(path: Path) -> dict[str, Any]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return json.load(fh)
    return json.loads(path.read_text(encoding="utf-8"))


def test_overlay_structure_and_clock(tmp_path: Path) -> None:
    diag, truth = build_pipeline_diagnosis()
    path = write_report("perfetto", diag, tmp_path / "overlay.json")
    doc = _load(path)
    assert set(doc) >= {"traceEvents", "displayTimeUnit", "otherData"}
    t0 = doc["otherData"]["t0_ns"]
    evs = doc["traceEvents"]
    meta = [e for e in evs if e["ph"] == "M"]
    xs = [e for e in evs if e["ph"] == "X"]
    assert all({"pid", "tid", "ts", "dur", "name", "cat"} <= set(e) for e in xs)
    assert all(e["dur"] >= 0 for e in xs)
    # one named process per rank, with its stage
    pnames = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert pnames == {r: f"rank {r} · stage {r}" for r in range(4)}
    # every device interval of the model is re-emitted
    dev = [e for e in xs if e["tid"] < TID_LOST]
    assert len(dev) == truth.kernels_total
    # the compute kernels of each simulated F/B block start exactly at the block start on the common clock
    # (the ranks have different clock offsets, so a wrong offset would move them)
    starts: dict[tuple[int, str, int], list[float]] = {}
    for e in dev:
        if e["cat"] == "compute" and "mb" in e["args"]:
            key = (e["pid"], e["args"]["phase"], e["args"]["mb"])
            starts.setdefault(key, []).append(e["ts"])
    for r, k, ph, mb, a, _b in truth.blocks:
        if k != 0:
            continue
        first = min(starts[(r, "fwd" if ph == "F" else "bwd", mb)])
        assert abs(first * 1000 + t0 - a) < 2, (r, ph, mb)
    # one thread per stream, named
    tnames = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert tnames[(0, 7)] == "stream 7" and tnames[(0, 20)] == "stream 20"
    assert tnames[(1, TID_LOST)] == "lost time (cause)"


def test_gap_track_matches_the_gap_tables(tmp_path: Path) -> None:
    diag, _truth = build_pipeline_diagnosis()
    path = tmp_path / "overlay.json"
    stats = write_perfetto(diag, path)
    doc = _load(path)
    assert stats.gap_events == sum(len(g) for g in diag.gaps.values())
    t0 = doc["otherData"]["t0_ns"]
    lost = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == TID_LOST]
    for r, g in diag.gaps.items():
        mine = sorted((e for e in lost if e["pid"] == r), key=lambda e: e["ts"])
        assert len(mine) == len(g)
        got = Counter(e["args"]["cause"] for e in mine)
        want = Counter(CAUSE_KEYS[int(c)] for c in g.cause)
        assert got == want
        for e, s, en, c, b in zip(mine, g.start, g.end, g.cause, g.blame, strict=True):
            assert e["name"] == CAUSE_LABELS[CAUSE_KEYS[int(c)]]
            assert abs(e["ts"] * 1000 + t0 - int(s)) < 2 and abs(e["dur"] * 1000 - int(en - s)) < 2
            assert e["args"]["blame_rank"] == (int(b) if b >= 0 else None)
    # the host stall is on the stalled rank's track and blames it
    host = [e for e in lost if e["args"]["cause"] == "host" and e["pid"] == 2]
    assert host and all(e["args"]["blame_rank"] == 2 for e in host)


def test_steps_track_and_escaping(tmp_path: Path) -> None:
    diag, truth = build_pipeline_diagnosis()
    path = tmp_path / "o.json.gz"
    write_perfetto(diag, path)
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    doc = _load(path)
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "step" and e["pid"] == 0]
    assert [e["name"] for e in steps] == ["step 5", "step 6", "step 7"]
    assert [round(e["dur"] * 1000) for e in steps] == [b - a for a, b in truth.step_windows]
    # a hostile kernel name is kept verbatim as JSON data (Perfetto shows it as text)
    assert any(e["name"] == EVIL for e in doc["traceEvents"] if e["ph"] == "X")


def test_overlay_of_a_run_without_pipeline(tmp_path: Path) -> None:
    diag = build_nopp_diagnosis()
    write_perfetto(diag, tmp_path / "o.json")
    doc = _load(tmp_path / "o.json")
    pnames = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert pnames == {0: "rank 0", 1: "rank 1"}
    causes = Counter(
        e["args"]["cause"] for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == TID_LOST
    )
    assert causes == {"host": 6, "exposed_comm": 6}
