"""Which ranks and steps of a run the gate's figures come from (``gate.coverage``)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
        if missing:
            of = f"world size {self.world_size}" if self.world_size else f"ranks 0-{self.expected - 1}"
            n = self.expected - len(set(self.traced) & set(range(self.expected)))
            out.append(f"{n} rank(s) {_ranges(missing)} of {of} have no trace")
        if self.no_steps:
            why = f" (excluded by --steps {self.step_filter})" if self.step_filter else ""
            out.append(f"rank(s) {_ranges(self.no_steps)} have no analysed step{why}")
        for f in self.skipped_files:
            out.append(f"unreadable trace file {f}")
        out += self.doubts
        return out

    def line(self) -> str:
        """One line: which ranks and steps took part."""
        world = f"world size {self.world_size}" if self.world_size else "world size unknown"
        steps = f"steps {_ranges(self.steps)}" if self.steps else "no step"
        return f"ranks {_ranges(self.analyzed) or 'none'} ({world}); {steps}"

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


def _ranges(xs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    xs = sorted(set(xs))
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    if len(out) > 12:
        out = [*out[:12], f"... ({len(xs)} in all)"]
    return ", ".join(out)


def coverage_of(
    report: Report, skipped_files: list[str] | None = None, step_filter: str | None = None
) -> Coverage:
    """The :class:`Coverage` a report describes (``run.world_size``, ``run.ranks``, ``ranks``)."""
    run = report.run
    analyzed = [r.rank for r in report.ranks if r.steps > 0]
    steps = [s for s in run.steps if s >= 0]
    return Coverage(
        max(run.world_size, 0), list(run.ranks), analyzed, steps, list(skipped_files or []), step_filter
    )
