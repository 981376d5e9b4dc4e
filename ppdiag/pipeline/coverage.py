"""What the parsed run says about its own completeness, for the gate (``gate.coverage``).

A gate passes only on a whole run (docs/budget.md). Besides the ranks and steps the report names,
the parsed run holds three more facts: the ranks its process-group member lists and peers name
(a missing last rank shows there when no trace states the world size), each rank's complete steps
(a trace cut or a rank that stopped has fewer), and how many events each rank lost or had altered.
They are read here, below the reports, which only render them (``reports/coverage.py``).
"""

from __future__ import annotations

from ppdiag.model import Run
from ppdiag.model.rank_ranges import rank_ranges
from ppdiag.model.run_coverage import MAX_DAMAGED_SHARE, PEER_SOURCE, PG_SOURCE, RunCoverage
from ppdiag.pipeline.steps import host_steps


def run_coverage(run: Run) -> RunCoverage:
    """The :class:`RunCoverage` of the parsed ``run``."""
    tls = run.ranks
    # one process with no distributed backend and no group is a run of one (world 1)
    alone = len(tls) == 1 and not tls[0].backend and not tls[0].process_groups
    named = {PG_SOURCE: -1, PEER_SOURCE: -1}
    for tl in tls:
        for g in tl.process_groups:
            named[PG_SOURCE] = max(named[PG_SOURCE], *g.ranks, -1)
        for a in (tl.intervals.peer, tl.ranges.peer):
            if len(a):
                named[PEER_SOURCE] = max(named[PEER_SOURCE], int(a.max()))
    return RunCoverage(
        world_stated=alone or any(tl.world_size for tl in tls),
        top_traced=max((tl.rank for tl in tls), default=-1),
        named=named,
        step_gaps=tuple(_step_gaps(run)),
        damaged=tuple(_damaged(run)),
    )


def _step_gaps(run: Run) -> list[str]:
    """Ranks that completed fewer steps than the others (a trace cut, a rank that stopped)."""
    have = {tl.rank: {n for n, _, _ in host_steps(tl) if n >= 0} for tl in run.ranks}
    every = set().union(*have.values()) if have else set()
    short = {r: every - s for r, s in have.items() if s and every - s}
    if not short:
        return []
    most = max(len(s) for s in have.values())
    out = []
    for r in sorted(short):
        out.append(
            f"rank {r} has {len(have[r])} complete step(s), others up to {most} "
            f"(step(s) {rank_ranges(short[r])} missing from its trace: cut or stopped)"
        )
    return out[:20]


def _damaged(run: Run) -> list[str]:
    """Ranks with more than :data:`MAX_DAMAGED_SHARE` of their events lost or altered."""
    out = []
    for tl in run.ranks:
        bad = tl.events_lost + tl.events_damaged
        total = max(tl.events_total + tl.events_lost, 1)
        if bad and bad / total > MAX_DAMAGED_SHARE:
            out.append(
                f"rank {tl.rank}: {bad} of {total} events lost or altered "
                f"({100 * bad / total:.2g} % > {100 * MAX_DAMAGED_SHARE:.2g} %; see run.warnings)"
            )
    return out
