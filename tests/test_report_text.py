"""The report's text: msgspec's compact JSON with the standard library's floats
(ppdiag/report_text.py) is the text of a decode and ``json.dumps`` of it, and a report's
:func:`~ppdiag.report_types.dumps` is the standard library's way's text."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from report_fill import typed

from ppdiag.report_text import stdlib_floats
from ppdiag.report_types import _dumps_stdlib, dumps

# floats around every switch of either library's notation, and strings that look like numbers
# or end in backslashes and quotes
_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=1e-7, max_value=2e-4),
    st.floats(min_value=-2e-4, max_value=-1e-7),
    st.floats(min_value=1e15, max_value=1e18),
    st.sampled_from([4e-05, 1e-05, 0.0001, 1e16, 1.5e-07, -0.0, 0.0, 1e-6]),
)
_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["0.00004", "1e16 x", 'a\\"0.00001', "\\\\", 'k"1e-7', '\\"', ":0.00004,"]),
)
_JSON = st.recursive(
    st.one_of(_FLOATS, st.integers(-(2**63), 2**63 - 1), _TEXT, st.booleans(), st.none()),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(_TEXT, kids, max_size=5),
    max_leaves=30,
)


def _stdlib(compact: bytes) -> bytes:
    doc = json.loads(compact)
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(_JSON)
def test_floats_as_the_standard_library_writes_them(doc: Any) -> None:
    compact = msgspec.json.encode(doc)
    assert stdlib_floats(compact) == _stdlib(compact)


def test_known_texts() -> None:
    # msgspec: 0.00004, 1e16, 1.5e-7; the standard library: 4e-05, 1e+16, 1.5e-07; strings kept
    compact = msgspec.json.encode({"a": 0.00004, "b": [1e16, -1.5e-7], "s": 'x"0.00004,1e16'})
    assert stdlib_floats(compact) == b'{"a":4e-05,"b":[1e+16,-1.5e-07],"s":"x\\"0.00004,1e16"}'
    # a long run of marks inside a string: kept, each byte walked once
    run = msgspec.json.encode(["1e" * 10_000, 1e-7])
    assert stdlib_floats(run) == run[:-5] + b"1e-07]"


def test_report_text_is_the_standard_librarys() -> None:
    # shares in [1e-5, 1e-4) and a large float: written otherwise by msgspec
    report = typed({"summary": {"step_ms": 1e16, "shares": {"host": 0.00004, "bubble": 1.5e-7}}})
    marker: dict[str, object] = {"ppdiag": {"kind": "report"}}
    assert dumps(report, marker) == _dumps_stdlib(report, marker)
    assert dumps(report) == _dumps_stdlib(report)
