"""Slices cut in the text give the timeline of the skeleton's slices, or leave the trace to them.

Each test writes a trace, parses it with the cut slices (the default) and with the skeleton path
alone (``kineto_cuts.plan`` returning None), and compares the timelines; the spies say which
path decoded the events.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_DATA, shared_trace
from test_kineto_slices import _same

from ppdiag.errors import InputError
from ppdiag.model import RankTimeline
from ppdiag.parsers import kineto, kineto_cuts, kineto_slices
from ppdiag.parsers.kineto_bytes import read_bytes
from ppdiag.parsers.kineto_names import _NameMemo

BASE: dict[str, Any] = json.loads((TEST_DATA / "gpu_pp_rank0.json").read_text())


def _paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which path decoded each parse's events: "cut", or "skeleton" (the cut path gave up)."""
    seen: list[str] = []
    cut, skeleton = kineto_cuts.decode_cut, kineto_slices.decode_sliced

    def spy_cut(*a: Any) -> Any:
        got = cut(*a)
        if got is not None:
            seen.append("cut")
        return got

    def spy_skeleton(*a: Any) -> Any:
        seen.append("skeleton")
        return skeleton(*a)

    monkeypatch.setattr(kineto, "decode_cut", spy_cut)
    monkeypatch.setattr(kineto, "decode_sliced", spy_skeleton)
    return seen


def _both(p: Path, monkeypatch: pytest.MonkeyPatch, slice_len: int) -> tuple[RankTimeline, RankTimeline]:
    """(cut slices where they hold, skeleton slices alone) of the trace at ``p``."""
    monkeypatch.setattr(kineto_slices, "SLICE", slice_len)
    cut = kineto.parse_file(p)
    with monkeypatch.context() as m:
        m.setattr(kineto_cuts, "plan", lambda data, step: None)
        skeleton = kineto.parse_file(p)
    return cut, skeleton


def _write(tmp_path: Path, doc: Any, indent: int | None = None) -> Path:
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc, indent=indent))
    return p


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("slice_len", [1, 3, 1 << 12])
def test_cut_slices_equal_the_skeleton_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slice_len: int, indent: int | None
) -> None:
    """Compact and pretty-printed text, one event per slice up to one slice in all: the cut
    path decodes the events, without the skeleton, and gives the same timeline."""
    p = _write(tmp_path, BASE, indent)
    seen = _paths(monkeypatch)
    cut, skeleton = _both(p, monkeypatch, slice_len)
    assert seen == ["cut", "skeleton"]
    _same(cut, skeleton)


def test_fields_after_the_array_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch writes the time base after the events: the cut path reads it there as the skeleton
    does (set to 2,000,000 ns, not the fixture's, so that a base read from anywhere else shows)."""
    doc = {k: v for k, v in BASE.items() if k not in ("traceEvents", "baseTimeNanoseconds")}
    doc["traceEvents"] = BASE["traceEvents"]
    doc["baseTimeNanoseconds"] = 2_000_000
    p = _write(tmp_path, doc)
    seen = _paths(monkeypatch)
    cut, skeleton = _both(p, monkeypatch, 1)
    assert seen == ["cut", "skeleton"]
    _same(cut, skeleton)
    assert cut.meta["time_base_ns"] == 2_000_000


def test_objects_after_the_array_are_left_to_the_skeleton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list of objects after the events (the devices, written last): its ``},{`` is taken for
    the end of the event array, the slice across the real end does not decode, and the skeleton
    path reads the trace (the same timeline as when it reads it alone)."""
    doc = {k: v for k, v in BASE.items() if k not in ("traceEvents", "deviceProperties")}
    doc["traceEvents"] = BASE["traceEvents"]
    doc["deviceProperties"] = BASE["deviceProperties"] * 3
    p = _write(tmp_path, doc)
    seen = _paths(monkeypatch)
    cut, skeleton = _both(p, monkeypatch, 1)
    assert seen == ["skeleton", "skeleton"]
    _same(cut, skeleton)


def test_a_cut_inside_an_event_falls_back_to_the_skeleton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every event's args hold a list of objects: most cuts fall inside an event, the slice ending
    there is not a JSON array, and the skeleton path decodes the trace (once: the instant-event
    hooks see each event once)."""
    doc = copy.deepcopy(BASE)
    for e in doc["traceEvents"]:
        e.setdefault("args", {})["nested"] = [{"a": 1}, {"b": 2}, {"c": 3}]
    p = _write(tmp_path, doc)
    hooked: list[str] = []
    monkeypatch.setattr(kineto_slices, "_INSTANT_HOOKS", [lambda evs: hooked.extend(e.name for e in evs)])
    seen = _paths(monkeypatch)
    monkeypatch.setattr(kineto_slices, "SLICE", 1)
    kineto.parse_file(p)
    assert seen == ["skeleton"]
    assert hooked == [e["name"] for e in doc["traceEvents"] if e.get("ph") in ("i", "I")]


@pytest.mark.parametrize("where", ["nested-before", "second-key"])
def test_events_key_in_an_odd_place_is_left_to_the_skeleton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A ``traceEvents`` key inside an earlier field (the first match in the text is not the
    document's), or a second top-level one (JSON's last key wins): the cut path proves neither,
    and the skeleton path reads the document's own events."""
    doc = copy.deepcopy(BASE)
    events = doc.pop("traceEvents")
    if where == "nested-before":
        doc = {"meta": {"traceEvents": events[:5]}, **doc, "traceEvents": events}
    else:
        doc = {"traceEvents": events[:5], **doc, "traceEvents2": None}
        text = json.dumps(doc).replace('"traceEvents2": null', '"traceEvents": ' + json.dumps(events))
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc) if where == "nested-before" else text)
    seen = _paths(monkeypatch)
    tl = kineto.parse_file(p)
    assert seen == ["skeleton"]
    assert tl.events_total == len(events)


def test_empty_array_is_left_to_the_whole_document_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = copy.deepcopy(BASE)
    doc["traceEvents"] = []
    p = _write(tmp_path, doc)
    seen = _paths(monkeypatch)
    with pytest.raises(InputError, match="empty trace"):
        kineto.parse_file(p)
    assert seen == ["skeleton"]


def test_in_place_cut_slices_leave_the_text_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gunzipped text is decoded in place (two bytes set to ``[``/``]`` and put back per
    slice): the text after is the text before, and the columns equal those of slices copied out of
    immutable text."""
    import numpy as np

    monkeypatch.setattr(kineto_slices, "SLICE", 97)
    data, _ = read_bytes(shared_trace("kineto/hta_2022_format_rank3.json.gz"))
    assert isinstance(data, bytearray)
    before = bytes(data)
    seen = _paths(monkeypatch)
    got = kineto._decode_sliced(data, _NameMemo(), "x")
    assert got is not None and bytes(data) == before
    copied = kineto._decode_sliced(before, _NameMemo(), "x")
    assert seen == ["cut", "cut"]
    assert copied is not None and got.events is not None and copied.events is not None
    for col in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "stream", "device", "corr", "nbytes"):
        assert np.array_equal(getattr(got.events, col), getattr(copied.events, col)), col
    assert got.events.names == copied.events.names
    assert got.kept_events == copied.kept_events == 109_123


@pytest.mark.parametrize(
    "rel",
    [
        "kineto/tracelens_b200_rank0.json.gz",  # pretty-printed, devices and groups as object lists
        "kineto/hta_ns_resolution_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    ],
)
def test_real_traces_cut_equal_skeleton(rel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _paths(monkeypatch)
    cut, skeleton = _both(shared_trace(rel), monkeypatch, 512)
    assert seen == ["cut", "skeleton"]
    _same(cut, skeleton)


ARGS_BATCHES = [
    # plain ints; one event without args, one with "args": null
    [b'{"stream":7,"device":0,"correlation":12,"bytes":64}', b"", b"null", b'{"correlation":3}'],
    # an unread field mistyped: the full args Struct reads the batch leniently, the narrow one not
    [b'{"stream":7,"correlation":12,"Seq":"x"}', b'{"correlation":5,"External id":1.5}'],
    # the read fields mistyped: floats, text, bool, an id beyond int64, ROCm's string bytes
    [b'{"stream":7.0,"device":"1","correlation":true,"bytes":"128"}', b'{"correlation":2.5}'],
    [b'{"correlation":340282366920938463463374607431768211455}', b'{"correlation":-1,"bytes":null}'],
    [b'{"stream":[1],"device":{"a":1},"correlation":"12"}'],
]


@pytest.mark.parametrize("rows", ARGS_BATCHES)
def test_narrow_args_read_what_the_full_args_read(rows: list[bytes]) -> None:
    """GPU ops and runtime calls decode their args with Structs of the four (one) fields read:
    every column equals the one read from the full args Struct, whatever the batch's typing."""
    import msgspec
    import numpy as np

    from ppdiag.parsers.kineto_schema import _STRICT, _col, _decode_args, _i64
    from ppdiag.parsers.kineto_table import _arg_corr, _arg_ints

    raws = [msgspec.Raw(r) for r in rows]
    full = [a if a is not None else _STRICT.args() for a in _decode_args(raws)]
    want = (
        _i64(_col(full, "stream")),
        _i64(_col(full, "device")),
        _i64(_col(full, "correlation"), name="correlation", path="x"),
        _i64(_col(full, "nbytes")),
    )
    got = _arg_ints(raws, "x")
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w, g)
    assert np.array_equal(_arg_corr(raws, "x"), want[2])
