"""The Kineto parser's output is unchanged by speed and memory work: every column of every test
and shared trace hashes to the digest stored from the reference parser
(``tests/digests/kineto_parse.json``; regenerate it only for an intended output change, and say
so in the commit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, SHARED_TRACES
from parse_digest import timeline_digest

from ppdiag.parsers.kineto import parse_file

DIGESTS = Path(__file__).resolve().parent / "digests" / "kineto_parse.json"
EXPECTED: dict[str, dict[str, str]] = json.loads(DIGESTS.read_text())


def _path(key: str) -> Path:
    return REPO / key if key.startswith("tests/") else SHARED_TRACES / key


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_parse_output_unchanged(key: str) -> None:
    p = _path(key)
    if not p.exists():
        pytest.skip(f"{key} not available")
    got = timeline_digest(parse_file(p))
    want = EXPECTED[key]
    changed = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert not changed, f"{key}: changed fields {changed}"


def test_unhashable_category_on_an_unused_event(tmp_path: Path) -> None:
    # a non-complete event whose "cat" is a list (no profiler writes one) is of no known kind and
    # ignored (it used to reject the rank with a TypeError): the rank parses as without that event
    src = REPO / "tests" / "data" / "gpu_pp_rank0.json"
    doc = json.loads(src.read_text())
    doc["traceEvents"].append({"ph": "i", "cat": ["odd"], "name": "marker", "ts": 1.0, "pid": 0, "tid": 0})
    odd = tmp_path / "rank0.json"
    odd.write_text(json.dumps(doc))
    got = timeline_digest(parse_file(odd))
    want = EXPECTED["tests/data/gpu_pp_rank0.json"]
    assert {k: v for k, v in got.items() if k != "events_total"} == {
        k: v for k, v in want.items() if k != "events_total"
    }
