"""Point-to-point partners decided from pipeline labels and cross-rank timing when the trace
names no peer.

gloo runs recorded with ``torch.profiler`` defaults (no ``record_shapes``), NCCL kernels without
comm args and nsys kernels without NVTX payloads carry a transfer's direction at best, never its
peer. In order (docs/clocks.md):

0. Pipeline labels: a transfer inside torch.distributed.pipelining's ``PP:<s>SEND_F<mb>`` range
   (or inside or next to a labelled forward / input-gradient block, never a weight-gradient one)
   belongs to stage ``s``; its peer is the rank holding ``s +- 1``. The labels are host ranges, so
   a device kernel is placed among them by its launch.
1. Coarse clock offsets: ranks of one host share a clock (CPU/gloo runs); else the device
   collectives, which end together on every member; else the step starts.
2. Host ops (gloo): each transfer is an activation or a gradient by the compute beside it
   (autograd ops consume / produce gradients); per flow and step the k-th send pairs with the
   k-th receive of the same flow, and each rank's partner is the one whose receives follow its
   sends causally and soonest. Forward and backward answers must agree.
3. Device kernels: per ordered rank pair the differences between ``a``'s send ends and ``b``'s
   receive ends (a matched send and receive end together) are histogrammed around the coarse
   offset; a real link shows sharp peaks far above the flat floor a non-partner gives. Links need
   reciprocal peaks (the same offset seen from both sides) that agree on one clock per rank
   around every cycle, which drops the schedule's periodic echoes. Each op goes to the linked
   partner whose nearest counterpart is closest; the margin to the second is its confidence, and
   a stream that talks to one peer settles its ties. Ranks whose transfers rarely end together
   (eager sends) are placed by the data flow of step 2 instead, and so are kernels whose ends
   meet only to a few ms (ranks sharing a GPU by time slices) when the flow places every op and
   the timing fit does not place them the same or finds them ambiguous: there a fused SendRecv
   kernel is one send and one receive of the flows the compute around it gives, and each
   candidate link is scored without a clock (:mod:`ppdiag.pipeline.peer_flow`).
   Direction-unknown kernels take the direction the timing and the per-link balance of
   activations and gradients give.

Ops nothing places stay unknown and are counted in a warning; ambiguous answers warn and fall
back, never guess silently. Everything is sorting, ``searchsorted`` and histograms per rank pair:
linear in the ops of a pair. The result is an overlay on :class:`~ppdiag.pipeline.clocks.P2POps`
(copies owned by the pipeline layer): the parser's arrays are never written.

Step 0 (the labels) is in :mod:`ppdiag.pipeline.peer_labels`; steps 1 and 3 (the coarse clock,
the link fits and the assignment to links) are in
:mod:`ppdiag.pipeline.peer_links`, step 2 (the data flow of host ops) in
:mod:`ppdiag.pipeline.peer_flow`; this module chains them and lays the result over the intervals.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, RankTimeline, Run
from ppdiag.pipeline.clocks import P2POps
from ppdiag.pipeline.host_clocks import coarse_host_offsets
from ppdiag.pipeline.peer_flow import _decide_by_flow, _step_of
from ppdiag.pipeline.peer_labels import _from_labels
from ppdiag.pipeline.peer_links import (
    HOW_LABELS,
    HOW_METADATA,
    HOW_NAMES,
    HOW_TIMING,
    HOW_UNKNOWN,
    Coarse,
    LinkFit,
    _Ambiguous,
    _assign_by_links,
    _fit_pass,
    _KeySets,
    _link_offsets,
    coarse_clock,
    coarse_offsets,
    fit_link,
    fit_peaks,
)
from ppdiag.report_types import PeerLink, Peers

_REFINED_WINDOW_NS = 500_000  # the second fit's window, on clocks the first fit's links set
_REFINED_UNC_NS = 50_000  # k-th collectives that end further apart are not one collective
_SAME_OP_NS = 50_000  # host ops of one transfer in the intervals and the ranges start this close


@dataclass
class PeerDecision:
    """How the run's p2p partners were decided."""

    source: str  # "metadata" | "nvtx name" | "timing" | "<known> and timing" | "none"
    coarse_offsets: dict[int, int]
    coarse_method: str
    links: dict[tuple[int, int], LinkFit] = field(default_factory=dict)
    decided: int = 0  # ops whose peer came from timing
    by_labels: int = 0  # ops whose peer came from the stage the pipeline labels put them in
    undecided: int = 0  # ops no link explained
    confidence: float | None = None  # median margin of the timing decisions (0..1)
    warnings: list[str] = field(default_factory=list)

    def to_report(self) -> Peers:
        """The report's ``run.peers`` section (docs/json.md)."""
        return Peers(
            source=self.source,
            decided_by_timing=self.decided,
            decided_by_labels=self.by_labels,
            undecided=self.undecided,
            confidence=None if self.confidence is None else round(self.confidence, 3),
            coarse_clock=self.coarse_method,
            links=[
                PeerLink(
                    src=f.src,
                    dst=f.dst,
                    ops=f.support,
                    shift_us=round(f.shift_ns / 1000.0, 1),
                    tol_us=round(f.tol_ns / 1000.0, 1),
                )
                for f in sorted(self.links.values(), key=lambda x: (x.src, x.dst))
            ],
        )


def decide_peers(run: Run, ops: dict[int, P2POps], lines: list[list[int]] | None = None) -> PeerDecision:
    """Fill the unknown peers of ``ops`` (``{rank: P2POps}``, modified in place): from the
    pipeline labels that name a transfer's stage (``PP:<s>SEND_F<mb>``) where the trace has them,
    else from timing. ``lines``: the pipelines' ranks in stage order when the user gave them
    (``--stage-map``): only neighbours there are candidates."""
    n_lab = _from_labels(run, ops)
    dec = _decide(run, ops, lines)
    dec.by_labels = n_lab
    hows: set[int] = set()
    for v in ops.values():
        hows.update(int(h) for h in np.unique(v.how[v.peer >= 0]))
    # peers the trace named: comm metadata, or the profiler's nccl:send a->b range names
    known = _known_source(run)
    names = [
        known if h == HOW_METADATA else HOW_NAMES[h]
        for h in (HOW_METADATA, HOW_LABELS, HOW_TIMING)
        if h in hows
    ]
    dec.source = " and ".join(names) if names else "none"
    if dec.decided or n_lab:
        tls = run.by_rank()
        for r, v in ops.items():
            if r in tls and (v.how >= HOW_TIMING).any():
                _lay_over(tls[r], v)
    return dec


def _known_source(run: Run) -> str:
    """What named the peers the trace carries: comm metadata (payloads, args, op inputs), the
    profiler's ``nccl:send a->b`` range names (nsys parser's ``meta["p2p_peer_source"]``), or both."""
    named = sum(int(tl.meta.get("p2p_peer_source", {}).get("nvtx name", 0)) for tl in run.ranks)
    meta = sum(int(tl.meta.get("p2p_peer_source", {}).get("metadata", 0)) for tl in run.ranks)
    no_counts = any("p2p_peer_source" not in tl.meta for tl in run.ranks)
    if named and (meta or no_counts):
        return "metadata and nvtx name"
    return "nvtx name" if named else "metadata"


def _count_undecided(dec: PeerDecision, o: dict[int, P2POps], n_unknown: int, why: str) -> PeerDecision:
    """Count the ops still without a peer into ``dec`` (and warn when there are any)."""
    dec.undecided = sum(int((v.peer < 0).sum()) for v in o.values())
    if dec.undecided:
        dec.warnings.append(f"p2p peers: {dec.undecided} of {n_unknown} ops without a peer {why}")
    return dec


_BY_FLOW = "could not be placed by the data flow and stay unmatched"


def _decide(run: Run, ops: dict[int, P2POps], lines: list[list[int]] | None) -> PeerDecision:
    o = ops
    unknown = {r: v.peer < 0 for r, v in o.items()}
    n_unknown = sum(int(u.sum()) for u in unknown.values())
    n_known = sum(int((~u).sum()) for u in unknown.values())
    coarse = _host_coarse(run, o) or coarse_clock(run)
    dec = PeerDecision("metadata" if n_known else "none", coarse.offsets, coarse.method)
    if n_unknown == 0:
        return dec
    if all(not v.ends_meet for v in o.values() if len(v.start)) and _by_flow_first(
        run, o, coarse, unknown, dec, n_known
    ):
        return _count_undecided(dec, o, n_unknown, _BY_FLOW)
    ranks = sorted(r for r in o if unknown[r].any())
    try:
        links, key_sets, off = _fit_links(o, unknown, ranks, coarse, _pipeline_neighbours(run, lines), dec)
    except _Ambiguous as amb:
        if _flow_places_all(run, o, coarse.offsets, unknown, ranks, dec, None):
            return _count_undecided(dec, o, n_unknown, _BY_FLOW)
        got = _in_rank_order(o, unknown, ranks, coarse, dec) if lines is None else None
        if got is None:
            dec.undecided = n_unknown
            dec.warnings.append(
                f"p2p peers unknown for {n_unknown} ops and ambiguous by timing ({amb}); not guessed: "
                "give --stage-map, or record the peers (record_shapes=True, NCCL comm args, nsys "
                "--include-blobs)"
            )
            return dec
        links, key_sets, off = got
    if _flow_places_all(run, o, off, unknown, ranks, dec, (links, key_sets, n_known)):
        return _count_undecided(dec, o, n_unknown, _BY_FLOW)
    dec.links = links
    if not links:
        dec.undecided = n_unknown
        dec.warnings.append(
            f"p2p peers unknown for {n_unknown} ops and no cross-rank timing pattern names them "
            f"(coarse clock: {coarse.method}); the pipeline cannot be rebuilt from timing"
        )
        return dec
    _assign(run, o, ranks, links, key_sets, off, dec, n_known)
    return _count_undecided(dec, o, n_unknown, "fit no link by timing and stay unmatched")


def _in_rank_order(
    o: dict[int, P2POps],
    unknown: dict[int, npt.NDArray[np.bool_]],
    ranks: list[int],
    coarse: Coarse,
    dec: PeerDecision,
) -> tuple[dict[tuple[int, int], LinkFit], _KeySets, dict[int, int]] | None:
    """Links of data-parallel replicas that run in lockstep, where timing fits a rank's partner
    and the same stage of another replica equally well: the pipelines the ranks' order and op
    counts give, the fit kept only when it is unambiguous among their neighbours (None otherwise).

    A pipeline's first and last ranks talk to one neighbour, so they have half the transfers of
    the others: those ``2 dp`` ranks are the pipelines' ends. Ranks are numbered either stage
    major (pipeline ``d`` is ``d, d + dp, d + 2 dp``..., Megatron's order) or replica major
    (``d P .. d P + P - 1``); the one numbering whose pipelines end at those ranks is taken.
    Either way the replicas' waits are the same, as their timing is.
    """
    counts = np.array([int(unknown[r].sum()) for r in ranks])
    n = len(ranks)
    ends = {i for i in range(n) if counts[i] <= 0.75 * counts.max()}
    dp = len(ends) // 2
    if dp < 2 or len(ends) % 2 or n % dp or n // dp < 3:
        return None
    p = n // dp
    layouts = (
        [[d + i * dp for i in range(p)] for d in range(dp)],  # stage major
        [list(range(d * p, (d + 1) * p)) for d in range(dp)],  # replica major
    )
    fit = [ls for ls in layouts if {x for line in ls for x in (line[0], line[-1])} == ends]
    if len(fit) != 1:
        return None
    steps = [(a, b) for line in fit[0] for a, b in itertools.pairwise(line)]
    allowed = {(ranks[x], ranks[y]) for a, b in steps for x, y in ((a, b), (b, a))}
    try:
        got = _fit_links(o, unknown, ranks, coarse, allowed, dec)
    except _Ambiguous:
        return None
    if not got[0]:
        return None
    dec.warnings.append(
        f"p2p peers: {dp} data-parallel replicas run in lockstep (timing fits a rank's partner and "
        "the same stage of another replica alike); the pipelines were taken in rank order "
        "(record the peers to confirm: NCCL comm args, nsys --include-blobs)"
    )
    return got


def _host_coarse(run: Run, o: dict[int, P2POps]) -> Coarse | None:
    """Host ops on several hosts: the hosts' clocks from the transfers' order and causality
    (:func:`ppdiag.pipeline.host_clocks.coarse_host_offsets`); None otherwise."""
    if any(v.ends_meet for v in o.values() if len(v.start)):
        return None
    got = coarse_host_offsets(run, o)
    if got is None:
        return None
    unc = got.uncertainty_ns
    return Coarse(got.offsets, max(2_000_000, 2 * unc), got.method, unc, got.candidates)


def _by_flow_first(
    run: Run,
    o: dict[int, P2POps],
    coarse: Coarse,
    unknown: dict[int, npt.NDArray[np.bool_]],
    dec: PeerDecision,
    n_known: int,
) -> bool:
    """No transfer's ends meet: the data flow is tried before timing. When it places the ops,
    its links, counts and warnings go into ``dec`` (True); else nothing changes."""
    flow = _decide_by_flow(run, o, coarse.offsets, unknown, coarse.candidates)
    if flow is None:
        return False
    dec.links, dec.decided, conf, warns = flow
    dec.warnings.extend(warns)
    dec.confidence = conf
    dec.source = "metadata and timing" if n_known else "timing"
    return True


def _assign(
    run: Run,
    o: dict[int, P2POps],
    ranks: list[int],
    links: dict[tuple[int, int], LinkFit],
    key_sets: _KeySets,
    off: dict[int, int],
    dec: PeerDecision,
    n_known: int,
) -> None:
    """Step 3: each unknown op goes to its best accepted link; directions follow; the count,
    confidence and source go into ``dec``."""
    decided, margins = _assign_by_links(run, o, ranks, links, key_sets)
    low = sum(int(((v.how == HOW_TIMING) & (v.conf < 0.5)).sum()) for v in o.values())
    if low:
        dec.warnings.append(
            f"p2p peers by timing: {low} ops fit two partners about equally well and were given the "
            "nearer one (low confidence)"
        )
    _directions(run, o, links, off)
    dec.decided = decided
    dec.confidence = float(np.median(np.concatenate(margins))) if margins and decided else None
    dec.source = "metadata and timing" if n_known else "timing"


def _fit_links(
    o: dict[int, P2POps],
    unknown: dict[int, npt.NDArray[np.bool_]],
    ranks: list[int],
    coarse: Coarse,
    allowed: set[tuple[int, int]] | None,
    dec: PeerDecision,
) -> tuple[dict[tuple[int, int], LinkFit], _KeySets, dict[int, int]]:
    """The accepted links, the key sets of the fit that found them, and the clock it ran on
    (raises :class:`_Ambiguous`). Where every transfer's ends meet and the coarse clock is loose,
    a second fit on the clock the first one's links set, kept when it links the same ranks."""
    off, window = coarse.offsets, coarse.window_ns
    all_meet = all(bool(v.ends_meet) for v in o.values() if len(v.start))
    links, key_sets = _fit_pass(o, unknown, ranks, off, window, coarse.uncertainty_ns, allowed, all_meet)
    if links and all_meet and coarse.uncertainty_ns > _REFINED_UNC_NS:
        # refine: the accepted links set the clocks to a few µs; fit again on those clocks
        # with a narrow window, where a real link stands at zero shift and an echo does not
        off2 = {r: off.get(r, 0) + e for r, e in _link_offsets(links, ranks).items()}
        try:
            links2, key_sets2 = _fit_pass(
                o, unknown, ranks, off2, _REFINED_WINDOW_NS, _REFINED_UNC_NS, allowed, all_meet
            )
        except _Ambiguous:
            links2, key_sets2 = {}, key_sets
        if {x for k in links2 for x in k} >= {x for k in links for x in k}:
            links, key_sets, off = links2, key_sets2, off2
            dec.coarse_method = f"{coarse.method}, refined on the matched transfers"
    return links, key_sets, off


def _flow_places_all(
    run: Run,
    o: dict[int, P2POps],
    off: dict[int, int],
    unknown: dict[int, npt.NDArray[np.bool_]],
    ranks: list[int],
    dec: PeerDecision,
    timed: tuple[dict[tuple[int, int], LinkFit], _KeySets, int] | None,
) -> bool:
    """The data flow (order and counts per step) instead of the timing fit ``timed`` (its links,
    key sets and the ops known before): where some ranks' transfers never end together with a
    partner's (eager sends, receives that cannot be posted ahead), or where every transfer's ends
    meet and the flow places every op while the timing fit leaves some unplaced or places them
    elsewhere (ends that meet only to a few ms, e.g. ranks sharing one GPU by time slices, let a
    schedule's periodic echo outvote a link). When the flow links every rank without a warning,
    its peers are taken into ``o`` and ``dec`` (True); else nothing changes. ``timed`` None: the
    timing fit found the partners ambiguous; ends that meet then take a flow that places every
    op."""
    links = timed[0] if timed is not None else {}
    trial = {r: _copy_ops(v) for r, v in o.items()}
    flow = _decide_by_flow(run, trial, off, unknown)
    if flow is None or not flow[0] or flow[3] or not {x for k in flow[0] for x in k} >= set(ranks):
        return False
    if timed is None or not set(ranks) - {x for k in links for x in k}:
        all_meet = all(bool(v.ends_meet) for v in o.values() if len(v.start))
        if not all_meet or any((trial[r].peer[unknown[r]] < 0).any() for r in ranks):
            return False
        if timed is not None:
            by_time = {r: _copy_ops(v) for r, v in o.items()}
            _assign(run, by_time, ranks, links, timed[1], off, PeerDecision("", {}, ""), timed[2])
            if all(np.array_equal(by_time[r].peer, trial[r].peer) for r in ranks):
                return False  # the same answer: the timing fit's links and confidences are kept
    for r, v in trial.items():
        o[r].peer[:], o[r].how[:], o[r].conf[:] = v.peer, v.how, v.conf
    dec.links, dec.decided, dec.confidence = flow[0], flow[1], flow[2]
    return True


def _pipeline_neighbours(run: Run, given: list[list[int]] | None = None) -> set[tuple[int, int]] | None:
    """Rank pairs that may be neighbours: any two traced members of a pipeline process group the
    trace describes (``pg_desc`` naming it, e.g. Megatron's PIPELINE_MODEL_PARALLEL_GROUP; torch
    lists its ranks sorted, not in stage order), or next to each other in ``given``
    (``--stage-map``), the ring's wrap included; None when neither exists.

    With data parallelism every replica runs the same schedule, so timing alone may not tell a
    rank's partner from the same stage of another replica; the group does.
    """
    from ppdiag.pipeline.topology import _PP_GROUP

    lines: set[tuple[int, ...]] = {tuple(x) for x in given or [] if len(x) > 1}
    members: set[tuple[int, ...]] = set()
    for tl in run.ranks:
        for g in tl.process_groups:
            if not given and _PP_GROUP.search(g.desc or "") and len(g.ranks) > 1:
                members.add(tuple(g.ranks))
    if not lines and not members:
        return None
    out: set[tuple[int, int]] = set()
    for line in lines:
        for x, y in zip(line, line[1:] + line[:1], strict=True):
            out.update(((x, y), (y, x)))
    traced = {tl.rank for tl in run.ranks}
    for grp in members:
        # a group lists its ranks sorted, not in stage order: any two traced members may be neighbours
        inside = sorted(traced.intersection(grp))
        out.update((x, y) for x in inside for y in inside if x != y)
    return out


def _copy_ops(v: P2POps) -> P2POps:
    """``v`` with its own peer / how / conf arrays (the rest shared, read only)."""
    return P2POps(
        v.start,
        v.end,
        v.peer.copy(),
        v.direction,
        v.device,
        v.how.copy(),
        v.conf.copy(),
        v.index,
        v.table,
        v.ends_meet,
    )


def _directions(
    run: Run, o: dict[int, P2POps], links: dict[tuple[int, int], LinkFit], off: dict[int, int]
) -> None:
    """Directions of the direction-unknown ops with a decided peer.

    Only ``me -> peer`` a link: a send; only ``peer -> me``: a receive. Where both are links, each
    op pairs with its counterpart on the peer (ends meet) and the side whose op started first is
    taken as the receive (posted early, it waited for the data). Every activation sent across a
    link comes back as one gradient, so per link and step both directions must count the same:
    where they do not, the pairs whose starts were closest (the weakest evidence) are flipped.
    """
    tls = run.by_rank()
    for r, v in o.items():
        m = (v.direction == 0) & (v.peer >= 0)
        if not m.any():
            continue
        idx = np.flatnonzero(m)
        peers = v.peer[idx]
        out_l = np.array([(r, int(p)) in links for p in peers], dtype=bool)
        in_l = np.array([(int(p), r) in links for p in peers], dtype=bool)
        d = np.where(out_l & ~in_l, int(Direction.SEND), np.where(in_l & ~out_l, int(Direction.RECV), 0))
        v.direction[idx] = d.astype(np.int8)
    done: set[tuple[int, int]] = set()
    for a, b in links:
        if (b, a) not in links or (min(a, b), max(a, b)) in done:
            continue
        a, b = min(a, b), max(a, b)
        done.add((a, b))
        va, vb = o[a], o[b]
        xa = np.flatnonzero((va.direction == 0) & (va.peer == b))
        yb = np.flatnonzero((vb.direction == 0) & (vb.peer == a))
        if xa.size == 0 or yb.size == 0:
            continue
        # counterpart on b of each of a's ops: nearest end on the coarse common clock
        eb = vb.end[yb] + off.get(b, 0)
        ob = np.argsort(eb, kind="stable")
        eb_s = eb[ob]
        ea = va.end[xa] + off.get(a, 0)
        j = np.clip(np.searchsorted(eb_s, ea), 0, eb_s.size - 1)
        jl = np.clip(j - 1, 0, eb_s.size - 1)
        j = np.where(np.abs(eb_s[jl] - ea) < np.abs(eb_s[j] - ea), jl, j)
        yj = yb[ob[j]]
        gap = (vb.start[yj] + off.get(b, 0)) - (va.start[xa] + off.get(a, 0))  # > 0: a started first
        a_recv = gap > 0
        step = _step_of(tls[a], va.start[xa]) if a in tls else np.zeros(xa.size, np.int64)
        for st in np.unique(step):
            sm = np.flatnonzero(step == st)
            n_recv = int(a_recv[sm].sum())
            n_send = sm.size - n_recv
            k = abs(n_send - n_recv) // 2
            if k == 0:
                continue
            major = sm[a_recv[sm]] if n_recv > n_send else sm[~a_recv[sm]]
            flip = major[np.argsort(np.abs(gap[major]), kind="stable")[:k]]
            a_recv[flip] = ~a_recv[flip]
        va.direction[xa] = np.where(a_recv, int(Direction.RECV), int(Direction.SEND)).astype(np.int8)
        # b's side: the opposite of its counterpart's (ops no counterpart chose keep unknown)
        vb.direction[yj] = np.where(a_recv, int(Direction.SEND), int(Direction.RECV)).astype(np.int8)
    for v in o.values():
        left = (v.direction == 0) & (v.peer >= 0) & (v.how == HOW_TIMING)
        v.peer[left] = -1  # a peer without a direction cannot be paired: undecided, counted
        v.how[left] = HOW_UNKNOWN


def interval_overlay(
    tl: RankTimeline, ops: P2POps
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int8]] | None:
    """Copies of ``tl.intervals.peer`` / ``.direction`` with the decided peers laid over (None when
    nothing was decided by timing)."""
    if ops.iv_peer.shape[0] != len(tl.intervals):
        return None
    return ops.iv_peer, ops.iv_dir


def _lay_over(tl: RankTimeline, v: P2POps) -> None:
    """Fill ``v.iv_peer`` / ``v.iv_dir``: the rank's p2p intervals with the decided peers.

    Device ops are rows of the intervals. Host ops (CPU runs) are ranges; the p2p intervals of a
    CPU run are the same host ops (the c10d op and the backend span it issued): each takes the
    peer of the chosen op of its direction that starts with it or first after it began.
    """
    iv = tl.intervals
    peer = iv.peer.copy()
    direction = iv.direction.copy()
    dec = v.how >= HOW_TIMING
    if v.table == "intervals":
        ok = dec & (v.index >= 0)
        peer[v.index[ok]] = v.peer[ok]
        direction[v.index[ok]] = v.direction[ok]
    else:
        m = np.flatnonzero((iv.kind == int(Kind.P2P)) & (peer < 0))
        for d in (int(Direction.SEND), int(Direction.RECV)):
            src = np.flatnonzero(dec & (v.direction == d))
            if src.size == 0:
                continue
            src = src[np.argsort(v.start[src], kind="stable")]
            st = v.start[src]
            tgt = m[iv.direction[m] == d]
            # the backend span itself (the CPU intervals may clip its start): the same end
            eo = np.argsort(v.end[src], kind="stable")
            en = v.end[src][eo]
            k = np.clip(np.searchsorted(en, iv.end[tgt]), 0, en.size - 1)
            kl = np.clip(k - 1, 0, en.size - 1)
            k = np.where(np.abs(en[kl] - iv.end[tgt]) < np.abs(en[k] - iv.end[tgt]), kl, k)
            same = np.abs(en[k] - iv.end[tgt]) <= _SAME_OP_NS
            peer[tgt[same]] = v.peer[src[eo[k[same]]]]
            # else the op that issued it: the backend span starts inside the issuing op; the two
            # tables may round the same event's times differently by some µs
            rest = tgt[~same]
            j = np.searchsorted(st, iv.start[rest] - _SAME_OP_NS, side="left")
            ok = j < st.size
            j = np.clip(j, 0, max(st.size - 1, 0))
            ok &= st[j] <= np.maximum(iv.end[rest], iv.start[rest]) + _SAME_OP_NS
            peer[rest[ok]] = v.peer[src[j[ok]]]
    v.iv_peer, v.iv_dir = peer.astype(np.int32), direction.astype(np.int8)


# re-exported: the timing fits that callers and tests import from here
__all__ = [
    "HOW_LABELS",
    "HOW_METADATA",
    "HOW_NAMES",
    "HOW_TIMING",
    "HOW_UNKNOWN",
    "Coarse",
    "LinkFit",
    "PeerDecision",
    "coarse_clock",
    "coarse_offsets",
    "decide_peers",
    "fit_link",
    "fit_peaks",
    "interval_overlay",
]
