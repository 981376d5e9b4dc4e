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
