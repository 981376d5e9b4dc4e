"""The replay graph's nodes built for every rank-step at once (``replay_build``) against the step at a
time functions of ``replay_reference`` (``_step_waits``, ``_local_pieces``: the wait before each block
of one step and the split of the local time around it).

On synthetic runs with slow links, host stalls, p2p on the compute stream, data parallelism and a
rank that stops mid-step, in both trace formats, every node's measured pieces, its wait (span,
operation that held it, compute-stream flag) and each step's tail (the local split after its last
block, its step-end collective and the split around it) must be the same numbers,
and the per-step fallback (each step on a line of its own, taken when the steps do not fit on one
int64 line together) must give the same nodes too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from analysis_parts import context
from replay_reference import _local_pieces, _step_waits

from ppdiag.api import Options, diagnose
from ppdiag.attribution.rank_step import RankStep, _m, _split_local
from ppdiag.attribution.replay_build import StepNodes, build_nodes
from ppdiag.attribution.replay_index import _P2PIndex
from ppdiag.attribution.tolerance import timing_tolerance_ns
from ppdiag.model import RankTimeline
from ppdiag.model import intervals as ivs
from ppdiag.model.interval_groups import Line
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario
from ppsynth.truncate import stop_rank

CASES: dict[str, dict[str, Any]] = {
    "slow_link_dp2": dict(pp=4, microbatches=8, dp=2, faults=[F.SlowLink(1, delay_ms=0.3)]),
    "host_stall_interleaved": dict(
        schedule="interleaved_1f1b", virtual=2, pp=2, microbatches=4, faults=[F.HostStall(1, 0.5)]
    ),
    "comm_on_compute_dp2": dict(
        pp=4, microbatches=4, dp=2, faults=[F.CommOnCompute(), F.ExposedAllReduce(1.0)]
    ),
    # rank 2 stops in the middle of step 1
    "stopped": dict(pp=4, microbatches=4, faults=[F.SlowLink(2, delay_ms=0.2)]),
}

PIECES = ("pre", "post", "pre_host", "pre_coll", "pre_ux", "pre_copy", "in_host", "in_ux", "in_copy")


def _per_step(
    steps: list[RankStep], timelines: dict[int, RankTimeline], index: dict[int, _P2PIndex], tol: int
) -> dict[str, Any]:
    """The same facts, one step at a time with the step functions."""
    keys = (*PIECES, "start", "lo", "prev_end", "wait", "on_compute", "tails")
    out: dict[str, list[Any]] = {k: [] for k in keys}
    base = 0
    for rs in steps:
        s_a, e_a = rs.blocks.start.astype(np.int64), rs.blocks.end.astype(np.int64)
        reach = np.maximum.accumulate(np.r_[np.int64(rs.w0), e_a])
        lo_a = np.minimum(reach[:-1], s_a)
        w = _step_waits(rs, index[rs.rank], lo_a, timelines[rs.rank].cpu_only, tol)
        lp = _local_pieces(rs, lo_a, w)
        named = dict(zip(("pre", "post", "pre_host", "pre_coll", "pre_ux", "pre_copy"), lp[:6], strict=True))
        named.update(in_host=lp.in_host, in_ux=lp.in_ux, in_copy=lp.in_copy)
        for k in PIECES:
            out[k] += named[k].tolist()
        out["start"] += s_a.tolist()
        out["lo"] += lo_a.tolist()
        out["prev_end"].append(int(reach[-1]))
        out["tails"].append(_tail_of(rs, int(reach[-1])))
        j = np.flatnonzero(w.has)
        rows = zip((base + j).tolist(), w.held, w.release[j].tolist(), w.start[j].tolist(), strict=True)
        out["wait"] += [(n, *h, rel, st) for n, h, rel, st in rows]
        out["on_compute"] += [n for n, oc in zip((base + j).tolist(), w.on_compute, strict=True) if oc]
        base += len(rs.blocks)
    return out


def _tail_of(rs: RankStep, t_lo: int) -> tuple[Any, ...]:
    """What follows a step's last block, measured span by span with the step's own sets."""
    t_hi = rs.w1
    busy, host, copy = (_m(x, t_lo, t_hi) for x in (rs.sets.compute, rs.host_set, rs.sets.copy))
    coll = _m(rs.sets.collective, t_lo, t_hi) + _m(rs.sets.p2p, t_lo, t_hi)
    split = (busy, coll, host, max(t_hi - t_lo - busy - coll - host - copy, 0), copy)
    cs, ce = ivs.window(rs.sets.collective, t_lo, t_hi)
    if not cs.size:
        return split, None
    c0, c1 = int(cs[0]), int(ce[-1])
    return split, (c0, c1, _split_local(rs, t_lo, c0), _split_local(rs, c1, t_hi))


def _tails(b: StepNodes) -> list[tuple[Any, ...]]:
    t = b.tails
    out: list[tuple[Any, ...]] = []
    for i, split in enumerate(t.split.tolist()):
        coll = None
        if t.has_coll[i]:
            c0, c1 = t.coll[i].tolist()
            coll = (c0, c1, tuple(t.before[i].tolist()), tuple(t.after[i].tolist()))
        out.append((tuple(split), coll))
    return out


def _facts(b: StepNodes) -> dict[str, Any]:
    out: dict[str, Any] = {k: b.cols[k].tolist() for k in PIECES}
    out.update(start=b.start.tolist(), lo=b.lo.tolist(), prev_end=b.prev_end.tolist())
    out["wait"] = [tuple(r) for r in np.stack(b.pending, axis=1).tolist()]
    out["on_compute"] = np.flatnonzero(b.on_compute).tolist()
    out["tails"] = _tails(b)
    return out


@pytest.fixture(scope="module", params=[(n, f) for n in CASES for f in ("kineto", "nsys")], ids=str)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    name, fmt = request.param
    d = tmp_path_factory.mktemp(f"{name}_{fmt}")
    run = make_scenario(steps=3, **CASES[name])
    if name == "stopped":
        w = run.ranks[2].step_windows
        run, _ = stop_rank(run, 2, int(w[1, 0] + 0.5 * (w[1, 1] - w[1, 0])))
    (write_kineto if fmt == "kineto" else write_nsys)(run, d)
    diag = diagnose([d], Options())
    steps = context(diag).rank_steps
    timelines = diag.run.by_rank()
    index = {r: _P2PIndex(timelines[r]) for r in {rs.rank for rs in steps}}
    return steps, timelines, index, timing_tolerance_ns(timelines)


def test_all_steps_at_once_equal_step_by_step(case: tuple[Any, ...]) -> None:
    steps, timelines, index, tol = case
    cpu = {r: timelines[r].cpu_only for r in index}
    got = _facts(build_nodes(steps, cpu, index, tol))
    want = _per_step(steps, timelines, index, tol)
    assert len(steps) >= 4 and want["wait"], "the case has several ranks and steps, and waits"
    assert got == want


def test_fallback_one_line_per_step(case: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    steps, timelines, index, tol = case
    cpu = {r: timelines[r].cpu_only for r in index}
    whole = build_nodes(steps, cpu, index, tol)
    of = Line.of

    def one_group_only(lo: Any, hi: Any) -> Line:
        if np.asarray(lo).size > 1:
            raise OverflowError("too wide")
        return of(lo, hi)

    monkeypatch.setattr(Line, "of", staticmethod(one_group_only))
    apart = build_nodes(steps, cpu, index, tol)
    assert _facts(apart) == _facts(whole)
    assert {k: v.tolist() for k, v in apart.cols.items()} == {k: v.tolist() for k, v in whole.cols.items()}
    assert apart.labels.tolist() == whole.labels.tolist()
    assert (apart.first.tolist(), apart.sizes.tolist()) == (whole.first.tolist(), whole.sizes.tolist())
