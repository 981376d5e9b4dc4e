"""The analysis's CPU by phase, each phase marked by what it reads: one replica, or all of them.

A replica map (a task per DP replica, a whole pipeline, docs/scale.md "What the reduce needs
from each replica") can take over only the phases that read one replica's ranks; the others stay
in the reducer, fed by per-replica digests. :func:`timed_phases` measures both shares on a real
analysis: it wraps the phases' functions where the analysis looks them up (module globals), adds up
each one's own CPU (``time.process_time``, its nested phases' time taken out) and restores the
functions afterwards. The wrappers cost a few microseconds per call: the phases are called once
per run, per rank or per rank-step, never per event.

    with timed_phases() as cpu:
        analyze_run(run)
    print(format_phases(cpu, total))
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ppdiag.compat import StrEnum


class Scope(StrEnum):
    """What a phase reads."""

    REPLICA = "one replica"  # a rank, or the ranks of one pipeline: a map task could run it
    # one replica's ranks, given a few run-wide facts a first reduce sends back to the map
    # (topology, clock offsets, schedule, normal p2p latency, the DP sync's arrivals)
    REPLICA_WITH = "replica+facts"
    ALL = "all replicas"  # cross-replica facts: the reducer's, from per-replica digests


@dataclass(frozen=True)
class Phase:
    """One function of the analysis, where the analysis looks it up."""

    module: str
    name: str
    scope: Scope
    what: str


_R, _F, _A = Scope.REPLICA, Scope.REPLICA_WITH, Scope.ALL
#: The analysis's phases in the order they run (api.analyze_run; pipeline.rebuild inside it).
PHASES: tuple[Phase, ...] = (
    Phase("ppdiag.api", "checked_run", _A, "flags against the run (sizes, step overlap)"),
    Phase("ppdiag.pipeline", "p2p_ops", _R, "each rank's p2p operations"),
    Phase("ppdiag.pipeline", "_peers_and_topology", _A, "p2p partners, stages, replicas"),
    Phase("ppdiag.pipeline", "match_pairs", _R, "sends matched with receives (inside a pipeline)"),
    Phase("ppdiag.pipeline", "fit_device_clocks", _A, "clock offsets (p2p and DP collectives)"),
    Phase("ppdiag.pipeline", "link_replicas", _A, "clock offsets: replicas linked"),
    Phase("ppdiag.pipeline", "with_host_clocks", _A, "clock offsets: hosts"),
    Phase("ppdiag.pipeline", "aligned_run", _F, "ranks shifted to the common clock"),
    Phase("ppdiag.pipeline", "_steps_and_blocks", _F, "step windows and compute blocks"),
    Phase("ppdiag.pipeline", "detect_schedule", _A, "schedule (votes over the ranks)"),
    Phase("ppdiag.pipeline", "override_warnings", _A, "flags against the trace"),
    Phase("ppdiag.pipeline", "_microbatches", _A, "micro-batches per step"),
    Phase("ppdiag.pipeline", "_order_labels", _F, "virtual-stage labels from the schedule order"),
    Phase("ppdiag.pipeline", "block_labels", _F, "interval labels from the blocks"),
    Phase("ppdiag.pipeline", "_collectives", _A, "collectives matched across each group's members"),
    Phase("ppdiag.pipeline", "contradiction", _A, "pipeline kept or rejected (dependency counts)"),
    Phase("ppdiag.pipeline", "detect_hang", _A, "how the run stopped (steps every rank completed)"),
    Phase("ppdiag.api", "_rank_steps", _F, "per rank-step accounting (mapped with a scheduler)"),
    Phase("ppdiag.attribution.causes", "Replay", _F, "replay graph of each pipeline"),
    Phase("ppdiag.attribution.causes", "replay_causes", _F, "replay variants (replicas meet at the DP sync)"),
    Phase("ppdiag.attribution.causes", "run_waits", _A, "collective waits charged to the late member"),
    Phase("ppdiag.attribution.causes", "paint", _F, "per-gap cause tables"),
    Phase("ppdiag.attribution.paint_map", "paint_replicas", _F, "per-gap tables, mapped with a scheduler"),
    Phase("ppdiag.api", "attribute", _F, "gain variants of the replay, cause totals"),
    Phase("ppdiag.api", "stage_balance", _A, "stage split (every replica's blocks)"),
    Phase("ppdiag.api", "build_report", _A, "summary, rank and stage rows"),
    Phase("ppdiag.api", "critical_paths", _F, "each step's critical path"),
    Phase("ppdiag.api", "build_noise", _A, "noise model (step-time spread)"),
    Phase("ppdiag.api", "memory_section", _R, "memory rows"),
    Phase("ppdiag.api", "link_rows", _R, "link rows"),
    Phase("ppdiag.api", "predict_fixes", _A, "what-if predictions"),
    Phase("ppdiag.api", "run_rules", _A, "rules (PP009 / PP010 compare replicas)"),
    Phase("ppdiag.api", "_checked", _A, "report consistency check"),
)


def _key(p: Phase) -> str:
    return f"{p.module.rsplit('.', 1)[-1]}.{p.name}"


@contextmanager
def timed_phases(phases: tuple[Phase, ...] = PHASES) -> Iterator[dict[str, float]]:
    """The own CPU seconds of every phase called inside the block (keyed ``module.name``); a phase
    named here that no longer exists raises ``AttributeError`` (the list is kept honest)."""
    own = {_key(p): 0.0 for p in phases}
    stack: list[float] = []  # the CPU of the nested phases of each running phase

    def wrap(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack.append(0.0)
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - t0
                nested = stack.pop()
                own[key] += spent - nested
                if stack:
                    stack[-1] += spent

        return timed

    saved: list[tuple[Any, str, Any]] = []
    try:
        for p in phases:
            mod = importlib.import_module(p.module)
            fn = getattr(mod, p.name)
            saved.append((mod, p.name, fn))
            setattr(mod, p.name, wrap(_key(p), fn))
        yield own
    finally:
        for mod, name, fn in reversed(saved):
            setattr(mod, name, fn)


def scope_totals(own: dict[str, float], phases: tuple[Phase, ...] = PHASES) -> dict[Scope, float]:
    """The phases' CPU summed by scope."""
    out = dict.fromkeys(Scope, 0.0)
    for p in phases:
        out[p.scope] += own.get(_key(p), 0.0)
    return out


def format_phases(own: dict[str, float], total: float, phases: tuple[Phase, ...] = PHASES) -> str:
    """The phases as a table (own CPU, share of ``total``), then the totals by scope."""
    lines = [f"  {'phase':30s} {'reads':13s} {'CPU s':>7s} {'share':>6s}  what"]
    for p in phases:
        s = own.get(_key(p), 0.0)
        lines.append(f"  {_key(p):30s} {p.scope.value:13s} {s:7.2f} {s / total:6.1%}  {p.what}")
    by = scope_totals(own, phases)
    rest = total - sum(by.values())
    lines.append(
        "  by scope: "
        + ", ".join(f"{sc.value} {v:.2f} s ({v / total:.0%})" for sc, v in by.items())
        + f", elsewhere {rest:.2f} s ({rest / total:.0%}); analysis {total:.2f} s CPU"
    )
    return "\n".join(lines)
