"""Rank and step lists in words: ``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""

from __future__ import annotations

from collections.abc import Iterable

#: Runs shown before the rest is counted ("... (N in all)").
MAX_RUNS = 12


def consecutive_runs(nums: list[int]) -> list[tuple[int, int]]:
    """The runs of consecutive numbers in ``nums``, in order: ``[0, 1, 2, 5]`` -> ``[(0, 2), (5, 5)]``."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append((nums[i], nums[j]))
        i = j + 1
    return out


def rank_ranges(xs: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``; more than :data:`MAX_RUNS` runs end in ``... (N in all)``."""
    vals = sorted(set(xs))
    out = [str(a) if a == b else f"{a}-{b}" for a, b in consecutive_runs(vals)]
    if len(out) > MAX_RUNS:
        out = [*out[:MAX_RUNS], f"... ({len(vals)} in all)"]
    return ", ".join(out)
