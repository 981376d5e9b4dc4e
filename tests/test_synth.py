"""Synthetic GPU pipeline runs: ground truth that adds up, traces that match it, valid Kineto JSON."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppdiag.model import Direction, Kind
from ppsynth import SynthRun
from ppsynth.faults import (
    CommOnCompute,
    ExposedAllReduce,
    Fault,
    HostStall,
    SlowLink,
    SlowStage,
    SlowStep,
)
from ppsynth.kineto import write_kineto
from ppsynth.scenario import TRUTH_CAUSES, make_scenario

SCENARIOS: dict[str, dict[str, Any]] = {
    "base": {},
    "slow_stage": {"faults": [SlowStage(2, 1.5)]},
    "slow_link": {"faults": [SlowLink(1, delay_ms=0.4)]},
    "host_stall": {"faults": [HostStall(1, 0.5)]},
    "comm_on_compute": {"faults": [CommOnCompute()]},
    "dp2": {"dp": 2},
    "exposed_ar": {"dp": 2, "faults": [ExposedAllReduce(2.0)]},
    "slow_step": {"faults": [SlowStep(1, 3.0)]},
    "combo": {
        "faults": [SlowStage(1, 1.3), HostStall(2, 0.3), SlowLink(0, delay_ms=0.2)],
        "pp": 5,
        "microbatches": 10,
    },
    "interleaved": {
        "schedule": "interleaved_1f1b",
        "virtual": 2,
        "fwd_ms": 0.5,
        "bwd_ms": 1.0,
        "faults": [HostStall(3, 0.2)],
    },
    "zero_bubble": {"schedule": "zero_bubble", "bwd_ms": 1.0, "wgrad_ms": 1.0, "faults": [SlowStage(3, 1.4)]},
    "zbv": {
        "schedule": "zbv",
        "virtual": 2,
        "fwd_ms": 0.5,
        "bwd_ms": 0.5,
        "wgrad_ms": 0.5,
        "faults": [SlowLink(2, delay_ms=0.3)],
    },
    "dualpipev": {
        "schedule": "dualpipev",
        "virtual": 2,
        "fwd_ms": 0.5,
        "bwd_ms": 0.5,
        "wgrad_ms": 0.5,
        "faults": [CommOnCompute((1,))],
    },
    "gpipe_labels": {"schedule": "gpipe", "annotations": "pp", "faults": [HostStall(0, 0.3)]},
}


@cache
def scenario(name: str) -> SynthRun:
    return make_scenario(**SCENARIOS[name])


@cache
def written(name: str, root: str) -> list[Path]:
    return write_kineto(scenario(name), Path(root) / name)


@pytest.fixture(scope="module")
def outdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("synth"))


def _union(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of intervals (independent of the generator's own bookkeeping)."""
    if len(start) == 0:
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    total, cur_s, cur_e = 0, int(s[0]), int(e[0])
    for a, b in zip(s[1:], e[1:], strict=True):
        if a > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = int(a), int(b)
        else:
            cur_e = max(cur_e, int(b))
    return total + cur_e - cur_s


# ------------------------------------------------------------------------------------------ truth


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_truth_adds_up_and_matches_the_trace(name: str) -> None:
    run = scenario(name)
    truth = run.truth
    n_blocks = 3 * run.microbatches * run.virtual
    tol_ms = n_blocks * 1e-3  # 1 µs per block
    for rk in run.ranks:
        t = truth["ranks"][str(rk.rank)]
        comp = rk.gpu.kind == int(Kind.COMPUTE)
        for k, st in enumerate(t["steps"]):
            causes = st["causes_ms"]
            assert set(causes) == set(TRUTH_CAUSES)
            assert all(v >= -1e-9 for v in causes.values()), causes
            assert sum(causes.values()) == pytest.approx(st["lost_ms"], abs=tol_ms)
            assert st["lost_ms"] == pytest.approx(st["window_ms"] - st["compute_ms"], abs=1e-9)
            # the compute kernels written into the trace give the same compute (minus the
            # intra-block kernel gaps the truth reports separately)
            w0, w1 = (int(x) for x in rk.step_windows[k])
            assert (w1 - w0) / 1e6 == pytest.approx(st["window_ms"])
            sel = comp & (rk.gpu.step == k)
            assert np.all(rk.gpu.start[sel] >= w0) and np.all(rk.gpu.end[sel] <= w1)
            union_ms = _union(rk.gpu.start[sel], rk.gpu.end[sel]) / 1e6
            assert union_ms == pytest.approx(st["compute_ms"] - st["kernel_gaps_ms"], abs=1e-6)
            assert 0 <= st["kernel_gaps_ms"] < 0.02 * st["window_ms"]
        # a stream runs one kernel at a time
        for sid in np.unique(rk.gpu.stream):
            sel = np.flatnonzero(rk.gpu.stream == sid)
            o = sel[np.argsort(rk.gpu.start[sel], kind="stable")]
            assert np.all(rk.gpu.start[o[1:]] >= rk.gpu.end[o[:-1]]), (rk.rank, int(sid))


def test_bubble_truth_is_the_textbook_bubble() -> None:
    run = scenario("base")
    t = run.truth
    # P=4, M=8, F=1, B=2 ms: every rank's schedule wait is (P-1)(F+B) = 9 ms with free links;
    # the bubble also holds the normal p2p latency (0.05 ms) of the transfers that fill and drain
    # the pipe (docs/json.md, "Time accounting"): at most one latency per forward and backward of
    # each micro-batch
    for rk in t["ranks"].values():
        assert 9.0 < rk["causes_ms"]["bubble"] <= 9.0 + 2 * 8 * 0.05 + 1e-9
        assert rk["causes_ms"]["imbalance"] == pytest.approx(0.0)
        assert rk["causes_ms"]["comm_wait"] == pytest.approx(0.0)
        assert rk["causes_ms"]["exposed_comm"] > 0  # the step-end all-reduce
    assert t["bubble"]["theoretical_ratio"] == pytest.approx(3 / 11)
    # the simulated step also holds the 1 ms optimizer: 9 ms idle in 8*3 + 9 + 1 ms with free
    # links, up to 0.8 ms more of normal latency in both
    assert 9 / 34 < t["bubble"]["balanced_sim_ratio"] <= 9.8 / 34.8 + 1e-9


def test_slow_stage_truth() -> None:
    run = scenario("slow_stage")
    ranks = run.truth["ranks"]
    slow = run.stage_to_rank[2]
    assert ranks[str(slow)]["causes_ms"]["imbalance"] == pytest.approx(0.0, abs=1e-9)
    for r, t in ranks.items():
        if int(r) != slow:
            assert t["causes_ms"]["imbalance"] > 1.0
    # the slow stage sets the clock: 8 micro-batches of (1.5 + 3) ms on its rank
    assert ranks[str(slow)]["compute_ms"] == pytest.approx(8 * 4.5 + 1.0)  # + optimizer
    assert run.truth["blame"]["imbalance"] == [slow]


def test_host_stall_truth_lands_on_the_stalled_rank_and_propagates() -> None:
    base, run = scenario("base").truth["ranks"], scenario("host_stall").truth["ranks"]
    extra = {int(r): run[r]["causes_ms"]["host"] - base[r]["causes_ms"]["host"] for r in run}
    assert max(extra, key=lambda r: extra[r]) == 1 or extra[1] == pytest.approx(max(extra.values()))
    assert extra[1] > 2.0
    for r in (0, 2, 3):  # neighbours wait because rank 1 was late: that wait is host too
        assert extra[r] > 1.0
    for r in run:
        assert run[r]["causes_ms"]["comm_wait"] == 0
        assert run[r]["causes_ms"]["imbalance"] == 0
    assert scenario("host_stall").truth["blame"]["host"] == [1]


def test_host_stall_is_visible_in_the_trace() -> None:
    run = scenario("host_stall")
    rk = run.ranks[1]
    g = rk.gpu
    sel = np.flatnonzero(g.kind == int(Kind.COMPUTE))
    order = sel[np.argsort(g.start[sel])]
    # launched after the GPU went idle: the launch of a kernel is later than the previous kernel's end
    late = int(np.sum(g.launch[order[1:]] > g.end[order[:-1]]))
    assert late >= run.microbatches
    other = run.ranks[2].gpu
    sel2 = np.flatnonzero(other.kind == int(Kind.COMPUTE))
    o2 = sel2[np.argsort(other.start[sel2])]
    assert int(np.sum(other.launch[o2[1:]] > other.end[o2[:-1]])) < late


def test_slow_link_truth() -> None:
    base, run = scenario("base").truth["ranks"], scenario("slow_link").truth["ranks"]
    for r in run:
        for c in ("bubble", "imbalance"):
            assert run[r]["causes_ms"][c] == pytest.approx(base[r]["causes_ms"][c])
        assert run[r]["causes_ms"]["comm_wait"] > 0.4

    # rank 1's transfers take 0.05 + 0.4 ms: from the start of rank 1's send kernel to the end of
    # rank 2's matching receive there is at least that, while other links keep 0.05 ms
    def min_transfer(name: str, src: int, dst: int) -> float:
        run = scenario(name)
        gs, gr = run.ranks[src].gpu, run.ranks[dst].gpu
        snd = (gs.kind == int(Kind.P2P)) & (gs.peer == dst) & (gs.direction == int(Direction.SEND))
        rcv = (gr.kind == int(Kind.P2P)) & (gr.peer == src) & (gr.direction == int(Direction.RECV))
        s0 = np.sort(gs.start[snd])
        r1 = np.sort(gr.end[rcv])
        assert len(s0) == len(r1) > 0
        return float((r1 - s0).min()) / 1e6

    assert min_transfer("slow_link", 1, 2) == pytest.approx(0.45, abs=1e-6)
    assert min_transfer("slow_link", 1, 0) == pytest.approx(0.45, abs=1e-6)
    assert min_transfer("slow_link", 2, 1) == pytest.approx(0.05, abs=1e-6)
    assert min_transfer("base", 1, 2) == pytest.approx(0.05, abs=1e-6)


def test_exposed_allreduce_truth() -> None:
    base, run = scenario("dp2").truth["ranks"], scenario("exposed_ar").truth["ranks"]
    assert len(run) == 8
    for r in run:
        d = run[r]["causes_ms"]["exposed_comm"] - base[r]["causes_ms"]["exposed_comm"]
        assert d == pytest.approx(2.0, abs=1e-6)
    rk = scenario("exposed_ar").ranks[3]
    dp_pg = rk.process_groups[rk.dp_group]
    assert dp_pg.desc == "DATA_PARALLEL_GROUP" and dp_pg.ranks == [2, 3]
    coll = (rk.gpu.kind == int(Kind.COLLECTIVE)) & (rk.gpu.group == rk.dp_group)
    durs = (rk.gpu.end - rk.gpu.start)[coll]
    assert len(durs) == run["3"]["steps"].__len__()
    assert np.all(durs >= 2_000_000)


def test_comm_on_compute_truth_and_trace() -> None:
    base, run = scenario("base").truth["ranks"], scenario("comm_on_compute").truth["ranks"]
    for r in run:
        assert run[r]["causes_ms"]["exposed_comm"] > base[r]["causes_ms"]["exposed_comm"]
        assert run[r]["causes_ms"]["bubble"] == pytest.approx(base[r]["causes_ms"]["bubble"])
    rk = scenario("comm_on_compute").ranks[1]
    p2p = rk.gpu.kind == int(Kind.P2P)
    assert p2p.sum() > 0 and np.all(rk.gpu.stream[p2p] == rk.compute_stream)


def test_slow_step_truth() -> None:
    base, run = scenario("base").truth, scenario("slow_step").truth
    assert run["step_ms"][1] - base["step_ms"][1] == pytest.approx(3.0, abs=0.05)
    assert run["step_ms"][0] == pytest.approx(base["step_ms"][0])
    for r in run["ranks"]:
        s0, s1 = run["ranks"][r]["steps"][0], run["ranks"][r]["steps"][1]
        b1 = base["ranks"][r]["steps"][1]
        assert s1["causes_ms"]["host"] - b1["causes_ms"]["host"] == pytest.approx(3.0, abs=0.05)
        assert s0["causes_ms"] == base["ranks"][r]["steps"][0]["causes_ms"]


# ------------------------------------------------------------------------------------ kineto json


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def _abs_ns(doc: dict[str, Any], ts: float | str) -> int:
    return int(doc["baseTimeNanoseconds"]) + round(float(ts) * 1000)


@pytest.mark.parametrize("name", ["combo", "interleaved", "exposed_ar", "zbv", "gpipe_labels"])
def test_kineto_structure(name: str, outdir: str) -> None:
    run = scenario(name)
    paths = written(name, outdir)
    assert len(paths) == run.world_size
    assert (paths[0].parent / "groundtruth.json").exists()
    seen_ranks = set()
    for path in paths:
        doc = _load(path)
        assert doc["schemaVersion"] == 1 and isinstance(doc["baseTimeNanoseconds"], int)
        assert doc["displayTimeUnit"] == "ms" and doc["deviceProperties"]
        di = doc["distributedInfo"]
        rank = di["rank"]
        seen_ranks.add(rank)
        assert di["world_size"] == run.world_size and di["backend"] == "nccl"
        pgs = {pg["pg_desc"]: pg for pg in di["pg_config"]}
        assert pgs["default_pg"]["ranks"] == list(range(run.world_size))
        pp_group = next(g for g in run.truth["pp_groups"] if rank in g)
        assert pgs["PIPELINE_MODEL_PARALLEL_GROUP"]["ranks"] == pp_group
        assert di["pg_count"] == len(di["pg_config"])
        ev = doc["traceEvents"]
        runtime = {
            e["args"]["correlation"]: e
            for e in ev
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"
        }
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        assert kernels
        cpu_pid = next(e["pid"] for e in ev if e.get("name") == "ProfilerStep#5")
        for kern in kernels:
            launch = runtime[kern["args"]["correlation"]]  # every kernel has its launch
            assert float(launch["ts"]) <= float(kern["ts"])
            assert kern["pid"] == kern["args"]["device"] != cpu_pid
            assert kern["tid"] == kern["args"]["stream"]
            if kern["name"].startswith("ncclDevKernel"):
                a = kern["args"]
                assert a["Collective name"] in ("send", "recv", "allreduce")
                pg_desc = a["Process Group Description"]
                assert pg_desc in ("PIPELINE_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP")
                assert "Process Group Ranks" in a and "Process Group Name" in a
                if a["Collective name"] == "send":
                    assert a["Dst Rank"] in pp_group and a["Dst Rank"] != rank
                if a["Collective name"] == "recv":
                    assert a["Src Rank"] in pp_group and a["Src Rank"] != rank
        steps = [e for e in ev if e.get("name", "").startswith("ProfilerStep#")]
        assert [e["name"] for e in steps] == [f"ProfilerStep#{5 + k}" for k in range(run.steps)]
        flows_s = {e["id"] for e in ev if e.get("ph") == "s"}
        flows_f = {e["id"] for e in ev if e.get("ph") == "f"}
        assert flows_f == {k["args"]["correlation"] for k in kernels} and flows_f <= flows_s
        rpc = [e for e in ev if e.get("name") == "record_param_comms"]
        assert rpc and all("Collective name" in e["args"] for e in rpc)
        titles = [e["name"] for e in ev if e.get("name", "").startswith("nccl:")]
        local = pp_group.index(rank)
        for t in titles:
            m = re.fullmatch(r"nccl:(send (\d+)->(\d+)|recv (\d+)<-(\d+)|all_reduce)", t)
            assert m, t
            if m.group(2):
                assert int(m.group(2)) == local
            if m.group(4):
                assert int(m.group(4)) == local
    assert seen_ranks == set(range(run.world_size))


def test_kineto_clock_skew_applied(outdir: str) -> None:
    # one GPU per host: each rank on a clock of its own (the ranks of one host share its clock)
    run = make_scenario(**SCENARIOS["combo"], gpus_per_node=1)
    paths = write_kineto(run, Path(outdir) / "combo_hosts")
    skews = []
    for path in paths:
        doc = _load(path)
        rank = doc["distributedInfo"]["rank"]
        rk = run.ranks[rank]
        step = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#5")
        true_abs = run.epoch_ns + int(rk.step_windows[0, 0])
        skew = _abs_ns(doc, step["ts"]) - true_abs
        assert skew == rk.clock_skew_ns == run.truth["clock_skew_ns"][str(rank)]
        skews.append(skew)
    assert max(abs(s) for s in skews) <= 5_000_000
    assert max(skews) - min(skews) > 1_000_000  # several ms apart
    assert len(set(skews)) == len(skews)


def test_ranks_of_one_host_share_its_clock() -> None:
    run = make_scenario(**SCENARIOS["combo"], gpus_per_node=2)
    by_host: dict[str, set[int]] = {}
    for rk in run.ranks:
        by_host.setdefault(rk.host_name, set()).add(rk.clock_skew_ns)
    assert len(by_host) == 3 and all(len(v) == 1 for v in by_host.values()), by_host
    assert len({v.pop() for v in by_host.values()}) == 3


def test_kineto_sends_and_receives_pair_up(outdir: str) -> None:
    """The k-th send a->b and the k-th receive on b from a finish together (on the true clock)."""
    run = scenario("combo")
    paths = written("combo", outdir)
    sends: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for path in paths:
        doc = _load(path)
        rank = doc["distributedInfo"]["rank"]
        skew = run.truth["clock_skew_ns"][str(rank)]
        for e in doc["traceEvents"]:
            if e.get("cat") != "kernel" or "Collective name" not in e["args"]:
                continue
            a = e["args"]
            s = _abs_ns(doc, e["ts"]) - skew
            end = s + round(float(e["dur"]) * 1000)
            if a["Collective name"] == "send":
                sends[(rank, a["Dst Rank"])].append((s, end))
            elif a["Collective name"] == "recv":
                recvs[(a["Src Rank"], rank)].append((s, end))
    assert sends and set(sends) == set(recvs)
    for pair, ss in sends.items():
        rr = recvs[pair]
        assert len(ss) == len(rr) == run.steps * run.microbatches
        for (s0, s1), (r0, r1) in zip(sorted(ss), sorted(rr), strict=True):
            assert s1 == r1  # NCCL send and recv complete together
            assert s0 <= r1 and r0 <= r1


def test_annotations_off_by_default_and_labels_when_asked(outdir: str) -> None:
    plain = _load(written("combo", outdir)[0])
    names = {e.get("name", "") for e in plain["traceEvents"]}
    assert not any(n.startswith(("PP:", "Forward ", "Backward ")) for n in names)
    labelled = _load(written("gpipe_labels", outdir)[1])
    names = {e.get("name", "") for e in labelled["traceEvents"]}
    assert {"PP:1F0", "PP:1B7"} <= names
    fwd = make_scenario(pp=2, microbatches=2, annotations="forward", steps=1)
    hn = {fwd.name(int(i)) for i in fwd.ranks[0].host.name}
    assert {"Forward 0", "Forward 1", "Backward 0", "Backward 1"} <= hn


def test_groundtruth_json(outdir: str) -> None:
    written("combo", outdir)
    gt = json.loads((Path(outdir) / "combo" / "groundtruth.json").read_text())
    for key in (
        "schedule",
        "pp",
        "microbatches",
        "stage_map",
        "faults",
        "clock_skew_ns",
        "step_ms",
        "ranks",
        "config",
        "blame",
    ):
        assert key in gt
    assert gt["schedule"] == "1f1b" and gt["pp"] == 5 and gt["microbatches"] == 10
    assert gt["stage_map"] == {str(s): [s] for s in range(5)}
    assert [f["type"] for f in gt["faults"]] == ["SlowStage", "HostStall", "SlowLink"]
    assert gt["blame"] == {"imbalance": [1], "host": [2], "comm_wait": [0]}
    r = gt["ranks"]["2"]
    assert set(r["causes_ms"]) == set(TRUTH_CAUSES) and len(r["steps"]) == 3


def test_dp_topology() -> None:
    run = scenario("dp2")
    assert run.world_size == 8
    assert run.truth["pp_groups"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert run.truth["dp_groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    rk = run.ranks[5]
    assert (rk.pp_rank, rk.dp_rank) == (2, 1)
    p2p = rk.gpu.kind == int(Kind.P2P)
    assert set(rk.gpu.peer[p2p].tolist()) == {3, 7}


def test_deterministic(tmp_path: Path) -> None:
    a = write_kineto(make_scenario(seed=7, steps=1), tmp_path / "a")
    b = write_kineto(make_scenario(seed=7, steps=1), tmp_path / "b")
    assert [p.name for p in a] == [p.name for p in b]
    for x, y in zip(a, b, strict=True):
        dx, dy = _load(x), _load(y)
        assert dx.pop("traceName") != dy.pop("traceName")  # the output path
        assert dx == dy
    c, d = make_scenario(seed=8, steps=1), make_scenario(seed=7, steps=1)
    assert [r.clock_skew_ns for r in c.ranks] != [r.clock_skew_ns for r in d.ranks]


def test_bad_scenarios() -> None:
    with pytest.raises(ValueError, match="dp >= 2"):
        make_scenario(faults=[ExposedAllReduce(1.0)])
    with pytest.raises(ValueError, match="stage 9"):
        make_scenario(faults=[SlowStage(9, 2.0)])
    with pytest.raises(ValueError, match="pipeline rank"):
        make_scenario(faults=[HostStall(4, 1.0)])
    with pytest.raises(ValueError, match="unknown schedule"):
        make_scenario(schedule="nope")
    with pytest.raises(ValueError, match="pp >= 2"):
        make_scenario(pp=1)


# -------------------------------------------------------------------------------- kineto parser


def test_kineto_parser_reads_synthetic_traces(outdir: str) -> None:
    kin = pytest.importorskip("ppdiag.parsers.kineto")
    from ppdiag.parsers import ParseOptions

    parser = kin.KinetoParser()
    run = scenario("interleaved")
    for path in written("interleaved", outdir):
        with gzip.open(path) as fh:
            assert parser.sniff(path, fh.read(4096))
        (tl,) = parser.parse(path, ParseOptions())
        rk = run.ranks[tl.rank]
        assert tl.world_size == run.world_size
        iv = tl.intervals
        n_kern = sum(1 for e in _load(path)["traceEvents"] if e.get("cat") == "kernel")
        assert len(iv) == n_kern == len(rk.gpu)
        p2p = iv.kind == int(Kind.P2P)
        assert int(p2p.sum()) == int((rk.gpu.kind == int(Kind.P2P)).sum())
        neighbours = {
            run.stage_to_rank[s + d]
            for s in rk.stages
            for d in (-1, 1)
            if 0 <= s + d < len(run.stage_to_rank)
        } - {rk.rank}
        assert set(iv.peer[p2p].tolist()) == neighbours
        for d in (int(Direction.SEND), int(Direction.RECV)):
            assert set(iv.peer[p2p & (iv.direction == d)].tolist()) == neighbours
        assert int((iv.kind == int(Kind.COLLECTIVE)).sum()) == run.steps
        assert int((iv.kind == int(Kind.COMPUTE)).sum()) == int((rk.gpu.kind == int(Kind.COMPUTE)).sum())
        assert any(pg.desc == "PIPELINE_MODEL_PARALLEL_GROUP" for pg in tl.process_groups)


def test_random_scenarios_stay_consistent() -> None:
    """Every schedule with random faults builds (the generator checks launch <= start and that each
    transfer fits between its send and receive) and its truth adds up."""
    import random

    rnd = random.Random(5)
    for sched, v in (
        ("gpipe", 1),
        ("1f1b", 1),
        ("interleaved_1f1b", 2),
        ("zero_bubble", 1),
        ("zbv", 2),
        ("dualpipev", 2),
    ):
        for p in (2, 3):
            m = 2 * p
            n_st = p * v
            faults: list[Fault] = [
                SlowStage(rnd.randrange(n_st), rnd.uniform(1.1, 2.0)),
                SlowLink(rnd.randrange(p), delay_ms=rnd.uniform(0.05, 0.8), factor=rnd.uniform(1, 3)),
                HostStall(rnd.randrange(p), rnd.uniform(0.05, 0.6)),
                CommOnCompute((rnd.randrange(p),)),
                SlowStep(rnd.randrange(2), 1.0, None),
            ]
            run = make_scenario(
                schedule=sched,
                pp=p,
                microbatches=m,
                virtual=v,
                fwd_ms=0.4,
                bwd_ms=0.8,
                wgrad_ms=0.3,
                faults=rnd.sample(faults, 3),
                steps=2,
                p2p_ms=0.1,
                seed=rnd.randrange(100),
            )
            for t in run.truth["ranks"].values():
                for st in t["steps"]:
                    assert sum(st["causes_ms"].values()) == pytest.approx(st["lost_ms"], abs=1e-6)
                    assert min(st["causes_ms"].values()) >= -1e-9
