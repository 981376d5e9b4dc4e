"""An op table read one DP replica (a whole pipeline) per task: the map step of a huge job's table.

One file holds every rank of the job, so mapping files (:mod:`ppdiag.parsers.scaleout`) gives it
one task. Split by replica instead:

* **plan** (where ``ppdiag`` runs): one pass over six small columns of the table (``dp_rank,
  stage, rank, step, start_ts, duration``), a row-group batch at a time, reduced to what every
  rank's timeline shares with the others: the step windows (:class:`~ppdiag.parsers.optable_ranks.Layout`),
  where each rank sits (rank, replica, stage: one row per rank), the timer resolution and the
  replicas. A few hundred kB for 10,000 ranks.
* **map** (a task per batch of replicas): read only those replicas' rows (a Parquet filter on
  ``dp_rank``: row groups of other replicas are skipped by their statistics when the table is
  written sorted by ``dp_rank``), build their ranks' timelines on the plan's layout and send
  them back encoded as columns (:func:`ppdiag.parsers.cache.encode_ranks`, the same digest as a
  trace file's) with the counts the table's warnings are made of
  (:class:`~ppdiag.parsers.optable_ranks.Tally`).
* **reduce**: the ranks in rank order, their process groups from the plan (shared lists, as a
  whole-table read builds them) and the table's warnings on the first rank, from the merged
  counts. The result is the whole-table parse, rank for rank and byte for byte; the analysis
  (pipeline, replay, causes, rules) then runs on it as on any parsed run.

Only names and replica ids travel to the workers, and the plan (once per worker); never rows.
Parquet tables only (CSV and JSON Lines cannot be read a replica at a time: they are parsed
whole, as before).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.io import qpath
from ppdiag.model import RankTimeline
from ppdiag.parsers.optable import REQUIRED, read_table, seconds_to_ns
from ppdiag.parsers.optable_ranks import (
    Layout,
    StepExtents,
    Tally,
    clean,
    file_warnings,
    placement,
    ranks_of,
)

if TYPE_CHECKING:
    import pandas as pd

    from ppdiag.parsers.detect import TraceFile
    from ppdiag.parsers.optable_ranks import _Placement

_I64 = npt.NDArray[np.int64]
_PLAN_COLUMNS = ("dp_rank", "stage", "rank", "step", "start_ts", "duration")
#: rows per batch of the plan's pass (six columns: ~50 MB of frame at a time)
_BATCH_ROWS = 1 << 20


def is_parquet(path: str | Path) -> bool:
    """Whether the file is Parquet (by its first bytes)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError:
        return False


def by_replica(f: TraceFile) -> bool:
    """Whether the file is read a replica per task: a Parquet op table on a local or shared path."""
    from ppdiag.parsers.urls import url_of

    return f.format == "optable" and url_of(f.path) is None and is_parquet(f.path)


@dataclass(frozen=True)
class TablePlan:
    """What every replica's map needs of the whole table (see the module's docstring)."""

    path: str  # as the workers open it (a local or shared path)
    src: str  # as the ranks name their source
    layout: Layout
    rank: _I64  # one row per rank: rank, replica, stage
    dp: _I64
    stage: _I64
    resolution_ns: float
    replicas: tuple[int, ...]  # every dp_rank value of the table, bad rows' included
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def placement(self) -> _Placement:
        """Where each rank sits (built once per process and plan)."""
        got = _PLACES.get(self.token)
        if got is None:
            import pandas as pd

            rows = pd.DataFrame({"rank": self.rank, "dp_rank": self.dp, "stage": self.stage})
            got = _PLACES[self.token] = placement(rows, self.src)
            while len(_PLACES) > 4:  # a worker serves few tables at a time
                _PLACES.pop(next(iter(_PLACES)))
        return got


_PLACES: dict[str, _Placement] = {}


@dataclass
class _Top:
    """The largest finite magnitude of a time column so far and its float type (the resolution)."""

    top: float = -1.0
    dtype: Any = None

    def add(self, values: npt.NDArray[Any]) -> None:
        if not values.size or not np.issubdtype(values.dtype, np.floating):
            self.dtype = self.dtype or values.dtype
            return
        self.dtype = values.dtype
        if np.isfinite(values).any():
            self.top = max(self.top, float(np.nanmax(np.abs(values))))

    def resolution(self) -> float:
        if self.dtype is None or not np.issubdtype(self.dtype, np.floating) or self.top < 0:
            return 0.0
        return float(np.spacing(self.dtype.type(self.top))) * 1e9


def _batches(path: Path, src: str) -> Iterable[pd.DataFrame]:
    """The plan's columns of the table, a row-group batch at a time."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(src, "Parquet op tables need pyarrow: pip install pyarrow") from None
    try:
        pf = pq.ParquetFile(path)
        missing = [c for c in REQUIRED if c not in pf.schema_arrow.names]
        if missing:
            raise InputError(src, f"op table lacks the required column(s) {', '.join(missing)}")
        for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=list(_PLAN_COLUMNS)):
            yield batch.to_pandas()
    except (OSError, ValueError) as exc:
        raise InputError(src, f"cannot read the op table ({str(exc).splitlines()[0][:200]})") from None


def plan_table(path: str | Path) -> TablePlan:
    """One pass over the table's placement and time columns (see the module's docstring)."""
    import pandas as pd

    src = qpath(path)
    ext: StepExtents | None = None
    places: list[pd.DataFrame] = []
    replicas: set[int] = set()
    tops = (_Top(), _Top())
    for raw in _batches(Path(path), src):
        try:
            df = pd.DataFrame(
                {
                    **{c: raw[c].to_numpy(np.int64) for c in ("dp_rank", "stage", "rank", "step")},
                    "t0": seconds_to_ns(raw["start_ts"]),
                    "dur": seconds_to_ns(raw["duration"]),
                }
            )
        except (ValueError, TypeError) as exc:
            why = str(exc).splitlines()[0][:200]
            raise InputError(src, f"op table has non-numeric values ({why})") from None
        tops[0].add(raw["start_ts"].to_numpy())
        tops[1].add(raw["duration"].to_numpy())
        replicas.update(np.unique(df["dp_rank"].to_numpy()).tolist())
        rows = clean(df)[0]
        part = StepExtents.of(*(rows[c].to_numpy() for c in ("step", "t0", "dur")))
        ext = part if ext is None else ext.merge(part)
        places.append(rows[["rank", "dp_rank", "stage"]].drop_duplicates())
    if ext is None:
        raise InputError(src, "op table has no rows")
    # the first row of each rank in table order, as a whole-table read meets them
    place = pd.concat(places, ignore_index=True).drop_duplicates()
    return TablePlan(
        path=str(path),
        src=src,
        layout=Layout.of(ext, False),
        rank=place["rank"].to_numpy(np.int64),
        dp=place["dp_rank"].to_numpy(np.int64),
        stage=place["stage"].to_numpy(np.int64),
        resolution_ns=max(tops[0].resolution(), tops[1].resolution()),
        replicas=tuple(sorted(int(r) for r in replicas)),
    )


@dataclass(frozen=True)
class ReplicaDigest:
    """The ranks of some replicas (encoded columns, without their process groups, which the
    reducer shares from the plan) and the counts of the table's warnings in their rows."""

    payload: bytes | None
    tally: Tally
    ranks_plain: list[RankTimeline] | None = None  # the rare ranks an encoding cannot carry
    # the InputError of the map, as plain data (its __init__ does not survive pickling)
    error_path: str | None = None
    error: str = ""

    @property
    def nbytes(self) -> int:
        """Size of the encoded ranks."""
        return len(self.payload) if self.payload is not None else 0

    def ranks(self) -> list[RankTimeline]:
        """The decoded ranks (raises the map's :class:`InputError` when it had one)."""
        from ppdiag.parsers import cache

        if self.error:
            raise InputError(self.error_path, self.error)
        return cache.decode_ranks(self.payload) if self.payload is not None else list(self.ranks_plain or [])


def map_replicas(plan: TablePlan, replicas: Sequence[int]) -> ReplicaDigest:
    """The map: the timelines of ``replicas``' ranks, read from the table's rows of those
    replicas only (what a worker runs)."""
    from ppdiag.parsers import cache

    try:
        df, _ = read_table(Path(plan.path), plan.src, b"PAR1", replicas)
        ranks, tally = ranks_of(df, plan.src, plan.layout, plan.placement(), plan.resolution_ns)
    except InputError as exc:
        return ReplicaDigest(None, Tally(), error_path=exc.path, error=exc.message)
    del df
    for tl in ranks:
        tl.process_groups = []  # the reducer's, shared: a world group is every rank
    data = cache.encode_ranks(ranks)
    return ReplicaDigest(data, tally) if data is not None else ReplicaDigest(None, tally, ranks)


def replica_batches(replicas: Sequence[int], workers: int) -> list[tuple[int, ...]]:
    """The replicas in tasks: about 8 per worker (balance against per-task cost), at most 16
    replicas each (a lost worker loses little)."""
    size = max(1, min(16, -(-len(replicas) // (8 * max(1, workers)))))
    return [tuple(replicas[a : a + size]) for a in range(0, len(replicas), size)]


#: Runs the map over the batches: ``(plan, batches) -> digests`` in any order.
Mapper = Callable[[TablePlan, list[tuple[int, ...]]], Iterable[ReplicaDigest]]


def inline_mapper(plan: TablePlan, batches: list[tuple[int, ...]]) -> Iterable[ReplicaDigest]:
    """The map in this process, one batch after the other."""
    return (map_replicas(plan, b) for b in batches)


def reduce_replicas(plan: TablePlan, digests: Iterable[ReplicaDigest]) -> list[RankTimeline]:
    """The reduce: every rank in rank order, with its process groups and the table's warnings
    on the first, as the whole-table parse returns them."""
    ranks: list[RankTimeline] = []
    tally = Tally()
    for d in digests:
        ranks.extend(d.ranks())
        tally = tally.merge(d.tally)
    ranks.sort(key=lambda tl: tl.rank)
    place = plan.placement()
    for tl in ranks:
        tl.source = plan.src
        tl.process_groups = place.groups(int(tl.meta["dp_rank"]), int(tl.meta["pp_rank"]))
    if ranks:
        ranks[0].warnings = file_warnings(tally, plan.layout, place.tp_facts())
    return ranks


def parse_by_replica(
    path: str | Path, mapper: Mapper = inline_mapper, workers: int = 1
) -> list[RankTimeline]:
    """A Parquet op table's ranks, mapped a batch of replicas per task by ``mapper``."""
    plan = plan_table(path)
    return reduce_replicas(plan, mapper(plan, replica_batches(plan.replicas, workers)))


def pool_mapper(jobs: int) -> Mapper:
    """The map in a local pool of ``jobs`` processes."""

    def run(plan: TablePlan, batches: list[tuple[int, ...]]) -> Iterable[ReplicaDigest]:
        from concurrent.futures import ProcessPoolExecutor

        from ppdiag.parsers.pool import _mp_context, _worker_init

        with ProcessPoolExecutor(jobs, mp_context=_mp_context(), initializer=_worker_init) as pool:
            yield from pool.map(map_replicas, [plan] * len(batches), batches)

    return run


def dask_mapper(client: Any) -> Mapper:
    """The map on a Dask cluster's workers: the plan is sent once to each, then only replica ids."""

    def run(plan: TablePlan, batches: list[tuple[int, ...]]) -> Iterable[ReplicaDigest]:
        from distributed import as_completed

        shared = client.scatter(plan, broadcast=True)
        futs = [client.submit(map_replicas, shared, list(b), pure=False) for b in batches]
        where = {f.key: b for f, b in zip(futs, batches, strict=True)}
        for fut in as_completed(futs, loop=client.loop):
            try:
                got: ReplicaDigest = fut.result()
            except Exception as exc:  # a worker lost, or a failure inside the map
                client.cancel(futs)
                b = where[fut.key]
                raise InputError(
                    plan.src,
                    f"the map of replicas {b[0]}..{b[-1]} on the Dask cluster failed "
                    f"({type(exc).__name__}: {str(exc)[:200]})",
                ) from None
            fut.release()  # the cluster need not keep what arrived here
            yield got

    return run


__all__ = [
    "ReplicaDigest",
    "TablePlan",
    "by_replica",
    "dask_mapper",
    "inline_mapper",
    "is_parquet",
    "map_replicas",
    "parse_by_replica",
    "plan_table",
    "pool_mapper",
    "reduce_replicas",
    "replica_batches",
]
