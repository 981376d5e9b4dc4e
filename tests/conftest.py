"""Shared test helpers: where the real traces live (``<repo>/../shared/traces``) and tiny data."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests judge results, never time: hypothesis's default 200 ms deadline per example fails
# a test whose example was descheduled on a busy host ("Unreliable test timings").
settings.register_profile("ppdiag", deadline=None)
settings.load_profile("ppdiag")

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
TEST_DATA = Path(__file__).resolve().parent / "data"

# The parse cache never touches the user's real cache dir from a test: a session folder, removed at
# exit. It is off by default (tests that monkeypatch a parser must see that parser run); the cache
# tests turn it on. Set here, at import, so CLI subprocesses and parse workers inherit both.
_CACHE_DIR = tempfile.mkdtemp(prefix="ppdiag-test-cache-")
os.environ["PPDIAG_CACHE_DIR"] = _CACHE_DIR
os.environ["PPDIAG_NO_CACHE"] = "1"
atexit.register(shutil.rmtree, _CACHE_DIR, True)
# Every report the suite produces is checked against itself (ppdiag/report_check.py): a violation
# is an error inside the package, in this process and in the CLI subprocesses that inherit it.
os.environ["PPDIAG_STRICT_CHECK"] = "1"


_ENV_AT_START = {k: v for k, v in os.environ.items() if k.startswith("PPDIAG_")}


@pytest.fixture(autouse=True)
def _ppdiag_environment_restored() -> Iterator[None]:
    """Every test ends with the ``PPDIAG_*`` variables of the session's start: a command run in
    process sets some of them for its parse workers (``--scheduler``, ``--no-cache``), and one left
    behind would send every later test's analysis to a scheduler that is gone."""
    yield
    for k in [k for k in os.environ if k.startswith("PPDIAG_") and k not in _ENV_AT_START]:
        del os.environ[k]
    os.environ.update(_ENV_AT_START)


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


@pytest.fixture
def cache_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Both caches on, in a folder of the test's own (the suite runs with them off)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("PPDIAG_CACHE_DIR", str(d))
    monkeypatch.delenv("PPDIAG_NO_CACHE", raising=False)
    return d
