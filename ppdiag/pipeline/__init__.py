"""Rebuild the pipeline from the parsed ranks: stages, clocks, steps, blocks, schedule."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ppdiag.errors import InputError
from ppdiag.model import Direction, Run
from ppdiag.model.schedule import Schedule, schedule_option
from ppdiag.model.structure import Structure
from ppdiag.pipeline.aligned import aligned_run
from ppdiag.pipeline.blocks import Blocks, IntervalLabels, block_labels, build_blocks
from ppdiag.pipeline.clocks import ClockFit, P2POps, Pairs, match_pairs, p2p_ops
from ppdiag.pipeline.collectives import CollectiveMatch, match_collectives
from ppdiag.pipeline.device_clocks import fit_device_clocks
from ppdiag.pipeline.hangs import detect as detect_hang
from ppdiag.pipeline.hangs import trimmed
from ppdiag.pipeline.host_clocks import with_host_clocks
from ppdiag.pipeline.overrides import override_warnings
from ppdiag.pipeline.peers import PeerDecision, decide_peers, interval_overlay
from ppdiag.pipeline.replica_clocks import link_replicas
from ppdiag.pipeline.schedule import detect_schedule, label_from_order, microbatch_count
from ppdiag.pipeline.steps import LocalStep, select_steps, step_windows
from ppdiag.pipeline.structure import claimed_words, contradiction, describe
from ppdiag.pipeline.topology import (
    Topology,
    directions_stated,
    exchange_only,
    infer_topology,
    no_pp,
    parse_stage_map,
    pp_disagreement,
)
from ppdiag.report_types import Hang


@dataclass
class PipelineOptions:
    """User overrides for facts the traces may lack."""

    pp: int | None = None
    stage_map: str | None = None
    microbatches: int | None = None
    schedule: str | None = None
    steps: str | None = None


@dataclass(frozen=True)
class Pipeline:
    """The rebuilt pipeline. Windows and blocks are on the aligned clock; ``aligned`` is the run on
    that clock with the block labels (the parsed run stays as parsed, ppdiag/pipeline/aligned.py)."""

    topology: Topology
    clocks: ClockFit
    pairs: Pairs
    ops: dict[int, P2POps]  # each rank's p2p operations (own clock), for the attribution
    windows: dict[int, list[LocalStep]]
    blocks: dict[int, Blocks]  # all analyzed steps of a rank; ``Blocks.step`` indexes ``windows``
    schedule: Schedule
    microbatches: int | None
    aligned: Run  # the parsed ranks with the fitted clock offsets and the labels: what later layers read
    warnings: list[str] = field(default_factory=list)
    peers: PeerDecision | None = None  # how the p2p partners were decided
    # per rank: the intervals' phase / micro-batch / virtual stage with the blocks laid over
    labels: dict[int, IntervalLabels] = field(default_factory=dict)
    # each structural fact's source and confidence; established False when contradictions
    # rejected the pipeline the evidence suggested (ppdiag/pipeline/structure.py)
    structure: Structure | None = None
    # the run stopped or its traces were cut: the windows and blocks keep only the steps every
    # rank completed (ppdiag/pipeline/hangs.py)
    hang: Hang | None = None
    # the flags (--pp, --stage-map, --schedule, -m) that disagree with the trace, one line each (also
    # in ``warnings``): what the command line repeats on stderr and the gate among its warnings
    overrides: list[str] = field(default_factory=list)
    # the run's collectives matched across the ranks of each group, on the aligned clock: what the
    # attribution splits into waits and the Perfetto overlay draws arrows for (matched once, here)
    collectives: CollectiveMatch = field(default_factory=CollectiveMatch.empty)
    # the structure was rejected, but its transfers state their direction and formed the chain it
    # was read from: a pipeline whose order could not be read, so a receive waits for data its
    # sender computes (a dependency), not for a late peer; the attribution leaves those waits as
    # exposed communication instead of charging them to the sender (ppdiag/attribution/causes.py)
    unread_chain: bool = False


def rebuild(run: Run, opts: PipelineOptions | None = None) -> Pipeline:
    """Topology, clock offsets, step windows, labelled blocks and schedule. ``run`` is not changed:
    the offsets and labels are held by the result (``clocks.offsets``, ``labels``, ``aligned``).

    A pipeline that contradicts its own evidence is not kept: the run is rebuilt without one, and
    ``structure`` says why (``established`` False). A run that stopped or was cut keeps only the
    steps every rank completed, and ``hang`` says how it stopped."""
    opts = opts or PipelineOptions()
    if opts.schedule:
        # one list of names for every command: aliases ("interleaved") resolve here
        opts = dataclasses.replace(opts, schedule=str(schedule_option(opts.schedule)))
    user = {
        "pp": opts.pp is not None,
        "stage_map": opts.stage_map is not None,
        "microbatches": opts.microbatches is not None,
        "schedule": opts.schedule is not None,
    }
    pipe = _build(run, opts, flat=False)
    topo = pipe.topology
    reason = contradiction(
        topo,
        pipe.blocks,
        pipe.windows,
        user["pp"] or user["stage_map"],
        pipe.microbatches,
        directions_stated(run),
    )
    rejected = None
    unread_chain = False
    if reason is not None:
        # (a rejection for transfers that state no direction says it cannot tell a pipeline from
        # an exchange: those keep the pairing of a run without a pipeline)
        unread_chain = directions_stated(run)
        rejected = (reason, claimed_words(topo, pipe.schedule, pipe.microbatches))
        pipe = _build(run, opts, flat=True)
        warned = f"pipeline structure could not be established: {reason}; analysed without a pipeline"
        pipe = dataclasses.replace(pipe, warnings=[*pipe.warnings, warned])
    labelled = any(b.labelled for b in pipe.blocks.values())
    peer_source = pipe.peers.source if pipe.peers is not None else "none"
    structure = describe(
        pipe.topology,
        pipe.schedule,
        pipe.microbatches,
        labelled,
        peer_source,
        pipe.clocks.method,
        user,
        rejected,
    )
    return _trimmed(dataclasses.replace(pipe, structure=structure, unread_chain=unread_chain))


def _trimmed(pipe: Pipeline) -> Pipeline:
    """The pipeline with how the run stopped (``hang``), keeping only the steps every rank
    completed when it stopped or was cut (a new Pipeline: the built one is not changed)."""
    by_rank = pipe.topology.neighbour_map()
    nb = {tl.rank: by_rank.get(tl.rank, (None, None)) for tl in pipe.aligned.ranks}
    hang = detect_hang(pipe.aligned, pipe.ops, pipe.windows, nb)
    windows, blocks = trimmed(pipe.windows, pipe.blocks, hang)
    return dataclasses.replace(pipe, windows=windows, blocks=blocks, hang=hang)


def _build(run: Run, opts: PipelineOptions, flat: bool) -> Pipeline:
    """The pipeline the evidence suggests, or with ``flat`` the run without one (pp 1)."""
    warnings: list[str] = []
    ops = {tl.rank: p2p_ops(tl) for tl in run.ranks}
    peers, topo, overrides = _peers_and_topology(run, opts, ops, warnings)
    if flat:
        topo = no_pp(run, source="none (rejected)")
    pairs = match_pairs(ops)
    warnings.extend(pairs.warnings)
    fit, clock_warnings = fit_device_clocks(run, pairs)  # one offset per host: docs/clocks.md
    warnings.extend(clock_warnings)
    fit = link_replicas(run, pairs, fit, topo)  # replicas: docs/clocks.md
    fit, clock_warnings = with_host_clocks(run, pairs, fit)
    warnings.extend(clock_warnings)
    warnings.extend(_residual_warning(fit))
    clocked = aligned_run(run, fit.offsets, hosts=fit.hosts)  # the parsed ranks on the common clock
    windows, blocks = _steps_and_blocks(clocked, opts, topo, ops, warnings)
    schedule = (
        Schedule.NONE
        if flat
        else (schedule_option(opts.schedule) or detect_schedule(topo, blocks, clocked.by_rank()))
    )
    flags = override_warnings(clocked, opts, topo, blocks)  # the other flags against the trace
    warnings.extend(flags)
    m = None if flat else opts.microbatches
    if m is None and not flat:
        m = _microbatches(clocked, topo, windows, blocks, ops)
    warnings.extend(_order_labels(topo, blocks, schedule, m))
    # after every label is known: an overlay on the parser's columns, shown on the aligned view
    labels = {tl.rank: block_labels(tl, blocks[tl.rank], tl.clock_offset_ns) for tl in clocked.ranks}
    if topo.pp > 1 and not any(len(b) for b in blocks.values()):
        warnings.append("pipeline stages found but no compute blocks could be delimited")
    aligned = aligned_run(run, fit.offsets, labels, fit.hosts)
    return Pipeline(
        topology=topo,
        clocks=fit,
        pairs=pairs,
        ops=ops,
        windows=windows,
        blocks=blocks,
        schedule=schedule,
        microbatches=m,
        aligned=aligned,
        warnings=warnings,
        peers=peers,
        labels=labels,
        overrides=[*overrides, *flags],
        collectives=_collectives(aligned),
    )


def _collectives(aligned: Run) -> CollectiveMatch:
    """The run's collectives matched (empty when the traces hold nothing matchable)."""
    try:
        return match_collectives(aligned.by_rank())
    except (ValueError, KeyError, IndexError):  # malformed group metadata: nothing to match
        return CollectiveMatch.empty()


def _peers_and_topology(
    run: Run, opts: PipelineOptions, ops: dict[int, P2POps], warnings: list[str]
) -> tuple[PeerDecision, Topology, list[str]]:
    """How the p2p partners were decided, the stages they form, and the --pp warning when the flag
    disagrees with the trace (as :func:`infer_topology` worded it); warnings appended. p2p ops that
    only ever send and receive at once are grouped send/recv of a collective (an all-to-all): no
    partner is guessed for them by timing (the user's --pp / --stage-map still asks for it)."""
    if exchange_only(run) and not (opts.stage_map or opts.pp):
        peers = PeerDecision(
            "metadata" if any((o.peer >= 0).any() for o in ops.values()) else "none", {}, "none"
        )
    else:
        peers = decide_peers(run, ops, parse_stage_map(opts.stage_map) if opts.stage_map else None)
    topo = infer_topology(run, opts.stage_map, opts.pp, ops)
    pp_note = pp_disagreement(opts.pp, topo) if opts.pp else None
    overrides = [w for w in topo.warnings if w == pp_note]
    if (peers.decided or peers.by_labels) and topo.source == "p2p chain":
        topo.source = f"p2p chain (peers from {peers.source})"
    elif peers.decided and topo.pp == 1:
        peers.warnings.append(
            f"p2p partners decided by timing for {peers.decided} ops form no pipeline chain; "
            "treated as no pipeline"
        )
    warnings.extend(peers.warnings)
    warnings.extend(topo.warnings)
    return peers, topo, overrides


def _microbatches(
    run: Run,
    topo: Topology,
    windows: dict[int, list[LocalStep]],
    blocks: dict[int, Blocks],
    ops: dict[int, P2POps],
) -> int | None:
    """Micro-batches per step when not given: counted from the blocks, or from the first stage's
    sends when no block is labelled (``run`` on the aligned clock)."""
    if topo.pp <= 1:
        return None
    m = microbatch_count(blocks, topo.virtual, run.by_rank())
    sent = _microbatches_from_sends(run, topo, windows, ops)
    if sent and not any(b.labelled for b in blocks.values()) and sent != m:
        # the first stage sends one activation per forward: a count that small helper ops
        # around the blocks cannot inflate
        return sent
    return m


def _order_labels(topo: Topology, blocks: dict[int, Blocks], schedule: str, m: int | None) -> list[str]:
    """Label unlabelled blocks of a virtual-stage run from the schedule's order; the warning when
    some rank-steps do not follow it."""
    if topo.virtual <= 1 or not any(len(b) and not b.labelled for b in blocks.values()):
        return []
    bad = label_from_order(blocks, topo, schedule, m)
    if not bad:
        return []
    return [
        f"{bad} rank-steps do not follow the {schedule} order: their blocks keep counted micro-batch numbers"
    ]


def _residual_warning(fit: ClockFit) -> list[str]:
    """Ranks whose clock residual exceeds the normal p2p latency: waits shorter than the residual
    cannot be told apart from it."""
    if fit.latency_us is None:
        return []
    high = {r: v for r, v in fit.residual_by_rank_us.items() if v > max(fit.latency_us, 50.0)}
    if not high:
        return []
    worst = max(high, key=lambda r: high[r])
    return [
        f"clock residual above the normal p2p latency ({fit.latency_us:.0f} µs) on ranks "
        f"{sorted(high)} (rank {worst}: {high[worst]:.0f} µs): waits shorter than that are "
        "not told apart from clock error"
    ]


def _steps_and_blocks(
    run: Run, opts: PipelineOptions, topo: Topology, ops: dict[int, P2POps], warnings: list[str]
) -> tuple[dict[int, list[LocalStep]], dict[int, Blocks]]:
    """Each rank's selected step windows and its compute blocks, on the aligned clock (``run`` is the
    aligned view: the ranks' clock offsets set); their warnings are appended to ``warnings``."""
    windows: dict[int, list[LocalStep]] = {}
    blocks: dict[int, Blocks] = {}
    found = {tl.rank: step_windows(tl) for tl in run.ranks}
    if opts.steps and not any(select_steps(loc, opts.steps) for loc, _ in found.values()):
        nums = sorted({s.number for loc, _ in found.values() for s in loc})
        raise InputError(None, f"--steps {opts.steps}: no such step in the traces (recorded steps: {nums})")
    nb = topo.neighbour_map()
    for tl in run.ranks:
        local, w = found[tl.rank]
        for msg in w:
            warnings.append(f"rank {tl.rank}: {msg}")
        local = select_steps(local, opts.steps)
        if not local:
            warnings.append(f"rank {tl.rank}: no step selected")
        prev, nxt = nb.get(tl.rank, (None, None))
        b = (
            build_blocks(
                tl, local, topo.stage_of.get(tl.rank, 0), prev, nxt, interval_overlay(tl, ops[tl.rank])
            )
            if topo.pp > 1
            else Blocks.empty()
        )
        off = tl.clock_offset_ns
        windows[tl.rank] = [LocalStep(s.number, s.start + off, s.end + off) for s in local]
        if len(b):
            b.start = b.start + off
            b.end = b.end + off
            b.launch = np.where(b.launch >= 0, b.launch + off, -1)
        blocks[tl.rank] = b
    return windows, blocks


def _microbatches_from_sends(
    run: Run, topo: Topology, windows: dict[int, list[LocalStep]], ops: dict[int, P2POps]
) -> int | None:
    """Forward activations the first stage sends to the second per step, over its chunks (``run``
    on the aligned clock)."""
    if not topo.pipelines or len(topo.pipelines[0]) < 2:
        return None
    first, second = topo.pipelines[0][0], topo.pipelines[0][1]
    o = ops.get(first)
    wins = windows.get(first, [])
    if o is None or not len(o.start) or not wins:
        return None
    off = run.by_rank()[first].clock_offset_ns
    sends = (o.peer == second) & ((o.direction == int(Direction.SEND)) | (o.direction == int(Direction.BOTH)))
    t = o.start[sends] + off
    counts = [int(((t >= w.start) & (t < w.end)).sum()) for w in wins]
    counts = [c for c in counts if c > 0]
    if not counts:
        return None
    return round(float(np.median(counts)) / max(topo.virtual, 1))
