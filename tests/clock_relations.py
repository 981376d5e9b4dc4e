"""What a clock transformation (ranks moved to another host, timestamps skewed) must not change
in a diagnosis: the clock metamorphic tests' definition, which ``benchmarks/bench_clock_relations.py``
reuses (a test-support module, imported by bare name)."""

from __future__ import annotations

from ppdiag.analysis import Analyzed


def clock_structure(a: Analyzed) -> dict[str, object]:
    """What no clock may change: pp, stage map, schedule, M and the findings (codes and ranks)."""
    run = a.result.run
    return {
        "pp": run.pp,
        "stage_map": run.stage_map,
        "schedule": str(run.schedule),
        "M": run.microbatches,
        "findings": sorted((f.code, tuple(sorted(f.ranks))) for f in a.result.findings),
    }


def cause_error(base: Analyzed, moved: Analyzed) -> float:
    """The largest change of one rank's cause, as a share of the step."""
    b = {r.rank: r.shares for r in base.result.ranks}
    return max(abs(v - b[r.rank][c]) for r in moved.result.ranks for c, v in r.shares.items())


__all__ = ["cause_error", "clock_structure"]
