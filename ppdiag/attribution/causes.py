"""Split every rank's lost time into causes (docs/json.md, *Time accounting*).

The measured run is rebuilt as a *replay*: each rank executes its blocks in the observed order,
and a block starts at ``max(previous end + local delay before the wait, release by the peer) +
transfer + local delay after the wait``. The release is the end of the producer block the rank
waited for (the last block the peer finished before the wait ended) plus the producer's delay in
issuing the transfer; the transfer is what remains of the wait once both sides were ready.
Pipeline data dependencies from the block labels are added with the normal latency. A step-end
collective that every rank joins is one sync point (early ranks wait in it, the last one pays only
the transfer), and a rank's consecutive steps are chained. With every quantity as measured, the
replay reproduces the measured timeline exactly (checked; a difference is reported).

Causes are counterfactuals (docs/json.md), built up from the ideal run one kind of delay at a
time; each cause is the growth of the rank's idle time when its kind is added, so they telescope
to the measured lost time (``CHAIN``, :func:`replay_causes`):

1. ``bubble``: the idle of the schedule with every stage's work brought to the mean stage work,
   pipeline transfers at the run's normal latency (the lower median of the links' median transfer
   times) and nothing else, capped by the idle with the actual costs.
2. ``imbalance``: what the actual stage costs add.
3. ``comm_wait``: what the actual transfer times add (slow links, late transfers).
4. ``host``: what host delays add: local idle where the next work was launched after the gap
   began (GPU), or any event-less stretch between ops (CPU-only runs), a producer's delay in
   issuing a transfer after its block ended.
5. ``exposed_comm``: what communication that could have overlapped adds: exposed collectives and
   transfers between blocks, the step-end sync's transfer, a rank waiting for its own send, a
   receive queued behind compute on the compute stream.
6. ``exposed_copy``: what exposed copies add (between and inside blocks, and before a send).
7. ``unexplained``: the rest (idle with work queued and no evidence, and any disagreement between
   the replay and the measurement).

A wait's transfer starts once the producer issued it and the waiting rank had posted its side (a
receive posted under compute lets the transfer run before the wait begins); on GPU runs the
producer's operation is the one that ended with the waiter's (NCCL send and receive end
together), and its producer block the last one it finished before issuing it.

A delay on one rank that makes its neighbours wait is removed everywhere at once, so the
neighbours' waiting is charged to the root cause (a host stall on rank 1 shows as ``host`` on
ranks 0, 2 and 3), as the attribution requires. The same replay with one delay removed gives each
finding's gain.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.attribution.collective_steps import run_waits
from ppdiag.attribution.collective_waits import CollectiveWaits, apply_moves
from ppdiag.attribution.collective_waits import _alloc as split_shares
from ppdiag.attribution.link_latency import LinkLatencies
from ppdiag.attribution.paint import paint
from ppdiag.attribution.paint_map import Painter
from ppdiag.attribution.rank_step import RankStep, _m, rank_step
from ppdiag.attribution.replay_graph import HELD_CALL_NS, STEP_JOIN_NS
from ppdiag.attribution.replay_index import (
    MATCH_END_NS,
    WAIT_JOIN_NS,
    _last_waits,
    _measure_between,
    _P2PIndex,
)
from ppdiag.attribution.replay_nodes import _Node
from ppdiag.attribution.replay_run import NEG_INF, Replay, Variant
from ppdiag.diagnosis import GapTable
from ppdiag.model import RankTimeline
from ppdiag.model import intervals as ivs
from ppdiag.parsers.heap import trim_heap
from ppdiag.pipeline.clocks import P2POps
from ppdiag.pipeline.collectives import CollectiveMatch


@dataclass
class Attribution:
    """Cause totals per (rank, step) in ns, the gap tables, and replay facts for findings."""

    causes: dict[tuple[int, int], dict[str, int]]
    gaps: dict[int, GapTable]  # as painted; the result's (Diagnosis.gaps) add each gap's root rank
    normal_latency_ns: int
    step_replay_ns: dict[str, float]  # mean step time of each replay variant (for gains)
    notes: list[str] = field(default_factory=list)
    # per edge (an observed wait): producer, consumer, transfer, waited (ns), as int64 rows
    edges: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 4), np.int64))
    collective_waits: CollectiveWaits | None = None  # waits in collectives for a late member
    # per edge: how long a host-op producer issued its send after its block (0 on devices)
    edge_held: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    links: LinkLatencies = field(default_factory=LinkLatencies)  # each link's normal transfer time
    # per edge: whether the consumer was waiting before the producer issued (the wait timed the
    # whole transfer, see link_latency)
    edge_whole: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    # per edge: the consumer was held in its own host-op call while the transfer was due (its
    # receive and the producer's next send waited for that call): it does not time the link
    edge_consumer_held: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))


# Variants of the replay, each removing one more kind of delay than the next (docs/json.md): the
# causes are the differences of consecutive ones, so they telescope to the measured lost time.
CHAIN: tuple[tuple[str, frozenset[str]], ...] = (
    ("measured", frozenset()),
    ("no_ux", frozenset({"ux"})),
    ("no_copy", frozenset({"ux", "copy"})),
    ("no_comm", frozenset({"ux", "copy", "comm"})),
    ("no_host", frozenset({"ux", "copy", "comm", "host"})),
    ("schedule_only", frozenset({"ux", "copy", "comm", "host", "comm_excess"})),
)


def _spec(removed: frozenset[str], balanced: dict[tuple[int, int, int], float] | None = None) -> Variant:
    """The replay variant with the named kinds of delay removed."""
    return Variant(
        host="host" not in removed,
        comm_excess="comm_excess" not in removed,
        comm="comm" not in removed,
        copy="copy" not in removed,
        ux="ux" not in removed,
        balanced=balanced,
    )


def _variant(
    rp: Replay, removed: frozenset[str], balanced: dict[tuple[int, int, int], float] | None = None
) -> dict[tuple[int, int], tuple[int, int]]:
    """One replay variant with the named kinds of delay removed."""
    return rp.run_many([_spec(removed, balanced)])[0]


def replay_causes(
    rp: Replay,
) -> tuple[dict[tuple[int, int], dict[str, int]], dict[str, dict[tuple[int, int], tuple[int, int]]]]:
    """The counterfactual causes of every (rank, step) from the replay, and every variant's result.

    Built up from the ideal run: ``bubble`` is the idle of the schedule with every stage at the
    mean cost, normal-latency transfers and nothing else (capped by the idle with the actual
    costs), ``imbalance`` what the actual stage costs add, ``comm_wait`` what the actual transfer
    times add (slow links, late transfers), ``host`` the host delays, ``exposed_comm`` the exposed
    collectives and transfers between blocks, ``exposed_copy`` the exposed copies; the rest of
    the measured idle is ``unexplained``.
    """
    full = {name: _variant(rp, removed) for name, removed in CHAIN}
    full["balanced"] = _variant(rp, CHAIN[-1][1], rp.mean_costs())
    v = {name: {k: x[1] for k, x in var.items()} for name, var in full.items()}
    out: dict[tuple[int, int], dict[str, int]] = {}
    for k in v["measured"]:
        sched = v["schedule_only"][k]
        bubble = max(min(v["balanced"][k], sched), 0)
        out[k] = {
            "bubble": bubble,
            "imbalance": max(sched - bubble, 0),
            "comm_wait": max(v["no_host"][k] - sched, 0),
            "host": max(v["no_comm"][k] - v["no_host"][k], 0),
            "exposed_comm": max(v["no_copy"][k] - v["no_comm"][k], 0),
            "exposed_copy": max(v["no_ux"][k] - v["no_copy"][k], 0),
            "unexplained": max(v["measured"][k] - v["no_ux"][k], 0),
        }
    return out, full


def attribute(
    steps: list[RankStep],
    timelines: dict[int, RankTimeline],
    ops: dict[int, P2POps],
    last_stage: int,
    pipelined: bool,
    collectives: CollectiveMatch | None = None,
    painter: Painter | None = None,
    p2p_waits: bool = True,
) -> Attribution:
    """Cause totals for every (rank, step) and the per-gap cause tables. ``collectives``: the run's
    collectives as the pipeline matched them (matched here when not given); ``painter``: what
    paints the tables from the settled causes (:func:`paint` here when not given; the replica
    map's :func:`~ppdiag.attribution.paint_map.painter_on` gives the same tables). ``p2p_waits``:
    without a pipeline, charge a send/recv pair's wait to the later side (``_no_pipeline``)."""
    causes: dict[tuple[int, int], dict[str, int]] = {}
    notes: list[str] = []
    replay_steps: dict[str, float] = {}
    edges = np.zeros((0, 4), np.int64)
    held = np.zeros(0, np.int64)
    whole = own = np.zeros(0, np.bool_)  # (own: the waits on a consumer's own held send call)
    lat = 0
    links = LinkLatencies()
    if pipelined and any(len(rs.blocks) for rs in steps):
        rp = Replay(steps, timelines, ops, last_stage)
        lat = rp.normal_latency
        links = rp.links
        mean_cost = rp.mean_costs()
        # every variant read below placed in one pass over the graph's levels
        rp.run_many(
            [_spec(removed) for _, removed in CHAIN]
            + [_spec(CHAIN[-1][1], mean_cost), Variant(balanced=mean_cost)]
            + [Variant(host=False), Variant(comm_excess=False), Variant(comm_excess=False, comm=False)]
            + [Variant(copy=False)]
        )
        cf, full = replay_causes(rp)
        # single-cause counterfactuals for the findings' gains: only that delay removed
        full["gain_host"] = rp.run(host=False)
        full["gain_comm_wait"] = rp.run(comm_excess=False)
        full["gain_comm"] = rp.run(comm_excess=False, comm=False)
        full["gain_copy"] = rp.run(copy=False)
        full["gain_balanced"] = rp.run(balanced=mean_cost)
        measured_idle = {k: x[1] for k, x in full["measured"].items()}  # (not one per variant)
        for rs in steps:
            k = (rs.rank, rs.step)
            c = dict(cf[k])
            # the replay's own disagreement with the measurement is left to _close
            c["unexplained"] = 0
            causes[k] = _close(c, rs.acct.lost)
        synced = {k: rp.tail_coll[k][:2] for k in rp.sync_of}
        # (the graph's own arrays: the graph is frozen)
        edges, held, whole, own = rp.waits, rp.held, rp.whole, rp.consumer_held
        notes += _replay_notes(rp, steps, measured_idle)
        # the graph, its placement plan and the variants' results are read no more: freed, with
        # the heap's free pages, before the waits and the paint allocate theirs (at a thousand
        # ranks the graph is a quarter of the analysis's memory)
        del rp, cf, measured_idle
        trim_heap()
        # collectives the replay does not model as its step-end sync: waits for a late member
        waits = run_waits(steps, timelines, synced, collectives=collectives)
        _apply_all_moves(causes, waits.moves)
        for name, var in full.items():
            replay_steps[name] = float(np.mean([w for w, _ in var.values()])) if var else 0.0
        del full
    else:
        waits = _no_pipeline(steps, timelines, causes, p2p_waits, collectives)
    notes.extend(waits.notes)
    gaps = (painter or paint)(steps, causes)
    return Attribution(causes, gaps, lat, replay_steps, notes, edges, waits, held, links, whole, own)


def _no_pipeline(
    steps: list[RankStep],
    timelines: dict[int, RankTimeline],
    causes: dict[tuple[int, int], dict[str, int]],
    p2p_waits: bool,
    collectives: CollectiveMatch | None,
) -> CollectiveWaits:
    """The causes of a run without a pipeline (into ``causes``) and its collective waits: a
    receive waiting for a late sender is charged the sender's cause like a collective's, unless
    not ``p2p_waits`` (a rejected pipeline whose transfers chain its ranks,
    ``Pipeline.unread_chain``): there a receive waits for the block its sender computes in an
    order that could not be read, which says nothing of a late sender."""
    if p2p_waits:
        waits = run_waits(steps, timelines, p2p=True)
    else:
        waits = run_waits(steps, timelines, collectives=collectives)
    for rs in steps:
        host = ivs.measure(ivs.subtract(rs.host_set, rs.sets.p2p))
        c = {
            "bubble": 0,
            "imbalance": 0,
            "comm_wait": 0,
            "exposed_comm": rs.acct.exposed_p2p + rs.acct.exposed_collective,
            "host": host,
            "exposed_copy": rs.acct.exposed_copy,
            "unexplained": 0,
        }
        k = (rs.rank, rs.step)
        causes[k] = apply_moves(_close(c, rs.acct.lost), waits.moves.get(k, {}))
    return waits


def _apply_all_moves(
    causes: dict[tuple[int, int], dict[str, int]], moves: Mapping[tuple[int, int], dict[str, int]]
) -> None:
    """:func:`apply_moves` on every ``causes[k]`` with ``moves[k]``, in place, with one split per
    set of move names (a run has one or a few), not one per rank-step: each row is split exactly
    as :func:`apply_moves` splits it alone (the split works row by row)."""
    groups: dict[tuple[str, ...], list[tuple[int, int]]] = defaultdict(list)
    for k, mv in moves.items():
        groups[tuple(mv)].append(k)
    for names, keys in groups.items():
        if not names:
            continue
        w = np.array([[float(moves[k][n]) for n in names] for k in keys], np.float64)
        total = np.array([sum(moves[k].values()) for k in keys], np.int64)
        have = np.array([causes[k].get("exposed_comm", 0) for k in keys], np.int64)
        live = np.flatnonzero((total > 0) & (have > 0))
        if live.size == 0:
            continue
        take = split_shares(np.minimum(total[live], have[live]), w[live])
        for j, row in zip(live.tolist(), take.tolist(), strict=True):
            k = keys[j]
            out = dict(causes[k])
            out["exposed_comm"] = int(have[j]) - sum(row)
            for n, ns in zip(names, row, strict=True):
                out[n] = out.get(n, 0) + ns
            causes[k] = out


def _replay_notes(rp: Replay, steps: list[RankStep], measured: dict[tuple[int, int], int]) -> list[str]:
    """What the replay had to leave out or could not reproduce, in words."""
    notes: list[str] = []
    if rp.dropped_edges:
        # blocks are numbered by their labels when the trace has them, else by their order
        labelled = any(rs.blocks.labelled for rs in steps)
        notes.append(
            f"{rp.dropped_edges} micro-batch dependencies between blocks contradict the measured "
            "order and were left out of the replay "
            + (
                "(labels may be mis-numbered)"
                if labelled
                else "(micro-batches numbered by their order: a reordered schedule or clock error)"
            )
        )
    if rp.untraced_waits:
        notes.append(
            f"{rp.untraced_waits} waits are on ranks that are not in the traces: "
            "they are counted as pipeline waits; analyze every rank of the pipeline to trace them"
        )
    if rp.untimed_waits:
        notes.append(
            f"{rp.untimed_waits} waits are on sends held in their call (the send span opened over "
            f"{HELD_CALL_NS / 1e6:g} ms after its block: when the data left is not recorded): "
            "the replay takes their transfers at the normal latency"
        )
    own = int(rp.consumer_held.sum())
    if own:
        notes.append(
            f"{own} waits were due while their consumer was held in its own send calls (over "
            f"{HELD_CALL_NS / 1e6:g} ms inside them: it posted no receive, and the producer's next "
            "send waited for it): PP004 does not time the links with them"
        )
    mism = [abs(measured[(rs.rank, rs.step)] - rs.acct.lost) for rs in steps]
    if mism and max(mism) > 0.02 * max(rs.acct.window for rs in steps):
        notes.append(
            "the replay of the measured timeline differs from the measurement by up to "
            f"{max(mism) / 1e6:.2f} ms; the difference is reported as unexplained"
        )
    return notes


def _close(c: dict[str, int], lost: int) -> dict[str, int]:
    """Make the causes add up to the lost time exactly: a shortfall is unexplained, an excess is
    taken back from the causes in reverse precedence (the replay overestimated them)."""
    total = sum(c.values())
    if total <= lost:
        c["unexplained"] += lost - total
        return c
    excess = total - lost
    for k in ("unexplained", "exposed_copy", "exposed_comm", "host", "comm_wait", "imbalance", "bubble"):
        take = min(excess, c[k])
        c[k] -= take
        excess -= take
        if excess == 0:
            break
    return c


# re-exported: the replay's parts that tests and callers import from here
__all__ = [
    "MATCH_END_NS",
    "NEG_INF",
    "STEP_JOIN_NS",
    "WAIT_JOIN_NS",
    "Attribution",
    "RankStep",
    "Replay",
    "_Node",
    "_P2PIndex",
    "_last_waits",
    "_m",
    "_measure_between",
    "attribute",
    "rank_step",
]
