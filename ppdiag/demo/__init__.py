"""``ppdiag demo``: record real pipeline-parallel CPU training runs with injected faults and ground truth.

Importing this package does not import torch; only :func:`record`'s rank processes do.

>>> from ppdiag.demo import DemoConfig, record
>>> record(DemoConfig(schedule="1f1b", slow_stage=2, slow_factor=2.0), Path("run"))  # doctest: +SKIP
"""

from __future__ import annotations

from ppdiag.demo.config import SCHEDULE_CLASSES, DemoConfig, canonical_schedule
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
