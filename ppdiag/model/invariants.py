"""What every parsed run must satisfy, and the read-only state the loader leaves it in.

:func:`check_run` lists every broken invariant of a :class:`~ppdiag.model.Run` (empty when it is
sound): each column table's columns of one length and their declared dtypes, intervals and ranges
with ``start <= end``, name indices inside the rank's name table, process-group indices inside its
groups (or -1), unique ranks in rank order. Tests run it on every kind of input.

:func:`freeze_run` makes the parsers' arrays read-only (``writeable=False``), so a later layer that
writes into them fails at once instead of changing the run for every later reader. The pipeline's
block labels are an overlay (``Pipeline.labels``), so no column is left writeable
(:data:`LABEL_COLUMNS` is empty); the pipeline shows the overlay on the timelines by pointing the
label columns at copies of it, never by writing into the parsed arrays.
"""

from __future__ import annotations

import numpy as np

from ppdiag.model.run import Run
from ppdiag.model.timeline import ColumnTable, RankTimeline

#: Interval columns left writeable for a later layer to annotate in place: none (the block labels
#: are an overlay held by the pipeline, see :func:`ppdiag.pipeline.blocks.block_labels`).
LABEL_COLUMNS: frozenset[str] = frozenset()


def _table_problems(where: str, t: ColumnTable) -> list[str]:
    out: list[str] = []
    n = len(t)
    for c in t.COLUMNS:
        a = getattr(t, c)
        if not isinstance(a, np.ndarray):
            out.append(f"{where}.{c} is {type(a).__name__}, not a numpy array")
            continue
        if a.shape != (n,):
            out.append(f"{where}.{c} has shape {a.shape}, expected ({n},)")
        if a.dtype != np.dtype(t.DTYPES[c]):
            out.append(f"{where}.{c} has dtype {a.dtype}, expected {np.dtype(t.DTYPES[c])}")
    if not out and n:
        bad = int(np.count_nonzero(getattr(t, "end") < getattr(t, "start")))  # noqa: B009
        if bad:
            out.append(f"{where}: {bad} row(s) end before they start")
    return out


def _rank_problems(tl: RankTimeline) -> list[str]:
    where = f"rank {tl.rank}"
    out: list[str] = []
    for label, t in (("intervals", tl.intervals), ("ranges", tl.ranges)):
        shape = _table_problems(f"{where} {label}", t)
        out += shape
        if any("shape" in p or "dtype" in p or "numpy" in p for p in shape):
            continue  # the index checks need well-formed columns
        name = getattr(t, "name")  # noqa: B009 - every column table has one
        if len(t) and (int(name.min()) < 0 or int(name.max()) >= max(len(tl.names), 1)):
            out.append(f"{where} {label}: name index outside the {len(tl.names)} names")
        group = getattr(t, "group")  # noqa: B009
        if len(t) and (int(group.min()) < -1 or int(group.max()) >= len(tl.process_groups)):
            out.append(f"{where} {label}: process group index outside the {len(tl.process_groups)} groups")
    if tl.events_lost < 0:
        out.append(f"{where}: negative events_lost")
    return out


def check_run(run: Run) -> list[str]:
    """Every invariant ``run`` breaks, one line each (empty: the run is sound)."""
    out: list[str] = []
    ranks = [tl.rank for tl in run.ranks]
    if ranks != sorted(set(ranks)):
        out.append(f"ranks not unique and in order: {ranks[:16]}")
    for tl in run.ranks:
        out += _rank_problems(tl)
    return out


def freeze_run(run: Run) -> Run:
    """Make every parser array of ``run`` read-only except :data:`LABEL_COLUMNS` (in place; returns
    ``run``). Idempotent."""
    for tl in run.ranks:
        for t, keep in ((tl.intervals, LABEL_COLUMNS), (tl.ranges, frozenset())):
            for c in t.COLUMNS:
                if c not in keep:
                    getattr(t, c).flags.writeable = False
    return run
