"""ppdiag: pipeline-parallel training diagnosis from profiler traces.

``ppdiag.analyze(paths, **options)`` analyses a run from Python (a notebook) and returns a
:class:`ppdiag.notebook.Analysis`; see docs/python.md. Importing ppdiag loads nothing heavy: the
analysis is imported on the first call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppdiag.version import __version__

if TYPE_CHECKING:
    from ppdiag.notebook import Analysis


def analyze(paths: str | Path | Sequence[str | Path], **options: Any) -> Analysis:
    """Analyse one run as ``ppdiag analyze`` does; see :func:`ppdiag.notebook.analyze`."""
    from ppdiag.notebook import analyze as _analyze

    return _analyze(paths, **options)


__all__ = ["__version__", "analyze"]
