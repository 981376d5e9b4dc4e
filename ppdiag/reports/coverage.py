"""Which ranks and steps of a run the gate's figures come from (``gate.coverage``).

A gate passes only on a whole run (docs/budget.md): every rank of the world traced, the world size
stated or inferred, every rank with the same complete steps, and no rank with more than
:data:`~ppdiag.model.run_coverage.MAX_DAMAGED_SHARE` of its events lost or altered. The pipeline
layer reads these from the parsed run (:class:`~ppdiag.model.run_coverage.RunCoverage`) and
:func:`run_gaps` takes them in; what it finds makes the gate inconclusive unless ``--allow-partial``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppdiag.model.rank_ranges import rank_ranges
from ppdiag.model.run_coverage import RunCoverage
from ppdiag.report_types import GateCoverage, Report


@dataclass
class Coverage:
    """Which ranks and steps of the run the gate's figures come from."""

    world_size: int = 0
    traced: list[int] = field(default_factory=list)  # ranks whose trace was read
    analyzed: list[int] = field(default_factory=list)  # ranks with at least one analysed step
    steps: list[int] = field(default_factory=list)  # step numbers analysed
    skipped_files: list[str] = field(default_factory=list)  # trace-like files that could not be read
    step_filter: str | None = None
    doubts: list[str] = field(default_factory=list)  # ranks that disagree with the others

    world_stated: bool = True  # a trace (or the report) states the world size
    world_from: str = ""  # what else names ranks (process groups, peers), when it raises the world
    step_gaps: list[str] = field(default_factory=list)  # ranks with fewer complete steps
    damaged: list[str] = field(default_factory=list)  # ranks with too many events lost or altered
    # steps the traces hold that the analysis left out as partial (a hang, a cut, lost transfers)
    stopped: list[str] = field(default_factory=list)

    @property
    def expected(self) -> int:
        """Ranks the job has: ``world_size``, or (when no trace says it) up to the highest rank
        traced, since ranks are numbered from 0."""
        return self.world_size or (max(self.traced) + 1 if self.traced else 0)

    @property
    def missing(self) -> list[int]:
        """Ranks of ``0..expected-1`` without a trace (the first 1000 of a huge job)."""
        have = set(self.traced)
        out: list[int] = []
        for r in range(self.expected):
            if r not in have:
                out.append(r)
                if len(out) >= 1000:
                    break
        return out

    @property
    def no_steps(self) -> list[int]:
        """Traced ranks that contributed no step (all excluded by ``--steps``, or none found)."""
        got = set(self.analyzed)
        return [r for r in self.traced if r not in got]

    def gaps(self) -> list[str]:
        """Why the run is only partly covered (empty when every rank took part)."""
        out = []
        missing = self.missing
        if not self.world_stated:
            seen = f"{self.world_from} go up to" if self.world_from else "the traces hold ranks up to"
            out.append(f"no trace states the world size ({seen} rank {self.expected - 1})")
        if missing:
            of = f"world size {self.world_size}" if self.world_size else f"ranks 0-{self.expected - 1}"
            if self.world_from:
                of += f" (inferred from {self.world_from})"
            n = self.expected - len(set(self.traced) & set(range(self.expected)))
            out.append(f"{n} rank(s) {rank_ranges(missing)} of {of} have no trace")
        out += self.step_gaps
        out += self.damaged
        out += self.stopped
        if self.no_steps:
            why = f" (excluded by --steps {self.step_filter})" if self.step_filter else ""
            out.append(f"rank(s) {rank_ranges(self.no_steps)} have no analysed step{why}")
        for f in self.skipped_files:
            out.append(f"unreadable trace file {f}")
        out += self.doubts
        return out

    def line(self) -> str:
        """One line: which ranks and steps took part."""
        world = f"world size {self.world_size}" if self.world_size else "world size unknown"
        steps = f"steps {rank_ranges(self.steps)}" if self.steps else "no step"
        return f"ranks {rank_ranges(self.analyzed) or 'none'} ({world}); {steps}"

    def to_report(self) -> GateCoverage:
        """The report's ``gate.coverage`` section."""
        return GateCoverage(
            world_size=self.world_size,
            traced=list(self.traced),
            analyzed=list(self.analyzed),
            steps=list(self.steps),
            missing=self.missing,
            no_steps=self.no_steps,
            skipped_files=list(self.skipped_files),
            doubts=list(self.doubts),
        )


def coverage_of(
    report: Report, skipped_files: list[str] | None = None, step_filter: str | None = None
) -> Coverage:
    """The :class:`Coverage` a report describes (``run.world_size``, ``run.ranks``, ``ranks``)."""
    run = report.run
    analyzed = [r.rank for r in report.ranks if r.steps > 0]
    steps = [s for s in run.steps if s >= 0]
    cov = Coverage(
        max(run.world_size, 0), list(run.ranks), analyzed, steps, list(skipped_files or []), step_filter
    )
    hang = report.hang
    if hang is not None and (hang.dropped_steps or hang.status == "hang"):
        # every rank's trace may hold the same steps while a send or receive of one is missing (an
        # event lost, events written twice): the analysis then finds the run stopped mid-step and
        # keeps only the steps before it, and the figures describe part of the run
        left = f"; step(s) {rank_ranges(hang.dropped_steps)} left out" if hang.dropped_steps else ""
        cov.stopped = [f"the analysis found the run {_STOPPED.get(hang.status, hang.status)} (PP013){left}"]
    return cov


_STOPPED = {"hang": "hung: ranks wait in operations their partners never joined", "cut": "cut mid-step"}


def run_gaps(cov: Coverage, facts: RunCoverage) -> None:
    """Fill in what the parsed run says about ``cov``'s completeness (:class:`RunCoverage`, read
    from the run by the pipeline layer): the world size inferred from process-group member lists
    and the peers the traces name (a missing last rank with no stated world size), ranks whose
    complete steps differ from the others', and ranks with too many events lost or altered."""
    cov.world_stated = facts.world_stated
    beyond = {k: v for k, v in facts.named.items() if v + 1 > max(cov.world_size, facts.top_traced + 1)}
    if beyond:
        cov.world_size = max(beyond.values()) + 1
        cov.world_from = " and ".join(sorted(beyond))
    cov.step_gaps = list(facts.step_gaps)
    cov.damaged = list(facts.damaged)
