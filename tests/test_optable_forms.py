"""Op tables and op timelines as they come: metadata at the end of the array or absent, step-relative
times, lanes numbered by rank, TP ranks left untraced, compressed under a plain name, a run
directory holding one table, and the gradient clip's wait as communication."""

from __future__ import annotations

import bz2
import json
from pathlib import Path

import pandas as pd
import pytest

from ppdiag.api import Options, diagnose
from ppdiag.errors import InputError
from ppdiag.parsers.detect import HEAD_BYTES, read_head
from ppdiag.parsers.loader import detect_format, load_run
from ppsynth.optable import OpTableParams, simulate_optable, write_chrome, write_table

# enough steps that the array passes the sniffed head (64 KiB) long before its metadata
BIG = OpTableParams(pp=4, dp=2, microbatches=4, steps=tuple(range(1, 13)), seed=2)


def _placement(path: Path) -> dict[int, tuple[int, int]]:
    run = load_run([path], jobs=1, progress=False)
    return {r.rank: (int(r.meta["pp_rank"]), int(r.meta["pipeline"])) for r in run.ranks}


@pytest.mark.parametrize("meta", ["last", "middle", "none"])
def test_timeline_metadata_anywhere_or_absent(tmp_path: Path, meta: str) -> None:
    df, _ = simulate_optable(BIG)
    first = write_chrome(df, tmp_path / "first.json")
    path = write_chrome(df, tmp_path / f"{meta}.json", meta=meta)
    head = read_head(path)
    assert len(head) == HEAD_BYTES and b"thread_name" not in head  # the lanes are not in the head
    assert detect_format(path) == ("optimeline", "")
    # Megatron's order with tp 1: rank = stage * 2 + replica, the same with the lanes named or not
    assert _placement(path) == _placement(first) == {s * 2 + d: (s, d) for s in range(4) for d in range(2)}


def test_timeline_without_names_orders_stages_by_time(tmp_path: Path) -> None:
    # lanes numbered against the stage order (stage 3's lanes first) and no metadata: the stages
    # come from when each lane's first forward starts (stage s waits for stage s - 1)
    df, _ = simulate_optable(OpTableParams(pp=4, dp=2, microbatches=4, steps=(1, 2)))
    path = write_chrome(df, tmp_path / "t.json", meta="none")
    events = json.loads(path.read_text())
    for e in events:
        e["tid"] = (3 - e["tid"] // 10) * 10 + e["tid"] % 10
    path.write_text(json.dumps(events))
    assert _placement(path) == {s * 2 + d: (s, d) for s in range(4) for d in range(2)}
    run = load_run([path], jobs=1, progress=False)
    assert any("no 'PP rank s, TP rank t' lane names" in w for w in run.warnings)


def test_step_relative_timeline_is_laid_like_the_table(tmp_path: Path) -> None:
    df, _ = simulate_optable(OpTableParams(pp=2, dp=2, microbatches=4, steps=(4, 9, 11)))
    laid = diagnose([write_chrome(df, tmp_path / "laid.json")], Options(progress=False, jobs=1)).result
    rel_path = write_chrome(df, tmp_path / "rel.json", relative=True)
    rel = diagnose([rel_path], Options(progress=False, jobs=1)).result
    assert any("step-relative" in w for w in rel.run.warnings)
    assert rel.run.steps == laid.run.steps == [4, 9, 11]
    assert laid.summary.step_ms is not None and rel.summary.step_ms is not None
    assert abs(rel.summary.step_ms - laid.summary.step_ms) <= 1e-3


def test_tp_ranks_untraced_make_a_world_of_tp_pp_dp(tmp_path: Path) -> None:
    # pp 4 x dp 2 x tp 4, TP rank 0 traced: ranks 0, 4, ..., 28 of a world of 32
    p = OpTableParams(pp=4, dp=2, microbatches=4, steps=(1, 2), tp=4)
    df, _ = simulate_optable(p)
    table = write_table(df, tmp_path / "ops.csv")
    rep = diagnose([table], Options(progress=False, jobs=1)).result
    assert rep.run.world_size == 32 and rep.run.ranks == list(range(0, 32, 4))
    assert not [w for w in rep.run.warnings if "outside world size" in w]
    assert any(
        "tensor-parallel size 4" in w and "4 x 4 x 2 = 32 ranks, 8 traced" in w for w in rep.run.warnings
    )
    # M = 4 < 2 x pp: PP008 speaks, with the table's tp: dp = 32 / (4 x 4) = 2
    pp008 = next(f for f in rep.findings if f.code == "PP008")
    assert pp008.evidence.as_dict().get("tp") == 4 and pp008.evidence.as_dict().get("dp") == 2, pp008.evidence
    # the timeline whose lane ids name the ranks keeps them; without them Megatron's order of tp 1
    named = write_chrome(df, tmp_path / "named.json", meta="last", rank_tids=True)
    assert sorted(_placement(named)) == list(range(0, 32, 4))
    plain = write_chrome(df, tmp_path / "plain.json")
    assert sorted(_placement(plain)) == list(range(8))


def test_ranks_out_of_megatron_order_keep_the_traced_world(tmp_path: Path) -> None:
    df, _ = simulate_optable(OpTableParams(pp=2, dp=2, microbatches=2, steps=(1,)))
    df["rank"] = df["rank"].map({0: 3, 1: 0, 2: 2, 3: 1})  # no tp fits this order
    run = load_run([write_table(df, tmp_path / "ops.csv")], jobs=1, progress=False)
    assert run.world_size == 4 and not any("tensor-parallel" in w for w in run.warnings)


def test_clip_wait_is_communication_not_compute(tmp_path: Path) -> None:
    # pp 2, dp 1, one micro-batch, one step (ms). Stage 1 is slow (F 4, B 8), so the gradient
    # clip's all-reduce waits on stage 1 for stage 0's backward:
    #   rank 0: F 0-2, send 2-2.05, backward-recv 2.05-14.2, B 14.2-18.2, clip 18.2-18.3
    #   rank 1: recv 0-2.1, F 2.1-6.1, B 6.1-14.1, send 14.1-14.15, clip 14.15-18.3
    #   both:   optimizer 18.3-19.3
    # rank 1 computes F 4 + B 8 + optimizer 1 = 13 ms; its 4.15 ms in the clip are a wait
    rows = [
        (0, "forward-compute", 0.0, 2.0, 0),
        (0, "forward-send", 2.0, 0.05, 0),
        (0, "backward-recv", 2.05, 12.15, 0),
        (0, "backward-compute", 14.2, 4.0, 0),
        (0, "optimizer-clip-main-grad", 18.2, 0.1, -1),
        (0, "optimizer", 18.3, 1.0, -1),
        (1, "forward-recv", 0.0, 2.1, 0),
        (1, "forward-compute", 2.1, 4.0, 0),
        (1, "backward-compute", 6.1, 8.0, 0),
        (1, "backward-send", 14.1, 0.05, 0),
        (1, "optimizer-clip-main-grad", 14.15, 4.15, -1),
        (1, "optimizer", 18.3, 1.0, -1),
    ]
    df = pd.DataFrame(
        [
            {"dp_rank": 0, "stage": s, "rank": s, "step": 1, "optype": op, "start_ts": t / 1e3}
            | {"duration": d / 1e3, "mb_id": mb}
            for s, op, t, d, mb in rows
        ]
    )
    path = tmp_path / "ops.csv"
    df.to_csv(path, index=False)
    rep = diagnose([path], Options(progress=False, jobs=1)).result
    by = {r.rank: r for r in rep.ranks}
    assert by[1].compute_ms == pytest.approx(13.0, abs=0.01)
    assert by[0].compute_ms == pytest.approx(7.0, abs=0.01)
    # the clip's wait is lost time on rank 1, not busy time
    assert sum(by[1].lost_ms.values()) == pytest.approx(by[1].step_ms - 13.0, abs=0.01)


def test_table_compressed_under_a_plain_name(tmp_path: Path) -> None:
    df, _ = simulate_optable(OpTableParams(pp=2, dp=1, microbatches=2, steps=(1,)))
    plain = write_table(df, tmp_path / "plain.csv")
    packed = tmp_path / "ops.csv"
    packed.write_bytes(bz2.compress(plain.read_bytes()))
    assert detect_format(packed)[0] == "optable"
    assert [r.rank for r in load_run([packed], jobs=1, progress=False).ranks] == [0, 1]


def test_run_directory_with_one_table(tmp_path: Path) -> None:
    df, _ = simulate_optable(OpTableParams(pp=2, dp=2, microbatches=2, steps=(1,)))
    d = tmp_path / "run"
    d.mkdir()
    write_table(df, d / "ops.csv")
    (d / "notes.csv").write_text("a,b\n1,2\n")  # a CSV that is no op table: skipped, said
    run = load_run([d], jobs=1, progress=False)
    assert [r.rank for r in run.ranks] == [0, 1, 2, 3] and not run.skipped
    # a second table: both named
    write_table(df, d / "again.jsonl")
    with pytest.raises(InputError) as e:
        load_run([d], jobs=1, progress=False)
    assert "2 op tables" in e.value.message and "again.jsonl" in e.value.message
    assert "ops.csv" in e.value.message


def test_table_beside_per_rank_traces_names_both(tmp_path: Path, test_data: Path) -> None:
    kineto = next(p for p in sorted(test_data.iterdir()) if detect_format(p)[0] == "kineto")
    df, _ = simulate_optable(OpTableParams(pp=2, dp=1, microbatches=2, steps=(1,)))
    d = tmp_path / "run"
    d.mkdir()
    write_table(df, d / "ops.csv")
    (d / kineto.name).write_bytes(kineto.read_bytes())
    with pytest.raises(InputError) as e:
        load_run([d], jobs=1, progress=False)
    assert "ops.csv" in e.value.message and kineto.name in e.value.message


def test_no_traces_error_lists_every_format(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    (d / "readme.txt").write_text("nothing")
    with pytest.raises(InputError) as e:
        load_run([d], jobs=1, progress=False)
    msg = e.value.message
    for what in ("*.json.gz", "*.sqlite", "*.nsys-rep", "*.csv", "*.jsonl", "*.parquet", "op timeline"):
        assert what in msg, what


def test_waits_cut_from_the_timeline_are_put_back(tmp_path: Path) -> None:
    # every communication op drawn as its last 50 µs (the writer cut the wait for the peers):
    # the replica that waits 10+ ms per step in the reduce-scatter for the slow worker's replica
    # shows that wait again, as the table does, and nothing is extended in the uncut timeline
    p = OpTableParams(pp=4, dp=2, microbatches=4, steps=(1, 2, 3), slow_worker=(1, 2, 1.3))
    df, _ = simulate_optable(p)
    table = diagnose([write_table(df, tmp_path / "ops.csv")], Options(progress=False, jobs=1)).result
    cut = diagnose(
        [write_chrome(df, tmp_path / "cut.json", transfer_ms=0.05)], Options(progress=False, jobs=1)
    ).result
    uncut = diagnose([write_chrome(df, tmp_path / "uncut.json")], Options(progress=False, jobs=1)).result
    assert any("transfer only" in w for w in cut.run.warnings)
    assert not any("transfer only" in w for w in uncut.run.warnings + table.run.warnings)
    step = table.summary.step_mean_ms
    assert step is not None
    # within 1.5 % of the step per rank and cause: a restored receive starts after the send before
    # it ends (as on a rank that calls them in turn), where the generator's send ran beside it
    want = {r.rank: r for r in table.ranks}
    for r in cut.ranks:
        for k, v in r.lost_ms.items():
            assert abs(v - want[r.rank].lost_ms[k]) <= 0.015 * step, (r.rank, k, v, want[r.rank].lost_ms[k])
    found = {(f.code, tuple(f.ranks)) for f in cut.findings}
    assert found == {(f.code, tuple(f.ranks)) for f in table.findings}


def test_negative_duration_kept_as_zero_length(tmp_path: Path) -> None:
    # one rank's gradient-clip op of one step 30 µs "long" backwards (two timers apart): dropping
    # it would leave that collective a member short and read as a hang (PP013)
    p = OpTableParams(pp=2, dp=2, microbatches=4, steps=(1, 2, 3))
    df, _ = simulate_optable(p)
    clip = df[df["optype"] == "optimizer"].copy()
    clip["optype"] = "optimizer-clip-main-grad"
    clip["duration"] = 0.0001
    df = pd.concat([df, clip], ignore_index=True)
    one = df.index[(df["optype"] == "optimizer-clip-main-grad") & (df["rank"] == 1) & (df["step"] == 2)]
    df.loc[one, "duration"] = -30e-6
    rep = diagnose([write_table(df, tmp_path / "ops.csv")], Options(progress=False, jobs=1)).result
    said = "1 ops with a negative duration (down to -30.0 µs) kept as zero-length"
    assert any(said in w for w in rep.run.warnings)
    assert "PP013" not in {f.code for f in rep.findings}
    assert rep.run.steps == [1, 2, 3]
