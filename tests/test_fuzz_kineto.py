"""Fuzzing the Kineto parser (and the analysis behind it) over mutated small traces.

The only outcomes allowed are a result or an InputError (exit 0 or 2): no other exception, which
the CLI would turn into exit 70. Mutations are field values no profiler writes (null, bool, text,
huge or negative numbers, control characters, containers) and byte damage (cuts, flips)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec
import pytest
from conftest import TEST_DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppdiag.api import Options, analyze_run
from ppdiag.errors import InputError
from ppdiag.parsers.loader import load_run
from ppdiag.report_types import Report

TRACES = {p.name: json.loads(p.read_text()) for p in sorted(TEST_DATA.glob("*.json"))}
EV_FIELDS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args")
ARG_FIELDS = (
    "correlation",
    "stream",
    "device",
    "External id",
    "Process Group Name",
    "Process Group Ranks",
    "Src Rank",
    "Dst Rank",
    "In msg nelems",
    "Collective name",
    "Input Dims",
)
TOP_FIELDS = ("distributedInfo", "baseTimeNanoseconds", "deviceProperties", "schemaVersion")

weird = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e300, -1e300, 0, -1, 2**63, 10**19]),
    st.text(max_size=12),
    st.sampled_from(["\x1b[31m", "X", "B", "E", "i", "kernel", "ProfilerStep#3", "nccl:send 0->1", "[0, 1]"]),
    st.lists(st.integers(-5, 5), max_size=4),
    st.dictionaries(
        st.sampled_from(["rank", "world_size", "pg_config"]), st.integers(-3, 10**30), max_size=2
    ),
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(TRACES)))
    doc = copy.deepcopy(TRACES[name])
    evs = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["event", "arg", "top", "drop", "dup"]))
        i = draw(st.integers(0, len(evs) - 1)) if evs else 0
        if kind == "event" and evs:
            evs[i][draw(st.sampled_from(EV_FIELDS))] = draw(weird)
        elif kind == "arg" and evs:
            args = evs[i].get("args")
            if not isinstance(args, dict):
                args = evs[i]["args"] = {}
            args[draw(st.sampled_from(ARG_FIELDS))] = draw(weird)
        elif kind == "top":
            doc[draw(st.sampled_from(TOP_FIELDS))] = draw(weird)
        elif kind == "drop" and evs:
            del evs[i]
        elif kind == "dup" and evs:
            evs.insert(i, copy.deepcopy(evs[i]))
    raw = json.dumps(doc).encode()
    damage = draw(st.sampled_from(["none", "none", "cut", "flip"]))
    if damage == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif damage == "flip":
        pos = draw(st.integers(0, len(raw) - 1))
        raw = raw[:pos] + bytes([draw(st.integers(0, 255))]) + raw[pos + 1 :]
    return name, raw


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(case=mutated())
def test_mutated_traces_give_a_result_or_an_input_error(tmp_path: Path, case: tuple[str, bytes]) -> None:
    name, raw = case
    p = tmp_path / name
    p.write_bytes(raw)
    try:
        run = load_run([p], progress=False, jobs=1)
        diag = analyze_run(run, Options())
    except InputError as exc:
        text = str(exc)
        assert "\n" not in text and text.startswith((str(p), "--", "cannot", "no ", "duplicate"))
        return
    assert isinstance(diag.result, Report)
    json.dumps(msgspec.to_builtins(diag.result))  # the report encodes as plain data


@pytest.mark.parametrize("name", sorted(TRACES))
def test_unmutated_fixtures_still_parse(tmp_path: Path, name: str) -> None:
    p = tmp_path / name
    p.write_text(json.dumps(TRACES[name]))
    assert load_run([p], progress=False, jobs=1).ranks
