"""Checks of the analysis flags (:func:`check_steps`, before any work) and of a parsed run against
them, before the pipeline is rebuilt.

:func:`checked_run` is what :func:`ppdiag.api.analyze_run` calls first, for every route into the
analysis (the commands, the notebook API, ``whatif``, ``demo``): it refuses ``-m`` / ``--pp``
values the traces cannot hold and returns the run with a warning for each rank whose step numbers
share none with the others'. The parsed run itself is not changed.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from ppdiag.errors import InputError
from ppdiag.model import Run
from ppdiag.pipeline.steps import host_steps

_STEPS_RANGE = re.compile(r"^\s*(-?\d+)?\s*:\s*(-?\d+)?\s*$")
_STEPS_LIST = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*,?\s*$")


def check_steps(spec: str | None) -> None:
    """Refuse a ``--steps`` value that is neither ``a:b`` nor ``5,6`` before any work is done."""
    if spec is None:
        return
    m = _STEPS_RANGE.match(spec)
    if m:
        a, b = m.group(1), m.group(2)
        if a is not None and b is not None and int(a) > int(b):
            raise InputError(None, f"--steps {spec!r}: the range is empty ({a} > {b})")
        return
    if _STEPS_LIST.match(spec):
        return
    hint = ""
    if re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", spec):
        hint = f" (for a range write {spec.replace('-', ':').replace(' ', '')})"
    raise InputError(
        None, f"--steps {spec!r}: expected 'a:b' (step numbers a..b, either may be empty) or '5,6'{hint}"
    )


def check_sizes(run: Run, pp: int | None, microbatches: int | None) -> None:
    """Refuse -m / --pp values the traces cannot hold: every micro-batch of a step runs at least
    one device interval on each rank, and every stage needs a rank of the job."""
    ranks = list(run.ranks)
    if not ranks:
        return
    if microbatches is not None:
        most = max(len(tl.intervals) for tl in ranks)
        if microbatches > max(most, 1):
            raise InputError(
                None,
                f"--microbatches {microbatches}: the traces hold at most {most} device intervals "
                "per rank, fewer than one per micro-batch",
            )
    if pp is not None:
        world = max(run.world_size, len(ranks))
        if pp > world:
            raise InputError(None, f"--pp {pp} is more than the job's {world} ranks")


def step_overlap_warnings(run: Run) -> list[str]:
    """A rank whose ProfilerStep numbers share none with the other ranks' (steps 100-102 against
    5-7) holds another run's trace, or another part of the run: merging them by position is wrong."""
    nums = {tl.rank: {n for n, _, _ in host_steps(tl) if n >= 0} for tl in run.ranks}
    nums = {r: v for r, v in nums.items() if v}
    if len(nums) < 2:
        return []
    # how many ranks hold each step number: a rank shares a step with the others when one of its
    # numbers is held twice (one pass over the ranks; a union of the others' steps per rank was
    # quadratic: 5.9 s at 10,240 ranks)
    held = Counter(n for v in nums.values() for n in v)
    out = []
    for r, mine in nums.items():
        if any(held[n] > 1 for n in mine):
            continue
        others = held.keys() - mine  # none of its numbers is another rank's
        if others:
            out.append(
                f"rank {r}: its steps {min(mine)}-{max(mine)} share none with the other ranks' "
                f"({min(others)}-{max(others)}): a trace from another run?"
            )
    return out


def checked_run(run: Run, pp: int | None, microbatches: int | None) -> Run:
    """``run`` once its sizes fit the flags (else :class:`InputError`), with the step-overlap
    warnings added to its warnings and doubts: a new :class:`Run` sharing the parsed ranks."""
    check_sizes(run, pp, microbatches)
    overlap = step_overlap_warnings(run)
    if not overlap:
        return run
    return dataclasses.replace(
        run, warnings=[*run.warnings, *overlap], doubts=[*run.doubts, *overlap], skipped=list(run.skipped)
    )
