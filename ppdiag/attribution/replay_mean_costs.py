"""The rebalanced replay variant's cost factors: what each (rank, stage, phase) label's blocks are
scaled by so that every label of a phase does the phase's mean work (docs/json.md, *Time
accounting*)."""

from __future__ import annotations

import numpy as np


def mean_cost_factors(
    tot: dict[tuple[int, int, int], int], cnt: dict[tuple[int, int, int], int], phases: tuple[int, ...]
) -> dict[tuple[int, int, int], float]:
    """The rebalanced variant's cost factor per (rank, stage, phase) label, from each label's work
    ``tot`` and block count ``cnt`` (keys in the order the work was first seen: the order the means
    sum them in). Where every label of a phase has as many blocks, each gets the phase's mean work
    over its own; else the work is taken per rank (a rank's stages of one phase together)."""
    out: dict[tuple[int, int, int], float] = {}
    for ph in phases:
        keys = [k for k in tot if k[2] == ph]
        if not keys:
            continue
        if len({cnt[k] for k in keys}) == 1:
            vals = {k: tot[k] for k in keys if tot[k] > 0}
            mean = float(np.mean(list(vals.values()))) if vals else 0.0
            out.update({k: mean / v for k, v in vals.items()})
            continue
        per_rank: dict[int, int] = {}
        for k in keys:
            per_rank[k[0]] = per_rank.get(k[0], 0) + tot[k]
        pos = {r: v for r, v in per_rank.items() if v > 0}
        mean = float(np.mean(list(pos.values()))) if pos else 0.0
        out.update({k: mean / pos[k[0]] for k in keys if k[0] in pos})
    return out


__all__ = ["mean_cost_factors"]
