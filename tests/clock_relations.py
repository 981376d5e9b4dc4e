"""What a clock transformation (ranks moved to another host, timestamps skewed) must not change
in a diagnosis, and the transformations themselves: the clock metamorphic tests' definition, which
``benchmarks/bench_clock_relations.py`` reuses (a test-support module, imported by bare name)."""

from __future__ import annotations

from ppdiag.analysis import Analyzed
from ppdiag.demo.skew import Move

MS = 1_000_000
# the skews of issue "runs that span hosts", both ahead and behind (ms)
SKEWS_MS = (1.0, -1.0, 20.0, -20.0, 2500.0, -2500.0, 60_000.0, -60_000.0)
# two hosts of half the ranks each, both moved, with different skews (ms)
TWO_HOSTS_MS = ((1.0, 60_000.0), (-20.0, 2500.0))
CAUSE_TOL = 0.015  # of the step


def clock_cases(n: int) -> dict[str, dict[int, Move]]:
    """Every clock transformation of an ``n``-rank run, by name: the last rank alone, the first rank
    alone (the reference host moves) and the upper half of the ranks moved to another host with
    each skew of :data:`SKEWS_MS` (``last+20``, ``first-2500``, ``half+60000``...), then two hosts
    of half the ranks each with the skews of :data:`TWO_HOSTS_MS` (``2x2+1/+60000``)."""
    out: dict[str, dict[int, Move]] = {}
    for place, ranks in (("last", (n - 1,)), ("first", (0,)), ("half", tuple(range(n // 2, n)))):
        for s in SKEWS_MS:
            out[f"{place}{s:+g}"] = {r: Move("other-node", int(s * MS)) for r in ranks}
    h = n // 2
    for sa, sb in TWO_HOSTS_MS:
        out[f"2x2{sa:+g}/{sb:+g}"] = {
            r: Move("host-a" if r < h else "host-b", int((sa if r < h else sb) * MS)) for r in range(n)
        }
    return out


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


def offset_error(base: Analyzed, moved: Analyzed, moves: dict[int, Move]) -> tuple[float, bool]:
    """The largest error (µs) of a moved rank's fitted offset against the skew applied (relative to
    the reference rank, whose host may have moved too), and whether every one is within its host's
    residual (1 µs of rounding allowed)."""
    ob, om = base.result.run.clock_offsets_us, moved.result.run.clock_offsets_us
    resid = {r: c.residual_us for c in moved.result.run.clocks for r in c.ranks}
    ref = min(om, key=int)
    worst, ok = 0.0, True
    for r, mv in moves.items():
        want = -(mv.skew_ns - moves.get(int(ref), Move("", 0)).skew_ns) / 1000.0
        err = abs((om[str(r)] - om[ref]) - (ob[str(r)] - ob[ref]) - want)
        worst = max(worst, err)
        ok = ok and err <= (resid.get(r) or moved.result.run.clock_residual_us or 0.0) + 1.0
    return worst, ok


def broken(base: Analyzed, moved: Analyzed, moves: dict[int, Move], offsets: bool = True) -> list[str]:
    """Which relations ``moved`` (``base`` with ``moves`` applied) breaks: empty when it keeps the
    structure and findings, every rank's causes within :data:`CAUSE_TOL` of the step and (with
    ``offsets``) each moved rank's offset within its host's residual of the skew."""
    out: list[str] = []
    want, got = clock_structure(base), clock_structure(moved)
    out += [f"{k}: {want[k]} -> {got[k]}" for k in want if want[k] != got[k]]
    ce = cause_error(base, moved)
    if ce > CAUSE_TOL:
        out.append(f"causes moved by {100 * ce:.2f} % of the step")
    oe, within = offset_error(base, moved, moves)
    if offsets and not within:
        out.append(f"offset {oe:.0f} µs off the skew, beyond the residual")
    return out


__all__ = [
    "CAUSE_TOL",
    "SKEWS_MS",
    "TWO_HOSTS_MS",
    "broken",
    "cause_error",
    "clock_cases",
    "clock_structure",
    "offset_error",
]
