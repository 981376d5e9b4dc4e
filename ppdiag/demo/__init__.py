"""``ppdiag demo``: record real pipeline-parallel CPU training runs with injected faults and ground truth.

Importing this package does not import torch; only :func:`record`'s rank processes do. The names
below are loaded on first use (PEP 562), so that the CLI registers ``ppdiag demo`` without numpy.

>>> from ppdiag.demo import DemoConfig, record
>>> record(DemoConfig(schedule="1f1b", slow_stage=2, slow_factor=2.0), Path("run"))  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ppdiag.demo.config import SCHEDULE_CLASSES, DemoConfig, canonical_schedule

if TYPE_CHECKING:
    from ppdiag.demo.groundtruth import GroundTruth, RankTruth
    from ppdiag.demo.groundtruth import load as load_groundtruth
    from ppdiag.demo.recorder import TORCH_MISSING, DemoError, record, torch_available

SCHEDULES = tuple(SCHEDULE_CLASSES)

__all__ = [
    "SCHEDULES",
    "SCHEDULE_CLASSES",
    "TORCH_MISSING",
    "DemoConfig",
    "DemoError",
    "GroundTruth",
    "RankTruth",
    "canonical_schedule",
    "load_groundtruth",
    "record",
    "torch_available",
]

_HOME = {
    "GroundTruth": ("ppdiag.demo.groundtruth", "GroundTruth"),
    "RankTruth": ("ppdiag.demo.groundtruth", "RankTruth"),
    "load_groundtruth": ("ppdiag.demo.groundtruth", "load"),
    "TORCH_MISSING": ("ppdiag.demo.recorder", "TORCH_MISSING"),
    "DemoError": ("ppdiag.demo.recorder", "DemoError"),
    "record": ("ppdiag.demo.recorder", "record"),
    "torch_available": ("ppdiag.demo.recorder", "torch_available"),
}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home[0]), home[1])
    globals()[name] = value
    return value
