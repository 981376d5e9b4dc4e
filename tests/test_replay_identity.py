"""The replay's vectorized parts against the node-at-a-time computation they replaced.

``_reference_run`` is the replay loop as it was written one node at a time, and
``_reference_nodes`` the per-block measures of the replay's graph (binary searches per block):
on synthetic runs of several schedules, sizes and faults, and in both trace formats, the
vectorized replay must give the same numbers exactly, in every variant. The interval helpers get
the same check on random sets (hypothesis).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_parts import context, pipeline, replay_args
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.api import Options, diagnose
from ppdiag.attribution.causes import (
    NEG_INF,
    WAIT_JOIN_NS,
    Replay,
    _last_waits,
    _m,
    _measure_between,
    _Node,
    _P2PIndex,
)
from ppdiag.attribution.paint import _pools
from ppdiag.attribution.replay_run import Variant
from ppdiag.model import Phase
from ppdiag.model import intervals as ivs
from ppdiag.pipeline.blocks import _group_union_measure
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario


def _reference_nodes(rp: Replay, timelines: dict[int, Any], ops: dict[int, Any]) -> list[tuple[int, ...]]:
    """Per node: (pre, post, pre_host, pre_coll, pre_ux, pre_copy, in_host, in_ux, in_copy, busy,
    span, on_compute), measured one block at a time. The gaps that the replay found were not
    waits (the peer issued the transfer only after the block began: that decision needs the peers'
    operations and is tested on its own) are measured as local time, like a block without a wait."""
    out: list[tuple[int, ...]] = []
    not_waits = {i for i, nd in enumerate(rp.nodes) if nd.false_wait}
    p2p_index = {r: _P2PIndex(timelines[r], ops.get(r)) for r in {rs.rank for rs in rp.steps}}
    for rs in rp.steps:
        b = rs.blocks
        prev_end = rs.w0
        for i in range(len(b)):
            s, e = int(b.start[i]), int(b.end[i])
            lo = min(prev_end, s)
            w_s, w_e = ivs.window(rs.wait_set, lo, s)
            on_compute = False
            if w_s.size and len(out) not in not_waits:
                k = w_s.size - 1
                while k > 0 and w_s[k] - w_e[k - 1] <= WAIT_JOIN_NS:
                    k -= 1
                wait_start, rel = int(w_s[k]), int(w_e[-1])
                held = p2p_index[rs.rank].blocking(wait_start, rel)
                if held[0] >= 0 and not timelines[rs.rank].cpu_only:
                    rel = max(min(rel, held[3]), wait_start)
                    wait_start = min(max(wait_start, held[2]), rel)
                on_compute = p2p_index[rs.rank].on_compute_at(wait_start, rel)
            else:
                wait_start = rel = s
            p2p_host = _m(rs.p2p_host, lo, wait_start) + _m(rs.p2p_host, rel, s)
            host = _m(rs.host_set, lo, wait_start) + _m(rs.host_set, rel, s) + p2p_host
            coll = (
                _m(rs.sets.collective, lo, wait_start)
                + _m(rs.sets.collective, rel, s)
                + _m(rs.sets.p2p, lo, wait_start)
                + _m(rs.sets.p2p, rel, s)
                - p2p_host
            )
            copy = _m(rs.sets.copy, lo, wait_start) + _m(rs.sets.copy, rel, s)
            lost = _m(rs.sets.gaps, lo, wait_start) + _m(rs.sets.gaps, rel, s)
            ux = max(lost - host - coll - copy, 0)
            in_lost = _m(rs.sets.gaps, s, e)
            in_copy = min(_m(rs.sets.copy, s, e), in_lost)
            in_host = min(_m(rs.host_set, s, e), in_lost - in_copy)
            out.append(
                (
                    wait_start - lo,
                    s - rel,
                    host,
                    coll,
                    ux,
                    copy,
                    in_host,
                    in_lost - in_host - in_copy,
                    in_copy,
                    int(b.busy[i]),
                    e - s,
                    int(on_compute),
                )
            )
            prev_end = max(prev_end, e)
    return out


def _node_row(nd: _Node) -> tuple[int, ...]:
    return (
        nd.pre,
        nd.post,
        nd.pre_host,
        nd.pre_coll,
        nd.pre_ux,
        nd.pre_copy,
        nd.in_host,
        nd.in_ux,
        nd.in_copy,
        nd.busy,
        nd.span,
        int(nd.on_compute),
    )


def _reference_run(
    self: Replay,
    *,
    host: bool = True,
    comm_excess: bool = True,
    comm: bool = True,
    copy: bool = True,
    ux: bool = True,
    balanced: dict[tuple[int, int, int], float] | None = None,
) -> dict[tuple[int, int], tuple[int, int]]:
    """The replay as it was computed one node at a time (before the columns), on times less the
    graph's origin (the float arithmetic on epoch ns would round every sum to 256 ns)."""
    n = len(self.nodes)
    o = self.origin
    start = [0] * n
    end = [0] * n
    done = [False] * n
    lat = self.normal_latency
    w_start: dict[tuple[int, int], int] = {}
    w_end: dict[tuple[int, int], int] = {}
    sync_end: dict[int, int] = {}

    def lead_of(nd: _Node) -> int:
        # with exposed comm removed a receive queued on the compute stream is posted early (on
        # its own stream): the transfer may run under the rank's previous work
        return nd.lead if (comm or not nd.on_compute) else -NEG_INF

    def node_end(j: int) -> int:
        return end[j] if done[j] else (self.meas_start[j] - o) + self.nodes[j].span

    def last_end(key: tuple[int, int]) -> int:
        f, c = self.first[key], self.count[key]
        return node_end(f + c - 1) if c else window_start(key)

    def window_start(key: tuple[int, int]) -> int:
        if key not in w_start:
            prev = self.prev_step.get(key)
            w_start[key] = window_end(prev) if prev is not None else self.w0[key] - o
        return w_start[key]

    def local(piece: tuple[int, int, int, int, int]) -> int:
        busy_p, host_p, other_p, copy_p, p2p_p = piece
        return busy_p + other_p + (host_p if host else 0) + (copy_p if copy else 0) + (p2p_p if comm else 0)

    def window_end(key: tuple[int, int]) -> int:
        if key in w_end:
            return w_end[key]
        sync = self.sync_of.get(key)
        if sync is not None:
            if sync not in sync_end:
                members, xfer = self.syncs[sync]
                arrive = NEG_INF
                for m in members:
                    arrive = max(arrive, last_end(m) + local(self.tail_coll[m][2]))
                sync_end[sync] = arrive + (xfer if comm else 0)
            val = sync_end[sync] + local(self.tail_coll[key][3])
        else:
            busy_t, coll_t, host_t, other_t, copy_t = self.tail[key]
            val = (
                last_end(key)
                + busy_t
                + other_t
                + (coll_t if comm else 0)
                + (host_t if host else 0)
                + (copy_t if copy else 0)
            )
        w_end[key] = int(val)
        return w_end[key]

    for i in self.order:
        nd = self.nodes[i]
        key = (nd.rank, nd.step)
        prev_end = end[i - 1] if i > self.first[key] else window_start(key)
        loc = nd.pre + nd.post
        keep = loc
        if not host:
            keep -= nd.pre_host
        if not comm:
            keep -= nd.pre_coll
        if not copy:
            keep -= nd.pre_copy
        if not ux:
            keep -= nd.pre_ux
        scale = keep / loc if loc > 0 else 0.0
        pre = nd.pre * scale
        post = nd.post * scale
        base = prev_end + pre
        if nd.send_wait and not comm:
            # waiting for its own send: no data dependency, the wait overlaps once comm does;
            # only a slow link's excess over the normal transfer stays (blocking sends)
            xfer = nd.obs[2] if nd.obs is not None else nd.obs_abs[1] if nd.obs_abs is not None else 0
            if comm_excess:
                base += max(xfer - lat, 0)
        elif nd.obs is not None:
            p, issue, xfer = nd.obs
            if not comm_excess:
                xfer = min(xfer, lat)
            # the transfer starts once the producer issued it and this rank had posted its
            # side (``lead`` before it began to wait); the block waits for its arrival
            ready = max(
                base - lead_of(nd), node_end(p) + (issue if host else 0) + (nd.issue_copy if copy else 0)
            )
            base = max(base, ready + xfer)
        elif nd.obs_abs is not None:
            t_issue, xfer = nd.obs_abs
            if not comm_excess:
                xfer = min(xfer, lat)
            base = max(base, max(base - lead_of(nd), t_issue - o) + xfer)
        if nd.release is not None:
            base = max(base, nd.release - o)
        for p, tau in nd.edges:
            base = max(base, node_end(p) + tau)
        s = base + post
        if balanced is not None:
            dur = (
                nd.busy * balanced.get((nd.rank, nd.stage, nd.phase), 1.0)
                + nd.in_host
                + nd.in_ux
                + nd.in_copy
            )
        else:
            dur = nd.span
        if not host:
            dur -= nd.in_host
        if not copy:
            dur -= nd.in_copy
        if not ux:
            dur -= nd.in_ux
        start[i] = int(s)
        end[i] = int(s + dur)
        done[i] = True
    idle: dict[tuple[int, int], tuple[int, int]] = {}
    for rs in self.steps:
        key = (rs.rank, rs.step)
        f, c = self.first[key], self.count[key]
        w0 = window_start(key)
        w1 = window_end(key)
        busy = rs.acct.compute
        if balanced is not None and c:
            # the blocks' compute at the mean cost (what is left of each span once its
            # host, copy and other idle is taken out)
            busy = (
                busy
                - sum(self.nodes[j].busy for j in range(f, f + c))
                + sum(
                    int(
                        self.nodes[j].busy
                        * balanced.get((self.nodes[j].rank, self.nodes[j].stage, self.nodes[j].phase), 1.0)
                    )
                    for j in range(f, f + c)
                )
            )
        idle[key] = (int(w1 - w0), int(w1 - w0 - busy))
    return idle


CASES: dict[str, dict[str, Any]] = {
    "1f1b_p4_stage": dict(schedule="1f1b", pp=4, microbatches=8, faults=[F.SlowStage(2, 2.0)]),
    "1f1b_p8_link": dict(schedule="1f1b", pp=8, microbatches=16, faults=[F.SlowLink(3, factor=25.0)]),
    "interleaved_host": dict(
        schedule="interleaved_1f1b", virtual=2, pp=4, microbatches=8, faults=[F.HostStall(1, 0.3)]
    ),
    "dp2_allreduce": dict(
        schedule="1f1b", pp=4, microbatches=8, dp=2, faults=[F.SlowStage(1, 1.5), F.ExposedAllReduce(2.0)]
    ),
    "zero_bubble_comm_on_compute": dict(
        schedule="zero_bubble", pp=4, microbatches=8, faults=[F.CommOnCompute()]
    ),
}
VARIANTS: list[dict[str, Any]] = [
    {},
    {"host": False},
    {"comm_excess": False},
    {"comm": False, "comm_excess": False},
    {"copy": False},
    {"ux": False},
    {"ux": False, "copy": False, "comm": False, "host": False, "comm_excess": False},
]


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
@pytest.mark.parametrize("name", list(CASES))
def test_vectorized_replay_equals_the_node_at_a_time_replay(tmp_path: Path, name: str, fmt: str) -> None:
    run = make_scenario(**dict(CASES[name]))
    (write_kineto if fmt == "kineto" else write_nsys)(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    pipe = pipeline(diag)
    steps, timelines, ops = context(diag).rank_steps, diag.run.by_rank(), pipe.ops
    rp = Replay(steps, timelines, ops, pipe.topology.pp * pipe.topology.virtual - 1)
    assert len(rp.nodes) > 0
    assert rp.check() == []
    assert [_node_row(nd) for nd in rp.nodes] == _reference_nodes(rp, timelines, ops)
    for kw in VARIANTS:
        assert rp.run(**kw) == _reference_run(rp, **kw), kw
    bal = rp.mean_costs()
    # the work per (rank, stage, phase), keys in the order of their first node, as a dict update
    # per node gives it
    tot: dict[tuple[int, int, int], int] = {}
    cnt: dict[tuple[int, int, int], int] = {}
    for nd in rp.nodes:
        if nd.phase in (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD)):
            k = (nd.rank, nd.stage, nd.phase)
            tot[k], cnt[k] = tot.get(k, 0) + nd.busy, cnt.get(k, 0) + 1
    got = rp._work_by_label((int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD)))
    assert [list(d.items()) for d in got] == [list(tot.items()), list(cnt.items())]
    assert rp.run(balanced=bal) == _reference_run(rp, balanced=bal)
    removed = VARIANTS[-1]
    assert rp.run(balanced=bal, **removed) == _reference_run(rp, balanced=bal, **removed)


_sets = st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 300)), max_size=30).map(
    lambda xs: ivs.union([a for a, _ in xs], [a + d for a, d in xs])
)
_spans = st.lists(st.tuples(st.integers(-100, 11_000), st.integers(-50, 2_000)), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(_sets, _spans)
def test_measures_between_equal_measure_in(iset: ivs.ISet, spans: list[tuple[int, int]]) -> None:
    lo = np.array([a for a, _ in spans], np.int64)
    hi = lo + np.array([d for _, d in spans], np.int64)
    got = _measure_between(iset, lo, hi)
    assert got.tolist() == [ivs.measure_in(iset, int(a), int(b)) for a, b in zip(lo, hi, strict=True)]


@settings(max_examples=200, deadline=None)
@given(_sets, _spans)
def test_last_waits_equal_the_join_loop(iset: ivs.ISet, spans: list[tuple[int, int]]) -> None:
    lo = np.array([a for a, _ in spans], np.int64)
    hi = lo + np.array([d for _, d in spans], np.int64)
    # gaps of 0-300 µs in ns units would never join: scale the set so that some pieces join
    scaled = (iset[0] * 20, iset[1] * 20)
    lo, hi = lo * 20, hi * 20
    has, ws, we = _last_waits(scaled, lo, hi)
    for j in range(lo.size):
        w_s, w_e = ivs.window(scaled, int(lo[j]), int(hi[j]))
        assert bool(has[j]) == bool(w_s.size)
        if w_s.size:
            k = w_s.size - 1
            while k > 0 and w_s[k] - w_e[k - 1] <= WAIT_JOIN_NS:
                k -= 1
            assert (int(ws[j]), int(we[j])) == (int(w_s[k]), int(w_e[-1]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 400)), min_size=1, max_size=8),
        min_size=1,
        max_size=10,
    )
)
def test_group_union_measure_equals_one_union_per_group(groups: list[list[tuple[int, int]]]) -> None:
    s_parts, e_parts, sizes = [], [], []
    for g in groups:
        g = sorted(g)
        s_parts += [a for a, _ in g]
        e_parts += [a + d for a, d in g]
        sizes.append(len(g))
    s = np.array(s_parts, np.int64)
    e = np.array(e_parts, np.int64)
    bounds = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64)
    ends = np.cumsum(sizes).astype(np.int64)
    got = _group_union_measure(s, e, bounds, ends)
    want = [ivs.measure(ivs.union(s[a:b], e[a:b])) for a, b in zip(bounds, ends, strict=True)]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(_sets, _sets, _sets, _sets, _sets)
def test_pools_equal_the_set_algebra(
    lost: ivs.ISet, host_set: ivs.ISet, wait_set: ivs.ISet, coll_set: ivs.ISet, copy_set: ivs.ISet
) -> None:
    host = ivs.intersect(lost, host_set)
    wait = ivs.subtract(ivs.intersect(lost, wait_set), host)
    coll = ivs.subtract(ivs.subtract(ivs.intersect(lost, coll_set), host), wait)
    copy = ivs.subtract(ivs.subtract(ivs.subtract(ivs.intersect(lost, copy_set), host), wait), coll)
    other = ivs.subtract(ivs.subtract(ivs.subtract(ivs.subtract(lost, host), wait), coll), copy)
    got = _pools(lost, [host_set, wait_set, coll_set, copy_set])
    for g, w in zip(got, [host, wait, coll, other, copy], strict=True):
        assert g[0].tolist() == w[0].tolist() and g[1].tolist() == w[1].tolist()


def test_replay_graph_check_finds_broken_graphs(tmp_path: Path) -> None:
    run = make_scenario(pp=4, microbatches=4, steps=2)
    write_kineto(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    rp = Replay(*replay_args(diag))
    assert rp.check() == []
    rp.nodes[3].edges.append((3, 0))  # a block that waits for itself
    rp.nodes[5].post = -1
    rp.count[(0, 0)] += 1  # a step that claims one node too many
    problems = rp.check()
    assert any("node 3" in p and "itself" in p for p in problems), problems
    assert any("node 5" in p and "negative" in p for p in problems), problems
    assert any("nodes start at" in p for p in problems), problems


def test_variants_without_their_kind_of_delay_are_computed_once(tmp_path: Path) -> None:
    """A run without copies (no faults: no slow link either) gives the same numbers with or without
    removing them; the replay computes such variants once, and each still equals the
    node-at-a-time replay."""
    run = make_scenario(pp=4, microbatches=8, steps=2)
    write_nsys(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    rp = Replay(*replay_args(diag))
    for kw in VARIANTS:
        assert rp.run(**kw) == _reference_run(rp, **kw), kw
    assert rp.run(copy=False) == rp.run() == rp.run(comm_excess=False)
    assert len(rp._memo) < len(VARIANTS)
    got = rp.run(copy=False)
    got.clear()  # each caller gets its own dict
    assert rp.run(copy=False) == _reference_run(rp, copy=False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(-1, 4), st.integers(-1, 3), st.integers(0, 3)), max_size=60
    ),
    st.integers(0, 4),
)
def test_label_pairs_equal_the_label_dict(labels: list[tuple[int, int, int, int]], last_stage: int) -> None:
    """The vectorized label dependencies against a dict of labels (a label given twice keeps its
    later block) and one lookup per label."""
    from ppdiag.attribution.replay_index import _label_pairs
    from ppdiag.model import Phase

    by_key = {key: nid for nid, key in enumerate(labels)}
    fwd, bwd, wgrad = int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD)
    want = set()
    for (stepn, stage, phase, mb), nid in by_key.items():
        if phase == fwd:
            prod = by_key.get((stepn, stage - 1, fwd, mb))
        elif phase == bwd:
            prod = by_key.get((stepn, stage, fwd, mb) if stage == last_stage else (stepn, stage + 1, bwd, mb))
        elif phase == wgrad:
            prod = by_key.get((stepn, stage, bwd, mb))
        else:
            prod = None
        if prod is not None and prod != nid:
            want.add((nid, prod))
    lab = np.array([[*k, i] for i, k in enumerate(labels)], np.int64).reshape(-1, 5).T
    cons, prod_a = _label_pairs(lab, last_stage)
    got = list(zip(cons.tolist(), prod_a.tolist(), strict=True))
    assert len(got) == len(set(got)) and set(got) == want


def test_dense_label_codes_survive_wide_ranges() -> None:
    """Label columns whose ranges multiply past int64 are renumbered: equal rows keep equal codes
    and different rows different ones."""
    from ppdiag.attribution.replay_index import _dense

    rng = np.random.default_rng(0)
    cols = [rng.choice(np.array([-(2**40), 0, 2**40]), 500) for _ in range(4)]
    code = _dense([c.astype(np.int64) for c in cols])
    rows = list(zip(*(c.tolist() for c in cols), strict=True))
    by_row: dict[tuple[int, ...], int] = {}
    for r, k in zip(rows, code.tolist(), strict=True):
        assert by_row.setdefault(r, k) == k
    assert len(set(by_row.values())) == len(by_row)


def test_variants_placed_together_reuse_unchanged_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Variants placed in one batch by the node loop share the loop lists of the columns they do
    not change (a host stall: removing host delay changes the durations, not the waits' codes),
    and each still equals the node-at-a-time replay."""
    from ppdiag.attribution import replay_columns

    run = make_scenario(pp=4, microbatches=8, steps=2, faults=[F.HostStall(1, 0.3), F.SlowStage(2, 1.4)])
    write_nsys(run, tmp_path)
    rp = Replay(*replay_args(diagnose([tmp_path], Options())))
    made: list[str] = []
    real = replay_columns._ordered

    def counting(name: str, arr: Any, order: Any, memo: Any) -> list[Any]:
        before = memo.get(name)
        out = real(name, arr, order, memo)
        if before is None or before[1] is not out:
            made.append(name)
        return out

    monkeypatch.setattr(replay_columns, "_ordered", counting)
    bal = rp.mean_costs()
    kws = [*VARIANTS, {"balanced": bal}]
    got = rp.run_many([Variant(**kw) for kw in kws])
    assert rp._placement is None  # (the node loop placed them, not the levels)
    for kw, g in zip(kws, got, strict=True):
        assert g == _reference_run(rp, **kw), kw
    batches = len(rp._memo)
    assert batches > 2
    # 8 value columns per variant; the node kinds (from the waits' codes), for one, are made
    # once for the whole batch, and so are the blocks the nodes read
    assert made.count("kind") == 1
    assert made.count("reads") == 1
    assert len(made) < 8 * batches
