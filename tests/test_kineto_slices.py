"""Sliced decoding gives the same timeline as decoding the whole document, with less memory."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TEST_DATA, shared_trace

from ppdiag.model import RankTimeline
from ppdiag.parsers import kineto, kineto_slices

BASE: dict[str, Any] = json.loads((TEST_DATA / "gpu_pp_rank0.json").read_text())


def _both(p: Path, monkeypatch: pytest.MonkeyPatch, slice_len: int) -> tuple[RankTimeline, RankTimeline]:
    monkeypatch.setattr(kineto_slices, "SLICE", slice_len)
    sliced = kineto.parse_file(p)
    with monkeypatch.context() as m:
        m.setattr(kineto, "_decode_sliced", lambda data, memo, path="": None)
        whole = kineto.parse_file(p)
    return sliced, whole


def _same(a: RankTimeline, b: RankTimeline) -> None:
    assert a.names == b.names and a.warnings == b.warnings and a.events_total == b.events_total
    for col in ("start", "end", "stream", "kind", "name", "peer", "direction", "phase", "launch"):
        assert np.array_equal(getattr(a.intervals, col), getattr(b.intervals, col)), col
    for col in ("start", "end", "kind", "name", "stage", "mb", "phase", "peer", "group"):
        assert np.array_equal(getattr(a.ranges, col), getattr(b.ranges, col)), col
    assert a.meta == b.meta


@pytest.mark.parametrize("slice_len", [1, 7, 1 << 15])
def test_hand_trace_equal_for_any_slice_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slice_len: int
) -> None:
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(BASE))
    calls: list[int] = []
    real = kineto._decode_sliced

    def spy(data: Any, memo: Any, path: str = "") -> Any:
        calls.append(1)
        return real(data, memo, path)

    monkeypatch.setattr(kineto, "_decode_sliced", spy)
    sliced, whole = _both(p, monkeypatch, slice_len)
    assert calls  # the sliced path ran
    _same(sliced, whole)


def test_dropped_host_ops_still_count_in_the_time_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One kernel without ts, and 50 CPU ops that no later step reads: the warning counts the
    used events of the whole trace in both paths (the 50 dropped ops among them)."""
    d = copy.deepcopy(BASE)
    k = next(e for e in d["traceEvents"] if e.get("cat") == "kernel")
    del k["ts"]
    d["traceEvents"] += [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5.0 + i, "dur": 0.5}
        for i in range(50)
    ]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d))
    sliced, whole = _both(p, monkeypatch, 16)
    _same(sliced, whole)
    assert any("dropped 1 of" in w for w in sliced.warnings)


CPU = json.loads((TEST_DATA / "cpu_gloo_rank0.json").read_text())


def _sliced_ran(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows kept by each sliced decoding (an empty list: the whole-document path ran)."""
    rows: list[int] = []
    real = kineto._decode_sliced

    def spy(data: Any, memo: Any, path: str = "") -> Any:
        got = real(data, memo, path)
        if got is not None:
            assert got.events is not None, "the sliced decoding builds the events' columns"
            rows.append(len(got.events))
        return got

    monkeypatch.setattr(kineto, "_decode_sliced", spy)
    return rows


@pytest.mark.parametrize("slice_len", [1, 7, 1 << 12])
def test_cpu_trace_is_sliced_and_keeps_every_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slice_len: int
) -> None:
    """No GPU category in the bytes: CPU mode reads every CPU op, so every row is kept (flow and
    metadata events too) and the timeline equals the whole-document one."""
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(CPU))
    rows = _sliced_ran(monkeypatch)
    sliced, whole = _both(p, monkeypatch, slice_len)
    assert rows == [len(CPU["traceEvents"])]
    assert sliced.cpu_only
    _same(sliced, whole)


def test_loosely_typed_slices_fall_back_to_lenient_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float pid (strict types refuse it) in one slice of seven: that slice is decoded
    leniently, the others strictly, and the timeline equals the whole-document (lenient) one."""
    d = copy.deepcopy(BASE)
    k = next(e for e in d["traceEvents"] if e.get("cat") == "kernel")
    k["pid"] = float(k["pid"]) + 0.5
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d))
    rows = _sliced_ran(monkeypatch)
    sliced, whole = _both(p, monkeypatch, 7)
    assert len(rows) == 1
    _same(sliced, whole)


def test_gpu_category_without_a_usable_gpu_event_keeps_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU trace plus one kernel without ts: the GPU filter found no usable GPU event, so the
    trace is decoded again keeping every host op, and both paths give the same CPU timeline
    (the dropped kernel counted in the same warning)."""
    d = copy.deepcopy(CPU)
    d["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "dur": 1.0})
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d))
    rows = _sliced_ran(monkeypatch)
    sliced, whole = _both(p, monkeypatch, 5)
    assert rows == [len(d["traceEvents"])]
    assert sliced.cpu_only and any("ts" in w for w in sliced.warnings)
    _same(sliced, whole)


def test_real_gloo_traces_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    for p in sorted(shared_trace("kineto/gloo_cpu_2rank").glob("*.json")):
        sliced, whole = _both(p, monkeypatch, 16)
        _same(sliced, whole)


@pytest.mark.parametrize("rel", ["kineto/hta_2022_format_rank3.json.gz", "kineto/hta_alltoall_rank0.json.gz"])
def test_real_traces_equal(rel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    p = shared_trace(rel)
    sliced, whole = _both(p, monkeypatch, 4096)
    _same(sliced, whole)


@pytest.mark.parametrize("whole", [False, True])
def test_instant_events_reach_the_hook_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    d = copy.deepcopy(BASE)
    d["traceEvents"] += [
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": 1,
            "tid": 1,
            "ts": 5.0 + i,
            "s": "t",
        }
        for i in range(3)
    ]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d))
    seen: list[str] = []
    monkeypatch.setattr(kineto_slices, "_INSTANT_HOOKS", [lambda evs: seen.extend(e.name for e in evs)])
    monkeypatch.setattr(kineto_slices, "SLICE", 5)
    if whole:
        monkeypatch.setattr(kineto, "_decode_sliced", lambda data, memo, path="": None)
    kineto.parse_file(p)
    # every instant event of the trace, in file order (the fixture's own among them)
    assert seen == [e["name"] for e in d["traceEvents"] if e.get("ph") in ("i", "I")]


def test_a_float_tid_is_the_same_thread_whatever_its_slice_holds() -> None:
    """numpy reads an all-number slice (1.0 -> 1); a slice that also holds a string takes the
    per-value path, which must read 1.0 the same way (it read -1, so a lenient trace's timeline
    depended on where the slices fell)."""
    from ppdiag.parsers.kineto_schema import _tids

    assert _tids([1.0, 2.0]).tolist() == [1, 2]
    assert _tids([1.0, "stream 7", float("nan"), 1e300]).tolist() == [1, 7, -1, -1]


def test_flow_and_metadata_stubs_equal_the_full_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flow, metadata and counter events decode as stubs (category and name only) in the
    filtered pass; a slice where the filter keeps one (a GPU category on a B-less phase, an
    unknown phase) is decoded again in full: both paths give the same timeline."""
    d = copy.deepcopy(BASE)
    k = next(e for e in d["traceEvents"] if e.get("cat") == "kernel")
    d["traceEvents"] += [
        {"ph": "s", "cat": "ac2g", "name": "flow", "id": 1, "pid": 1, "tid": 1, "ts": k["ts"]},
        {"ph": "f", "cat": "ac2g", "name": "flow", "id": 1, "pid": 0, "tid": 7, "ts": k["ts"], "bp": "e"},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        {"ph": "C", "cat": "kernel", "name": "counter", "pid": 0, "tid": 7, "ts": k["ts"], "args": {"v": 1}},
        {"ph": "Z", "cat": "cpu_op", "name": "unknown phase", "pid": 1, "tid": 1, "ts": k["ts"]},
    ]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d))
    for slice_len in (1, 3, 1 << 15):
        sliced, whole = _both(p, monkeypatch, slice_len)
        _same(sliced, whole)


def test_in_place_slices_leave_the_text_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gunzipped text is decoded slice by slice in place (two bytes set to ``[``/``]`` and put
    back): the text after the parse is the text before, and the columns equal those of the copied
    slices (a join per slice, the path of immutable text)."""
    from ppdiag.parsers.kineto_bytes import read_bytes
    from ppdiag.parsers.kineto_names import _NameMemo

    monkeypatch.setattr(kineto_slices, "SLICE", 97)
    data, _ = read_bytes(shared_trace("kineto/hta_2022_format_rank3.json.gz"))
    assert isinstance(data, bytearray)
    before = bytes(data)
    got = kineto._decode_sliced(data, _NameMemo(), "x")
    assert got is not None and bytes(data) == before
    monkeypatch.setattr(kineto_slices._Text, "window", lambda self, raws: None)
    copied = kineto._decode_sliced(data, _NameMemo(), "x")
    assert copied is not None and got.events is not None and copied.events is not None
    for col in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "stream", "device", "corr", "nbytes"):
        assert np.array_equal(getattr(got.events, col), getattr(copied.events, col)), col
    assert got.events.names == copied.events.names
    assert {k: bytes(v) for k, v in got.events.args.items()} == {
        k: bytes(v) for k, v in copied.events.args.items()
    }


def test_gpu_category_found_anywhere_in_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tail is searched first, then the whole text: a GPU category only near the start (or
    only in the tail, or spelled with white space) is found; host events alone are not GPU."""
    monkeypatch.setattr(kineto_slices, "_GPU_TAIL", 64)
    host = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0},' * 40
    gpu = b'{"ph": "X", "cat" :  "kernel", "name": "k", "ts": 2.0},'
    assert not kineto_slices.has_gpu_category(b'{"traceEvents": [' + host + b"{}]}")
    assert kineto_slices.has_gpu_category(b'{"traceEvents": [' + gpu + host + b"{}]}")
    assert kineto_slices.has_gpu_category(bytearray(b'{"traceEvents": [' + host + gpu + b"{}]}"))
    # a match that starts before the tail and ends inside it
    text = b'{"traceEvents": [' + host + gpu + b"{}]}"
    monkeypatch.setattr(kineto_slices, "_GPU_TAIL", len(text) - text.find(b'"cat" :') - 3)
    assert kineto_slices.has_gpu_category(text)
