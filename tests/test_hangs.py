"""Runs that stop or hang (ppdiag/pipeline/hangs.py, PP013) and truncated traces.

Hand-built op lists check the counting; synthetic runs where one rank stops mid-step
(:func:`ppsynth.truncate.stop_rank`, whose ground truth says who blocks on whom since when)
and traces cut in the middle of a step check the whole analysis.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppdiag.api import Options, diagnose
from ppdiag.model import Direction, Intervals, Kind, Ranges, RankTimeline, Run
from ppdiag.model.timeline import ProcessGroup
from ppdiag.pipeline.clocks import P2POps
from ppdiag.pipeline.hangs import detect
from ppdiag.pipeline.steps import LocalStep
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario
from ppsynth.truncate import cut_kineto, stop_rank

MS = 1_000_000
SEND, RECV = int(Direction.SEND), int(Direction.RECV)


def _tl(
    rank: int, starts: list[int], ends: list[int], kinds: list[int], groups: list[int] | None = None
) -> RankTimeline:
    n = len(starts)
    iv = Intervals.from_columns(
        n,
        {
            "start": starts,
            "end": ends,
            "kind": kinds,
            "name": [1] * n,
            "group": groups if groups else [-1] * n,
        },
    )
    return RankTimeline(
        rank,
        f"rank{rank}",
        "kineto",
        ["", "op"],
        iv,
        Ranges.empty(),
        process_groups=[ProcessGroup("0", "default_pg", [0, 1, 2])],
    )


def _ops(starts: list[int], ends: list[int], peer: list[int], direction: list[int]) -> P2POps:
    return P2POps(
        np.array(starts, np.int64),
        np.array(ends, np.int64),
        np.array(peer, np.int32),
        np.array(direction, np.int8),
        True,
        index=np.arange(len(starts), dtype=np.int64),
    )


def test_recv_beyond_the_sends_waits_for_the_sender() -> None:
    # rank 0 sends at 0, 10, 20 ms (1 ms each) and then stops (trace ends at 21 ms); rank 1
    # receives at 0, 10, 20 and posts a 4th receive at 30 ms that runs until its trace ends at
    # 130 ms: rank 1 waits in recv from rank 0 since t=30 ms for 100 ms; it is a hang (rank 1's
    # trace runs 109 ms past rank 0's end).
    s0, e0 = [0, 10 * MS, 20 * MS], [MS, 11 * MS, 21 * MS]
    s1, e1 = [0, 10 * MS, 20 * MS, 30 * MS], [MS, 11 * MS, 21 * MS, 130 * MS]
    run = Run([_tl(0, s0, e0, [1] * 3), _tl(1, s1, e1, [1] * 4)], "kineto")
    ops = {0: _ops(s0, e0, [1] * 3, [SEND] * 3), 1: _ops(s1, e1, [0] * 4, [RECV] * 4)}
    wins = {0: [LocalStep(7, 0, 12 * MS)], 1: [LocalStep(7, 0, 12 * MS)]}
    h = detect(run, ops, wins)
    assert h is not None and h.status == "hang" and h.root == 0
    assert h.first is not None
    assert (h.first.rank, h.first.op, h.first.peer, h.first.count) == (1, "recv", 0, 1)
    assert h.first.since_ms == pytest.approx(30.0)
    assert h.first.waited_ms == pytest.approx(100.0)
    assert h.first.open_at_end
    assert h.last_ops["0"].end_ms == pytest.approx(21.0)
    assert "rank 1 waits in recv from rank 0 since t=30.000 ms" in h.message
    # step 7 (0..12 ms) ended before the wait on both ranks and before rank 0's trace end
    assert h.complete_steps == 1


def test_send_nobody_received() -> None:
    # rank 0 sends at 0 and 10 ms; rank 1 received only the first one and its trace ends at
    # 5 ms, together with rank 0's 2nd send (10..11 ms ends within 6 ms): a cut, not a hang
    s0, e0 = [0, 10 * MS], [MS, 11 * MS]
    run = Run([_tl(0, s0, e0, [1, 1]), _tl(1, [0, 2 * MS], [MS, 5 * MS], [1, 0])], "kineto")
    ops = {0: _ops(s0, e0, [1, 1], [SEND, SEND]), 1: _ops([0], [MS], [0], [RECV])}
    h = detect(run, ops, {0: [], 1: []})
    assert h is not None and h.status == "cut"
    assert h.first is not None and (h.first.rank, h.first.op, h.first.peer) == (0, "send", 1)
    assert h.first.since_ms == pytest.approx(10.0)


def test_collective_some_members_never_entered() -> None:
    # group 0 = ranks 0, 1, 2; ranks 0 and 1 enter two all-reduces (0 and 10 ms), rank 2 only the
    # first: ranks 0 and 1 wait in the second since 10 ms for rank 2, whose last op ended at 1 ms
    kinds = [int(Kind.COLLECTIVE)] * 2
    tls = [_tl(r, [0, 10 * MS], [MS, 200 * MS], kinds, [0, 0]) for r in (0, 1)]
    tls.append(_tl(2, [0], [MS], kinds[:1], [0]))
    h = detect(Run(tls, "kineto"), {}, {})
    assert h is not None and h.status == "hang" and h.root == 2
    assert sorted((w.rank, w.op, tuple(w.missing)) for w in h.waits) == [
        (0, "collective", (2,)),
        (1, "collective", (2,)),
    ]
    assert all(w.since_ms == pytest.approx(10.0) for w in h.waits)


def test_complete_run_has_no_hang(tmp_path: Path) -> None:
    write_kineto(make_scenario(steps=2), tmp_path)
    rep = diagnose([tmp_path], Options()).result
    assert rep.hang is None  # the section is absent when the run completed
    assert not any(f.code == "PP013" for f in rep.findings)


@pytest.mark.parametrize(("stopped", "frac"), [(2, 0.5), (1, 0.3)])
def test_rank_stops_sending_mid_step(tmp_path: Path, stopped: int, frac: float) -> None:
    full = make_scenario(steps=3, clock_skew_ms=5.0, gpus_per_node=1)
    w = full.ranks[stopped].step_windows
    at = int(w[1, 0] + frac * (w[1, 1] - w[1, 0]))
    run, truth = stop_rank(full, stopped, at)
    write_kineto(run, tmp_path)
    d = diagnose([tmp_path], Options())
    rep = d.result
    h = rep.hang
    assert h is not None
    assert h.status == "hang" and h.root == stopped
    # the first finding says who waits for whom since when
    f = rep.findings[0]
    assert f.code == "PP013" and f.severity == "high"
    assert stopped in f.ranks
    got = {(x.rank, x.op, x.peer): x.since_ms for x in h.waits}
    want = {(b.rank, b.kind, b.peer): b.since_ns / MS for b in truth.blocked}
    assert set(got) == set(want)
    # the run's origin differs (first host event vs first kernel): compare the waits' times
    # relative to the first one; the clocks are aligned to well below 0.05 ms
    k0 = min(want, key=lambda k: want[k])
    for k in want:
        assert got[k] - got[k0] == pytest.approx(want[k] - want[k0], abs=0.05), k
    first = h.first
    assert first is not None
    assert first.peer == stopped and (
        first.rank,
        "recv" if first.op == "recv" else "send",
        stopped,
    ) in {(b.rank, b.kind, b.peer) for b in truth.blocked}
    assert f"waits in {first.op} " in f.title and f"rank {stopped}'s last op was" in f.title
    # the analysis keeps the steps every rank completed: step 0 only, and its step time is that
    # of the same step in the complete run
    assert rep.run.steps == [full.ranks[0].step_numbers[0]]
    whole = tmp_path / "whole"
    whole.mkdir()
    write_kineto(full, whole)
    ref = diagnose([whole], Options(steps=f"{full.ranks[0].step_numbers[0]}:{full.ranks[0].step_numbers[0]}"))
    assert rep.summary.step_ms == pytest.approx(ref.result.summary.step_ms, rel=0.01)


def _load(p: Path) -> dict[str, Any]:
    with gzip.open(p, "rt") if p.suffix == ".gz" else p.open() as fh:
        return dict(json.load(fh))


def _save(obj: dict[str, Any], p: Path) -> None:
    with gzip.open(p, "wt") if p.suffix == ".gz" else p.open("w") as fh:
        json.dump(obj, fh)


def cut_run_dir(src: Path, dst: Path, frac_of_step: float, step_index: int = -1) -> float:
    """Copy a run's Kineto traces cut at one common wall time: ``frac_of_step`` into the
    ``step_index``-th ProfilerStep of the first trace (the traces share the wall clock to within
    their skew). Returns the cut (µs)."""
    files = sorted(src.glob("*.json*"))
    traces = {p: _load(p) for p in files if "trace" in p.name or p.name.startswith("rank")}
    steps = sorted(
        (e["ts"], e["dur"])
        for e in next(iter(traces.values()))["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
    )
    ts, dur = steps[step_index]
    cut = float(ts) + frac_of_step * float(dur)
    dst.mkdir(parents=True, exist_ok=True)
    for p, t in traces.items():
        out, _ = cut_kineto(t, cut)
        _save(out, dst / p.name)
    return cut


def test_synthetic_trace_cut_mid_step(tmp_path: Path) -> None:
    full = make_scenario(steps=3, clock_skew_ms=0.0)
    src = tmp_path / "src"
    src.mkdir()
    write_kineto(full, src)
    cut_run_dir(src, tmp_path / "cut", 0.5)
    rep = diagnose([tmp_path / "cut"], Options()).result
    h = rep.hang
    assert h is not None and h.status == "cut"
    assert h.first is not None and h.first.peer is not None
    # the cut step is left out: the two complete steps are analysed
    assert rep.run.steps == full.ranks[0].step_numbers[:2]
    assert h.dropped_steps == [full.ranks[0].step_numbers[2]]
    assert rep.findings[0].code == "PP013"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the demo recorder needs torch")
def test_recorded_demo_cut_mid_step(tmp_path: Path) -> None:
    from ppdiag.demo.config import DemoConfig
    from ppdiag.demo.recorder import record

    src = tmp_path / "run"
    record(DemoConfig(pp=4, microbatches=4, steps=3, timeout_s=120), src)
    whole = diagnose([src], Options()).result
    assert whole.hang is None  # absent when the run completed
    # cut in the middle of a receive of the last step that waited (over 1 ms): its sender had not
    # sent at the cut
    t1 = _load(src / "rank1.pt.trace.json.gz")["traceEvents"]
    ts, dur = max((e["ts"], e["dur"]) for e in t1 if str(e.get("name", "")).startswith("ProfilerStep#"))
    waited = [
        e for e in t1 if e.get("name") == "gloo:recv" and ts <= e["ts"] < ts + dur and e.get("dur", 0) > 1000
    ]
    assert waited
    recv = waited[len(waited) // 2]
    cut = float(recv["ts"]) + 0.5 * float(recv["dur"])
    (tmp_path / "cut").mkdir()
    for p in src.glob("rank*.pt.trace.json.gz"):
        _save(cut_kineto(_load(p), cut)[0], tmp_path / "cut" / p.name)
    rep = diagnose([tmp_path / "cut"], Options()).result
    h = rep.hang
    assert h is not None and h.status == "cut"
    ours = [w for w in h.waits if w.rank == 1 and w.op == "recv"]
    assert ours and ours[0].open_at_end
    # since the receive was issued: it waited from its start to the cut, where the trace ends
    assert ours[0].waited_ms == pytest.approx(0.5 * float(recv["dur"]) / 1000, abs=0.01)
    assert ours[0].since_ms == pytest.approx(h.trace_end_ms["1"] - 0.5 * float(recv["dur"]) / 1000, abs=0.01)
    first = h.first
    # a rank in a p2p op at the cut, its peer one pipeline neighbour away, since a time inside
    # the cut step and before the cut
    assert first is not None and first.peer is not None and abs(first.rank - first.peer) == 1
    last = whole.run.steps[-1]
    assert first.step == last
    assert first.since_ms <= max(h.trace_end_ms.values())
    assert f"rank {first.rank} waits in {first.op}" in rep.findings[0].title

    # the complete steps are analysed; on a loaded host the first of them may be left out as a
    # warm-up outlier against the one remaining step, which the run then says
    # (each analysis decides on its own whether its first step is a warm-up outlier, and says which)
    def warm_up(ws: list[str]) -> set[int]:
        return {
            int(m.group(1)) for w in ws if (m := re.search(r"first profiled step \((\d+)\) is an outlier", w))
        }

    recorded = sorted(set(whole.run.steps) | warm_up(whole.run.warnings))
    expected = [s for s in recorded if s != last and s not in warm_up(rep.run.warnings)]
    assert rep.run.steps == expected
    assert h.dropped_steps == [last]
