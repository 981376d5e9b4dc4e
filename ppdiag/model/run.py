"""A whole run: the parsed ranks plus run-level warnings."""

from __future__ import annotations

from dataclasses import dataclass, field

from ppdiag.model.timeline import RankTimeline


@dataclass
class Run:
    """All ranks of one profiled run, ordered by rank."""

    ranks: list[RankTimeline]
    format: str
    warnings: list[str] = field(default_factory=list)
    # trace-like files of the run that could not be read (skipped with a warning)
    skipped: list[str] = field(default_factory=list)
    # ranks that disagree with the others (world size, clock, step numbers): maybe another run
    doubts: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        sizes = [r.world_size for r in self.ranks if r.world_size]
        return max(sizes) if sizes else len(self.ranks)

    def by_rank(self) -> dict[int, RankTimeline]:
        return {r.rank: r for r in self.ranks}
