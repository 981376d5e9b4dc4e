"""Op-table rows (every rank's ops in one frame) turned into one :class:`RankTimeline` per rank.

The mapping of optypes to intervals and ranges is described in :mod:`ppdiag.parsers.optable`.
The frame has the columns ``dp_rank, stage, rank, step, optype, t0, dur, seq_id, mc, gmc,
mb_id`` (times in ns; ``t0`` step-relative unless the rows were laid on one clock already).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.model import Direction, Intervals, Kind, Phase, ProcessGroup, RangeKind, Ranges, RankTimeline

if TYPE_CHECKING:
    import pandas as pd

# optype -> code; the order is the code (and the interval name id - 1)
OPTYPES = (
    "forward-compute",
    "backward-compute",
    "forward-send",
    "forward-recv",
    "backward-send",
    "backward-recv",
    "grads-reduce-scatter",
    "params-all-gather",
    "embedding-grads-all-reduce",
    "layernorm-grads-all-reduce",
    "optimizer",
    "optimizer-clip-main-grad",
    "gc",
    "other",
)
FC, BC, FS, FR, BS, BR, RS, AG, EMB, LN, OPT, CLIP, GC, OTHER = range(len(OPTYPES))
_COMPUTE = (FC, BC, OPT)
_P2P = (FS, FR, BS, BR)
# the gradient clip all-reduces the gradient norm over every rank of the job: its waiting for the
# slowest rank is communication, not optimizer compute (it ends together on every rank)
_COLL = (RS, AG, EMB, LN, CLIP)
#: the names of the communication optypes (p2p and collectives)
COMM_OPTYPES = tuple(OPTYPES[c] for c in (*_P2P, *_COLL))
# stream per op family: one compute stream, one per p2p direction, one for DP collectives
_STREAM = np.array([7, 7, 21, 22, 23, 24, 40, 40, 41, 42, 7, 43, 0, 0], dtype=np.int64)
_PHASE = np.array([1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 5, 5], dtype=np.int8)
# neighbour stage offset and direction of each p2p optype
_PEER_OFF = np.zeros(len(OPTYPES), dtype=np.int64)
_PEER_OFF[[FS, BR]] = 1
_PEER_OFF[[FR, BS]] = -1
_DIR = np.zeros(len(OPTYPES), dtype=np.int8)
_DIR[[FS, BS]] = int(Direction.SEND)
_DIR[[FR, BR]] = int(Direction.RECV)
# group slot in every rank's process_groups: 0 pipeline, 1 DP (stage across replicas),
# 2 embedding (first + last stage of the pipeline), 3 the rank's TP lane peers (layernorm grads),
# 4 every rank of the table (the gradient-norm all-reduce of the clip)
_GROUP = np.full(len(OPTYPES), -1, dtype=np.int32)
_GROUP[[RS, AG]] = 1
_GROUP[EMB] = 2
_GROUP[LN] = 3
_GROUP[CLIP] = 4

_I64 = npt.NDArray[np.int64]


def resolution_ns(values: npt.NDArray[Any], unit_ns: float) -> float:
    """The timer resolution the time column carries, in ns: the spacing of its float type at its
    largest magnitude (float32 seconds at 0.1 s are 7 ns apart, at 30 s 2 µs apart)."""
    if not values.size or not np.issubdtype(values.dtype, np.floating):
        return 0.0
    top = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0
    return float(np.spacing(values.dtype.type(top))) * unit_ns


@dataclass(frozen=True)
class StepExtents:
    """Per step number: the earliest start and the latest end of its ops (step-relative ns, after
    the bad rows are dropped and negative durations clamped). A reduction: the extents of a
    table's parts merged (:meth:`merge`) are the whole table's, so the step windows every rank
    shares can be laid from a pass over a few columns, part by part."""

    steps: _I64
    lo: _I64
    hi: _I64

    @classmethod
    def of(cls, step: _I64, t0: _I64, dur: _I64) -> StepExtents:
        """The extents of rows (step number, start, duration)."""
        steps, inv = np.unique(step, return_inverse=True)
        lo = np.full(steps.size, np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.full(steps.size, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(lo, inv, t0)
        np.maximum.at(hi, inv, t0 + dur)
        return cls(steps, lo, hi)

    def merge(self, other: StepExtents) -> StepExtents:
        """The extents of both parts together."""
        steps, inv = np.unique(np.concatenate([self.steps, other.steps]), return_inverse=True)
        lo = np.full(steps.size, np.iinfo(np.int64).max, dtype=np.int64)
        hi = np.full(steps.size, np.iinfo(np.int64).min, dtype=np.int64)
        np.minimum.at(lo, inv, np.concatenate([self.lo, other.lo]))
        np.maximum.at(hi, inv, np.concatenate([self.hi, other.hi]))
        return StepExtents(steps, lo, hi)


@dataclass(frozen=True)
class Layout:
    """The step windows every rank shares: the offset added to a row's start per step number
    (step-relative times laid side by side on one clock, in step order; zero when the rows are on
    one clock already) and each window's start and end."""

    steps: _I64
    offset: _I64
    w_lo: _I64
    w_hi: _I64
    sampled: bool  # sampled steps laid side by side (said in a warning)

    @classmethod
    def of(cls, ext: StepExtents, laid: bool) -> Layout:
        """The windows of a table of these extents (``laid``: its starts are on one clock)."""
        steps = ext.steps
        if laid:
            zero = np.zeros(steps.size, dtype=np.int64)
            return cls(steps, zero, ext.lo, np.maximum(ext.hi, 0), False)
        lo, hi = np.minimum(ext.lo, 0), np.maximum(ext.hi, 0)
        span = hi - lo
        # a gap between sampled steps keeps the windows apart on the timeline
        gap = np.maximum(span // 20, 1_000_000)
        starts = np.concatenate([[0], np.cumsum(span + gap)[:-1]]).astype(np.int64) - lo
        sampled = steps.size > 1 and bool(np.any(np.diff(steps) > 1))
        return cls(steps, starts, starts + lo, np.maximum(ext.hi + starts, 0), sampled)

    def t_abs(self, step: _I64, t0: _I64) -> _I64:
        """Each row's start on the run's clock."""
        return t0 + self.offset[np.searchsorted(self.steps, step)]


@dataclass(frozen=True)
class Tally:
    """What a table's warnings count, for one part of it; the parts' tallies add up
    (:meth:`merge`) to the whole table's, whichever way its rows were split."""

    unknown: tuple[tuple[str, int], ...] = ()  # unknown optype -> ops, by name
    dropped: int = 0  # ops with a negative rank or stage
    negative: int = 0  # ops with a negative duration
    worst_ns: int = 0  # the most negative duration
    p2p_bad: int = 0  # receives that end before their sender's send starts
    p2p_total: int = 0

    def merge(self, other: Tally) -> Tally:
        """Both parts' counts together."""
        unk = dict(self.unknown)
        for name, n in other.unknown:
            unk[name] = unk.get(name, 0) + n
        return Tally(
            tuple(sorted(unk.items())),
            self.dropped + other.dropped,
            self.negative + other.negative,
            min(self.worst_ns, other.worst_ns),
            self.p2p_bad + other.p2p_bad,
            self.p2p_total + other.p2p_total,
        )


def file_warnings(tally: Tally, layout: Layout, tp: tuple[int, int, int, int, int]) -> list[str]:
    """The table's warnings (said once, on its first rank), in the order the reader meets them.
    ``tp``: the placement's (tp size, pp, replicas, world, traced ranks)."""
    out: list[str] = []
    if tally.unknown:
        shown = ", ".join(f"{n} ({c})" for n, c in tally.unknown[:8])
        out.append(f"{sum(c for _, c in tally.unknown)} ops of unknown optype kept as 'other': {shown}")
    if tally.dropped:
        out.append(f"{tally.dropped} ops with a negative rank or stage dropped")
    if tally.negative:
        worst = float(-tally.worst_ns) / 1e3
        out.append(
            f"{tally.negative} ops with a negative duration (down to -{worst:.1f} µs) kept as zero-length"
        )
    if layout.sampled:
        steps = layout.steps
        out.append(f"{steps.size} sampled steps ({steps[0]}..{steps[-1]}) laid side by side on one clock")
    size, n_pp, n_dp, world, traced = tp
    if size > 1:
        out.append(
            f"ranks in Megatron's default order (rank = (stage * dp + dp_rank) * tp + tp_rank) with "
            f"tensor-parallel size {size}: a world of {size} x {n_pp} x {n_dp} = {world} ranks, "
            f"{traced} traced"
        )
    if tally.p2p_total and tally.p2p_bad > 0.05 * tally.p2p_total:
        out.append(
            f"{tally.p2p_bad} of {tally.p2p_total} receives end before their sender's send starts: the "
            "stage / dp_rank placement (columns or lane names) may not match the transfers"
        )
    return out


def _check_p2p_order(df: pd.DataFrame, codes: _I64, t_abs: _I64, n_pp: int) -> tuple[int, int]:
    """The stage placement checked against the transfers: a receive of micro-batch ``k`` ends after
    its sender's send of ``k`` starts. Many receives that finish before their send began mean the
    ``stage`` / ``dp_rank`` columns (or lanes) do not say where the ranks really sit. Returns
    (receives that end too early, receives matched): one replica's rows hold all of its own."""
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    ends = t_abs + df["dur"].to_numpy()
    dp, st, step, mb = (df[c].to_numpy() for c in ("dp_rank", "stage", "step", "mb_id"))
    bad = total = 0
    for send, recv, off in ((FS, FR, 1), (BS, BR, -1)):
        sm, rm = codes == send, codes == recv
        if not sm.any() or not rm.any():
            continue
        s_df = pd.DataFrame(
            {"dp": dp[sm], "st": (st[sm] + off) % n_pp, "step": step[sm], "mb": mb[sm], "t": t_abs[sm]}
        )
        r_df = pd.DataFrame({"dp": dp[rm], "st": st[rm], "step": step[rm], "mb": mb[rm], "e": ends[rm]})
        # first transfer of each micro-batch per link and step (interleaved chunks send several)
        j = (
            s_df.groupby(["dp", "st", "step", "mb"])
            .t.min()
            .to_frame()
            .join(r_df.groupby(["dp", "st", "step", "mb"]).e.max(), how="inner")
        )
        total += len(j)
        bad += int((j["e"] < j["t"] - 10_000).sum())
    return bad, total


def _codes(df: pd.DataFrame) -> tuple[_I64, tuple[tuple[str, int], ...]]:
    """Optype code per row, unknown optypes as ``other``; and the unknown ones' counts by name."""
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    col = df["optype"]
    # by distinct optype (a handful), not by row: the reader's categorical, else made here
    cat = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype(str).astype("category")
    names = [str(v) for v in cat.cat.categories]
    lut = np.r_[pd.Index(OPTYPES).get_indexer(pd.Index(names)), -1].astype(np.int64)
    cc = cat.cat.codes.to_numpy().astype(np.int64)  # -1: a missing optype, read as "nan"
    codes = lut[cc]
    unknown = codes < 0
    if not unknown.any():
        return codes, ()
    counts = np.bincount(np.where(cc < 0, len(names), cc)[unknown], minlength=len(names) + 1)
    found: dict[str, int] = {}
    for name, k in zip([*names, "nan"], counts.tolist(), strict=True):
        if k:
            found[name] = found.get(name, 0) + int(k)
    return np.where(unknown, OTHER, codes), tuple(sorted(found.items()))


def world_of(rank: _I64, dp: _I64, stage: _I64, n_pp: int) -> tuple[int, int]:
    """(tensor-parallel size, world size) of a table whose ranks follow Megatron's default order
    ``rank = (stage * D + dp) * T + t``: the smallest ``T`` that puts every rank in its (dp, stage)
    slot, so a table that traces one TP rank of each slot (ranks 0, 4, 8 ...) is a world of
    ``T x pp x dp``. ``(0, 0)`` when the ranks follow another order (the world is then what is traced).
    """
    n_dp = int(dp.max()) + 1
    idx = stage * n_dp + dp
    # rank // T == idx for every row: T > rank / (idx + 1) and T <= rank / idx (idx > 0)
    t = int(np.max(rank // (idx + 1))) + 1
    ok = bool(np.all(rank // t == idx))
    if not ok:
        return 0, 0
    return t, t * n_pp * n_dp


class _Placement:
    """Where each rank sits, from the columns: one (dp, stage) per rank."""

    def __init__(self, df: pd.DataFrame, src: str) -> None:
        import pandas as pd  # here, not at import: detecting formats must not load pandas

        cols = {
            "rank": df["rank"].to_numpy(),
            "dp": df["dp_rank"].to_numpy(),
            "stage": df["stage"].to_numpy(),
        }
        place = pd.DataFrame(cols).drop_duplicates()
        if place["rank"].duplicated().any():
            dup = place[place["rank"].duplicated(keep=False)]["rank"].iloc[0]
            raise InputError(src, f"rank {dup} appears with more than one (dp_rank, stage)")
        self.n_pp = int(df["stage"].max()) + 1
        self.n_ranks = int(place["rank"].nunique())
        self.all_ranks = sorted(int(r) for r in place["rank"].unique())
        self.tp_size, self.world = world_of(
            place["rank"].to_numpy(np.int64),
            place["dp"].to_numpy(np.int64),
            place["stage"].to_numpy(np.int64),
            self.n_pp,
        )
        self.loc = pd.Series(
            place["rank"].to_numpy(), index=pd.MultiIndex.from_arrays([place["dp"], place["stage"]])
        )
        # tp lanes: ranks sharing (dp, stage) are one stage's tensor-parallel group
        self.lines: dict[int, list[int]] = {}
        for d in sorted(place["dp"].unique()):
            sub = place[place["dp"] == d].sort_values(["stage", "rank"])
            self.lines[int(d)] = [int(r) for r in sub.drop_duplicates("stage")["rank"]]
        self.stage_ranks: dict[int, list[int]] = {}
        self.tp: dict[tuple[int, int], list[int]] = {}
        for r, d, s in zip(place["rank"], place["dp"], place["stage"], strict=True):
            self.stage_ranks.setdefault(int(s), []).append(int(r))
            self.tp.setdefault((int(d), int(s)), []).append(int(r))
        # each stage's DP group, sorted once and shared by its ranks (sorted per rank, the groups
        # cost the ranks times the replicas)
        self._dp_group: dict[int, list[int]] = {}

    def peers(self, codes: _I64, dp: _I64, stage: _I64) -> _I64:
        """Peer of each p2p op: the neighbouring stage in the same replica (wraps for interleaved
        chunks); -1 elsewhere."""
        import pandas as pd  # here, not at import: detecting formats must not load pandas

        is_p2p = np.isin(codes, _P2P)
        peer_stage = (stage + _PEER_OFF[codes]) % self.n_pp
        peer = np.full(len(codes), -1, dtype=np.int64)
        if is_p2p.any():
            idx = self.loc.index.get_indexer(pd.MultiIndex.from_arrays([dp[is_p2p], peer_stage[is_p2p]]))
            peer[is_p2p] = np.where(idx >= 0, self.loc.to_numpy()[np.clip(idx, 0, None)], -1)
        return peer

    def tp_facts(self) -> tuple[int, int, int, int, int]:
        """(tensor-parallel size, pp, replicas, world, traced ranks): what the TP warning says."""
        return self.tp_size, self.n_pp, len(self.lines), self.world, self.n_ranks

    def _sorted_stage(self, s: int) -> list[int]:
        got = self._dp_group.get(s)
        if got is None:
            got = self._dp_group[s] = sorted(self.stage_ranks[s])
        return got

    def groups(self, d: int, s: int) -> list[ProcessGroup]:
        line = self.lines[d]
        return [
            ProcessGroup(f"pp_dp{d}", "PIPELINE_MODEL_PARALLEL_GROUP", line),
            ProcessGroup(f"dp_stage{s}", "DATA_PARALLEL_GROUP", self._sorted_stage(s)),
            ProcessGroup(f"emb_dp{d}", "EMBEDDING_GROUP", sorted({line[0], line[-1]})),
            ProcessGroup(f"tp_dp{d}_s{s}", "TENSOR_MODEL_PARALLEL_GROUP", sorted(self.tp[(d, s)])),
            ProcessGroup("world", "GRAD_NORM_GROUP", self.all_ranks),
        ]


class _Cols:
    """The table's columns as arrays, with what every rank's tables are cut from."""

    def __init__(self, df: pd.DataFrame, codes: _I64, t_abs: _I64, peer: _I64) -> None:
        self.codes, self.t_abs, self.peer = codes, t_abs, peer
        self.dur = df["dur"].to_numpy()
        self.stage = df["stage"].to_numpy()
        self.mb = df["mb_id"].to_numpy()
        self.mc = df["mc"].to_numpy()
        self.seq = df["seq_id"].to_numpy()
        gmc = df["gmc"].to_numpy()
        self.lstage = np.where(gmc >= 0, gmc, self.stage)
        self.is_p2p = np.isin(codes, _P2P)
        kind = np.full(len(df), -1, dtype=np.int8)
        kind[np.isin(codes, _COMPUTE)] = int(Kind.COMPUTE)
        kind[self.is_p2p] = int(Kind.P2P)
        kind[np.isin(codes, _COLL)] = int(Kind.COLLECTIVE)
        self.kind = kind

    def intervals(self, sel: _I64) -> Intervals:
        isel = sel[self.kind[sel] >= 0]
        ic = self.codes[isel]
        t = self.t_abs[isel]
        return Intervals.from_columns(
            isel.size,
            {
                "start": t,
                "end": t + self.dur[isel],
                "stream": _STREAM[ic],
                "kind": self.kind[isel],
                "name": ic + 1,
                "phase": _PHASE[ic],
                "mb": np.where(np.isin(ic, (FC, BC)) | self.is_p2p[isel], self.mb[isel], -1),
                "chunk": self.mc[isel],
                "peer": self.peer[isel],
                "direction": _DIR[ic],
                "seq": np.where(self.kind[isel] == int(Kind.COLLECTIVE), -1, self.seq[isel]),
                "group": _GROUP[ic],
            },
        )

    def ranges(self, sel: _I64, steps: _I64, w_lo: _I64, w_hi: _I64) -> Ranges:
        """Step windows, a pipeline label per compute block, and the OTHER ops, in time order."""
        c = self.codes[sel]
        blk = sel[(c == FC) | (c == BC)]
        oth = sel[(c == GC) | (c == OTHER)]
        t, dur = self.t_abs, self.dur
        lab = Ranges.from_columns(
            blk.size,
            {
                "start": t[blk],
                "end": t[blk] + dur[blk],
                "kind": np.full(blk.size, int(RangeKind.LABEL)),
                "name": self.codes[blk] + 1,
                "stage": self.lstage[blk],
                "mb": self.mb[blk],
                "phase": _PHASE[self.codes[blk]],
            },
        )
        other = Ranges.from_columns(
            oth.size,
            {
                "start": t[oth],
                "end": t[oth] + dur[oth],
                "kind": np.full(oth.size, int(RangeKind.OTHER)),
                "name": self.codes[oth] + 1,
                "phase": np.full(oth.size, int(Phase.OTHER)),
            },
        )
        st_rows = Ranges.from_columns(
            steps.size,
            {
                "start": w_lo,
                "end": w_hi,
                "kind": np.full(steps.size, int(RangeKind.STEP)),
                "name": np.zeros(steps.size),
                "num": steps,
            },
        )
        ranges = Ranges.concat([st_rows, lab, other])
        return ranges.take(np.argsort(ranges.start, kind="stable"))


def clean(df: pd.DataFrame) -> tuple[pd.DataFrame, npt.NDArray[np.bool_] | None, int, int]:
    """The rows with a negative rank or stage dropped (the mask of those kept, None when all are)
    and negative durations (two timers a few µs apart) kept as zero-length: dropping one would
    leave its collective a member short, which reads as a hang. Returns (rows, kept, durations
    clamped, the most negative one)."""
    bad = (df["rank"].to_numpy() < 0) | (df["stage"].to_numpy() < 0)
    keep = None
    if bad.any():
        keep = ~bad
        df = df[keep].reset_index(drop=True)
    neg = df["dur"].to_numpy() < 0
    if not neg.any():
        return df, keep, 0, 0
    worst = int(df["dur"].to_numpy()[neg].min())
    df = df.copy()
    df.loc[neg, "dur"] = 0
    return df, keep, int(neg.sum()), worst


def placement(df: pd.DataFrame, src: str) -> _Placement:
    """Where each rank sits, from rows (or the distinct rows) of ``rank, dp_rank, stage``."""
    return _Placement(df, src)


def to_ranks(
    df: pd.DataFrame,
    src: str,
    laid: bool,
    warnings: list[str],
    resolution_ns: float,
    rank_source: str = "rank column",
) -> list[RankTimeline]:
    """One timeline per rank of the table; warnings of the file go on the first rank.

    The same as :func:`ranks_of` over parts of the table (its replicas) on the whole table's
    :class:`Layout` and placement, with :func:`file_warnings` of the parts' merged tallies on
    the first rank (:mod:`ppdiag.parsers.optable_replicas`)."""
    if not len(df):
        raise InputError(src, "op table has no rows")
    rows = clean(df)[0]
    layout = Layout.of(StepExtents.of(*(rows[c].to_numpy() for c in ("step", "t0", "dur"))), laid)
    place = _Placement(rows, src)
    out, tally = ranks_of(df, src, layout, place, resolution_ns, rank_source)
    warnings.extend(file_warnings(tally, layout, place.tp_facts()))
    if out:
        out[0].warnings = list(warnings)
    return out


def ranks_of(
    df: pd.DataFrame,
    src: str,
    layout: Layout,
    place: _Placement,
    resolution_ns: float,
    rank_source: str = "rank column",
) -> tuple[list[RankTimeline], Tally]:
    """The timelines of the ranks whose rows ``df`` holds (every row of each: a whole table or
    some of its replicas), on the table's step ``layout`` and ``place``-ment, without the table's
    warnings (each rank's list is empty); and the counts those warnings are made of."""
    codes, unknown = _codes(df)
    df, keep, negative, worst = clean(df)
    dropped = 0
    if keep is not None:
        dropped = int(keep.size - keep.sum())
        codes = codes[keep]
    t_abs = layout.t_abs(df["step"].to_numpy(), df["t0"].to_numpy())
    rank = df["rank"].to_numpy()
    dp = df["dp_rank"].to_numpy()
    stage = df["stage"].to_numpy()
    cols = _Cols(df, codes, t_abs, place.peers(codes, dp, stage))
    bad, total = _check_p2p_order(df, codes, t_abs, place.n_pp)
    tally = Tally(unknown, dropped, negative, worst, bad, total)
    names = ["", *OPTYPES]
    order = np.lexsort((t_abs, rank))
    r_sorted = rank[order]
    cuts: list[int] = (
        np.flatnonzero(np.r_[True, r_sorted[1:] != r_sorted[:-1], True]).tolist() if rank.size else []
    )
    out: list[RankTimeline] = []
    for a, b in itertools.pairwise(cuts):  # one iteration per rank
        sel = order[a:b]
        d, s = int(dp[sel[0]]), int(stage[sel[0]])
        out.append(
            RankTimeline(
                rank=int(rank[sel[0]]),
                source=src,
                format="optable",
                names=names,
                intervals=cols.intervals(sel).sorted(),
                ranges=cols.ranges(sel, layout.steps, layout.w_lo, layout.w_hi),
                world_size=place.world or max(place.all_ranks[-1] + 1, place.n_ranks),
                process_groups=place.groups(d, s),
                rank_source=rank_source,
                events_total=int(sel.size),
                meta={
                    "pipeline": d,
                    "dp_rank": d,
                    "pp_rank": s,
                    "time_resolution_ns": resolution_ns,
                    **({"tp_size": place.tp_size} if place.tp_size else {}),
                },
            )
        )
    return out, tally
