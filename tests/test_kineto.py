"""Kineto parser: hand-written traces with known truths, the real traces, damaged files."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TEST_DATA, shared_trace

from ppdiag.model import Direction, Kind, Phase, RangeKind, RankTimeline
from ppdiag.parsers import PARSERS, ParseOptions
from ppdiag.parsers.kineto import PARSER, parse_file, rank_from_filename

BASE = 1_790_857_026_000_000_000


def us(t: float) -> int:
    """ns on the absolute clock of the hand-written traces (relative µs + their base)."""
    return BASE + round(t * 1000)


def names_of(r: RankTimeline, ids: Any) -> list[str]:
    return [r.names[int(i)] for i in ids]


def x(
    name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 100, pid: int = 100, **args: Any
) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def trace(events: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    out.update(top)
    out["traceEvents"] = events
    return out


def write(path: Path, obj: Any, gz: bool = False, compact: bool = False) -> Path:
    text = json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj, indent=1)
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def gpu_events(*comm: dict[str, Any]) -> list[dict[str, Any]]:
    """A compute kernel plus the given events (GPU mode needs one GPU event at least)."""
    return [
        x("aten::mm", 10, 5),
        x("cudaLaunchKernel", 11, 1, cat="cuda_runtime", correlation=1),
        x("gemm_kernel", 20, 10, cat="kernel", pid=0, tid=7, correlation=1, stream=7),
        *comm,
    ]


# ----------------------------------------------------------------------------------------------
# hand-written traces (tests/data)
# ----------------------------------------------------------------------------------------------


def test_registered_and_sniffs() -> None:
    assert PARSERS["kineto"] is PARSER
    head = (TEST_DATA / "gpu_pp_rank0.json").read_bytes()[:4096]
    assert PARSER.sniff(Path("x.json"), head)
    assert not PARSER.sniff(Path("x.json"), b'{"foo": 1}')
    assert not PARSER.sniff(Path("x.json"), b"SQLite format 3\x00")
    assert not PARSER.sniff(Path("x.json"), b"[1, 2]")


def test_gpu_trace_intervals() -> None:
    r = parse_file(TEST_DATA / "gpu_pp_rank0.json")
    assert (r.rank, r.rank_source, r.world_size, r.backend) == (0, "distributedInfo", 2, "nccl")
    assert r.device == "NVIDIA H100 80GB HBM3" and not r.cpu_only
    assert [(g.name, g.desc, g.ranks) for g in r.process_groups] == [("0", "default_pg", [0, 1])]
    iv = r.intervals
    # 8 kernels + memcpy + memset + cuda_sync; the gpu_user_annotation is not device work
    assert len(iv) == 11
    assert np.all(np.diff(iv.start) >= 0)
    nm = names_of(r, iv.name)
    assert "nccl:all_reduce" not in nm
    kinds = dict(zip(nm, iv.kind.tolist(), strict=False))
    assert kinds["Memcpy HtoD (Pinned -> Device)"] == Kind.MEMCPY
    assert kinds["Memset (Device)"] == Kind.MEMSET
    assert kinds["Stream Sync"] == Kind.SYNC
    assert kinds["nvjet_hsh_256x128_gemm"] == Kind.COMPUTE

    def row(start_us: float) -> int:
        hit = np.flatnonzero(iv.start == us(start_us))
        assert len(hit) == 1, start_us
        return int(hit[0])

    gemm = row(140)
    assert iv.end[gemm] == us(240) and iv.stream[gemm] == 7 and iv.launch[gemm] == us(125)
    # K1: the kernel's own comm args
    k1 = row(240)
    assert (iv.kind[k1], iv.peer[k1], iv.direction[k1]) == (Kind.P2P, 1, Direction.SEND)
    assert (iv.bytes[k1], iv.seq[k1], iv.group[k1], iv.stream[k1]) == (1024 * 2, 7, 0, 20)
    assert iv.launch[k1] == us(220)  # cuda_driver launches count too
    # K2: no args of its own, no runtime event: record_param_comms by External id
    k2 = row(360)
    assert (iv.kind[k2], iv.peer[k2], iv.direction[k2]) == (Kind.P2P, 1, Direction.RECV)
    assert (iv.bytes[k2], iv.seq[k2], iv.launch[k2]) == (512 * 4, 8, -1)
    # K3: only the enclosing "nccl:send 0->1" annotation at launch time says what it is
    k3 = row(420)
    assert (iv.kind[k3], iv.peer[k3], iv.direction[k3]) == (Kind.P2P, 1, Direction.SEND)
    assert iv.launch[k3] == us(410)
    k4 = row(480)
    assert iv.kind[k4] == Kind.COLLECTIVE and iv.peer[k4] == -1
    # K5: a SendRecv kernel launched by an all-to-all is a collective
    k5 = row(570)
    assert iv.kind[k5] == Kind.COLLECTIVE
    opt = row(650)
    assert iv.phase[opt] == Phase.OPTIM and iv.launch[opt] == us(635)
    assert iv.launch[row(700)] == -1  # launched from outside the trace
    assert iv.bytes[row(710)] == 4096 and iv.launch[row(710)] == us(705)
    others = np.ones(len(iv), bool)
    others[[opt]] = False
    assert np.all(iv.phase[others] == Phase.UNKNOWN)
    assert np.all(iv.mb == -1)
    assert r.meta["comm_unclassified"] == 0 and not r.warnings
    assert r.events_total == 50 and r.events_lost == 0


def test_gpu_trace_ranges() -> None:
    r = parse_file(TEST_DATA / "gpu_pp_rank0.json")
    rg = r.ranges
    by_name: dict[str, list[int]] = {}
    for i, n in enumerate(names_of(r, rg.name)):
        by_name.setdefault(n, []).append(i)
    assert "aten::mm" not in by_name and "aten::add_" not in by_name
    assert "torch/nn/modules/module.py(1520): _call_impl" not in by_name
    assert len(rg) == 20
    (step,) = by_name["ProfilerStep#3"]
    assert (rg.kind[step], rg.num[step]) == (RangeKind.STEP, 3)
    assert (rg.start[step], rg.end[step]) == (us(100), us(1000))
    expect_labels = {  # name: (stage, mb, phase)
        "PP:0F1": (0, 1, Phase.FWD),
        "Forward 2": (-1, 2, Phase.FWD),
        "backward_mb3": (-1, 3, Phase.BWD),
        "PP:0W4": (0, 4, Phase.WGRAD),
    }
    for n, (stage, mb, phase) in expect_labels.items():
        (i,) = by_name[n]
        assert (rg.kind[i], rg.stage[i], rg.mb[i], rg.phase[i]) == (RangeKind.LABEL, stage, mb, phase), n
    (recv,) = by_name["PP:0RECV_B1"]
    assert (rg.kind[recv], rg.stage[recv], rg.mb[recv], rg.direction[recv]) == (
        RangeKind.COMM_OP,
        0,
        1,
        Direction.RECV,
    )
    (ov,) = by_name["PP:(0F6;1B2)OVERLAP_F_B"]
    assert (rg.kind[ov], rg.stage[ov], rg.mb[ov]) == (RangeKind.OTHER, 0, 6)
    (un,) = by_name["PP:0UNSHARD"]
    assert (rg.kind[un], rg.stage[un]) == (RangeKind.OTHER, 0)
    (opt,) = by_name["Optimizer.step#SGD.step"]
    assert rg.kind[opt] == RangeKind.OTHER and rg.phase[opt] == Phase.OPTIM
    (mod,) = by_name["nn.Module: Linear_0"]
    assert rg.kind[mod] == RangeKind.MODULE
    rpc = by_name["record_param_comms"]
    assert rg.kind[rpc].tolist() == [RangeKind.COMM_OP] * 2
    assert rg.peer[rpc].tolist() == [1, 1] and rg.direction[rpc].tolist() == [Direction.SEND, Direction.RECV]
    assert rg.bytes[rpc].tolist() == [2048, 2048] and rg.seq[rpc].tolist() == [7, 8]
    sends = by_name["nccl:send 0->1"]
    assert rg.peer[sends].tolist() == [1, 1] and rg.kind[sends].tolist() == [RangeKind.COMM_OP] * 2
    for n in ("c10d::send", "c10d::allreduce_", "c10d::alltoall_base_", "nccl:all_reduce", "nccl:all_to_all"):
        assert all(rg.kind[i] == RangeKind.COMM_OP for i in by_name[n]), n
    assert np.all(rg.tid == 4242)


def test_cpu_mode_timeline() -> None:
    r = parse_file(TEST_DATA / "cpu_gloo_rank0.json")
    assert r.cpu_only and r.device == "cpu" and r.backend == "gloo"
    iv = r.intervals
    got = [
        (
            (int(s) - BASE) // 1000,
            (int(e) - BASE) // 1000,
            Kind(k).name,
            int(p),
            int(ph),
            int(pe),
            int(d),
            int(b),
        )
        for s, e, k, p, ph, pe, d, b in zip(
            iv.start, iv.end, iv.kind, iv.stream, iv.phase, iv.peer, iv.direction, iv.bytes, strict=True
        )
    ]
    S, R, N = int(Direction.SEND), int(Direction.RECV), int(Direction.NONE)
    assert got == [
        (10, 100, "COMPUTE", 100, 0, -1, N, -1),  # aten::linear; its child aten::addmm is not separate
        (110, 130, "P2P", 100, 0, 1, S, -1),  # c10d::send issue, peer from Concrete Inputs
        (150, 200, "COMPUTE", 100, 0, -1, N, -1),
        (210, 230, "P2P", 100, 0, 1, R, -1),
        # both gloo spans cover [230, 350]: the recv ends first, so that piece is the recv's
        (230, 350, "P2P", 100, 0, 1, R, 16 * 8),
        (350, 400, "P2P", 100, 0, 1, S, 4 * 8 * 4),
        (410, 500, "COMPUTE", 100, int(Phase.BWD), -1, N, -1),
        (520, 590, "COMPUTE", 100, int(Phase.OPTIM), -1, N, -1),
    ]
    assert names_of(r, iv.name)[4:6] == ["gloo:recv", "gloo:send"]
    assert r.meta["main_tid"] == 100
    # the gloo collective on the gloo worker thread is kept as a range, not as main-thread work
    rg = r.ranges
    ar = [i for i, n in enumerate(names_of(r, rg.name)) if n == "gloo:all_reduce"]
    assert len(ar) == 1 and rg.tid[ar[0]] == 200 and rg.bytes[ar[0]] == 4096 * 4


def test_cpu_main_thread_without_steps(tmp_path: Path) -> None:
    ev = [x("aten::mm", 0, 10, tid=1), x("aten::mm", 20, 10, tid=1), x("aten::copy_", 0, 15, tid=2)]
    r = parse_file(write(tmp_path / "t.json", trace(ev, distributedInfo={"backend": "gloo", "rank": 0})))
    assert r.meta["main_tid"] == 1 and len(r.intervals) == 2


# ----------------------------------------------------------------------------------------------
# timestamps and ranks
# ----------------------------------------------------------------------------------------------


def _ts_trace(ts_text: str, dur_text: str, base: int | None) -> bytes:
    base_kv = f'"baseTimeNanoseconds": {base},' if base is not None else ""
    return (
        '{"schemaVersion": 1, "deviceProperties": [], ' + base_kv + '"traceEvents": ['
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, '
        f'"ts": {ts_text}, "dur": {dur_text}, "args": {{}}}}]}}'
    ).encode()


@pytest.mark.parametrize(
    ("ts_text", "dur_text", "base", "start", "end"),
    [
        # ≤ 2024-03: integer µs since the epoch
        ("1712195495406752", "12", None, 1_712_195_495_406_752_000, 1_712_195_495_406_764_000),
        # 2024-03 → 05: float µs since the epoch (3 decimals)
        ("1712195495406752.000", "12.000", None, 1_712_195_495_406_752_000, 1_712_195_495_406_764_000),
        # ≥ 2024-05: µs relative to baseTimeNanoseconds
        (
            "230849406752.000",
            "12.000",
            1_711_964_646_000_000_000,
            1_712_195_495_406_752_000,
            1_712_195_495_406_764_000,
        ),
        # sub-µs: relative timestamps keep the ns; absolute floats keep what float64 holds (.5)
        (
            "230849406752.123",
            "12.345",
            1_711_964_646_000_000_000,
            1_712_195_495_406_752_123,
            1_712_195_495_406_764_468,
        ),
        ("1712195495406752.500", "0.250", None, 1_712_195_495_406_752_500, 1_712_195_495_406_752_750),
    ],
)
def test_timestamp_generations(
    tmp_path: Path, ts_text: str, dur_text: str, base: int | None, start: int, end: int
) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(_ts_trace(ts_text, dur_text, base))
    iv = parse_file(p).intervals
    assert (int(iv.start[0]), int(iv.end[0])) == (start, end)


def test_negative_duration_is_clamped(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(_ts_trace("100.0", "-5.0", 0))
    iv = parse_file(p).intervals
    assert iv.start[0] == 100_000 and iv.end[0] == 100_000


def test_rank_compact_json_and_after_events(tmp_path: Path) -> None:
    dist = {
        "backend": "gloo",
        "rank": 1,
        "world_size": 4,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": "[0, 1, 2, 3]"}],
    }
    obj = trace([x("aten::mm", 0, 1)], distributedInfo=dist)
    r = parse_file(write(tmp_path / "rank7.json", obj, compact=True))
    assert b'"rank":1' in (tmp_path / "rank7.json").read_bytes()
    assert (r.rank, r.rank_source, r.world_size) == (1, "distributedInfo", 4)
    assert r.process_groups[0].ranks == [0, 1, 2, 3]
    # on-demand traces append distributedInfo after traceEvents
    after = {
        "schemaVersion": 1,
        "deviceProperties": [],
        "traceEvents": [x("aten::mm", 0, 1)],
        "distributedInfo": dist,
        "traceName": "t",
    }
    r2 = parse_file(write(tmp_path / "b.json", after))
    text = (tmp_path / "b.json").read_text()
    assert text.index('"distributedInfo"') > text.index('"traceEvents"')
    assert (r2.rank, r2.world_size) == (1, 4)


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank3.json", 3),
        ("rank-3.json", 3),
        ("rank_3.pt.trace.json", 3),
        ("worker3.json", 3),
        ("worker-3.json.gz", 3),
        ("host_worker12.1700000000.pt.trace.json", 12),
        ("RANK5.json", 5),
        ("sampled_rank-1.json.gz", 1),
        ("trace.json", None),
        ("frank3.json", None),
        ("ranks.json", None),
    ],
)
def test_rank_from_file_name(tmp_path: Path, name: str, rank: int | None) -> None:
    assert rank_from_filename(Path(name)) == rank
    obj = trace([x("aten::mm", 0, 1)])
    r = parse_file(write(tmp_path / name, obj, gz=name.endswith(".gz")))
    if rank is None:
        assert (r.rank, r.rank_source) == (-1, "none")
    else:
        assert (r.rank, r.rank_source) == (rank, "file name")


def test_rank_from_directory_name_and_distributed_info_wins(tmp_path: Path) -> None:
    (tmp_path / "rank7").mkdir()
    r = parse_file(write(tmp_path / "rank7" / "trace.json", trace([x("aten::mm", 0, 1)])))
    assert (r.rank, r.rank_source) == (7, "file name")
    obj = trace([x("aten::mm", 0, 1)], distributedInfo={"backend": "gloo", "rank": 2, "world_size": 4})
    r2 = parse_file(write(tmp_path / "rank5.json", obj))
    assert (r2.rank, r2.rank_source) == (2, "distributedInfo")


# ----------------------------------------------------------------------------------------------
# communication classification (built traces)
# ----------------------------------------------------------------------------------------------


def test_p2p_peer_through_a_subgroup(tmp_path: Path) -> None:
    # rank 2; its pipeline group is [2, 3] (ranks as a string, as on-demand traces write them):
    # "nccl:recv 0<-1" names group ranks, so the peer is global rank 3
    dist = {
        "backend": "nccl",
        "rank": 2,
        "world_size": 4,
        "pg_config": [
            {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
            {"pg_name": "5", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": "[2, 3]"},
        ],
    }
    ev = gpu_events(
        x("c10d::recv_", 100, 30),
        x("nccl:recv 0<-1", 105, 20, cat="user_annotation"),
        x("cudaLaunchKernel", 110, 2, cat="cuda_runtime", correlation=9),
        x(
            "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            120,
            40,
            cat="kernel",
            pid=0,
            tid=20,
            correlation=9,
            stream=20,
        ),
    )
    r = parse_file(write(tmp_path / "t.json", trace(ev, distributedInfo=dist)))
    iv = r.intervals
    k = int(np.flatnonzero(iv.stream == 20)[0])
    assert (iv.kind[k], iv.peer[k], iv.direction[k]) == (Kind.P2P, 3, Direction.RECV)


@pytest.mark.parametrize("with_alltoall", [False, True])
def test_sendrecv_without_evidence(tmp_path: Path, with_alltoall: bool) -> None:
    extra = [x("nccl:all_to_all", 300, 10, cat="user_annotation")] if with_alltoall else []
    ev = gpu_events(
        x(
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            120,
            40,
            cat="kernel",
            pid=0,
            tid=20,
            correlation=77,
            stream=20,
        ),
        *extra,
    )
    r = parse_file(write(tmp_path / "t.json", trace(ev, distributedInfo={"backend": "nccl", "rank": 0})))
    iv = r.intervals
    k = int(np.flatnonzero(iv.stream == 20)[0])
    assert iv.kind[k] == (Kind.COLLECTIVE if with_alltoall else Kind.P2P)
    assert iv.peer[k] == -1
    assert r.meta["comm_unclassified"] == 1
    assert any("1 communication kernel" in w for w in r.warnings)


@pytest.mark.parametrize("in_collective", [False, True])
def test_coalesced_p2p(tmp_path: Path, in_collective: bool) -> None:
    # a send and a receive to group rank 1, coalesced into one kernel: a p2p exchange, unless the
    # group runs inside a collective's op (an all-to-all of 2 ranks is exactly this group)
    concrete: dict[str, Any] = {"Concrete Inputs": ["", "", "1", "0"]}  # peer group rank 1
    outer = [x("c10d::alltoall_base_", 95, 80)] if in_collective else []
    dist = {
        "backend": "nccl",
        "rank": 0,
        "world_size": 2,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}],
    }
    ev = gpu_events(
        *outer,
        x("c10d::send", 100, 5, **concrete),
        x("c10d::recv_", 110, 5, **concrete),
        x("nccl:coalesced", 120, 10, cat="user_annotation"),
        x("cudaLaunchKernel", 122, 2, cat="cuda_runtime", correlation=9),
        x(
            "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            130,
            40,
            cat="kernel",
            pid=0,
            tid=20,
            correlation=9,
            stream=20,
        ),
    )
    r = parse_file(write(tmp_path / "t.json", trace(ev, distributedInfo=dist)))
    iv = r.intervals
    k = int(np.flatnonzero(iv.stream == 20)[0])
    if in_collective:
        assert (iv.kind[k], iv.peer[k], iv.direction[k]) == (Kind.COLLECTIVE, -1, Direction.NONE)
    else:
        assert (iv.kind[k], iv.peer[k], iv.direction[k]) == (Kind.P2P, 1, Direction.BOTH)


def test_multiple_devices_keep_streams_apart(tmp_path: Path) -> None:
    ev = [
        x("k", 0, 1, cat="kernel", pid=0, tid=7, stream=7),
        x("k", 2, 1, cat="kernel", pid=1, tid=7, stream=7),
    ]
    r = parse_file(write(tmp_path / "t.json", trace(ev)))
    assert len(set(r.intervals.stream.tolist())) == 2
    assert any("2 devices" in w for w in r.warnings)


def test_lenient_types(tmp_path: Path) -> None:
    # a writer that puts ids in strings and nulls in args still parses (slower, lenient path)
    ev = [
        x("cudaLaunchKernel", 11, 1, cat="cuda_runtime", correlation="5"),
        x("gemm", 20, 10, cat="kernel", pid=0, tid=7, correlation="5", stream=None),
    ]
    r = parse_file(write(tmp_path / "t.json", trace(ev)))
    assert r.intervals.launch[0] == 11_000 and r.intervals.stream[0] == 7


def test_huge_names(tmp_path: Path) -> None:
    big = "k" * 1_000_000
    ev = [
        x(big, 0, 5, cat="kernel", pid=0, tid=7, stream=7),
        x("Forward " + "9" * 5000, 0, 1, cat="user_annotation"),
    ]
    r = parse_file(write(tmp_path / "t.json", trace(ev)))
    assert r.names[int(r.intervals.name[0])] == big


# ----------------------------------------------------------------------------------------------
# damaged files: every complete event before the cut is kept
# ----------------------------------------------------------------------------------------------


def _lined_trace(n: int) -> tuple[bytes, list[int]]:
    """A trace with one event per line and the byte offset just past each event's closing brace."""
    head = (
        b'{"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": 1000000000,\n"traceEvents": [\n'
    )
    parts = [head]
    ends = []
    pos = len(head)
    for i in range(n):
        ev = {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i}",
            "pid": 1,
            "tid": 1,
            "ts": 10.0 * i,
            "dur": 5.0,
            "args": {"External id": i, "Input Dims": [[i, 2], []], "nested": {"a": {"b": i}}},
        }
        s = json.dumps(ev).encode()
        ends.append(pos + len(s))
        s += b",\n" if i < n - 1 else b"\n"
        parts.append(s)
        pos += len(s)
    parts.append(b'],\n"traceName": "t.json"}\n')
    return b"".join(parts), ends


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_keeps_every_complete_event(tmp_path: Path, gz: bool) -> None:
    data, ends = _lined_trace(400)
    # cut points: inside an event, inside nested args, right after a "}", right after "},\n",
    # inside the trailing keys
    cuts = [ends[100] - 7, ends[200] - 3, ends[250], ends[300] + 1, ends[350] + 2, len(data) - 5]
    for cut in cuts:
        if gz:
            comp = gzip.compress(data)
            # cut the compressed stream; the truth is what a streaming gunzip yields from that prefix
            cb = max(20, int(len(comp) * cut / len(data)))
            prefix = zlib.decompressobj(wbits=31).decompress(comp[:cb])
            p = tmp_path / "rank0.json.gz"
            p.write_bytes(comp[:cb])
            avail = len(prefix)
        else:
            p = tmp_path / "rank0.json"
            p.write_bytes(data[:cut])
            avail = cut
        expected = sum(1 for e in ends if e <= avail)
        if expected == 0:
            continue
        r = parse_file(p)
        assert r.events_total == expected, (cut, gz)
        assert len(r.intervals) == expected
        assert r.intervals.start[-1] == 1_000_000_000 + (expected - 1) * 10_000
        if expected < len(ends):
            assert r.warnings and any("truncated" in w for w in r.warnings)
            assert r.events_lost >= (1 if avail > ends[expected - 1] + 2 else 0)


def test_truncated_real_trace(tmp_path: Path) -> None:
    src = shared_trace("kineto/hta_ddp_nccl_rank0.json.gz")
    data = gzip.decompress(src.read_bytes())
    cut = int(len(data) * 0.62)  # Kineto writes GPU events last: keep some
    # independent count: walk the event array with the standard library's raw_decode
    start = data.index(b"[", data.index(b'"traceEvents"')) + 1
    dec = json.JSONDecoder()
    text = data[:cut].decode("utf-8", "replace")
    i, count = len(data[:start].decode()), 0
    while True:
        m = re.compile(r"[\s,]*").match(text, i)
        assert m is not None
        i = m.end()
        try:
            _, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        count += 1
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gzip.compress(data[:cut]))
    r = parse_file(p)
    assert count > 1000
    assert r.events_total == count
    assert r.events_lost >= 1


def test_malformed_event_is_dropped(tmp_path: Path) -> None:
    data, _ = _lined_trace(50)
    # an unescaped quote inside a name, as old writers produced for some Python file names
    bad = data.replace(b'"name": "aten::op20"', b'"name": "aten::op"20"', 1)
    p = tmp_path / "rank0.json"
    p.write_bytes(bad)
    r = parse_file(p)
    assert r.events_total == 49 and r.events_lost == 1
    assert "aten::op20" not in r.names and "aten::op21" in r.names and "aten::op49" in r.names
    assert any("malformed" in w for w in r.warnings)


def test_truncated_after_event_list(tmp_path: Path) -> None:
    data, _ = _lined_trace(30)
    p = tmp_path / "rank0.json"
    p.write_bytes(data[: data.index(b'"traceName"') + 5])
    r = parse_file(p)
    assert r.events_total == 30


# ----------------------------------------------------------------------------------------------
# the real traces (../shared/traces)
# ----------------------------------------------------------------------------------------------

REAL = {
    # file: (rank, rank_source, world_size, cpu_only)
    "kineto/hta_2022_format_rank3.json.gz": (3, "distributedInfo", 8, False),
    "kineto/hta_alltoall_rank0.json.gz": (0, "distributedInfo", 16, False),
    "kineto/hta_ddp_nccl_rank0.json.gz": (0, "distributedInfo", 2, False),
    "kineto/hta_ns_resolution_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": (0, "distributedInfo", 1, False),
    "kineto/kineto_2021_resnet50_worker0.pt.trace.json.gz": (0, "file name", None, False),
    "kineto/tracelens_b200_rank0.json.gz": (0, "distributedInfo", 8, False),
    "kineto/tracelens_h100_single.json.gz": (-1, "none", None, False),
    "kineto/tracelens_mi300_ddp_rank0.json.gz": (0, "distributedInfo", 8, False),
    "kineto/hta_sampled_2rank/sampled_rank-0.json.gz": (0, "distributedInfo", 128, False),
    "kineto/hta_sampled_2rank/sampled_rank-1.json.gz": (1, "distributedInfo", 128, False),
    "kineto/gloo_cpu_2rank/rank0.10013.pt.trace.json": (0, "distributedInfo", 2, True),
    "kineto/gloo_cpu_2rank/rank1.10014.pt.trace.json": (1, "distributedInfo", 2, True),
}

_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "Kernel", "Memcpy", "Memset"}
_COMM_RE = re.compile(r"nccl|rccl", re.IGNORECASE)


def _load_json(p: Path) -> dict[str, Any]:
    raw = p.read_bytes()
    doc: dict[str, Any] = json.loads(
        gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, parse_float=Decimal
    )
    return doc


@pytest.mark.parametrize("rel", sorted(REAL))
def test_real_trace(rel: str) -> None:
    p = shared_trace(rel)
    rank, source, world, cpu_only = REAL[rel]
    r = parse_file(p)
    assert (r.rank, r.rank_source, r.world_size, r.cpu_only) == (rank, source, world, cpu_only)
    # independent counts with the standard library
    doc = _load_json(p)
    evs = doc["traceEvents"]
    assert r.events_total == len(evs)
    iv = r.intervals
    if cpu_only:
        assert len(iv) > 0 and r.device == "cpu"
        assert (iv.kind == Kind.P2P).sum() > 0
        return
    gpu = [e for e in evs if e.get("ph") == "X" and e.get("cat") in _GPU_CATS]
    assert len(iv) == len(gpu) > 0
    kernels = [e for e in gpu if e["cat"] in ("kernel", "Kernel")]
    assert (
        int(((iv.kind == Kind.COMPUTE) | (iv.kind == Kind.P2P) | (iv.kind == Kind.COLLECTIVE)).sum())
        == len(kernels)
        > 0
    )
    comm = [e for e in kernels if _COMM_RE.search(e["name"][:48])]
    assert int(((iv.kind == Kind.P2P) | (iv.kind == Kind.COLLECTIVE)).sum()) == len(comm)
    # times: the earliest GPU op on the absolute clock, computed exactly with Decimal
    base = int(doc.get("baseTimeNanoseconds", 0))
    first = min(base + int((Decimal(e["ts"]) * 1000).to_integral_value()) for e in gpu)
    if base or all(Decimal(e["ts"]) == int(e["ts"]) for e in gpu[:100]):
        assert int(iv.start.min()) == first
    else:
        # 2024-03..05 traces: absolute µs floats; float64 holds them to 0.25 µs (KINETO.md §3)
        assert abs(int(iv.start.min()) - first) <= 125
    assert np.all(iv.end >= iv.start)
    # a kernel never starts before it was launched
    m = iv.launch >= 0
    assert m.mean() > 0.6
    assert np.all(iv.launch[m] <= iv.start[m])


def test_real_launch_join_matches_known_counts() -> None:
    # KINETO.md §6.1: correlation matched 3774/3774 GPU ops in the 2024 DDP sample and 6875/7747
    # in the 2023 all-to-all sample (some launches came from untraced threads)
    ddp = parse_file(shared_trace("kineto/hta_ddp_nccl_rank0.json.gz"))
    assert (int((ddp.intervals.launch >= 0).sum()), len(ddp.intervals)) == (3774, 3774)
    a2a = parse_file(shared_trace("kineto/hta_alltoall_rank0.json.gz"))
    assert (int((a2a.intervals.launch >= 0).sum()), len(a2a.intervals)) == (6875, 7747)


def test_real_alltoall_sendrecv_kernels_are_collective() -> None:
    for rel in (
        "kineto/hta_alltoall_rank0.json.gz",
        "kineto/hta_2022_format_rank3.json.gz",
        "kineto/hta_sampled_2rank/sampled_rank-0.json.gz",
    ):
        r = parse_file(shared_trace(rel))
        iv = r.intervals
        sendrecv = np.array(["SendRecv" in r.names[int(i)] for i in iv.name])
        assert sendrecv.sum() > 0
        assert np.all(iv.kind[sendrecv] == Kind.COLLECTIVE), rel
        assert not np.any(iv.kind == Kind.P2P)


def test_real_ddp_collective_metadata() -> None:
    p = shared_trace("kineto/hta_ddp_nccl_rank0.json.gz")
    r = parse_file(p)
    doc = _load_json(p)
    want = sorted(
        (base_ns := int(doc["baseTimeNanoseconds"])) + int((Decimal(e["ts"]) * 1000).to_integral_value())
        for e in doc["traceEvents"]
        if e.get("cat") == "kernel" and "nccl" in e["name"]
    )
    del base_ns
    iv = r.intervals
    comm = np.flatnonzero(iv.kind == Kind.COLLECTIVE)
    assert sorted(iv.start[comm].tolist()) == want
    nelems = {
        int((Decimal(e["ts"]) * 1000).to_integral_value()) + int(doc["baseTimeNanoseconds"]): e["args"][
            "In msg nelems"
        ]
        * {"Float": 4, "Long": 8}[e["args"]["dtype"]]
        for e in doc["traceEvents"]
        if e.get("cat") == "kernel" and "nccl" in e["name"]
    }
    assert {int(iv.start[i]): int(iv.bytes[i]) for i in comm} == nelems
    assert np.all(iv.group[comm] == 0)
    assert r.process_groups[0].desc == "default_pg"


def test_real_gloo_blocked_time_is_span_tails() -> None:
    p = shared_trace("kineto/gloo_cpu_2rank/rank1.10014.pt.trace.json")
    r = parse_file(p)
    doc = _load_json(p)
    base = int(doc["baseTimeNanoseconds"])

    def ns(v: Any) -> int:
        return base + int((Decimal(v) * 1000).to_integral_value())

    main = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 10014]
    spans = [e for e in main if e["name"].startswith("gloo:")]
    ops = sorted(
        (ns(e["ts"]), ns(e["ts"]) + int((Decimal(e["dur"]) * 1000).to_integral_value()))
        for e in main
        if e["cat"] == "cpu_op"
    )
    # the last op that starts before each span's end; its end (or the span start) opens the tail
    tails = []
    for s in spans:
        s0 = ns(s["ts"])
        s1 = s0 + int((Decimal(s["dur"]) * 1000).to_integral_value())
        before = [b for a, b in ops if a < s1]
        t0 = max(max(before) if before else s0, s0)
        if t0 < s1:
            tails.append((t0, s1))
    iv = r.intervals
    blocked = [
        (int(a), int(b))
        for a, b, n in zip(iv.start, iv.end, iv.name, strict=True)
        if r.names[int(n)].startswith("gloo:")
    ]
    assert sorted(blocked) == sorted(tails)
    assert np.all(iv.peer[iv.kind == Kind.P2P] == 0)
    assert np.all(iv.direction[iv.kind == Kind.P2P] == Direction.RECV)


def test_parse_options_ignored_by_kineto() -> None:
    r = PARSER.parse(TEST_DATA / "cpu_gloo_rank0.json", ParseOptions(nsys_cache_dir="/nonexistent"))
    assert len(r) == 1


def test_trailing_junk_and_non_json_numbers(tmp_path: Path) -> None:
    data, ends = _lined_trace(20)
    p = tmp_path / "rank0.json"
    p.write_bytes(data + b"\x00\x00 garbage")
    r = parse_file(p)
    assert r.events_total == 20 and any("after the end" in w for w in r.warnings)
    # NaN / Infinity (written by some tools) are not JSON; the events carrying them are kept
    nan = data.replace(b'"dur": 5.0', b'"dur": NaN', 3).replace(b'"ts": 50.0', b'"ts": 50.0, "x": -Infinity')
    p.write_bytes(nan)
    r = parse_file(p)
    assert r.events_total == 20 and r.events_lost == 0
    assert any("NaN" in w for w in r.warnings)
    assert int((r.intervals.end == r.intervals.start).sum()) == 3  # unknown durations read as 0
    assert len(ends) == 20


def test_gpu_phase_from_launching_op(tmp_path: Path) -> None:
    ev = [
        x("autograd::engine::evaluate_function: MmBackward0", 100, 50, tid=5),
        x("cudaLaunchKernel", 110, 2, cat="cuda_runtime", tid=5, correlation=11),
        x("bwd_gemm", 130, 10, cat="kernel", pid=0, tid=7, correlation=11, stream=7),
        x("cudaLaunchKernel", 160, 2, cat="cuda_runtime", tid=5, correlation=12),  # outside
        x("fwd_gemm", 170, 10, cat="kernel", pid=0, tid=7, correlation=12, stream=7),
        x("Optimizer.step#AdamW.step", 200, 50, cat="user_annotation", tid=5),
        x("autograd::engine::evaluate_function: X", 205, 20, tid=5),
        x("cudaLaunchKernel", 210, 2, cat="cuda_runtime", tid=5, correlation=13),
        x("adam_kernel", 230, 10, cat="kernel", pid=0, tid=7, correlation=13, stream=7),
        # same times, other thread: not inside that thread's backward op
        x("cudaLaunchKernel", 111, 2, cat="cuda_runtime", tid=6, correlation=14),
        x("other_thread_kernel", 300, 10, cat="kernel", pid=0, tid=8, correlation=14, stream=8),
    ]
    r = parse_file(write(tmp_path / "t.json", trace(ev)))
    phase = dict(zip(names_of(r, r.intervals.name), r.intervals.phase.tolist(), strict=True))
    assert phase == {
        "bwd_gemm": Phase.BWD,
        "fwd_gemm": Phase.UNKNOWN,
        "adam_kernel": Phase.OPTIM,
        "other_thread_kernel": Phase.UNKNOWN,
    }


@pytest.mark.parametrize("label", [None, "PP:0SEND_F0"])
def test_fused_sendrecv_kernel_takes_the_peer_of_the_ops_issued_before_it(
    tmp_path: Path, label: str | None
) -> None:
    """torch.distributed.pipelining over NCCL (batch_isend_irecv): ``c10d::send`` and
    ``c10d::recv_`` each hold a ``record_param_comms`` child that names the peer, then one
    ``nccl:coalesced`` range launches one fused ``ncclDevKernel_SendRecv`` through
    ``cuLaunchKernelEx``; multi-stage schedules wrap it in their ``PP:<s>SEND_F<mb>`` range. The
    kernel carries both: direction BOTH, peer 1, size the larger payload (4096 bf16 = 8192 B)."""
    bf16: dict[str, Any] = {"dtype": "BFloat16"}
    send = {**bf16, "Collective name": "send", "Dst Rank": 1, "In msg nelems": 4096}
    recv = {**bf16, "Collective name": "recv", "Src Rank": 1, "In msg nelems": 2048}
    comm = [
        x("c10d::send", 30, 4),
        x("record_param_comms", 31, 2, **send),
        x("c10d::recv_", 35, 4),
        x("record_param_comms", 36, 2, **recv),
        x("nccl:coalesced", 40, 5, cat="user_annotation"),
        x("cuLaunchKernelEx", 41, 2, cat="cuda_driver", correlation=9),
        x("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 50, 30, cat="kernel", pid=0, tid=16,
          correlation=9, stream=16),
    ]  # fmt: skip
    if label:
        comm.append(x(label, 29, 20, cat="user_annotation"))
    dist = {"backend": "nccl", "rank": 0, "world_size": 2}
    r = parse_file(write(tmp_path / "rank0.json", trace(gpu_events(*comm), distributedInfo=dist)))
    iv = r.intervals
    k = np.flatnonzero(iv.kind == int(Kind.P2P))
    assert len(k) == 1
    assert int(iv.peer[k[0]]) == 1
    assert int(iv.direction[k[0]]) == int(Direction.BOTH)
    assert int(iv.bytes[k[0]]) == 8192
