"""p2p partners from timing (``ppdiag.pipeline.peers``) and pairing that survives lost events.

The hand-built timelines below are a few transfers each, with their times written out; the
synthetic runs are diagnosed twice, with their peer metadata and with it stripped
(``tests/ablate.py``), and must come out the same.
"""

from __future__ import annotations

import gzip
import json
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from ppdiag.api import Options, diagnose
from ppdiag.model import Direction, Intervals, Kind, Phase, RangeKind, Ranges, RankTimeline, Run
from ppdiag.pipeline.clocks import P2POps, match_pairs, p2p_ops
from ppdiag.pipeline.peers import HOW_TIMING, decide_peers, fit_link
from ppdiag.report_types import Report
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario, write_groundtruth

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablate import (
    ALL_KINETO,
    EMIT_NVTX,
    PAYLOADS,
    strip_kineto_dir,
    strip_nsys_dir,
)

MS = 1_000_000
US = 1_000
S, R = int(Direction.SEND), int(Direction.RECV)


def _ops(start: list[int], end: list[int], peer: list[int], dirn: list[int], device: bool = True) -> P2POps:
    return P2POps(
        np.array(start, np.int64),
        np.array(end, np.int64),
        np.array(peer, np.int32),
        np.array(dirn, np.int8),
        device,
    )


# ---- pairing by time and order ---------------------------------------------------------------


def _link(n: int, lost: int | None = None, dup: int | None = None) -> dict[int, P2POps]:
    """Rank 0 sends n activations to rank 1, every 10 ms, each kernel 1 ms; rank 1's clock is
    3 ms behind (its receive of send k ends at 10k + 1 - 3 ms on its own clock)."""
    s_start = [10 * MS * k for k in range(n)]
    s_end = [t + MS for t in s_start]
    r_end = [t + MS - 3 * MS for t in s_start]
    r_start = [t - 2 * MS for t in r_end]  # posted 2 ms early
    if lost is not None:
        del r_start[lost], r_end[lost]
    if dup is not None:
        r_start.insert(dup, r_start[dup])
        r_end.insert(dup, r_end[dup])
    a = _ops(s_start, s_end, [1] * n, [S] * n)
    b = _ops(r_start, r_end, [0] * len(r_end), [R] * len(r_end))
    return {0: a, 1: b}


def test_pairs_in_order_when_nothing_is_lost() -> None:
    p = match_pairs(_link(6))
    assert len(p) == 6
    # every pair ends together once rank 1's 3 ms are added
    assert np.all(p.send_end - p.recv_end == 3 * MS)
    assert not p.unmatched and not p.warnings


def test_a_lost_receive_costs_one_pair_and_shifts_none() -> None:
    # the receive of send 2 is lost: 5 pairs, each still 3 ms apart (index pairing would pair
    # send 2 with receive 3 and every later one 10 ms off)
    p = match_pairs(_link(6, lost=2))
    assert len(p) == 5
    assert np.all(p.send_end - p.recv_end == 3 * MS)
    assert p.unmatched == {(0, 1): (1, 0)}
    assert len(p.warnings) == 1 and "0->1" in p.warnings[0] and "1 sends" in p.warnings[0]


def test_a_duplicated_receive_is_skipped() -> None:
    p = match_pairs(_link(6, dup=4))
    assert len(p) == 6
    assert np.all(p.send_end - p.recv_end == 3 * MS)
    assert p.unmatched == {(0, 1): (0, 1)}


def test_host_ops_lost_send_pairs_each_receive_after_its_send() -> None:
    # host ops (gloo): sends at 0, 10, 20, 30 ms; the receive of each ends 0.2 ms after it began;
    # the send at 10 ms is lost from the trace: the receive ending at 10.2 ms has no partner and
    # each other receive keeps its own send
    a = _ops([0, 20 * MS, 30 * MS], [US, 20 * MS + US, 30 * MS + US], [1] * 3, [S] * 3, device=False)
    r_end = [200 * US, 10 * MS + 200 * US, 20 * MS + 200 * US, 30 * MS + 200 * US]
    b = _ops([t - MS for t in r_end], r_end, [0] * 4, [R] * 4, device=False)
    p = match_pairs({0: a, 1: b})
    assert len(p) == 3
    assert np.all(p.recv_end - p.send_start == 200 * US)
    assert p.unmatched == {(0, 1): (0, 1)}


# ---- the link fit ---------------------------------------------------------------------------


def test_fit_link_finds_the_offset_above_a_flat_floor() -> None:
    # 40 sends every 1.7 ms; their receives end 120 µs later (+-3 µs); 200 unrelated receive
    # ends spread over the same time: the peak is at 120 µs and holds all 40 sends
    rng = np.random.default_rng(1)
    s = np.arange(40, dtype=np.int64) * 1_700 * US
    r_true = s + 120 * US + rng.integers(-3 * US, 3 * US, s.size)
    r_noise = rng.integers(0, int(s[-1]), 200)
    r = np.sort(np.concatenate([r_true, r_noise]))
    f = fit_link(s, r, 2 * MS, -2 * MS)
    assert f is not None
    shift, _, support, floor = f
    assert abs(shift - 120 * US) <= 5 * US
    # a non-partner would put ~6 differences into the same 40 µs (600 differences over 4 ms)
    assert support >= 40 and support > 5 * floor


# ---- synthetic GPU runs, peers stripped --------------------------------------------------------


def _diag(path: Path) -> Report:
    return diagnose([path], Options()).result


def _compare(rep: Report, stripped: Report, tol_pct: float = 1.0) -> None:
    """Same structure; every cause of every rank within ``tol_pct`` % of the step."""
    for k in ("pp", "schedule", "microbatches", "virtual_stages", "stage_map"):
        assert getattr(stripped.run, k) == getattr(rep.run, k), k
    for a, b in zip(rep.ranks, stripped.ranks, strict=True):
        for k, v in a.lost_ms.items():
            assert abs(b.lost_ms[k] - v) <= tol_pct / 100 * a.step_ms, (
                a.rank,
                k,
                v,
                b.lost_ms[k],
            )


def _kineto_pair(tmp_path: Path, **kw: Any) -> tuple[Report, Report, dict[str, int]]:
    run = make_scenario(steps=2, clock_skew_ms=5.0, **kw)
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_kineto(run, base)
    write_groundtruth(run, base)
    counts = strip_kineto_dir(base, bare, ALL_KINETO)
    return _diag(base), _diag(bare), counts


def test_kineto_without_any_peer_source_rebuilds_the_same_pipeline(tmp_path: Path) -> None:
    rep, bare, counts = _kineto_pair(tmp_path, schedule="1f1b", pp=4, microbatches=6)
    # the strip really removed every source of structure
    assert counts["comm_args"] > 0 and counts["param_comms"] > 0 and counts["nvtx_names"] > 0
    assert counts["pg"] > 0
    assert rep.run.peer_source == "metadata"
    assert bare.run.peer_source == "timing"
    assert bare.run.stage_source.startswith("p2p chain")
    assert bare.run.peers is not None
    assert bare.run.peers.decided_by_timing > 0 and bare.run.peers.undecided == 0
    assert bare.run.clock_residual_us is not None and bare.run.clock_residual_us < 50
    _compare(rep, bare)


def test_kineto_interleaved_ring_without_peers(tmp_path: Path) -> None:
    rep, bare, _ = _kineto_pair(tmp_path, schedule="interleaved_1f1b", pp=4, microbatches=4, virtual=2)
    assert bare.run.virtual_stages == 2
    _compare(rep, bare)


def test_nsys_without_payloads_or_emit_nvtx_names(tmp_path: Path) -> None:
    run = make_scenario(
        steps=2, clock_skew_ms=5.0, schedule="1f1b", pp=4, microbatches=6, faults=[F.SlowStage(2, 2.0)]
    )
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_nsys(run, base)
    counts = strip_nsys_dir(base, bare, (PAYLOADS, EMIT_NVTX))
    assert counts[PAYLOADS] > 0
    rep, stripped = _diag(base), _diag(bare)
    assert stripped.run.peer_source in ("timing", "metadata and timing")
    _compare(rep, stripped)


def _drop_sendrecv_kernel(path: Path, nth: int) -> None:
    """Delete the ``nth`` SendRecv kernel of a Kineto trace (a lost event)."""
    with gzip.open(path) as f:
        obj = json.loads(f.read())
    ev = obj["traceEvents"]
    idx = [i for i, e in enumerate(ev) if e.get("cat") == "kernel" and "SendRecv" in str(e.get("name"))]
    del ev[idx[nth]]
    with gzip.open(path, "wb") as f:
        f.write(json.dumps(obj).encode())


def test_a_lost_kernel_without_peers_moves_no_clock(tmp_path: Path) -> None:
    run = make_scenario(steps=2, clock_skew_ms=5.0, schedule="1f1b", pp=4, microbatches=6)
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_kineto(run, base)
    strip_kineto_dir(base, bare, ALL_KINETO)
    rank1 = next(p for p in sorted(bare.glob("rank1.*.json.gz")))
    _drop_sendrecv_kernel(rank1, 5)
    rep, lost = _diag(base), _diag(bare)
    assert lost.run.pp == 4 and lost.run.stage_map == rep.run.stage_map
    # the offsets stay where they were (index pairing moved them by a block's length)
    for r, v in rep.run.clock_offsets_us.items():
        assert abs(lost.run.clock_offsets_us[r] - v) < 5.0
    assert lost.run.clock_residual_us is not None and lost.run.clock_residual_us < 50
    # the orphaned send is counted, not paired with a later receive
    assert any("unmatched" in w for w in lost.run.warnings)


def test_timing_without_a_pattern_falls_back_with_a_warning(tmp_path: Path) -> None:
    # the same run with every rank's p2p kernels shuffled in time: nothing lines up across
    # ranks, so no partner is guessed and the run says so
    run = make_scenario(steps=2, clock_skew_ms=5.0, schedule="1f1b", pp=4, microbatches=6)
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_kineto(run, base)
    strip_kineto_dir(base, bare, ALL_KINETO)
    rng = np.random.default_rng(0)
    for p in sorted(bare.glob("rank*.json.gz")):
        with gzip.open(p) as f:
            obj = json.loads(f.read())
        for e in obj["traceEvents"]:
            if e.get("cat") == "kernel" and "SendRecv" in str(e.get("name")):
                e["ts"] = float(e["ts"]) + float(rng.uniform(-40_000, 40_000))
        with gzip.open(p, "wb") as f:
            f.write(json.dumps(obj).encode())
    rep = _diag(bare)
    assert rep.run.pp == 1
    assert any("p2p peers" in w or "p2p partners" in w for w in rep.run.warnings)
    assert rep.run.peer_source in ("none", "timing")


def test_decided_ops_are_marked_as_timing(tmp_path: Path) -> None:
    from ppdiag.parsers.loader import load_run
    from ppdiag.pipeline import rebuild

    run = make_scenario(steps=2, clock_skew_ms=5.0, schedule="gpipe", pp=4, microbatches=4)
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_kineto(run, base)
    strip_kineto_dir(base, bare, ALL_KINETO)
    meta = rebuild(load_run([base]))
    timed_run = load_run([bare])
    timed = rebuild(timed_run)
    for r, o in timed.ops.items():
        assert np.all(o.how == HOW_TIMING)
        np.testing.assert_array_equal(o.peer, meta.ops[r].peer)
        np.testing.assert_array_equal(o.direction, meta.ops[r].direction)
    # the parser's columns stay as parsed (no peer)
    for tl in timed_run.ranks:
        assert np.all(tl.intervals.peer == -1)


def test_lockstep_replicas_are_told_apart_by_rank_order(tmp_path: Path) -> None:
    # dp = 2: both replicas run the same schedule to the ns, so rank 0's sends end together with
    # the receives of both stage-1 ranks; without a process group timing cannot tell the replicas
    # apart. The ranks' op counts can: each pipeline's first and last ranks have half the
    # transfers (here 0, 1, 6, 7: stage-major numbering), so the pipelines are 0-2-4-6 and 1-3-5-7,
    # with a warning that says so; the analysis is the one the peers in the trace give
    run = make_scenario(steps=2, clock_skew_ms=5.0, schedule="1f1b", pp=4, microbatches=4, dp=2)
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_kineto(run, base)
    strip_kineto_dir(base, bare, ALL_KINETO)
    ref, rep = _diag(base), _diag(bare)
    want = (4, {"0": 0, "1": 2, "2": 4, "3": 6})
    assert (rep.run.pp, rep.run.stage_map) == (ref.run.pp, ref.run.stage_map) == want
    assert any("lockstep" in w and "rank order" in w for w in rep.run.warnings), rep.run.warnings
    for a, b in zip(ref.ranks, rep.ranks, strict=True):
        for k in a.lost_ms:
            assert abs(a.lost_ms[k] - b.lost_ms[k]) < 0.05, (a.rank, k, a.lost_ms, b.lost_ms)


def test_lockstep_ends_that_fit_no_numbering_are_not_guessed() -> None:
    """Op counts whose short ranks are the ends of neither numbering (nor of both) decide
    nothing: the ambiguity stands."""
    from ppdiag.pipeline.clocks import P2POps
    from ppdiag.pipeline.peer_links import Coarse
    from ppdiag.pipeline.peers import PeerDecision, _in_rank_order

    def ops(n: int) -> P2POps:
        z = np.zeros(n, np.int64)
        return P2POps(z, z.copy(), np.full(n, -1, np.int32), np.ones(n, np.int8), True)

    coarse = Coarse({}, 1_000_000, "none", 0)
    for counts in ([4, 8, 4, 8, 4, 8, 4, 8], [8, 8, 8, 8, 8, 8, 8, 8]):  # ends 0, 2, 4, 6; none
        o = {r: ops(c) for r, c in enumerate(counts)}
        unknown = {r: v.peer < 0 for r, v in o.items()}
        assert _in_rank_order(o, unknown, sorted(o), coarse, PeerDecision("none", {}, "none")) is None


def test_pipeline_group_separates_lockstep_replicas(tmp_path: Path) -> None:
    from ppdiag.parsers.loader import load_run
    from ppdiag.pipeline import rebuild

    run = make_scenario(steps=2, clock_skew_ms=5.0, schedule="1f1b", pp=4, microbatches=4, dp=2)
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_kineto(run, base)
    # peers gone, the process groups (pg_config naming the pipeline group) kept
    strip_kineto_dir(base, bare, ("comm_args", "param_comms", "nvtx_names"))
    meta = rebuild(load_run([base]))
    timed = rebuild(load_run([bare]))
    assert timed.topology.stage_map() == meta.topology.stage_map()
    for r, o in timed.ops.items():
        np.testing.assert_array_equal(o.peer, meta.ops[r].peer)


def test_stage_map_separates_lockstep_replicas(tmp_path: Path) -> None:
    # the same ambiguous run as above, with the user's --stage-map: the partners follow from it
    run = make_scenario(steps=2, clock_skew_ms=5.0, schedule="1f1b", pp=4, microbatches=4, dp=2)
    base, bare = tmp_path / "meta", tmp_path / "bare"
    write_kineto(run, base)
    strip_kineto_dir(base, bare, ALL_KINETO)
    rep = _diag(base)
    lines = ";".join(",".join(str(r) for r in line) for line in [[0, 2, 4, 6], [1, 3, 5, 7]])
    got = diagnose([bare], Options(stage_map=lines)).result
    assert got.run.stage_map == rep.run.stage_map
    assert got.run.peers is not None and got.run.peers.undecided == 0
    assert not any("ambiguous" in w for w in got.run.warnings)


# ---- fused exchanges (one SendRecv kernel carries a send and a receive) ----------------------

B = int(Direction.BOTH)
# 1F1B with 3 stages and 3 micro-batches, one rank per stage, as batch_isend_irecv runs it: a send
# and a receive to the same neighbour are one kernel (B). Times in 0.1 ms on the true clock;
# compute blocks F (forward) and W (backward), p2p rows (direction, start, end, true peer). The
# ranks share one GPU by time slices, so a matched pair ends together only to 0-2.2 ms.
#   rank 0 (stage 0): S a0->1, S a1->1, B {a2->1, g0<-1}, R g1<-1, R g2<-1: every peer 1
#   rank 1 (stage 1): R a0<-0, S a0->2, R a1<-0, B {a1->2, g0<-2}, B {g0->0, a2<-0},
#                     B {a2->2, g1<-2}, S g1->0, R g2<-2, S g2->0: peers 0 2 0 2 0 2 0 2 0
#   rank 2 (stage 2): R a0<-1, B {g0->1, a1<-1}, B {g1->1, a2<-1}, S g2->1: every peer 1
# The k-th forward send of rank 0 (a0, a1, a2) ends with the k-th forward receive of rank 1, and
# the k-th backward send of rank 1 (g0, g1, g2) with the k-th backward receive of rank 0: the two
# median gaps add up to ~0 (+0.8 ms) whatever the clocks, while rank 0 against rank 2 adds up to
# stage 1's compute both ways. Rank 1's B kernels go to 2, 0, 2 in turn on one stream.
_FUSED: dict[int, list[tuple[Any, ...]]] = {
    0: [("F", 0, 20), (S, 20, 23, 1), ("F", 23, 43), (S, 43, 64, 1), ("F", 64, 84), (B, 84, 182, 1),
        ("W", 182, 222), (R, 222, 255, 1), ("W", 255, 295), (R, 295, 356, 1), ("W", 356, 396)],
    1: [(R, 0, 38, 0), ("F", 38, 58), (S, 58, 61, 2), (R, 61, 72, 0), ("F", 72, 92), (B, 92, 124, 2),
        ("W", 124, 164), (B, 164, 189, 0), ("F", 189, 209), (B, 209, 212, 2), ("W", 212, 252),
        (S, 252, 255, 0), (R, 255, 305, 2), ("W", 305, 345), (S, 345, 348, 0)],
    2: [(R, 0, 61, 1), ("F", 61, 81), ("W", 81, 121), (B, 121, 146, 1), ("F", 146, 166),
        ("W", 166, 206), (B, 206, 227, 1), ("F", 227, 247), ("W", 247, 287), (S, 287, 290, 1)],
}  # fmt: skip
# each rank's own clock, and its host step start (later stages start the step earlier)
_CLOCK = {0: 0, 1: 37 * MS, 2: -21 * MS}
_STEP_START = {0: -1, 1: -60, 2: -120}


def _fused_rank(rank: int) -> RankTimeline:
    """The rank's kernels on its own clock: each compute block as three kernels on stream 7, the
    p2p kernels on one NCCL stream (20) with directions and no peers."""
    unit = MS // 10
    cols: dict[str, list[int]] = {c: [] for c in ("start", "end", "stream", "kind", "phase", "direction")}
    for row in _FUSED[rank]:
        if isinstance(row[0], str):
            cuts = np.linspace(row[1], row[2], 4)
            spans = list(pairwise(cuts))
            kind, stream, phase, d = Kind.COMPUTE, 7, Phase.FWD if row[0] == "F" else Phase.BWD, 0
        else:
            spans, kind, stream, phase, d = [(row[1], row[2])], Kind.P2P, 20, Phase.UNKNOWN, row[0]
        for a, b in spans:
            for c, x in zip(cols, (int(a * unit), int(b * unit), stream, kind, phase, d), strict=True):
                cols[c].append(int(x) + (_CLOCK[rank] if c in ("start", "end") else 0))
    iv = Intervals.from_columns(len(cols["start"]), cols)
    step = {"start": [_STEP_START[rank] * unit + _CLOCK[rank]], "end": [400 * unit + _CLOCK[rank]]}
    rg = Ranges.from_columns(1, {**step, "kind": [int(RangeKind.STEP)], "num": [1]})
    return RankTimeline(rank, f"rank{rank}", "kineto", [""], iv, rg, world_size=3)


def test_fused_exchanges_on_a_shared_gpu_find_their_partners_by_order() -> None:
    run = Run([_fused_rank(r) for r in range(3)], "kineto")
    ops = {tl.rank: p2p_ops(tl) for tl in run.ranks}
    assert int((ops[1].direction == B).sum()) == 3  # fused kernels to two peers on one stream
    dec = decide_peers(run, ops)
    assert dec.undecided == 0 and dec.decided == 18 and dec.warnings == []
    for r, v in ops.items():
        want = [row[3] for row in _FUSED[r] if not isinstance(row[0], str)]
        assert v.peer.tolist() == want, r
        assert np.all(v.how == HOW_TIMING)
    assert sorted(dec.links) == [(0, 1), (1, 0), (1, 2), (2, 1)]
