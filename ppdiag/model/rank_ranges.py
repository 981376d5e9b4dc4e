"""Rank and step lists in words: ``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""

from __future__ import annotations

from collections.abc import Iterable

#: Runs shown before the rest is counted ("... (N in all)").
MAX_RUNS = 12


def rank_ranges(xs: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``; more than :data:`MAX_RUNS` runs end in ``... (N in all)``."""
    vals = sorted(set(xs))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    if len(out) > MAX_RUNS:
        out = [*out[:MAX_RUNS], f"... ({len(vals)} in all)"]
    return ", ".join(out)
