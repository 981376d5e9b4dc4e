"""The columnar run model.

The names below are loaded on first use (PEP 562), so that importing a light submodule such as
:mod:`ppdiag.model.schedule` (the CLI's schedule names) does not load numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ppdiag.model.run import Run
    from ppdiag.model.timeline import (
        COMM_KINDS,
        KIND_NAMES,
        PHASE_NAMES,
        Direction,
        Intervals,
        Kind,
        NameTable,
        Phase,
        ProcessGroup,
        RangeKind,
        Ranges,
        RankTimeline,
    )

__all__ = [
    "COMM_KINDS",
    "KIND_NAMES",
    "PHASE_NAMES",
    "Direction",
    "Intervals",
    "Kind",
    "NameTable",
    "Phase",
    "ProcessGroup",
    "RangeKind",
    "Ranges",
    "RankTimeline",
    "Run",
]

_HOME = {name: "ppdiag.model.timeline" for name in __all__} | {"Run": "ppdiag.model.run"}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
