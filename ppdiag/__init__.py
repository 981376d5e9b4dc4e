"""ppdiag: pipeline-parallel training diagnosis from profiler traces."""

from __future__ import annotations

__version__ = "0.1.0"
