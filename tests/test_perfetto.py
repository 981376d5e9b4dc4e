"""Perfetto overlay: valid Chrome trace JSON, every device interval on the common clock, cause tracks."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

from diag_fixture import EVIL, build_nopp_diagnosis, build_pipeline_diagnosis

from ppdiag.report_types import Cause
from ppdiag.reports import write_report
from ppdiag.reports.perfetto import write_perfetto
from ppdiag.reports.perfetto_events import TID_LOST
from ppdiag.reports.style import CAUSE_LABELS


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any]
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    else:
        doc = json.loads(path.read_text(encoding="utf-8"))
    return doc


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
        want = Counter(Cause.of(c) for c in g.cause)
        assert got == want
        for e, s, en, c, b in zip(mine, g.start, g.end, g.cause, g.blame, strict=True):
            assert e["name"] == CAUSE_LABELS[Cause.of(c)]
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


# ------------------------------------------------------------------ arrows and tracks on analysed runs


def _partial_overlaps(doc: dict[str, Any]) -> Counter[str]:
    """Per track name: slices that start inside an earlier slice of the track and end after it."""
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    bad: Counter[str] = Counter()
    for key, sl in tracks.items():
        sl.sort()
        open_ends: list[float] = []
        for s, e in sl:
            # (1e-6 µs: the float sum of a rounded ts and dur, not an overlap)
            while open_ends and open_ends[-1] <= s + 1e-6:
                open_ends.pop()
            if open_ends and e > open_ends[-1] + 1e-6:
                bad[names.get(key, str(key))] += 1
            open_ends.append(e)
    return bad


def _analyzed(tmp_path: Path, run: Any) -> Any:
    from ppdiag.api import diagnose
    from ppsynth.kineto import write_kineto

    write_kineto(run, tmp_path / "run")
    return diagnose([tmp_path / "run"])


def test_flows_are_the_matched_pairs_and_tracks_never_partially_overlap(tmp_path: Path) -> None:
    from ppsynth.scenario import make_scenario

    diag = _analyzed(tmp_path, make_scenario(seed=5, steps=3))
    pairs = diag.context.pipeline.pairs
    assert len(pairs) > 0
    stats = write_perfetto(diag, tmp_path / "overlay.json")
    doc = _load(tmp_path / "overlay.json")
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s" and e["name"] == "p2p"]
    ends = [e for e in doc["traceEvents"] if e["ph"] == "f" and e["name"] == "p2p"]
    assert stats.flows == len(starts) == len(ends) == len(pairs)
    # each arrow leaves a send slice of its sender and lands inside a recv slice of its receiver
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for e in starts + ends:
        assert any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])]), e
    assert {e["pid"] for e in starts} == {int(x) for x in pairs.src}
    assert _partial_overlaps(doc) == Counter()
    tnames = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"critical path", "lost time (cause)", "p2p sends (matched)", "p2p recvs (matched)"} <= tnames


def test_collective_arrows_go_from_the_last_arriver_to_the_waiters(tmp_path: Path) -> None:
    from ppsynth.collectives import make_collective_run

    # rank 0 starts each step 1 ms late: in every collective the others wait for it
    diag = _analyzed(tmp_path, make_collective_run(world=3, late_ms={0: 1.0}, steps=2))
    stats = write_perfetto(diag, tmp_path / "overlay.json")
    doc = _load(tmp_path / "overlay.json")
    s = [e for e in doc["traceEvents"] if e["ph"] == "s" and e["name"] == "last arriver"]
    f = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f" and e["name"] == "last arriver"}
    assert stats.collective_flows == len(s) > 0
    # the instances rank 0 arrives last at: its arrows go to both other ranks
    from_0 = [e for e in s if e["pid"] == 0]
    assert from_0 and {f[e["id"]]["pid"] for e in from_0} == {1, 2}
    assert _partial_overlaps(doc) == Counter()


def test_lanes_keep_a_track_free_of_overlaps() -> None:
    import numpy as np

    from ppdiag.reports.perfetto_events import lanes

    # [0,10) [5,15) [12,20) [14,16): [12,20) reuses lane 0 (free at 10), [14,16) overlaps both
    # others still open: lane 2; [30,40) overlaps nothing: lane 0
    ln = lanes(np.array([0, 5, 12, 14, 30]), np.array([10, 15, 20, 16, 40]))
    assert ln.tolist() == [0, 1, 0, 2, 0]
    # a chain where each slice overlaps only the next needs two lanes, whatever its length
    n = 50
    ln = lanes(np.arange(n) * 10, np.arange(n) * 10 + 15)
    assert set(ln.tolist()) == {0, 1}
