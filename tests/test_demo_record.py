"""Real multi-process pipeline runs recorded by ``ppdiag.demo.record``, checked against what was injected.

Every recording starts 4 (or 2) processes with torch.distributed.pipelining over gloo; each is shared
by the tests of one configuration (module-scoped cache). The truths used here are the configuration
itself (costs, faults, stage placement) and causality, never numbers taken from the code's output.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from demo_noise import RunNoise, Scale, Support, kept_costs, record_dir_supported

from ppdiag.demo import DemoConfig, DemoError, GroundTruth, load_groundtruth, record

if importlib.util.find_spec("torch") is None:
    pytest.skip("the demo recorder needs torch", allow_module_level=True)

pytestmark = pytest.mark.slow

MS = 1_000_000
HOLD_OPS = ("ppdiag_demo::hold", "ppdiag_demo::hold_backward")
RECORD_SECONDS: dict[str, float] = {}


# ---- recordings ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., GroundTruth]]:
    """``recorded(name, support=None, **config)``: record once per name, then reuse; ``support``
    (or :data:`SUPPORT` of the name) may have it recorded once more (see demo_noise)."""
    cache: dict[str, GroundTruth] = {}

    def get(name: str, support: SupportSpec | None = None, **kwargs: Any) -> GroundTruth:
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            t0 = time.monotonic()
            # a run whose assertions need its fault to stand out of this host's load, as the run
            # measured it, is recorded again with larger costs or faults when it does not
            check, scale, costs = support or SUPPORT.get(name, (None, None, True))
            out = record_dir_supported(name, DemoConfig(**kwargs), out, check, scale, costs)
            RECORD_SECONDS[name] = time.monotonic() - t0
            cache[name] = load_groundtruth(out)
        return cache[name]

    yield get
    if RECORD_SECONDS:
        print("\nrecording wall time: " + ", ".join(f"{k} {v:.1f}s" for k, v in RECORD_SECONDS.items()))


SCHEDULE_RUNS: dict[str, dict[str, Any]] = {
    "gpipe": {"schedule": "gpipe", "microbatches": 4},
    "1f1b": {"schedule": "1f1b", "microbatches": 8},
    "interleaved_1f1b": {"schedule": "interleaved_1f1b", "microbatches": 8},
    "looped_bfs": {"schedule": "looped_bfs", "microbatches": 4},
    "zero_bubble": {"schedule": "zero_bubble", "microbatches": 8},
    "zbv": {"schedule": "zbv", "microbatches": 8},
    "dualpipev": {"schedule": "dualpipev", "microbatches": 8},
}
# Blocks of several ms keep Python's per-block overhead small next to them, also on a busy machine.
COMMON: dict[str, Any] = {"pp": 4, "steps": 2, "fwd_ms": 8.0, "bwd_ms": 16.0, "timeout_s": 120.0}
#: How far the trace clock (Kineto) and time.time_ns() may disagree on one host.
CLOCK_SLACK_NS = 100_000


def _send_holds(truth: dict[str, Any]) -> tuple[float, float]:
    """(median hold of the delayed rank's sends, largest median time any other rank's sends took
    from the schedule's request to the post): how long the fault held a send, and how long this
    run's load held a send that nothing delayed."""
    slow = truth["faults"][0]["rank"]
    medians = {}
    for rt in truth["ranks"]:
        iv = rt["intervals"]
        d = [e - s for k, s, e in zip(iv["kind"], iv["start_ns"], iv["end_ns"], strict=True) if k == "send"]
        medians[rt["rank"]] = float(np.median(d)) if d else 0.0
    hold = medians.pop(slow)
    return hold, max(medians.values(), default=0.0)


#: How many times longer than the load holds an undelayed send the fault must hold a delayed one.
DELAY_OVER_LOAD = 4.0

#: (support, scale, whether a second recording scales the costs too) of a recording.
SupportSpec = tuple[Support | None, Scale | None, bool]


def delay_support(base_load_ns: float) -> SupportSpec:
    """The slow-link recording must hold its delayed sends :data:`DELAY_OVER_LOAD` times longer than
    the load alone held a send: any other rank's in that run, the same sends in the fault-free run
    (``base_load_ns``). It is recorded again with only the delay larger, as the test compares its
    waits with the fault-free run of the same costs."""

    def check(truth: dict[str, Any], noise: RunNoise) -> str | None:
        hold, load = _send_holds(truth)
        load = max(load, base_load_ns)
        if hold >= DELAY_OVER_LOAD * load:
            return None
        return f"delayed sends held {hold / MS:.2f} ms, undelayed ones {load / MS:.2f} ms by the load alone"

    def scale(truth: dict[str, Any], noise: RunNoise) -> float:
        hold, load = _send_holds(truth)
        return 1.5 * DELAY_OVER_LOAD * max(load, base_load_ns) / hold if hold > 0 else 6.0

    return check, scale, False


#: Recordings whose assertions need the holds to have kept their costs (see demo_noise).
SUPPORT: dict[str, SupportSpec] = {"slow_stage": (kept_costs(0.25), None, True)}
#: Upper bound of what one sleep-op call adds around its timed hold (dispatch, clone, profiler) on a
#: quiet host; on a busy one the test allows a quarter of the op's hold.
OP_OVERHEAD_NS = 150_000


def schedule_run(recorded: Callable[..., GroundTruth], name: str) -> GroundTruth:
    return recorded(name, **COMMON, **SCHEDULE_RUNS[name])


def baseline(recorded: Callable[..., GroundTruth]) -> GroundTruth:
    return schedule_run(recorded, "1f1b")


# ---- raw trace helpers (independent of every ppdiag parser) ---------------------------------


def load_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def ops(
    doc: dict[str, Any], *, main_only: bool = True, names: tuple[str, ...] | None = None, cat: str = "cpu_op"
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """(start_ns, end_ns, events) of complete events of one category on the trace clock."""
    base = int(doc["baseTimeNanoseconds"])
    evs = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") == cat
        and (not main_only or e.get("tid") == e.get("pid"))
        and (names is None or e.get("name") in names)
    ]
    start = np.array([base + round(float(e["ts"]) * 1000) for e in evs], dtype=np.int64)
    end = start + np.array([round(float(e["dur"]) * 1000) for e in evs], dtype=np.int64)
    return start, end, evs


def top_level(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Outermost intervals (those not nested in an earlier one) of one thread."""
    order = np.lexsort((-end, start))
    s, e = start[order], end[order]
    prev_max = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(e)[:-1]])
    keep = s >= prev_max
    return s[keep], e[keep]


def union_within(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> int:
    """Length of the union of intervals clipped to [lo, hi]."""
    s, e = np.clip(start, lo, hi), np.clip(end, lo, hi)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    prev = np.concatenate([[lo], reach[:-1]])
    return int(np.clip(e - np.maximum(s, prev), 0, None).sum())


def in_windows(start: np.ndarray, end: np.ndarray, truth: GroundTruth, rank: int) -> np.ndarray:
    rt = truth.rank(rank)
    m = np.zeros(start.shape, dtype=bool)
    for lo, hi in zip(rt.step_start, rt.step_end, strict=True):
        m |= (start >= lo) & (end <= hi)
    return m


def expected_stages(schedule: str, pp: int, rank: int) -> list[int]:
    if schedule in ("gpipe", "1f1b"):
        return [rank]
    if schedule in ("zbv", "dualpipev"):
        return [rank, 2 * pp - 1 - rank]
    return [rank, rank + pp]


def held(truth: GroundTruth, rank: int, kinds: tuple[str, ...], stage: int | None = None) -> int:
    rt = truth.rank(rank)
    m = rt.mask(kinds)
    if stage is not None:
        m &= rt.cols["stage"] == stage
    return int(rt.cols["held_ns"][m].sum())


# ---- every schedule -----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SCHEDULE_RUNS))
def test_schedule_run_is_a_real_profiled_pipeline(recorded: Callable[..., GroundTruth], name: str) -> None:
    truth = schedule_run(recorded, name)
    cfg = {**COMMON, **SCHEDULE_RUNS[name]}
    pp, m, steps = cfg["pp"], cfg["microbatches"], cfg["steps"]
    assert truth.schedule == name and truth.pp == pp and truth.microbatches == m
    assert truth.steps == [2, 3]  # after the profiler's wait and warmup steps
    split_bwd = name in ("zero_bubble", "zbv", "dualpipev")
    for r in range(pp):
        rt = truth.rank(r)
        assert rt.stages == expected_stages(name, pp, r)
        doc = load_trace(truth.trace_path(r))
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (r, pp, "gloo")
        ustart, uend, uevs = ops(doc, cat="user_annotation")
        step_evs = sorted(e["name"] for e in uevs if e["name"].startswith("ProfilerStep#"))
        assert step_evs == [f"ProfilerStep#{s}" for s in truth.steps]
        # ground truth and trace share one clock: each ProfilerStep encloses the truth's step (it opens
        # in the profiler's step call just before), up to the ~25 µs the two clocks may differ
        for s, lo, hi in zip(rt.step, rt.step_start, rt.step_end, strict=True):
            i = next(i for i, e in enumerate(uevs) if e["name"] == f"ProfilerStep#{s}")
            assert -CLOCK_SLACK_NS <= int(lo) - int(ustart[i]) < 100 * MS
            assert int(uend[i]) >= int(hi) - CLOCK_SLACK_NS
        # every micro-batch of every stage ran once forward and once backward (or as I + W) per step
        for step in truth.steps:
            for stage in rt.stages:
                for mb in range(m):
                    sel = (rt.cols["step"] == step) & (rt.cols["stage"] == stage) & (rt.cols["mb"] == mb)
                    kinds = sorted(rt.cols["kind"][sel & rt.mask(("fwd", "bwd", "bwd_input", "wgrad"))])
                    assert kinds in (["bwd", "fwd"], ["bwd_input", "fwd", "wgrad"]), (step, stage, mb, kinds)
                    if not split_bwd:
                        assert kinds == ["bwd", "fwd"]
        # runtime schedules label their actions PP:<stage><action><mb>: the stages match the truth
        labels = {e["name"] for e in uevs if e["name"].startswith("PP:")}
        if name not in ("gpipe", "1f1b"):
            label_stages = {
                int(lb[3:].split("F")[0])
                for lb in labels
                if lb[3:].split("F")[0].isdigit() and lb[3:].split("F")[1].isdigit()
            }
            assert label_stages == set(rt.stages)
        # the sleep op held what the config asked: steps x M x (F + B) per stage
        nominal = steps * m * sum(cfg["fwd_ms"] + cfg["bwd_ms"] for _ in rt.stages) * MS
        got = held(truth, r, ("fwd", "bwd", "bwd_input", "wgrad"))
        # (a sleep only ends late, and later holds give the overrun back: never less than asked; how
        # much more depends on the machine's load, so the bound above is what the run measured: the
        # holds lie inside the compute blocks)
        assert nominal * 0.999 <= got <= rt.compute_ns()
        # raw trace: one sleep op per block and pass (forward x and w paths, their two backwards) ...
        hs, he, _ = ops(doc, names=HOLD_OPS)
        inside = in_windows(hs, he, truth, r)
        n_ops = int(inside.sum())
        assert n_ops == steps * m * len(rt.stages) * 2 * 2 * cfg.get("layers_per_stage", 2)
        # ... each running inside one of the truth's compute blocks
        blocks = rt.mask(("fwd", "bwd", "bwd_input", "wgrad"))
        b_start, b_end = rt.cols["start_ns"][blocks], rt.cols["end_ns"][blocks]
        order = np.argsort(b_start)
        b_start, b_end = b_start[order], b_end[order]
        b_held = rt.cols["held_ns"][blocks][order]
        k = np.searchsorted(b_start, hs[inside] + CLOCK_SLACK_NS, side="right") - 1
        assert np.all(k >= 0)
        assert np.all(he[inside] <= b_end[k] + CLOCK_SLACK_NS)
        # ... whose durations add up to what the truth held: never less, and per block no more than
        # a small call overhead per op (a median: a busy host may preempt any single call)
        dur = (he - hs)[inside]
        assert int(dur.sum()) >= got - n_ops * 2_000
        op_sum_per_block = np.bincount(k, weights=dur, minlength=len(b_start))
        ops_per_block = np.bincount(k, minlength=len(b_start))
        overhead = (op_sum_per_block - b_held) / np.maximum(ops_per_block, 1)
        # the bound scales with what the ops hold: a preempted call on a busy host overruns more,
        # while an op that swallowed a wait (ms) would still stand far above it
        per_op_hold = b_held / np.maximum(ops_per_block, 1)
        assert np.median(overhead) < max(OP_OVERHEAD_NS, 0.25 * float(np.median(per_op_hold)))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"])
def test_parsed_compute_matches_ground_truth(recorded: Callable[..., GroundTruth], name: str) -> None:
    parsers = pytest.importorskip("ppdiag.parsers")
    timeline = pytest.importorskip("ppdiag.model.timeline")
    parsers.load_builtin()
    if "kineto" not in parsers.PARSERS:
        pytest.skip("the Kineto parser is not available yet")
    truth = schedule_run(recorded, name)
    for r in range(truth.pp):
        rt = truth.rank(r)
        (tl,) = parsers.PARSERS["kineto"].parse(truth.trace_path(r), parsers.ParseOptions())
        assert tl.rank == r
        iv = tl.intervals
        comp = iv.kind == int(timeline.Kind.COMPUTE)
        s = iv.start[comp] + tl.clock_offset_ns
        e = iv.end[comp] + tl.clock_offset_ns
        parsed = sum(
            union_within(s, e, int(lo), int(hi)) for lo, hi in zip(rt.step_start, rt.step_end, strict=True)
        )
        # The truth's blocks are wall time around the ops, Python's glue between them included; that
        # glue grows with the host's load and is no op. So the parsed compute must hold at least what
        # the sleep ops held, and may exceed the blocks only by ops outside them (loss, optimizer):
        # at most what the trace's outermost main-thread ops cover in the steps, read without ppdiag
        # (a loaded host stretches those ops as well, so no fixed share of the blocks bounds them)
        held_ns = int(rt.cols["held_ns"][rt.mask(("fwd", "bwd", "bwd_input", "wgrad"))].sum())
        raw_s, raw_e = top_level(*ops(load_trace(truth.trace_path(r)))[:2])
        outer = sum(
            union_within(raw_s, raw_e, int(lo), int(hi))
            for lo, hi in zip(rt.step_start, rt.step_end, strict=True)
        )
        assert held_ns * 0.999 <= parsed <= max(outer, rt.compute_ns()) * 1.001, (r, parsed, outer)


def test_raw_trace_compute_matches_ground_truth(recorded: Callable[..., GroundTruth]) -> None:
    # The same check without any ppdiag parser: outermost main-thread ops vs the truth's blocks.
    for name in ("1f1b", "zero_bubble"):
        truth = schedule_run(recorded, name)
        for r in range(truth.pp):
            rt = truth.rank(r)
            s, e = top_level(*ops(load_trace(truth.trace_path(r)))[:2])
            covered = 0
            for kind in ("fwd", "bwd", "bwd_input", "wgrad"):
                m = rt.mask(kind)
                for lo, hi in zip(rt.cols["start_ns"][m], rt.cols["end_ns"][m], strict=True):
                    covered += union_within(s, e, int(lo), int(hi))
            # (never less than the sleep ops held; never more than the blocks: see above)
            held_ns = int(rt.cols["held_ns"][rt.mask(("fwd", "bwd", "bwd_input", "wgrad"))].sum())
            assert held_ns * 0.999 <= covered <= rt.compute_ns()


def test_zero_bubble_splits_backward_into_input_and_weight_blocks(
    recorded: Callable[..., GroundTruth],
) -> None:
    truth = schedule_run(recorded, "zero_bubble")
    steps, m = len(truth.steps), truth.microbatches
    cfg = truth.header["config"]  # the recorded run's (recorded again with larger costs on a busy host)
    # what the config asks of one stage's backward; a sleep never ends early, so the holds measured
    # at least that, and how much more is the machine's load: the bounds below are what this run
    # measured (the blocks' held time, the trace's own hold ops), never the nominal cost plus a margin
    asked = cfg["bwd_ms"] * MS * steps * m
    for r in range(truth.pp):
        rt = truth.rank(r)
        hs, he, _ = ops(load_trace(truth.trace_path(r)), names=HOLD_OPS)
        # (late wake-ups are given back across the rank's stages: the floor holds per rank)
        assert held(truth, r, ("bwd_input", "wgrad")) >= 0.999 * asked * len(rt.stages)
        for stage in rt.stages:
            i_ns = held(truth, r, ("bwd_input",), stage)
            w_ns = held(truth, r, ("wgrad",), stage)
            if stage == 0:
                # the first stage has no input gradient to send: torch runs its backward in W
                assert i_ns < 0.1 * w_ns
            else:
                # each half carries its own path's hold: neither holds more than three times the
                # other (a broken split puts all of it on one side; equal costs on a quiet host)
                assert min(i_ns, w_ns) >= 0.25 * (i_ns + w_ns), (r, stage, i_ns, w_ns)
            # the profiler saw the same holds inside those blocks as the recorder logged
            for kind, got in (("bwd_input", i_ns), ("wgrad", w_ns)):
                sel = rt.mask(kind) & (rt.cols["stage"] == stage)
                inside = np.zeros(hs.shape, dtype=bool)
                for lo, hi in zip(rt.cols["start_ns"][sel], rt.cols["end_ns"][sel], strict=True):
                    inside |= (hs >= lo - CLOCK_SLACK_NS) & (he <= hi + CLOCK_SLACK_NS)
                traced = int((he - hs)[inside].sum())
                assert got - int(inside.sum()) * 2_000 <= traced, (r, stage, kind, traced, got)
                assert traced <= int((rt.cols["end_ns"][sel] - rt.cols["start_ns"][sel]).sum()), (r, stage)
    # W blocks of a micro-batch always follow its I block
    rt = truth.rank(1)
    for step in truth.steps:
        for mb in range(m):
            sel = (rt.cols["step"] == step) & (rt.cols["stage"] == 1) & (rt.cols["mb"] == mb)
            i_end = rt.cols["end_ns"][sel & rt.mask("bwd_input")][0]
            w_start = rt.cols["start_ns"][sel & rt.mask("wgrad")][0]
            assert w_start >= i_end


# ---- faults -------------------------------------------------------------------------------


def test_slow_stage_computes_factor_times_longer(recorded: Callable[..., GroundTruth]) -> None:
    factor, slow = 2.0, 2
    truth = recorded(
        "slow_stage", **COMMON, schedule="1f1b", microbatches=8, slow_stage=slow, slow_factor=factor
    )
    assert truth.faults == [{"kind": "slow_stage", "stage": slow, "rank": slow, "factor": factor}]
    steps, m, cfg = len(truth.steps), truth.microbatches, truth.header["config"]
    asked = (cfg["fwd_ms"] + cfg["bwd_ms"]) * MS * steps * m  # one fault-free stage
    per_rank_held = {r: held(truth, r, ("fwd", "bwd")) for r in range(truth.pp)}
    per_rank_blocks = {r: truth.rank(r).compute_ns() for r in range(truth.pp)}
    per_rank_trace = {}
    for r in range(truth.pp):
        hs, he, _ = ops(load_trace(truth.trace_path(r)), names=HOLD_OPS)
        per_rank_trace[r] = int((he - hs)[in_windows(hs, he, truth, r)].sum())
    # a sleep never ends early: every rank held at least what it was asked, the slow one factor x
    for r, got in per_rank_held.items():
        assert got >= 0.999 * asked * (factor if r == slow else 1.0), (r, got)
    # how much more than asked is the load, the same on every rank: the slow rank stands above every
    # other rank by most of the extra it was asked in each measure (the held time, the blocks with
    # their Python glue, the trace's own hold ops), whatever the load added to all of them
    n_ops = steps * m * 2 * 2 * 2  # forward and backward of the x and w paths of 2 layers
    for measure in (per_rank_held, per_rank_blocks, per_rank_trace):
        assert all(measure[r] >= per_rank_held[r] - n_ops * 2_000 for r in measure), measure
        others = [v for r, v in measure.items() if r != slow]
        assert measure[slow] - max(others) >= 0.5 * (factor - 1) * asked, (measure, asked)
    # the slow stage sets the pace of this run: no rank's step is shorter than the slow rank's
    # held compute per step, and the other ranks wait for it a good part of each step
    slow_per_step = per_rank_held[slow] / steps
    for r in range(truth.pp):
        rt = truth.rank(r)
        step_ns = rt.step_end - rt.step_start
        assert float(np.mean(step_ns)) >= 0.999 * slow_per_step, r
        if r != slow:
            assert per_rank_held[r] / steps < 0.8 * float(np.mean(step_ns)), r


def _sends_and_recv_waits(truth: GroundTruth, src: int, dst: int) -> tuple[np.ndarray, ...]:
    """Sends src→dst (request, post) and dst's waits on the matching recvs from src.

    A transfer is identified by (step, payload, micro-batch): one stage per rank sends one
    activation and one gradient per micro-batch.
    """
    s, d = truth.rank(src), truth.rank(dst)
    ms = s.mask("send") & (s.cols["peer"] == dst)
    md = d.mask("wait") & (d.cols["peer"] == src) & (d.cols["direction"] == "recv")

    def keyed(rt: Any, m: np.ndarray) -> dict[tuple[int, str, int], int]:
        rows = np.flatnonzero(m)
        c = rt.cols
        return {(int(c["step"][i]), str(c["payload"][i]), int(c["mb"][i])): int(i) for i in rows}

    sk, dk = keyed(s, ms), keyed(d, md)
    assert len(sk) == int(ms.sum()) and len(dk) == int(md.sum())  # keys are unique
    assert sk.keys() == dk.keys() and sk
    si = np.array([sk[k] for k in sorted(sk)])
    di = np.array([dk[k] for k in sorted(sk)])
    return (s.cols["start_ns"][si], s.cols["end_ns"][si], d.cols["start_ns"][di], d.cols["end_ns"][di])


def test_slow_link_delays_the_ranks_sends_by_the_injected_time(recorded: Callable[..., GroundTruth]) -> None:
    delay, slow = 10.0, 1
    base = baseline(recorded)
    # how long the load alone held the slow rank's sends in the fault-free run
    base_load = 0.0
    for peer in (0, 2):
        b_req, b_post, _, _ = _sends_and_recv_waits(base, slow, peer)
        base_load = max(base_load, float(np.median(b_post - b_req)))
    truth = recorded(
        "comm_delay",
        delay_support(base_load),
        **COMMON,
        schedule="1f1b",
        microbatches=8,
        comm_delay_ms=delay,
        comm_delay_rank=slow,
        record_shapes=True,  # the peers below are read from the ops' Concrete Inputs
    )
    d_ns = delay * MS
    holds: list[float] = []
    assert truth.faults[0]["peers"] == [0, 2]
    for peer in (0, 2):
        req, post, wstart, wend = _sends_and_recv_waits(truth, slow, peer)
        # each send left the slow rank D after the schedule issued it ...
        # (a sleep never ends early; how late it ends is the load's, so the hold used below is the
        # one these sends measured, not the nominal delay)
        assert np.all(post - req >= 0.98 * d_ns)
        holds.append(float(np.median(post - req)))
        # ... and no data arrived before it left
        assert np.all(wend >= post - 0.1 * MS)
        waiting = wstart <= req  # the receiver was already waiting when the send was issued
        assert waiting.any()
        # most of the waiting receiver's wait after the send was issued is the sender's hold, not
        # the transfer after it (how soon a receiver wakes up on a loaded host is the load's)
        assert np.median((wend - post)[waiting]) < np.median((post - req)[waiting])
        # the receivers wait longer per message than in the fault-free run by most of the hold the
        # sends measured (not all of it: where 1F1B gives a receiver other work first, part of the
        # hold passes before it waits, and a loaded host lengthens the baseline's waits too)
        b_req, b_post, b_wstart, b_wend = _sends_and_recv_waits(base, slow, peer)
        hold = float(np.median(post - req))
        more = float(np.median(wend - wstart) - np.median(b_wend - b_wstart))
        assert 0.5 * hold <= more <= 1.3 * hold, (more, hold)
        # in the fault-free run the same sends are held by no delay: only by the load, which the
        # recording's support check kept under a quarter of the hold (how soon the receiver then
        # wakes up is the load's too, so no bound on the baseline's waits in ms)
        assert np.median(b_post - b_req) < 0.5 * hold
    # links not touching the slow rank keep their speed (held by the load alone, see above)
    req, post, wstart, wend = _sends_and_recv_waits(truth, 3, 2)
    assert np.median(post - req) < 0.5 * min(holds)
    # (a loaded 2-core host can deschedule a sender for a few ms now and then: most sends, not
    # every one, leave at once, while every send of the slow rank is held >= 0.98 D above)
    assert np.mean(post - req < 0.5 * min(holds)) >= 0.75
    # the slow rank's trace shows every send it made, with its peer, as torch records a gloo send
    doc = load_trace(truth.trace_path(slow))
    _check_sends_recorded_as_torch_does(doc, truth, slow)


def _check_sends_recorded_as_torch_does(doc: dict[str, Any], truth: GroundTruth, slow: int) -> None:
    """Each send of the delayed rank is a ``c10d::send`` CPU op on the main thread at its issue,
    with its peer, opening a ``gloo:send`` span that ends when the wait on the send returns (the
    tail that covers a main thread blocked on its slow send); no other thread has an event, and no
    annotation carries an op's name."""
    cs, ce, cevs = ops(doc, names=("c10d::send",))
    rt = truth.rank(slow)
    sends = rt.mask("send")
    inside = in_windows(cs, ce, truth, slow)
    assert int(inside.sum()) == int(sends.sum())
    if truth.header["config"]["record_shapes"]:  # the peers are op inputs
        peers = sorted(int(e["args"]["Concrete Inputs"][2]) for e, ok in zip(cevs, inside, strict=True) if ok)
        assert peers == sorted(int(p) for p in rt.cols["peer"][sends])
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("pid"), int)]
    assert all(e["tid"] == e["pid"] for e in timed)
    assert not ops(doc, names=("c10d::send",), cat="user_annotation")[2]
    gs, ge, _ = ops(doc, names=("gloo:send",), cat="user_annotation")
    order = np.argsort(cs)
    cs, ce = cs[order], ce[order]
    k = np.searchsorted(cs, gs, side="right") - 1
    assert np.all(k >= 0) and np.all(gs <= ce[k])
    ge = np.sort(ge)
    w = rt.mask("wait") & (rt.cols["direction"] == "send")
    ws, we = rt.cols["start_ns"][w], rt.cols["end_ns"][w]
    j = np.minimum(np.searchsorted(ge, ws - CLOCK_SLACK_NS), len(ge) - 1)
    assert np.all(ge[j] >= ws - CLOCK_SLACK_NS) and np.all(ge[j] <= we + CLOCK_SLACK_NS)


def test_a_synchronous_slow_link_blocks_each_send_call(recorded: Callable[..., GroundTruth]) -> None:
    delay, slow = 10.0, 1
    truth = recorded(
        "comm_delay_sync",
        delay_support(0.0),
        **COMMON,
        schedule="1f1b",
        microbatches=8,
        comm_delay_ms=delay,
        comm_delay_rank=slow,
        comm_delay_sync=True,
    )
    assert truth.faults[0]["sync"] is True
    rt = truth.rank(slow)
    sends = rt.mask("send")
    # what the run measured: each send of the slow rank left D or more after its request
    hold = rt.cols["end_ns"][sends] - rt.cols["start_ns"][sends]
    assert np.all(hold >= 0.98 * delay * MS)
    doc = load_trace(truth.trace_path(slow))
    _check_sends_recorded_as_torch_does(doc, truth, slow)
    # the send call itself held the main thread: the slow rank's c10d::send ops last the hold
    # (a sleep never ends early), the other ranks' a small part of it
    cs, ce, _ = ops(doc, names=("c10d::send",))
    inside = in_windows(cs, ce, truth, slow)
    assert np.all((ce - cs)[inside] >= 0.98 * delay * MS)
    for r in range(truth.pp):
        if r != slow:
            os_, oe, _ = ops(load_trace(truth.trace_path(r)), names=("c10d::send",))
            assert float(np.median(oe - os_)) < 0.25 * float(np.median(hold)), r


def test_host_stall_leaves_op_free_gaps_before_each_forward(recorded: Callable[..., GroundTruth]) -> None:
    stall_ms, who = 6.0, 2
    truth = recorded(
        "host_stall", **COMMON, schedule="1f1b", microbatches=8, host_stall_ms=stall_ms, host_stall_rank=who
    )
    rt = truth.rank(who)
    stalls = rt.mask("stall")
    assert int(stalls.sum()) == len(truth.steps) * truth.microbatches * len(rt.stages)
    for r in range(truth.pp):
        if r != who:
            assert not truth.rank(r).mask("stall").any()
    st, en = rt.cols["start_ns"][stalls], rt.cols["end_ns"][stalls]
    assert np.all(en - st >= stall_ms * MS)  # a sleep never ends early (how late is the load's)
    # each stall sits right before its micro-batch's forward
    fwd = rt.mask("fwd")
    for e_, step, mb in zip(en, rt.cols["step"][stalls], rt.cols["mb"][stalls], strict=True):
        sel = fwd & (rt.cols["step"] == step) & (rt.cols["mb"] == mb)
        f_start = int(rt.cols["start_ns"][sel][0])
        # nothing the rank logged lies between them (the glue is Python's, as long as the load makes it)
        assert f_start >= e_
        assert not np.any((rt.cols["start_ns"] > e_) & (rt.cols["start_ns"] < f_start)), (step, mb)
    # raw trace: no operator runs on the stalled rank's main thread during a stall ...
    os_, oe, _ = ops(load_trace(truth.trace_path(who)))
    margin = 100_000
    for s_, e_ in zip(st, en, strict=True):
        assert not np.any((os_ < e_ - margin) & (oe > s_ + margin))
    # ... so the op-free gap before each forward's first op is at least the stall
    ts, te = top_level(os_, oe)
    for s_, e_ in zip(st, en, strict=True):
        before = te[te <= s_ + margin]
        after = ts[ts >= e_ - margin]
        assert after.min() - before.max() >= stall_ms * MS * 0.98


# ---- real compute, progress, failures -------------------------------------------------------


def test_real_compute_run_has_the_pipeline_structure(recorded: Callable[..., GroundTruth]) -> None:
    truth = recorded("real", pp=2, schedule="1f1b", microbatches=4, steps=2, compute="real", hidden=128)
    assert truth.header["compute"] == "real" and truth.header["stage_costs_ms"] is None
    for r in range(2):
        rt = truth.rank(r)
        doc = load_trace(truth.trace_path(r))
        assert doc["distributedInfo"]["rank"] == r
        names = {e["name"] for e in ops(doc)[2]}
        assert {"aten::addmm", "aten::gelu", "aten::layer_norm"} <= names
        assert not names & set(HOLD_OPS)
        assert int(rt.cols["held_ns"].sum()) == 0
        for kind in ("fwd", "bwd"):
            assert int(rt.mask(kind).sum()) == 2 * 4
        annotations = [e["name"] for e in ops(doc, cat="user_annotation")[2]]
        assert sum(a.startswith("ProfilerStep#") for a in annotations) == 2


def test_progress_is_reported_until_done(tmp_path: Path) -> None:
    seen: list[tuple[str, float]] = []
    record(
        DemoConfig(pp=2, schedule="gpipe", microbatches=2, steps=1, fwd_ms=1, bwd_ms=2),
        tmp_path,
        progress=lambda msg, frac: seen.append((msg, frac)),
    )
    fracs = [f for _, f in seen]
    assert fracs == sorted(fracs) and fracs[0] == 0.0 and fracs[-1] == 1.0
    assert sum("steps done" in msg for msg, _ in seen) == 2 * 3  # every rank, every iteration
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "groundtruth.json",
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
    ]


def _processes_with(token: str) -> list[int]:
    """Live processes (zombies have no environment) whose environment carries ``token``."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
        except OSError:
            continue
        if token.encode() in env:
            found.append(int(d))
    return found


def _assert_no_process_left(token: str) -> None:
    deadline = time.monotonic() + 5
    while (left := _processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    """A marker in the environment of every process a test's recording starts."""
    if not Path("/proc/self/environ").exists():
        pytest.skip("needs /proc to look for leftover processes")
    tok = f"ppdiag-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("PPDIAG_DEMO_TEST_TOKEN", tok)
    return tok


def test_a_failing_rank_ends_the_run_with_one_line_naming_it(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PPDIAG_DEMO_FAIL", "2:1")
    t0 = time.monotonic()
    with pytest.raises(DemoError) as ei:
        record(DemoConfig(pp=4, microbatches=4, steps=1, timeout_s=600), tmp_path)
    msg = str(ei.value)
    # the rank's own error, not the run's timeout (which says "timed out")
    assert msg == "demo run failed on rank 2: RuntimeError: injected failure at step 1 (PPDIAG_DEMO_FAIL)"
    assert ei.value.rank == 2
    # nor gloo's (30 min): the peers blocked on rank 2 did not hold the run up. The bound leaves a
    # loaded host its start-up of four torch processes (about 45 s at a load of 15 on 2 cores)
    assert time.monotonic() - t0 < 300
    _assert_no_process_left(token)
    assert (tmp_path / "demo-failure.log").exists()
    assert not (tmp_path / "groundtruth.json").exists()


def test_a_hung_rank_is_stopped_by_the_timeout(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PPDIAG_DEMO_HANG", "1:2")
    t0 = time.monotonic()
    with pytest.raises(DemoError) as ei:
        record(DemoConfig(pp=4, microbatches=4, steps=1, timeout_s=8), tmp_path)
    assert time.monotonic() - t0 < 8 + 5
    assert str(ei.value).startswith("demo run timed out after 8 s")
    assert "\n" not in str(ei.value)
    _assert_no_process_left(token)


def test_a_tiny_timeout_stops_the_run_during_start_up(tmp_path: Path, token: str) -> None:
    with pytest.raises(DemoError, match=r"timed out after 0.2 s"):
        record(DemoConfig(timeout_s=0.2), tmp_path)
    _assert_no_process_left(token)
