"""Events and fields a trace should not hold: each is counted in one warning naming the file (the
analysis goes on with the rest), or refused in one line naming the field. Never a crash."""

from __future__ import annotations

import bz2
import copy
import gzip
import json
import lzma
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_DATA

from ppdiag.errors import InputError
from ppdiag.model import Run
from ppdiag.parsers.kineto import parse_file
from ppdiag.parsers.loader import load_run

BASE: dict[str, Any] = json.loads((TEST_DATA / "gpu_pp_rank0.json").read_text())


def _trace(mutate: Any = None) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    if mutate:
        mutate(d)
    return d


def _write(tmp_path: Path, d: dict[str, Any] | bytes, name: str = "rank0.json") -> Path:
    p = tmp_path / name
    p.write_bytes(d if isinstance(d, bytes) else json.dumps(d).encode())
    return p


def _kernels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in d["traceEvents"] if e.get("cat") == "kernel"]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, "ts missing, null, text or not finite"),
        ("12.5", "ts missing, null, text or not finite"),
        (True, "ts missing, null, text or not finite"),
        (1e300, "ts out of range"),
        ("absent", "ts missing, null, text or not finite"),
    ],
)
def test_bad_ts_is_dropped_and_counted(tmp_path: Path, value: Any, why: str) -> None:
    def mutate(d: dict[str, Any]) -> None:
        k = _kernels(d)[0]
        if value == "absent":
            del k["ts"]
        else:
            k["ts"] = value

    tl = parse_file(_write(tmp_path, _trace(mutate)))
    hits = [w for w in tl.warnings if "unusable times" in w]
    assert len(hits) == 1 and why in hits[0] and hits[0].startswith("dropped 1 of "), tl.warnings


def test_negative_dur_is_counted(tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        _kernels(d)[1]["dur"] = -5.0
        _kernels(d)[2]["dur"] = -1.0

    tl = parse_file(_write(tmp_path, _trace(mutate)))
    (w,) = [w for w in tl.warnings if "negative dur" in w]
    assert w.startswith("2 of ") and w.endswith("events read as zero-length (2 with a negative dur)")


def test_begin_end_kernels_are_read(tmp_path: Path) -> None:
    """Every kernel as a B/E pair: the same kernels as the X trace, and a note saying so."""
    ref = parse_file(_write(tmp_path, _trace(), "x.json"))

    def mutate(d: dict[str, Any]) -> None:
        out = []
        for e in d["traceEvents"]:
            if e.get("cat") == "kernel" and e.get("ph") == "X":
                b = {**e, "ph": "B"}
                b.pop("dur")
                en = {k: v for k, v in e.items() if k not in ("dur", "args")}
                en.update(ph="E", ts=e["ts"] + e["dur"])
                out += [b, en]
            else:
                out.append(e)
        d["traceEvents"] = out

    tl = parse_file(_write(tmp_path, _trace(mutate)))
    assert any("written as B/E pairs read as complete events" in w for w in tl.warnings), tl.warnings
    assert len(tl.intervals) == len(ref.intervals)
    assert (tl.intervals.start == ref.intervals.start).all() and (tl.intervals.end == ref.intervals.end).all()


def test_unpaired_and_other_ph_kernels_are_counted(tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        k = _kernels(d)
        k[0]["ph"] = "B"  # never ends
        k[1]["ph"] = "i"

    tl = parse_file(_write(tmp_path, _trace(mutate)))
    (w,) = [w for w in tl.warnings if "not complete (ph X)" in w]
    assert w.startswith("dropped 2 GPU events") and "1 unpaired B/E, 1 with another ph" in w


def test_base_time_not_a_number_is_said(tmp_path: Path) -> None:
    tl = parse_file(_write(tmp_path, _trace(lambda d: d.update(baseTimeNanoseconds="abc"))))
    assert any("baseTimeNanoseconds 'abc' is not a number" in w for w in tl.warnings), tl.warnings


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["distributedInfo"].update(rank=10**30), "distributedInfo.rank"),
        (lambda d: d["distributedInfo"].update(world_size=-(10**20)), "distributedInfo.world_size"),
        (lambda d: d.update(baseTimeNanoseconds=10**19), "baseTimeNanoseconds"),
        (lambda d: d.update(baseTimeNanoseconds=1e19), "baseTimeNanoseconds"),
    ],
)
def test_out_of_range_fields_name_the_field(tmp_path: Path, mutate: Any, field: str) -> None:
    # (a link id beyond 64 bits is read, not refused: tests/test_hostile_inputs.py)
    p = _write(tmp_path, _trace(mutate))
    with pytest.raises(InputError) as ei:
        load_run([p], progress=False)
    assert str(ei.value).startswith(f"{p}: {field} = ") and "out of range" in str(ei.value)


def test_invalid_utf8_in_a_name_is_replaced(tmp_path: Path) -> None:
    raw = json.dumps(_trace()).encode()
    name = _kernels(BASE)[0]["name"].encode()
    raw = raw.replace(name, name[:5] + b"\xff\xfe" + name[5:], 1)
    tl = parse_file(_write(tmp_path, raw))
    assert any("invalid UTF-8 byte sequence(s) in names replaced" in w for w in tl.warnings), tl.warnings
    assert any("\ufffd" in n for n in tl.names)


@pytest.mark.parametrize("pack", [bz2.compress, lzma.compress])
def test_bzip2_and_xz_are_read(tmp_path: Path, pack: Any) -> None:
    """The standard library reads both: the rank is kept, and the warning says what it was."""
    p = _write(tmp_path, pack(json.dumps(BASE).encode()), "rank0.pt.trace.json.gz")
    ref = parse_file(_write(tmp_path, BASE, "ref.json"))
    run = load_run([p], progress=False)
    (tl,) = run.ranks
    assert len(tl.intervals) == len(ref.intervals)
    assert any("-compressed data under a .gz name: read as" in w for w in run.warnings), run.warnings
    cut = _write(tmp_path, pack(json.dumps(BASE).encode())[:200], "rank1.pt.trace.json.gz")
    with pytest.raises(InputError, match=r"stream ends early|corrupt|cut short"):
        load_run([cut], progress=False)


@pytest.mark.parametrize(
    ("pack", "what"),
    [
        (lambda b: b"\x28\xb5\x2f\xfd" + b"\x00" * 32, "zstd-compressed data"),
        (lambda b: b"\x04\x22\x4d\x18" + b"\x00" * 32, "lz4-compressed data"),
    ],
)
def test_other_compression_under_a_gz_name(tmp_path: Path, pack: Any, what: str) -> None:
    p = _write(tmp_path, pack(json.dumps(BASE).encode()), "rank1.pt.trace.json.gz")
    with pytest.raises(InputError, match=what):
        load_run([p], progress=False)
    # in a directory it is skipped, said, and recorded as a rank the run lacks
    good = tmp_path / "rank0.pt.trace.json.gz"
    good.write_bytes(gzip.compress(json.dumps(BASE).encode()))
    run = load_run([tmp_path], progress=False)
    assert any(what in w for w in run.warnings)
    assert len(run.skipped) == 1 and what in run.skipped[0]


def test_pipe_is_not_called_empty(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_run([fifo], progress=False)


def test_traces_in_subdirectories_are_said(tmp_path: Path) -> None:
    _write(tmp_path, _trace(), "rank0.json")
    (tmp_path / "old").mkdir()
    _write(tmp_path / "old", _trace(), "rank0.json")
    run = load_run([tmp_path], progress=False)
    assert any("trace files in subdirectories not read (old/)" in w for w in run.warnings), run.warnings


def test_gzip_bomb_is_refused_within_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 MiB of blanks inside an unterminated array: ~64 KB compressed, a 1000x ratio
    body = b'{"traceEvents": [' + b" " * (64 << 20)
    p = _write(tmp_path, gzip.compress(body, compresslevel=6), "rank0.json.gz")
    monkeypatch.setenv("PPDIAG_MAX_TRACE_GB", str(16 / 1024))  # a 16 MiB cap
    with pytest.raises(InputError, match="refused as a likely gzip bomb") as ei:
        load_run([p], progress=False, jobs=1)
    assert str(ei.value).startswith(f"{p}: gzip data expands past 16.0 MiB")


# ------------------------------------------------------------------ ranks against each other


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from ppsynth.kineto import write_kineto
    from ppsynth.scenario import make_scenario

    d = tmp_path_factory.mktemp("two")
    paths = write_kineto(make_scenario(pp=2, microbatches=4, steps=2), d, gzip=False, groundtruth=False)
    return [json.loads(p.read_text()) for p in paths]


def _run_of(tmp_path: Path, traces: list[dict[str, Any]]) -> Run:
    for i, t in enumerate(traces):
        _write(tmp_path, t, f"rank{i}.json")
    return load_run([tmp_path], progress=False, jobs=1)


def test_rank_from_another_day_is_named(tmp_path: Path, two_ranks: list[dict[str, Any]]) -> None:
    a, b = copy.deepcopy(two_ranks)
    b["baseTimeNanoseconds"] = int(b.get("baseTimeNanoseconds") or 0) + 86400 * 10**9
    if not two_ranks[1].get("baseTimeNanoseconds"):
        for e in b["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += 86400e6
    run = _run_of(tmp_path, [a, b])
    assert any("trace starts" in w and "another run" in w for w in run.doubts), run.warnings
    assert run.doubts[0].startswith(("rank 0:", "rank 1:"))
    (tmp_path / "ok").mkdir()
    assert _run_of(tmp_path / "ok", copy.deepcopy(two_ranks)).doubts == []


def test_world_sizes_that_disagree_are_named(tmp_path: Path, two_ranks: list[dict[str, Any]]) -> None:
    a, b = copy.deepcopy(two_ranks)
    b["distributedInfo"]["world_size"] = 8
    run = _run_of(tmp_path, [a, b])
    (w,) = [w for w in run.doubts if "world_size differs" in w]
    assert "2 on rank(s) 0" in w and "8 on rank(s) 1" in w


def test_every_change_of_a_file_is_one_warning(tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        k = _kernels(d)
        k[0]["ts"] = None  # dropped
        k[1]["dur"] = -3.0  # zero-length
        k[2]["ph"] = "i"  # not a complete event

    tl = parse_file(_write(tmp_path, _trace(mutate)))
    (w,) = [w for w in tl.warnings if "dropped" in w or "zero-length" in w]
    assert "dropped 1 GPU events that are not complete" in w
    assert "dropped 1 of " in w and "events read as zero-length (1 with a negative dur)" in w


def test_only_unusable_gpu_events_are_not_called_missing_cuda(tmp_path: Path) -> None:
    def mutate(d: dict[str, Any]) -> None:
        for e in d["traceEvents"]:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation"):
                e["ph"] = "i"

    p = _write(tmp_path, _trace(mutate))
    with pytest.raises(InputError) as ei:
        load_run([p], progress=False)
    text = str(ei.value)
    assert "no usable GPU events (dropped" in text and "not complete (ph X)" in text
    assert "ProfilerActivity.CUDA" not in text
