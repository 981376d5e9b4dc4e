"""Replay of the measured block order with given block costs, every step and pipeline at once.

The step time of one step replayed from its block order (PP009's and PP010's gains): each rank
runs its blocks of the step in their measured order, as soon as the rank is free and the block's
input exists (forward after the previous virtual stage's forward of the micro-batch, backward
after the next stage's backward, or this stage's forward on the last stage, weight-gradient after
the input-gradient); transfers cost nothing. The replicas meet at the end (the DP collective):
the step is the slowest replica's makespan.

:class:`ReplayPlan` builds the dependency graph of every (pipeline, step) once, as columns, and
orders its blocks in waves (Kahn's algorithm over all pipelines and steps together: wave ``k``
holds the blocks whose inputs are all in earlier waves). :meth:`ReplayPlan.run` then evaluates a
cost vector one wave at a time with numpy, so a replay costs a few array operations per wave
instead of a Python step per block; replicas of one pipeline share the plan. Each block's end is
``max(rank free, input's end) + cost``, the same operations as the block-by-block replay
(:func:`replay_loop`), so the numbers are identical; the plan falls back to that replay where its
assumptions do not hold (two blocks of one pipeline and step with the same key, a key too wide
for one integer, NaN costs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ppdiag.model import Phase
from ppdiag.pipeline.blocks import Blocks

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
_FWD, _BWD, _WGRAD = int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD)


def replay_loop(
    pipelines: Sequence[Sequence[int]],
    blocks: Mapping[int, Blocks],
    step: int,
    cost: Mapping[int, F64],
    last_stage: int,
) -> float:
    """Step time (ns) of ``step``, block by block (the reference the plan reproduces)."""
    worst = 0.0
    for line in pipelines:
        seqs: dict[int, list[tuple[int, int, int, float]]] = {}
        for r in line:
            b = blocks.get(r)
            if b is None or not len(b):
                continue
            sel = np.flatnonzero(b.step == step)
            sel = sel[np.argsort(b.start[sel], kind="stable")]
            seqs[r] = list(
                zip(
                    b.stage[sel].tolist(),
                    b.phase[sel].tolist(),
                    b.mb[sel].tolist(),
                    cost[r][sel].tolist(),
                    strict=True,
                )
            )
        # the blocks this step has: a producer missing from the trace never blocks a consumer
        present = {(x[0], x[1], x[2]) for q in seqs.values() for x in q}
        end: dict[tuple[int, int, int], float] = {}
        ptr = dict.fromkeys(seqs, 0)
        free = dict.fromkeys(seqs, 0.0)
        left = sum(len(q) for q in seqs.values())
        while left:  # one pass per dependency wave; each block is placed once
            moved = False
            for r, q in seqs.items():
                i, t_free, n = ptr[r], free[r], len(q)
                while i < n:
                    st, ph, mb, c = q[i]
                    dep = _dep_key(st, ph, mb, last_stage)
                    t = t_free
                    if dep is not None and dep in present:
                        e = end.get(dep)
                        if e is None:
                            break
                        t = max(t, e)
                    t_free = t + c
                    end[(st, ph, mb)] = t_free
                    i += 1
                    left -= 1
                    moved = True
                ptr[r], free[r] = i, t_free
            if not moved:
                return float("nan")  # an order the dependencies cannot satisfy: no replay
        worst = max(worst, max(free.values(), default=0.0))
    return worst


def _dep_key(st: int, ph: int, mb: int, last_stage: int) -> tuple[int, int, int] | None:
    if ph == _FWD:
        return (st - 1, ph, mb) if st > 0 else None
    if ph == _WGRAD:
        return (st, _BWD, mb)
    return (st + 1, ph, mb) if st < last_stage else (st, _FWD, mb)


def _pack(cols: Sequence[I64], lows: Sequence[int], spans: Sequence[int]) -> I64 | None:
    """One int64 per row of ``cols`` (mixed radix), or None when the key is too wide."""
    total = 1
    for s in spans:
        total *= s
    if total >= 2**62:
        return None
    out = np.zeros(cols[0].shape[0], np.int64)
    for c, lo, s in zip(cols, lows, spans, strict=True):
        out = out * s + (c - lo)
    return out


class ReplayPlan:
    """The block graph of every analysed step of ``pipelines``, ordered in dependency waves."""

    def __init__(
        self, pipelines: Sequence[Sequence[int]], blocks: Mapping[int, Blocks], last_stage: int
    ) -> None:
        self.pipelines = [list(dict.fromkeys(line)) for line in pipelines]
        self.blocks = blocks
        self.last_stage = last_stage
        self.steps: list[int] = sorted({int(s) for b in blocks.values() for s in np.unique(b.step).tolist()})
        self.ok = False
        parts = [
            (li, r, b)
            for li, line in enumerate(self.pipelines)
            for r in line
            if (b := blocks.get(r)) is not None and len(b)
        ]
        if not parts:
            self.ok = True
            self.waves: list[I64] = []
            self.nan_steps: set[int] = set()
            self.parts = parts
            self._empty = True
            return
        self._empty = False
        self.parts = parts
        self._build(parts)

    def _build(self, parts: list[tuple[int, int, Blocks]]) -> None:
        # every block of every (pipeline, rank) in replay order: by step, then measured start
        orders = [np.lexsort((b.start, b.step)) for _, _, b in parts]
        sizes = np.array([o.size for o in orders], np.int64)
        self.orders = orders
        line = np.repeat(np.array([p[0] for p in parts], np.int64), sizes)
        owner = np.repeat(np.arange(len(parts), dtype=np.int64), sizes)
        step = np.concatenate([b.step[o] for (_, _, b), o in zip(parts, orders, strict=True)]).astype(
            np.int64
        )
        st = np.concatenate([b.stage[o] for (_, _, b), o in zip(parts, orders, strict=True)]).astype(np.int64)
        ph = np.concatenate([b.phase[o] for (_, _, b), o in zip(parts, orders, strict=True)]).astype(np.int64)
        mb = np.concatenate([b.mb[o] for (_, _, b), o in zip(parts, orders, strict=True)]).astype(np.int64)
        n = int(step.size)
        # the input each block waits for (the rules of _dep_key, as columns)
        fwd, wg = ph == _FWD, ph == _WGRAD
        other = ~(fwd | wg)
        d_st = np.where(fwd, st - 1, np.where(wg, st, np.where(st < self.last_stage, st + 1, st)))
        d_ph = np.where(wg, _BWD, np.where(other & (st >= self.last_stage), _FWD, ph))
        has_dep = ~(fwd & (st <= 0))
        lo_st, hi_st = int(min(st.min(), d_st.min())), int(max(st.max(), d_st.max()))
        lo_ph, hi_ph = int(min(ph.min(), _FWD, _BWD)), int(max(ph.max(), _FWD, _BWD))
        lows = (0, int(step.min()), lo_st, lo_ph, int(mb.min()))
        spans = (
            len(self.pipelines),
            int(step.max()) - lows[1] + 1,
            hi_st - lo_st + 1,
            hi_ph - lo_ph + 1,
            int(mb.max()) - lows[4] + 1,
        )
        key = _pack((line, step, st, ph, mb), lows, spans)
        dkey = _pack((line, step, d_st, d_ph, mb), lows, spans)
        if key is None or dkey is None:
            return
        srt = np.argsort(key, kind="stable")
        ks = key[srt]
        if n > 1 and bool((ks[1:] == ks[:-1]).any()):
            return  # two blocks with one key: which one a consumer sees depends on the order
        pos = np.minimum(np.searchsorted(ks, dkey), n - 1)
        found = has_dep & (ks[pos] == dkey)
        # node n: "free at 0" (no previous block of the rank in the step); n + 1: no input
        dep = np.where(found, srt[pos], n + 1)
        first = np.ones(n, bool)
        first[1:] = (owner[1:] != owner[:-1]) | (step[1:] != step[:-1])
        prev = np.where(first, n, np.arange(n, dtype=np.int64) - 1)
        self.n, self.prev, self.dep = n, prev, dep
        self.owner, self.step_of, self.line_of = owner, step, line
        self.last = np.flatnonzero(np.append(first[1:], True))  # each (rank, step)'s last block
        self._waves(first, found)
        self.ok = True

    def _waves(self, first: npt.NDArray[np.bool_], found: npt.NDArray[np.bool_]) -> None:
        """Kahn's algorithm, every pipeline and step at once: a block is ready once its previous
        block on the rank and its input are placed; blocks never placed sit on a cycle (or after
        one), which makes their step unreplayable (NaN)."""
        n = self.n
        indeg = (~first).astype(np.int64) + found.astype(np.int64)
        cons = np.flatnonzero(found)
        by_dep = cons[np.argsort(self.dep[cons], kind="stable")]
        dep_sorted = self.dep[by_dep]
        has_next = np.append(~first[1:], False)
        waves: list[I64] = []
        placed = 0
        wave = np.flatnonzero(indeg == 0)
        while wave.size:
            waves.append(wave)
            placed += int(wave.size)
            nxt = wave[has_next[wave]] + 1
            lo, hi = np.searchsorted(dep_sorted, wave), np.searchsorted(dep_sorted, wave, side="right")
            cnt = hi - lo
            idx = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
            targets = np.concatenate([nxt, by_dep[idx]])
            np.subtract.at(indeg, targets, 1)
            cand = np.unique(targets)
            wave = cand[indeg[cand] == 0]
        self.waves = waves
        self.nan_steps = set()
        if placed < n:
            done = np.zeros(n, bool)
            done[np.concatenate(waves) if waves else np.zeros(0, np.int64)] = True
            self.nan_steps = {int(s) for s in np.unique(self.step_of[~done]).tolist()}

    def run(self, cost: Mapping[int, F64]) -> dict[int, float]:
        """Replayed step time (ns) of every analysed step under ``cost`` (per rank, per block)."""
        if self._empty:
            return dict.fromkeys(self.steps, 0.0)
        if not self.ok or any(bool(np.isnan(cost[r]).any()) for _, r, _ in self.parts):
            return {s: replay_loop(self.pipelines, self.blocks, s, cost, self.last_stage) for s in self.steps}
        c = np.concatenate(
            [np.asarray(cost[r], np.float64)[o] for (_, r, _), o in zip(self.parts, self.orders, strict=True)]
        )
        end = np.empty(self.n + 2, np.float64)
        end[self.n], end[self.n + 1] = 0.0, -np.inf
        prev, dep = self.prev, self.dep
        for w in self.waves:
            t, e = end[prev[w]], end[dep[w]]
            # ``max(t, e)`` as the block-by-block replay takes it (the first on a tie)
            end[w] = np.where(e > t, e, t) + c[w]
        return self._worst(end)

    def _worst(self, end: F64) -> dict[int, float]:
        """Per step: the slowest rank's end over every pipeline (0 where a step has no block)."""
        last = self.last
        free, st = end[last], self.step_of[last]
        out = dict.fromkeys(self.steps, 0.0)
        if free.size:
            u, inv = np.unique(st, return_inverse=True)
            m = np.full(u.size, 0.0)
            # a step whose order cannot be satisfied has NaN ends: it is reported as NaN below
            with np.errstate(invalid="ignore"):
                np.maximum.at(m, inv, free)
            out.update(zip(u.tolist(), m.tolist(), strict=True))
        for s in self.nan_steps:
            out[s] = float("nan")
        return out


def replay_step_ns(
    pipelines: Sequence[Sequence[int]],
    blocks: Mapping[int, Blocks],
    step: int,
    cost: Mapping[int, F64],
    last_stage: int,
) -> float:
    """Step time (ns) of one step replayed from its block order with the given block costs."""
    return ReplayPlan(pipelines, blocks, last_stage).run(cost).get(step, 0.0)


__all__ = ["ReplayPlan", "replay_loop", "replay_step_ns"]
