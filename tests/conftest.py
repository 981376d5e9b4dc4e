"""Shared test helpers: where the real traces live (``<repo>/../shared/traces``) and tiny data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
TEST_DATA = Path(__file__).resolve().parent / "data"


def shared_trace(relpath: str) -> Path:
    """Path of a real trace under ``../shared/traces``; skips the test when it is absent."""
    p = SHARED_TRACES / relpath
    if not p.exists():
        pytest.skip(f"shared trace {relpath} not available")
    return p


@pytest.fixture
def shared_traces() -> Path:
    """The ``../shared/traces`` folder; skips the test when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces not available")
    return SHARED_TRACES


@pytest.fixture
def test_data() -> Path:
    """The tiny hand-written traces in ``tests/data``."""
    return TEST_DATA
