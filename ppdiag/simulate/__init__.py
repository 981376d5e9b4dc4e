"""Pipeline schedule simulator: per-rank action orders and a discrete-event execution model.

``simulate(SimConfig(...))`` runs one step of GPipe, 1F1B, interleaved 1F1B, zero-bubble (ZB-H1),
ZBV or DualPipeV from per-stage F/B/W costs, p2p latencies and host/communication delays, and
returns every block's times with the per-rank busy and idle time. ``closed_form_bubble`` gives the
textbook bubble ratio for equal costs.
"""

from __future__ import annotations

from ppdiag.simulate.engine import SimConfig, SimResult, closed_form_bubble, simulate
from ppdiag.simulate.schedules import (
    SCHEDULES,
    Action,
    canonical_schedule,
    rank_orders,
    splits_backward,
    stage_to_rank,
    uses_v_placement,
)

__all__ = [
    "SCHEDULES",
    "Action",
    "SimConfig",
    "SimResult",
    "canonical_schedule",
    "closed_form_bubble",
    "rank_orders",
    "simulate",
    "splits_backward",
    "stage_to_rank",
    "uses_v_placement",
]
