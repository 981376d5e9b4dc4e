"""The model as a sequence of layers for the what-if rebalancing.

:class:`LayerProfile` — the model as a sequence of blocks (layers) with a cost each, so stages can
be re-cut: from module ranges in the trace (``nn.Module: …`` events, NVTX ranges per layer), from a
``--layer-costs`` file measured elsewhere, or estimated from the stage totals
(``--layers-per-stage``: each stage's layers assumed equal), or — without any of these — the stage
totals spread evenly over each stage (a continuous model that only supports ideal splits).

Costs are ns per micro-batch at the measured micro-batch size.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.model import Kind, Phase, RangeKind, RankTimeline
from ppdiag.pipeline.blocks import Blocks
from ppdiag.whatif.costs import MS, MeasuredRun

F64 = npt.NDArray[np.float64]


@dataclass
class LayerProfile:
    """The model as blocks in order, each with its cost per micro-batch (ns).

    ``bwd_ns`` is the whole backward of a block (weight gradient included), ``wgrad_ns`` the part of
    it that is the weight gradient when known (NaN otherwise). ``act_mb`` is the activation memory one
    micro-batch leaves on the block until its backward (NaN when unknown). ``bounds`` is the current
    split into virtual stages when known. ``discrete``: blocks are real layers and splits must fall
    between them; otherwise the units are whole stages whose cost is taken as spread evenly, and a
    split may cut anywhere (an ideal that a real layer split only approaches).
    """

    names: list[str]
    fwd_ns: F64
    bwd_ns: F64
    wgrad_ns: F64
    act_mb: F64
    bounds: list[int] | None
    source: str  # "trace" | "file" | "layers-per-stage" | "stages"
    discrete: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def total_ns(self) -> F64:
        return self.fwd_ns + self.bwd_ns

    @property
    def has_activations(self) -> bool:
        return bool(np.isfinite(self.act_mb).all()) and self.n > 0

    def chunk_sums(self, bounds: Sequence[float]) -> dict[str, F64]:
        """Per chunk between consecutive (possibly fractional) bounds: fwd, bwd, wgrad, act, layers."""
        x = np.asarray(bounds, dtype=np.float64)
        grid = np.arange(self.n + 1, dtype=np.float64)
        out: dict[str, F64] = {}
        for key, arr in (
            ("fwd", self.fwd_ns),
            ("bwd", self.bwd_ns),
            ("wgrad", np.nan_to_num(self.wgrad_ns)),
            ("act", np.nan_to_num(self.act_mb)),
        ):
            pre = np.concatenate(([0.0], np.cumsum(arr)))
            c = np.interp(x, grid, pre)
            out[key] = np.diff(c)
        out["layers"] = np.diff(x)
        return out


def profile_from_stages(meas: MeasuredRun, layers_per_stage: Sequence[int] | None = None) -> LayerProfile:
    """Per-block costs estimated from the stage totals.

    With ``layers_per_stage`` (one count, or one per virtual stage) every stage's layers are taken
    as equally expensive; without it each stage is one unit that a split may cut anywhere.
    """
    n_st = meas.stages
    bwd_full = meas.bwd_ns + meas.wgrad_ns
    wg = meas.wgrad_ns if meas.split_backward else np.full(n_st, np.nan)
    if layers_per_stage is None:
        return LayerProfile(
            [f"stage {s}" for s in range(n_st)],
            meas.fwd_ns.copy(),
            bwd_full.copy(),
            wg.copy(),
            np.full(n_st, np.nan),
            list(range(n_st + 1)),
            "stages",
            discrete=False,
        )
    counts = list(layers_per_stage)
    if len(counts) == 1:
        counts = counts * n_st
    if len(counts) != n_st:
        raise InputError(
            None, f"--layers-per-stage has {len(counts)} values but the run has {n_st} (virtual) stages"
        )
    if any(c < 1 for c in counts):
        raise InputError(None, "--layers-per-stage values must be >= 1")
    rep = np.repeat(np.arange(n_st), counts)
    cnt = np.asarray(counts, dtype=np.float64)
    names = [f"layer {i}" for i in range(int(sum(counts)))]
    bounds = [0, *np.cumsum(counts).tolist()]
    return LayerProfile(
        names,
        (meas.fwd_ns / cnt)[rep],
        (bwd_full / cnt)[rep],
        (wg / cnt)[rep],
        np.full(rep.size, np.nan),
        bounds,
        "layers-per-stage",
        discrete=True,
        notes=[
            "per-layer costs estimated from the stage totals (layers of a stage assumed equally expensive)"
        ],
    )


_FILE_COLS = ("fwd_ms", "bwd_ms")
_OPT_COLS = ("activation_mb", "wgrad_ms", "stage")
_NAME_COLS = ("block", "name", "layer")


def _num(path: str, where: str, key: str, raw: Any, optional: bool) -> float:
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        if optional:
            return math.nan
        raise InputError(path, f"{where}: {key} is missing")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise InputError(path, f"{where}: {key} is not a number: {str(raw)[:40]!r}") from None
    if not math.isfinite(v) or v < 0:
        raise InputError(path, f"{where}: {key} must be a finite number >= 0, got {str(raw)[:40]}")
    return v


def read_layer_costs(path: str | Path) -> LayerProfile:
    """Read a per-block cost file: CSV with a header row, or JSON (a list of objects, or
    ``{"blocks": [...]}``). Columns: ``block`` (name), ``fwd_ms``, ``bwd_ms`` (whole backward), and
    optionally ``activation_mb``, ``wgrad_ms`` (weight-gradient part of ``bwd_ms``) and ``stage``
    (the current stage of the block). Blocks are in model order. Any problem: InputError."""
    p = Path(path)
    sp = str(p)
    rows, where = _file_rows(p, sp)
    names, cols = _columns(sp, rows, where)
    fwd = np.asarray(cols["fwd_ms"]) * MS
    bwd = np.asarray(cols["bwd_ms"]) * MS
    wg = np.asarray(cols["wgrad_ms"]) * MS
    if np.isfinite(wg).any() and (wg[np.isfinite(wg)] > bwd[np.isfinite(wg)] + 1e-9).any():
        raise InputError(sp, "wgrad_ms is the weight-gradient part of bwd_ms and cannot exceed it")
    act = np.asarray(cols["activation_mb"])
    if np.isfinite(act).any() and not np.isfinite(act).all():
        raise InputError(sp, "activation_mb is given for some blocks but not for all")
    bounds = _stage_bounds(sp, np.asarray(cols["stage"]))
    if float((fwd + bwd).sum()) <= 0:
        raise InputError(sp, "every block costs 0 ms")
    return LayerProfile(names, fwd, bwd, wg, act, bounds, "file", discrete=True)


def _file_rows(p: Path, sp: str) -> tuple[list[dict[str, Any]], str]:
    """The layer-cost file's rows (JSON objects or CSV lines) and how a row is named in errors."""
    try:
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(sp, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(sp, f"cannot read the layer-cost file: {exc}") from None
    stripped = text.lstrip()
    if not stripped:
        raise InputError(sp, "the layer-cost file is empty")
    if p.suffix.lower() == ".json" or stripped[:1] in "[{":
        rows, where = _json_rows(sp, text), "block {i}"
    else:
        rows, where = _csv_rows(sp, text), "line {line}"
    if not rows:
        raise InputError(sp, "the layer-cost file lists no blocks")
    return rows, where


def _json_rows(sp: str, text: str) -> list[dict[str, Any]]:
    """A JSON list of objects, or the list under ``blocks`` (or ``layers``)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(sp, f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if isinstance(data, dict):
        data = data.get("blocks", data.get("layers"))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise InputError(sp, 'expected a list of objects (or {"blocks": [...]}) with fwd_ms and bwd_ms')
    return data


def _csv_rows(sp: str, text: str) -> list[dict[str, Any]]:
    """The lines of a CSV file with a header row that names the required columns."""
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames:
        raise InputError(sp, "the CSV file has no header row")
    reader.fieldnames = [f.strip().lower() for f in reader.fieldnames]
    missing = [c for c in _FILE_COLS if c not in reader.fieldnames]
    if missing:
        raise InputError(
            sp,
            f"the CSV header lacks {', '.join(missing)} (need block, fwd_ms, bwd_ms; "
            "optional activation_mb, wgrad_ms, stage)",
        )
    return list(reader)


def _columns(sp: str, rows: list[dict[str, Any]], where: str) -> tuple[list[str], dict[str, list[float]]]:
    """The block names and, per column, the numbers of every row (NaN where an optional one is
    left out)."""
    names: list[str] = []
    cols: dict[str, list[float]] = {k: [] for k in (*_FILE_COLS, *_OPT_COLS)}
    for i, row in enumerate(rows):
        w = where.format(i=i, line=i + 2)
        low = {str(k).strip().lower(): v for k, v in row.items() if k is not None}
        name = next((str(low[c]) for c in _NAME_COLS if low.get(c) not in (None, "")), f"block {i}")
        names.append(name[:200])
        for key in _FILE_COLS:
            cols[key].append(_num(sp, w, key, low.get(key), optional=False))
        for key in _OPT_COLS:
            cols[key].append(_num(sp, w, key, low.get(key), optional=True))
    return names, cols


def _stage_bounds(sp: str, st: npt.NDArray[np.float64]) -> list[int] | None:
    """The block bounds of the stages the ``stage`` column gives, or None without one."""
    if not np.isfinite(st).any():
        return None
    if not np.isfinite(st).all() or (st != np.round(st)).any():
        raise InputError(sp, "stage must be an integer on every block when it is given")
    s = st.astype(np.int64)
    if s[0] != 0 or (np.diff(s) < 0).any() or (np.diff(s) > 1).any():
        raise InputError(
            sp,
            "stage must start at 0 and grow by at most 1 from block to block (stages hold contiguous blocks)",
        )
    return [0, *(np.flatnonzero(np.diff(s)) + 1).tolist(), int(s.size)]


def scale_profile_to(profile: LayerProfile, meas: MeasuredRun) -> LayerProfile:
    """Scale a profile measured elsewhere so its totals match the trace (forward and backward apart)."""
    f_meas = float(meas.fwd_ns.sum())
    b_meas = float((meas.bwd_ns + meas.wgrad_ns).sum())
    f_file = float(profile.fwd_ns.sum())
    b_file = float(profile.bwd_ns.sum())
    kf = f_meas / f_file if f_file > 0 else 1.0
    kb = b_meas / b_file if b_file > 0 else 1.0
    out = LayerProfile(
        list(profile.names),
        profile.fwd_ns * kf,
        profile.bwd_ns * kb,
        profile.wgrad_ns * kb,
        profile.act_mb.copy(),
        profile.bounds,
        profile.source,
        profile.discrete,
        list(profile.notes),
    )
    if abs(kf - 1) > 0.02 or abs(kb - 1) > 0.02:
        out.notes.append(f"block costs scaled to the trace's totals (forward x{kf:.3g}, backward x{kb:.3g})")
    return out


# ---- per-block costs from module ranges in the trace ---------------------------------------


def _depths(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Nesting depth of every range (0: inside no other range), ranges sorted by (start, -end)."""
    depth = np.zeros(start.size, dtype=np.int64)
    stack: list[int] = []  # ends of the open ranges
    for i in range(start.size):  # one iteration per module range (a few per layer and micro-batch)
        s, e = int(start[i]), int(end[i])
        while stack and stack[-1] <= s:
            stack.pop()
        depth[i] = len(stack)
        stack.append(e)
    return depth


def module_layers(tl: RankTimeline, blocks: Blocks) -> dict[int, tuple[list[str], F64]]:
    """Per virtual stage of this rank: the names and the mean forward compute (ns) of its layers.

    A layer is a module range (``RangeKind.MODULE``) at the shallowest nesting level that has at least
    two ranges inside one forward block (the level below the stage's own wrapper module). Its compute
    is the device time of the work it launched (GPU) or ran (CPU-only). Only blocks whose layer count
    is the stage's most common one are used.
    """
    rg = tl.ranges
    mm = rg.kind == int(RangeKind.MODULE)
    if not mm.any() or not len(blocks):
        return {}
    off = tl.clock_offset_ns
    ms = rg.start[mm] + off
    me = rg.end[mm] + off
    mname = rg.name[mm]
    order = np.lexsort((-me, ms))
    ms, me, mname = ms[order], me[order], mname[order]
    depth = _depths(ms, me)
    iv = tl.intervals
    comp = iv.kind == int(Kind.COMPUTE)
    if not comp.any():
        return {}
    use_launch = (not tl.cpu_only) and bool((iv.launch[comp] >= 0).any())
    key = (
        np.where(iv.launch[comp] >= 0, iv.launch[comp], iv.start[comp]) if use_launch else iv.start[comp]
    ) + off
    dstart = iv.start[comp] + off
    dur = (iv.end[comp] - iv.start[comp]).astype(np.float64)
    o = np.argsort(key, kind="stable")
    key, dstart, dur = key[o], dstart[o], dur[o]
    cum = np.concatenate(([0.0], np.cumsum(dur)))
    lo = np.searchsorted(key, ms, side="left")
    hi = np.searchsorted(key, me, side="left")
    busy = cum[hi] - cum[lo]
    has = hi > lo
    first_dev = np.where(has, dstart[np.minimum(lo, key.size - 1)], -1)
    # the forward block each module range's work ran in
    fwd = np.flatnonzero(blocks.phase == int(Phase.FWD))
    if fwd.size == 0:
        return {}
    bs, be = blocks.start[fwd], blocks.end[fwd]
    ob = np.argsort(bs, kind="stable")
    fwd, bs, be = fwd[ob], bs[ob], be[ob]
    bi = np.searchsorted(bs, first_dev, side="right") - 1
    inside = has & (bi >= 0) & (first_dev < be[np.clip(bi, 0, None)])
    blk = np.where(inside, fwd[np.clip(bi, 0, None)], -1)
    per_stage: dict[int, list[tuple[list[int], F64]]] = {}
    for b in np.unique(blk[blk >= 0]):
        sel = np.flatnonzero(blk == b)
        d = depth[sel]
        level = None
        for lv in np.unique(d):
            if int((d == lv).sum()) >= 2:
                level = lv
                break
        if level is None:
            continue
        rows = sel[d == level]
        per_stage.setdefault(int(blocks.stage[b]), []).append((mname[rows].tolist(), busy[rows]))
    out: dict[int, tuple[list[str], F64]] = {}
    for st, items in per_stage.items():
        n = Counter(len(x[0]) for x in items).most_common(1)[0][0]
        keep = [x for x in items if len(x[0]) == n]
        mean = np.mean(np.stack([x[1] for x in keep]), axis=0)
        names = [tl.name_of(i).removeprefix("nn.Module: ") for i in keep[0][0]]
        out[st] = (names, mean)
    return out


def profile_from_trace(
    timelines: dict[int, RankTimeline], blocks: dict[int, Blocks], meas: MeasuredRun
) -> LayerProfile | None:
    """Per-layer costs from module ranges, when every virtual stage shows its layers; else None.

    Forward costs come from the ranges; the stage's measured forward is spread over its layers in
    proportion (work between the layer ranges, e.g. the loss, goes with them), and the backward in
    the same proportion as the forward (layer ranges mark forward calls only).
    """
    found: dict[int, tuple[list[str], F64]] = {}
    for r, tl in timelines.items():
        b = blocks.get(r)
        if b is None or not len(b):
            continue
        for st, val in module_layers(tl, b).items():
            found.setdefault(st, val)
    n_st = meas.stages
    if any(s not in found for s in range(n_st)):
        return None
    names: list[str] = []
    fwd: list[F64] = []
    bwd: list[F64] = []
    wg: list[F64] = []
    counts: list[int] = []
    coverage: list[float] = []
    for s in range(n_st):
        nm, f = found[s]
        tot = float(f.sum())
        share = f / tot if tot > 0 else np.full(f.size, 1.0 / f.size)
        coverage.append(tot / float(meas.fwd_ns[s]) if meas.fwd_ns[s] > 0 else 1.0)
        names.extend(nm)
        fwd.append(share * meas.fwd_ns[s])
        bwd.append(share * (meas.bwd_ns[s] + meas.wgrad_ns[s]))
        wg.append(share * meas.wgrad_ns[s] if meas.split_backward else np.full(f.size, np.nan))
        counts.append(f.size)
    prof = LayerProfile(
        names,
        np.concatenate(fwd),
        np.concatenate(bwd),
        np.concatenate(wg),
        np.full(sum(counts), np.nan),
        [0, *np.cumsum(counts).tolist()],
        "trace",
        True,
        [
            "per-layer forward costs from the module ranges in the trace; backward split in "
            "the same proportions"
        ],
    )
    low = min(coverage)
    if low < 0.8:
        prof.notes.append(
            f"the layer ranges cover only {low:.0%} of a stage's forward compute; the rest "
            "is spread over its layers"
        )
    return prof


def measured_from_profile(
    profile: LayerProfile, pp: int, microbatches: int, schedule: str, virtual: int = 1, p2p_ns: float = 0.0
) -> MeasuredRun:
    """A stand-in for a measured run when there is no trace: the block costs split into stages (the
    file's ``stage`` column, else equal block counts), nothing lost beyond the schedule. Its step
    time is the simulator's. ``profile.bounds`` is set to the split used."""
    from ppdiag.simulate import SimConfig, simulate, splits_backward
    from ppdiag.simulate.schedules import canonical_schedule, default_virtual
    from ppdiag.whatif.rebalance import even_split

    try:
        sched = canonical_schedule(schedule)
        v = default_virtual(sched, virtual)
    except ValueError as exc:
        raise InputError(None, str(exc)) from None
    n_st = pp * v
    if profile.bounds is not None and len(profile.bounds) == n_st + 1:
        bounds: list[int] = list(profile.bounds)
    else:
        if profile.n < n_st:
            raise InputError(None, f"{profile.n} blocks cannot fill {n_st} stages")
        bounds = even_split(profile.n, n_st)
        if profile.bounds is not None:
            profile.notes.append(
                f"the file's stage column has {len(profile.bounds) - 1} stages, not {n_st}; "
                "blocks split evenly instead"
            )
    prof = LayerProfile(
        profile.names,
        profile.fwd_ns,
        profile.bwd_ns,
        profile.wgrad_ns,
        profile.act_mb,
        bounds,
        profile.source,
        profile.discrete,
        profile.notes,
    )
    sums = prof.chunk_sums([float(b) for b in bounds])
    split = splits_backward(sched)
    wg = (
        sums["wgrad"]
        if split and np.isfinite(profile.wgrad_ns).all()
        else (sums["bwd"] * 0.5 if split else np.zeros(n_st))
    )
    bwd = sums["bwd"] - wg
    try:
        res = simulate(
            SimConfig(
                sched,
                pp,
                microbatches,
                v,
                fwd_ns=sums["fwd"].tolist(),
                bwd_ns=bwd.tolist(),
                wgrad_ns=wg.tolist(),
                p2p_ns=p2p_ns,
            )
        )
    except ValueError as exc:
        raise InputError(None, str(exc)) from None
    profile.bounds = bounds
    return MeasuredRun(
        schedule=sched,
        detected_schedule=sched,
        pp=pp,
        virtual=v,
        microbatches=microbatches,
        fwd_ns=sums["fwd"],
        bwd_ns=bwd,
        wgrad_ns=wg,
        split_backward=split,
        p2p_ns=p2p_ns,
        head_ns=0.0,
        tail_idle_ns=np.zeros(pp),
        tail_busy_ns=np.zeros(pp),
        step_ns=float(res.step_ns),
        bubble_ratio=float(res.bubble_ratio),
        from_trace=False,
    )


__all__ = [
    "LayerProfile",
    "measured_from_profile",
    "module_layers",
    "profile_from_stages",
    "profile_from_trace",
    "read_layer_costs",
    "scale_profile_to",
]
