"""Typed sections of the JSON report (``docs/json.md``): summary, bubble, stages[], ranks[].

:mod:`ppdiag.summary` builds these frozen :class:`msgspec.Struct` values and encodes them with
:func:`encode` (field order = the JSON key order), so the sections it writes have one declared
shape. ``report.schema.json`` next to this module is :func:`sections_schema` written out
(``python -m ppdiag.report_types`` regenerates it; a test keeps it current and checks that
``docs/json.md`` names every field).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

#: The shipped schema of the typed sections.
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


class Dist(msgspec.Struct, frozen=True):
    """Distribution of per-micro-batch block compute (ms)."""

    mean: float
    p50: float
    p95: float
    n: int


class Summary(msgspec.Struct, frozen=True):
    """Run-level step time and lost time (``summary``)."""

    step_ms: float | None
    step_p95_ms: float | None
    step_mean_ms: float | None
    compute_ms: float | None
    lost_ratio: float | None
    lost_ms: dict[str, float]
    shares: dict[str, float] | None
    steps_ms: list[float]
    slowest_stage: int | None
    stage_ratio: float | None


class Bubble(msgspec.Struct, frozen=True):
    """Measured pipeline waits vs the schedule's theoretical bubble (``bubble``)."""

    measured_ratio: float | None
    theoretical_ratio: float | None


class RankRow(msgspec.Struct, frozen=True):
    """One rank's time accounting, mean per step (``ranks[]``)."""

    rank: int
    stage: int | None
    pipeline: int | None  # DP replica index of the rank's pipeline (null without PP)
    steps: int
    step_ms: float
    compute_ms: float
    exposed_p2p_ms: float
    exposed_collective_ms: float
    exposed_copy_ms: float
    idle_ms: float
    lost_ms: dict[str, float]
    shares: dict[str, float]


class StageRow(msgspec.Struct, frozen=True):
    """One pipeline stage (``stages[]``)."""

    stage: int
    ranks: list[int]
    chunks: list[int]
    fwd_ms: Dist | None
    bwd_ms: Dist | None
    wgrad_ms: Dist | None
    compute_ms: float | None
    block_ms: float | None
    lost_ms: dict[str, float]
    fwd_samples_ms: list[float]
    bwd_samples_ms: list[float]
    wgrad_samples_ms: list[float]


#: JSON section name -> its type (a list section holds rows of that type).
SECTIONS: dict[str, type[msgspec.Struct]] = {
    "summary": Summary,
    "bubble": Bubble,
    "stages": StageRow,
    "ranks": RankRow,
}


def encode(value: msgspec.Struct | list[Any]) -> Any:
    """The JSON builtins (dicts in field order, lists) of a section value."""
    return msgspec.to_builtins(value)


def sections_schema() -> dict[str, Any]:
    """JSON Schema of the typed sections: an object with ``summary``, ``bubble``, ``stages`` and
    ``ranks``, each as the report writes it."""
    types = (Summary, Bubble, list[StageRow], list[RankRow])
    parts, defs = msgspec.json.schema_components(types, ref_template="#/$defs/{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ppdiag report (typed sections)",
        "type": "object",
        "properties": dict(zip(("summary", "bubble", "stages", "ranks"), parts, strict=True)),
        "$defs": defs,
    }


def schema_text() -> str:
    """:func:`sections_schema` as the shipped file holds it."""
    return json.dumps(sections_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {SCHEMA_PATH}\n")
