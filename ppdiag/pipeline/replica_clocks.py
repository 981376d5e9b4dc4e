"""Put data-parallel replicas on one clock through the collectives they share (docs/clocks.md).

Matched transfers align the ranks of one pipeline; collectives whose process group the trace names
align the members of that group. When the collectives name no group (Kineto without comm args,
Nsight Systems without NCCL payloads), nothing ties one replica's pipeline to another's and each
keeps its own clock. Yet the replicas meet every step in the gradient all-reduce, which runs
between the ranks that hold the same stages (the same parameters): the rank at position ``i`` of
one pipeline and the rank at position ``i`` of every other. A device collective ends together on
all its members, so the k-th collective of one kernel name on those two ranks fixes the offset
between their pipelines.

Which kernel name is the shared one: the one whose instances, over every position and step, agree
on one offset (within half the shortest kernel, at least 50 µs). A collective each pipeline runs
on its own (a gradient-norm sync over the pipeline group) agrees only as far as the replicas run in
lockstep; the shared all-reduce agrees by construction, so it wins where they differ.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.model import Kind, Run
from ppdiag.pipeline.clocks import ClockFit, Pairs, collective_rows
from ppdiag.pipeline.collectives import SYNC_TOL_NS
from ppdiag.pipeline.topology import Topology

_AGREE = 0.8  # the share of a name's instances that must agree on the offset

# per rank and kernel name: the device collectives' ends and durations (own clock, issue order)
_Ends = dict[int, dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]]


def _components(ranks: list[int], pairs: Pairs, run: Run) -> dict[int, int]:
    """Each rank's set of clock-linked ranks (its lowest rank): linked by a matched device
    transfer or a collective of a named group, as in the clock fit."""
    parent = {r: r for r in ranks}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    # the distinct rank pairs of the matched transfers (one per link, not one per transfer)
    links = _links(np.asarray(pairs.src, np.int64), np.asarray(pairs.dst, np.int64))
    links |= {(a, b) for a, b, _, _ in collective_rows(run)}
    for a, b in links:
        if a in parent and b in parent:
            ra, rb = find(a), find(b)
            parent[max(ra, rb)] = min(ra, rb)
    return {r: find(r) for r in ranks}


def _links(src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> set[tuple[int, int]]:
    """The distinct (src, dst) pairs, by one sort of a single key per pair (a row-wise unique
    sorts rows as records: several times slower on the transfers of a large run)."""
    if src.size == 0:
        return set()
    lo = int(min(src.min(), dst.min()))
    span = int(max(src.max(), dst.max())) - lo + 1
    key = np.sort((src - lo) * span + (dst - lo))
    key = key[np.r_[True, key[1:] != key[:-1]]]
    return {(int(k) // span + lo, int(k) % span + lo) for k in key.tolist()}


def _collective_ends(run: Run) -> _Ends:
    """Every device rank's collectives per kernel name, in issue order."""
    out: _Ends = {}
    for tl in run.ranks:
        if tl.cpu_only:
            continue
        iv = tl.intervals
        sel = np.flatnonzero(iv.kind == int(Kind.COLLECTIVE))
        if not sel.size:
            continue
        sel = sel[np.argsort(iv.start[sel], kind="stable")]
        names = iv.name[sel]
        mine: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
        for n in np.unique(names):  # one entry per kernel name, not per kernel
            m = sel[names == n]
            mine[tl.names[int(n)]] = (iv.end[m].astype(np.int64), (iv.end[m] - iv.start[m]).astype(np.int64))
        out[tl.rank] = mine
    return out


def _shift(ref: list[int], other: list[int], ends: _Ends, off: dict[int, int]) -> int | None:
    """ns to add to ``other``'s clock so that the collectives of each position's two ranks end
    together, from the kernel name whose instances agree best; None when none agrees."""
    per_name: dict[str, tuple[list[npt.NDArray[np.int64]], list[npt.NDArray[np.int64]]]] = {}
    for a, b in zip(ref, other, strict=False):
        ea, eb = ends.get(a, {}), ends.get(b, {})
        for name in ea.keys() & eb.keys():
            (xa, da), (xb, db) = ea[name], eb[name]
            if xa.size != xb.size:  # a rank missed some: the order cannot pair them
                continue
            d, tol = per_name.setdefault(name, ([], []))
            d.append((xa + off[a]) - (xb + off[b]))
            tol.append(np.maximum(np.minimum(da, db) // 2, SYNC_TOL_NS))
    best: tuple[int, int] | None = None  # (agreeing instances, shift)
    for d_parts, t_parts in per_name.values():
        diff, near = np.concatenate(d_parts), np.concatenate(t_parts)
        mid = float(np.median(diff))
        ok = np.abs(diff - mid) <= near
        if ok.mean() >= _AGREE and (best is None or int(ok.sum()) > best[0]):
            best = (int(ok.sum()), round(float(np.median(diff[ok]))))
    return None if best is None else best[1]


def link_replicas(run: Run, pairs: Pairs, fit: ClockFit, topo: Topology) -> ClockFit:
    """``fit`` with the pipelines that nothing else linked put on the first pipeline's clock
    through the collectives of the ranks at the same position (module doc); unchanged when the
    pipelines are linked already, or when no collective agrees on an offset."""
    if topo.pp < 2 or len(topo.pipelines) < 2 or fit.residual_us is None:
        return fit
    ranks = sorted(tl.rank for tl in run.ranks)
    comp = _components(ranks, pairs, run)
    lines = [p for p in topo.pipelines if p and all(r in comp for r in p)]
    if len(lines) < 2 or len({comp[r] for p in lines for r in p}) < 2:
        return fit
    ends = _collective_ends(run)
    off = dict(fit.offsets)
    linked = {comp[r] for r in lines[0]}
    joined = 0
    for line in lines[1:]:
        own = {comp[r] for r in line}
        if own <= linked or len(own) > 1:  # linked already, or itself split: left as fitted
            continue
        delta = _shift(lines[0], line, ends, off)
        if delta is None:
            continue
        for r in ranks:
            if comp[r] in own:
                off[r] += delta
        linked |= own
        joined += 1
    if not joined:
        return fit
    left = len({comp[r] for r in ranks} - linked)
    method = fit.method.split(" (")[0] + f"; {joined + 1} replicas linked by the collectives they share"
    if left:
        method += f" ({left} unlinked groups of ranks left, each on its own clock)"
    return ClockFit(off, fit.residual_us, method, fit.residual_by_rank_us, fit.latency_us, fit.hosts)


__all__ = ["link_replicas"]
