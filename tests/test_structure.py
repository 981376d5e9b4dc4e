"""Abstain rather than invent: grouped send/recv of a collective is no pipeline, a pipeline that
contradicts its own evidence is rejected (header, JSON, no pipeline finding, no what-if), and every
structural fact says where it comes from (``run.structure``, docs/json.md)."""

from __future__ import annotations

import gzip
import html
import json
import re
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from ablate import COMM_ARGS, strip_kineto_dir, strip_nsys_dir
from rich.console import Console

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose, load
from ppdiag.model import Direction, Kind, Phase
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.steps import LocalStep
from ppdiag.pipeline.structure import contradiction
from ppdiag.pipeline.topology import Topology
from ppdiag.report_types import Confidence, FactSource, Report, decode, dumps
from ppdiag.reports.html import render_html
from ppdiag.reports.md import render_markdown
from ppdiag.reports.terminal import headline
from ppsynth import SynthRun, make_scenario, write_kineto
from ppsynth.collectives import make_collective_run
from ppsynth.nsys import write_nsys

REAL_FSDP = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "nsys" / "nsysai_h100_fsdp_2gpu.sqlite"
)
PIPELINE_CODES = {"PP001", "PP002", "PP003"}
REJECTED = "pipeline structure could not be established"


def _header(rep: Report) -> str:
    con = Console(width=200, record=True, color_system=None)
    con.print(headline(rep))
    return con.export_text()


def _a2a_paths(tmp_path: Path, fmt: str, world: int, late: dict[int, float]) -> list[Path]:
    run = make_collective_run(world=world, late_ms=late, steps=3, seed=world)
    raw = tmp_path / "raw"
    if fmt.startswith("kineto"):
        write_kineto(run, raw)
        if fmt == "kineto":
            return [raw]
        strip_kineto_dir(raw, tmp_path / "bare", [COMM_ARGS])
        return [tmp_path / "bare"]
    write_nsys(run, raw, nccl_payloads=fmt == "nsys")
    if fmt == "nsys-no-nccl-ranges":
        # nothing but the SendRecv kernels: no NCCL API ranges, payloads or PyTorch ranges
        strip_nsys_dir(raw, tmp_path / "bare")
        return [tmp_path / "bare"]
    return [raw]


@pytest.mark.parametrize(("world", "late"), [(2, {1: 4.0}), (3, {1: 4.0}), (4, {1: 4.0, 3: 2.5})])
@pytest.mark.parametrize(
    "fmt", ["kineto", "kineto-no-comm-args", "nsys", "nsys-no-payloads", "nsys-no-nccl-ranges"]
)
def test_all_to_all_from_grouped_send_recv_is_no_pipeline(
    tmp_path: Path, fmt: str, world: int, late: dict[int, float]
) -> None:
    # every all-to-all is one fused SendRecv kernel per rank: ncclGroupStart, ncclSend/ncclRecv to
    # every other member, ncclGroupEnd (2 ranks: one send and one receive to the same peer, what a
    # pipeline's send_forward_recv_backward looks like). Late ranks start every step late.
    diag = diagnose(_a2a_paths(tmp_path, fmt, world, late), Options())
    rep = diag.result
    assert rep.run.pp == 1 and rep.run.schedule == "none" and rep.stages == []
    st = rep.run.structure
    assert st is not None and st.pp.source == FactSource.DEFAULT
    if fmt != "nsys-no-nccl-ranges":
        assert st.established and "no pipeline parallelism found" in _header(rep)
    else:
        # kernels of unknown direction whose peers only timing suggests: no pipeline, or one
        # suggested and rejected, never one kept
        assert st.established or REJECTED in _header(rep)
    codes = [f.code for f in rep.findings]
    assert not PIPELINE_CODES & set(codes)
    assert "PP013" not in codes  # no receive left waiting for a partner timing made up
    (f,) = [f for f in rep.findings if f.code == "PP009"]
    assert sorted(f.ranks) == sorted(late) and f.ranks[0] == 1  # the latest first
    got = f.evidence.as_dict()["late_ranks"]["1"]["late_ms_per_step"]  # type: ignore[index]
    assert isinstance(got, float) and 3.0 < got < 5.0


def _relabelled_gpipe(tmp_path: Path, m: int = 8) -> Path:
    """A 2-stage GPipe run whose second stage numbers its micro-batches one off (forward k labelled
    k+1, backward k labelled k-1, modulo M): the labels say each forward of stage 1 starts before
    its producer (stage 0's forward of the next micro-batch) ends, and each backward of stage 0
    before the backward it consumes."""
    run = make_scenario(schedule="gpipe", pp=2, microbatches=m, annotations="pp", steps=2, clock_skew_ms=5.0)
    out = tmp_path / "run"
    paths = write_kineto(run, out)

    def shift(mt: re.Match[str]) -> str:
        ph, mb = mt.group(1), int(mt.group(2))
        return f"PP:1{ph}{(mb + 1) % m if ph == 'F' else (mb - 1) % m}"

    for p in paths:
        obj = json.loads(gzip.decompress(p.read_bytes()))
        for e in obj["traceEvents"]:
            n = e.get("name")
            if isinstance(n, str) and n.startswith("PP:1"):
                e["name"] = re.sub(r"^PP:1([FB])(\d+)$", shift, n)
        p.write_bytes(gzip.compress(json.dumps(obj).encode()))
    return out


def _assert_rejected(diag: Analyzed, why: str) -> None:
    rep = diag.result
    st = rep.run.structure
    assert st is not None and not st.established
    assert st.reason is not None and why in st.reason
    assert st.claimed is not None and "stages" in st.claimed
    assert st.pp.value == 1 and st.pp.confidence == Confidence.LOW
    assert rep.run.pp == 1 and rep.run.schedule == "none" and rep.stages == []
    assert not PIPELINE_CODES & {f.code for f in rep.findings}
    assert rep.whatif == []
    # the per-rank breakdown stays: every traced rank, its causes adding up to its lost time
    assert [r.rank for r in rep.ranks] == rep.run.ranks and rep.ranks
    for r in rep.ranks:
        assert r.step_ms > 0
        assert abs(sum(r.lost_ms.values()) + r.compute_ms - r.step_ms) < 0.01 * r.step_ms
    # said in every header and in the JSON
    head = " ".join(_header(rep).split())
    assert f"{REJECTED}: {st.reason}" in head
    assert REJECTED in render_markdown(rep)
    assert html.escape(f"{REJECTED}: {st.reason}") in render_html(diag)
    back = decode(dumps(rep)).run.structure
    assert back is not None and back.reason == st.reason and not back.established


def test_labels_against_the_measured_order_reject_the_pipeline(tmp_path: Path) -> None:
    diag = diagnose([_relabelled_gpipe(tmp_path)], Options())
    _assert_rejected(diag, "micro-batch dependencies from the block labels contradict the measured order")
    # the same run labelled right keeps its pipeline, every fact with its source
    run = make_scenario(schedule="gpipe", pp=2, microbatches=8, annotations="pp", steps=2, clock_skew_ms=5.0)
    write_kineto(run, tmp_path / "ok")
    ok = diagnose([tmp_path / "ok"], Options())
    rep = ok.result
    st = rep.run.structure
    assert st is not None and st.established and st.reason is None
    assert rep.run.pp == 2 and st.pp.value == 2 and rep.run.schedule == "gpipe"
    assert st.microbatches.value == 8 and st.microbatches.source == FactSource.LABELS


def test_a_structure_the_user_gives_is_not_rejected(tmp_path: Path) -> None:
    diag = diagnose([_relabelled_gpipe(tmp_path)], Options(stage_map="0,1"))
    st = diag.result.run.structure
    assert st is not None and st.established and st.pp.source == FactSource.OVERRIDE
    assert diag.result.run.pp == 2


@pytest.mark.skipif(not REAL_FSDP.exists(), reason="real traces not present")
def test_real_fsdp_report_has_no_pipeline_and_keeps_the_breakdown() -> None:
    diag = diagnose([REAL_FSDP], Options())
    rep = diag.result
    assert rep.run.pp == 1 and rep.run.schedule == "none" and rep.whatif == []
    assert not PIPELINE_CODES & {f.code for f in rep.findings}
    st = rep.run.structure
    assert st is not None and st.established and st.pp.source == FactSource.DEFAULT
    assert [r.rank for r in rep.ranks] == [0, 1]
    for r in rep.ranks:
        assert abs(sum(r.lost_ms.values()) + r.compute_ms - r.step_ms) < 0.01 * r.step_ms


def _blocks(steps: list[int], phase: int, stage: list[int] | None = None) -> Blocks:
    """Blocks 1 ms long, 1 ms apart, in ``steps`` (step index per block)."""
    n = len(steps)
    start = np.arange(n, dtype=np.int64) * 2_000_000
    return Blocks(
        np.array(steps, np.int32),
        start,
        start + 1_000_000,
        np.full(n, 1_000_000, np.int64),
        np.full(n, -1, np.int64),
        np.full(n, phase, np.int8),
        np.full(n, -1, np.int32),
        np.array(stage if stage is not None else [-1] * n, np.int32),
    )


def _topo(pp: int, virtual: int, source: str = "p2p chain") -> Topology:
    ranks = list(range(pp))
    return Topology(
        pp, {r: r for r in ranks}, {r: [r] for r in ranks}, [ranks], virtual=virtual, source=source
    )


def test_more_virtual_stages_than_forward_blocks_reject_the_pipeline() -> None:
    # 2 ranks claimed to hold v = 8 chunks each, but each shows 3 forward blocks per step (2
    # steps): at least 8 forwards per step are needed, one per chunk. 16 claimed stages, 2 traced
    # (chunk unknown: one per rank) -> also "most untraced", which is checked first; with the
    # chunks labelled 0..7 on each rank only the forward count is left to object.
    fwd = int(Phase.FWD)
    wins = {r: [LocalStep(10, 0, 10**9), LocalStep(11, 0, 10**9)] for r in (0, 1)}
    chunks = [0, 2, 4, 6, 1, 3]
    blocks = {r: _blocks([0, 0, 0, 1, 1, 1], fwd, [c + r for c in chunks]) for r in (0, 1)}
    reason = contradiction(_topo(2, 8), blocks, wins, overridden=False)
    assert reason is not None and "8 virtual stages per rank" in reason and "more than 3 forward" in reason
    assert contradiction(_topo(2, 8), blocks, wins, overridden=True) is None
    # 8 forwards a step: v = 8 holds
    blocks8 = {r: _blocks([0] * 8 + [1] * 8, fwd, list(range(8)) * 2) for r in (0, 1)}
    assert contradiction(_topo(2, 8), blocks8, wins, overridden=False) is None


def test_most_claimed_stages_untraced_reject_the_pipeline() -> None:
    # pp 2 x v 33 = 66 claimed stages; the blocks carry no chunk: 2 traced (one per rank)
    fwd = int(Phase.FWD)
    wins = {r: [LocalStep(-1, 0, 10**9)] for r in (0, 1)}
    blocks = {r: _blocks([0] * 40, fwd) for r in (0, 1)}
    reason = contradiction(_topo(2, 33), blocks, wins, overridden=False)
    assert reason == "only 2 of the 66 claimed pipeline stages have traced blocks"
    # a process group that names the pipeline lists its untraced ranks: not a contradiction
    big = _topo(8, 1, source="pipeline process group")
    few = {0: _blocks([0] * 4, fwd), 1: _blocks([0] * 4, fwd)}
    assert contradiction(big, few, {0: wins[0], 1: wins[1]}, overridden=False) is None
    # the same 8 stages from a chain of transfers with 2 traced: rejected
    chain = _topo(8, 1)
    assert contradiction(chain, few, {0: wins[0], 1: wins[1]}, overridden=False) is not None


def _forwards(stage: int, t0_ms: float, m: int = 4) -> Blocks:
    """``m`` forward blocks of micro-batches 0..m-1 on ``stage``, 1 ms long, one every 2 ms from
    ``t0_ms`` (one step)."""
    start = ((t0_ms + 2.0 * np.arange(m)) * 1e6).astype(np.int64)
    return Blocks(
        np.zeros(m, np.int32),
        start,
        start + 1_000_000,
        np.full(m, 1_000_000, np.int64),
        np.full(m, -1, np.int64),
        np.full(m, int(Phase.FWD), np.int8),
        np.arange(m, dtype=np.int32),
        np.full(m, stage, np.int32),
        labelled=True,
    )


def test_each_block_depends_on_the_producer_of_its_own_replica() -> None:
    # 3 DP replicas of a 2-stage pipeline (ranks 0-1, 2-3, 4-5), one step, 4 forwards each.
    # In every replica stage 1's forward of micro-batch k starts 0.1 ms after stage 0's ends (k
    # at t0 + 2k ms, stage 1 at t0 + 2k + 1.1 ms): the order holds in each replica. Replica 0
    # runs at t0 = 100 ms, replicas 1 and 2 at t0 = 0: measured against replica 0's producers
    # (ending at 101 + 2k ms), replicas 1 and 2's 8 consumers would all start before their
    # producer ends: 8 of 12 dependencies "contradicted", the pipeline wrongly rejected.
    pipelines = [[0, 1], [2, 3], [4, 5]]
    topo = Topology(
        2,
        {r: i for line in pipelines for i, r in enumerate(line)},
        {r: [i] for line in pipelines for i, r in enumerate(line)},
        pipelines,
        source="pipeline process group",
    )
    blocks: dict[int, Blocks] = {}
    for line, t0 in zip(pipelines, (100.0, 0.0, 0.0), strict=True):
        blocks[line[0]] = _forwards(0, t0)
        blocks[line[1]] = _forwards(1, t0 + 1.1)
    wins = {r: [LocalStep(10, 0, 10**9)] for r in blocks}
    assert contradiction(topo, blocks, wins, overridden=False) is None
    # a replica whose consumers do start before their own producers end is still seen: every
    # stage-1 forward 0.5 ms before its producer's end in all three replicas -> 12 of 12
    for line, t0 in zip(pipelines, (100.0, 0.0, 0.0), strict=True):
        blocks[line[1]] = _forwards(1, t0 + 0.5)
    reason = contradiction(topo, blocks, wins, overridden=False)
    assert reason == "12 of 12 micro-batch dependencies from the block labels contradict the measured order"


def _add_torch_ranges(db: Path) -> int:
    """Put PyTorch's ``c10d::alltoall_base_`` / ``nccl:all_to_all`` ranges (what emit_nvtx and
    record_function write) around every NCCL group of an nsys export; returns the groups wrapped."""
    con = sqlite3.connect(db)
    try:
        text = "COALESCE(text, (SELECT value FROM StringIds s WHERE s.id = NVTX_EVENTS.textId))"
        starts = con.execute(
            f"SELECT start, globalTid FROM NVTX_EVENTS WHERE {text} = 'ncclGroupStart' ORDER BY start"
        ).fetchall()
        ends = con.execute(
            f"SELECT \"end\" FROM NVTX_EVENTS WHERE {text} = 'ncclGroupEnd' ORDER BY start"
        ).fetchall()
        for (t0, tid), (t1,) in zip(starts, ends, strict=True):
            for name, pad in (("c10d::alltoall_base_, op_id = 7", 2_000), ("nccl:all_to_all", 1_000)):
                con.execute(
                    'INSERT INTO NVTX_EVENTS (start, "end", eventType, globalTid, domainId, text) '
                    "VALUES (?, ?, 59, ?, 0, ?)",
                    (t0 - pad, t1 + pad, tid, name),
                )
        con.commit()
        return len(starts)
    finally:
        con.close()


def test_nccl_group_inside_a_collective_range_is_that_collective(tmp_path: Path) -> None:
    # 2 ranks, NCCL payloads: each all-to-all is ncclSend + ncclRecv to the one peer, read as a p2p
    # exchange with that peer; inside PyTorch's all-to-all ranges the same kernel is a collective
    run = make_collective_run(world=2, steps=2, seed=2)
    paths = write_nsys(run, tmp_path / "plain")
    plain = load(paths, Options())
    sendrecv = [np.flatnonzero(tl.intervals.kind == int(Kind.P2P)) for tl in plain.ranks]
    assert all(len(x) == 2 * 2 for x in sendrecv)  # two all-to-alls a step, two steps
    assert all(
        (tl.intervals.direction[x] == int(Direction.BOTH)).all()
        for tl, x in zip(plain.ranks, sendrecv, strict=True)
    )
    wrapped = []
    for p in paths:
        q = tmp_path / "torch" / p.name
        q.parent.mkdir(exist_ok=True)
        shutil.copy(p, q)
        assert _add_torch_ranges(q) >= 4
        wrapped.append(q)
    got = load(wrapped, Options())
    for tl, tl0 in zip(got.ranks, plain.ranks, strict=True):
        iv = tl.intervals
        assert not (iv.kind == int(Kind.P2P)).any()
        assert (iv.kind == int(Kind.COLLECTIVE)).sum() == (
            tl0.intervals.kind == int(Kind.COLLECTIVE)
        ).sum() + 4


# ---- one exchange each way, directions unstated -------------------------------------------------


def _kernels_only(tmp_path: Path, run: object) -> Path:
    """The run as nsys exports with nothing but the kernels: no NCCL ranges, payloads or PyTorch
    ranges, so no transfer states its direction or peer."""
    raw, bare = tmp_path / "raw", tmp_path / "bare"
    write_nsys(run, raw)  # type: ignore[arg-type]
    (raw / "groundtruth.json").unlink(missing_ok=True)
    strip_nsys_dir(raw, bare)
    return bare


@pytest.mark.parametrize(("world", "steps"), [(2, 1), (2, 2), (3, 1)])
def test_one_exchange_each_way_of_unstated_direction_is_no_pipeline(
    tmp_path: Path, world: int, steps: int
) -> None:
    # an all-to-all of SendRecv kernels, twice a step: timing pairs them into one transfer each
    # way per step, which a 2-stage pipeline of 1 micro-batch would also show; nothing in the trace
    # tells them apart, so no pipeline is claimed and the late rank is named
    run = make_collective_run(world=world, late_ms={1: 4.0}, steps=steps, seed=world + steps)
    rep = diagnose([_kernels_only(tmp_path, run)], Options()).result
    st = rep.run.structure
    assert st is not None and not st.established and st.reason is not None
    assert "state no direction" in st.reason and "2 stages" in (st.claimed or "")
    assert rep.run.pp == 1 and rep.stages == [] and not PIPELINE_CODES & {f.code for f in rep.findings}
    assert REJECTED in _header(rep)
    (f,) = [f for f in rep.findings if f.code == "PP009"]
    assert f.ranks[0] == 1


def test_one_microbatch_pipeline_needs_stated_directions(tmp_path: Path) -> None:
    run = make_scenario(schedule="1f1b", pp=2, microbatches=1, steps=2, seed=1)
    # with the NCCL ranges the transfers state send and receive: the pipeline holds
    raw = tmp_path / "raw"
    write_nsys(run, raw)
    (raw / "groundtruth.json").unlink(missing_ok=True)
    rep = diagnose([raw], Options()).result
    assert rep.run.pp == 2 and rep.run.microbatches == 1
    assert rep.run.structure is not None and rep.run.structure.established
    # kernels only: the same evidence as a two-rank exchange, so "cannot tell" (the cost of the
    # rule: a real M=1 pipeline traced this bare is not claimed) unless the user says it is one
    bare = _kernels_only(tmp_path / "k", run)
    rep = diagnose([bare], Options()).result
    assert rep.run.pp == 1 and rep.run.structure is not None and not rep.run.structure.established
    rep = diagnose([bare], Options(pp=2)).result
    assert rep.run.pp == 2 and rep.run.structure is not None and rep.run.structure.established
    # more micro-batches are more evidence than one exchange: kept from timing
    many = make_scenario(schedule="1f1b", pp=2, microbatches=4, steps=1, seed=1)
    rep = diagnose([_kernels_only(tmp_path / "m", many)], Options()).result
    assert rep.run.pp == 2 and rep.run.microbatches == 4
    assert rep.run.structure is not None and rep.run.structure.established


def _v_run(schedule: str, annotations: str | None) -> SynthRun:
    """P=4, M=8, every forward, input- and weight-gradient block 1 ms, 2 steps."""
    ms = 1.0
    return make_scenario(
        schedule=schedule,
        pp=4,
        microbatches=8,
        fwd_ms=ms,
        bwd_ms=ms,
        wgrad_ms=ms,
        steps=2,
        annotations=annotations,
    )


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_unlabelled_v_pipeline_is_rejected_without_naming_stragglers(tmp_path: Path, schedule: str) -> None:
    # a healthy V pipeline (stages r and 2P-1-r on rank r, every block 1 ms) traced without block
    # labels: its transfers form the chain 0-1-2-3 of a plain pipeline, whose order the measured
    # blocks contradict, so no pipeline is claimed. Its receives then wait for blocks the sender
    # computes: a dependency of the unread schedule, not a late peer. Every rank runs the same
    # blocks, so none computes longer than another: no straggler (PP009) and no imbalance; the
    # waits stay exposed communication (before, each rank was charged ~3 ms of "imbalance" and
    # ranks 1-3 were named stragglers that "compute longer than the others")
    write_kineto(_v_run(schedule, None), tmp_path / "run")
    diag = diagnose([tmp_path / "run"], Options())
    _assert_rejected(diag, "micro-batch dependencies from the block labels contradict the measured order")
    rep = diag.result
    assert "PP009" not in {f.code for f in rep.findings}
    for r in rep.ranks:
        # (a few µs: the step-end collective's own waits, matched as before)
        assert r.lost_ms["imbalance"] < 0.05, (r.rank, r.lost_ms)
        # P=4 stages, each idle about (P-1) blocks of 1 ms in the V's fill and drain
        assert r.lost_ms["exposed_comm"] > 2.0, (r.rank, r.lost_ms)
    # the same run labelled keeps its pipeline
    write_kineto(_v_run(schedule, "pp"), tmp_path / "labelled")
    rep = diagnose([tmp_path / "labelled"], Options()).result
    assert rep.run.structure is not None and rep.run.structure.established
    assert rep.run.pp == 4 and rep.run.virtual_stages == 2
