"""Which pipeline stage each rank runs.

Evidence, in order: ``--stage-map``; the pipeline process group (``pg_desc`` naming it, e.g.
Megatron's ``PIPELINE_MODEL_PARALLEL_GROUP``) for which ranks form a pipeline, its stage order
from the labels, else the p2p chain, else as listed (torch lists a group's ranks sorted, whatever
order the stages run in); pipeline labels that name stages (``PP:<stage>F<mb>``);
the chain of point-to-point partners (a path, or a ring for interleaved placements, whose first
stage is the rank that sends first); ``--pp`` with Megatron's default rank order. A run with none
of these has no pipeline parallelism (``pp`` 1).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ppdiag.errors import InputError
from ppdiag.limits import MAX_PP
from ppdiag.model import Direction, Kind, RangeKind, RankTimeline, Run
from ppdiag.pipeline.clocks import P2POps, p2p_ops

_PP_GROUP = re.compile(r"pipe|(^|[^a-z])pp([^a-z]|$)", re.IGNORECASE)


@dataclass
class Topology:
    """Stage placement of the run's ranks.

    ``stage_of`` maps each rank to its first (physical) stage 0..pp-1; ``chunks_of`` lists the
    virtual stages each rank holds (``[s]`` without interleaving); ``pipelines`` lists the ranks of
    each pipeline in stage order (several with data parallelism).
    """

    pp: int
    stage_of: dict[int, int]
    chunks_of: dict[int, list[int]]
    pipelines: list[list[int]]
    virtual: int = 1
    placement: str = "loop"  # "loop" (stage s on rank s % P) or "v" (r and 2P-1-r)
    source: str = "none"
    ring: bool = False  # the last rank sends back to the first (interleaved placement)
    warnings: list[str] = field(default_factory=list)

    def stage_map(self) -> dict[str, int]:
        """``{stage: rank}`` of the first pipeline (JSON form)."""
        if not self.pipelines:
            return {}
        return {str(s): r for s, r in enumerate(self.pipelines[0])}

    def neighbours(self, rank: int) -> tuple[int | None, int | None]:
        """Previous and next rank in the rank's pipeline (physical stage order; wraps on a ring)."""
        return self.neighbour_map().get(rank, (None, None))

    def neighbour_map(self) -> dict[int, tuple[int | None, int | None]]:
        """:meth:`neighbours` of every rank of the pipelines, from one pass over them (a scan of
        the pipelines per rank is quadratic in the replicas). A rank listed in two pipelines
        keeps its first, as the scan did."""
        wrap = self.ring or (self.virtual > 1 and self.placement == "loop")
        out: dict[int, tuple[int | None, int | None]] = {}
        for line in self.pipelines:
            n = len(line)
            for i, rank in enumerate(line):
                if rank in out:
                    continue  # the first line holding the rank, at its first place in it
                prev = line[i - 1] if i > 0 else (line[-1] if wrap and n > 1 else None)
                nxt = line[i + 1] if i + 1 < n else (line[0] if wrap and n > 1 else None)
                out[rank] = (prev, nxt)
        return out


def no_pp(run: Run, source: str = "none") -> Topology:
    ranks = [r.rank for r in run.ranks]
    return Topology(1, {r: 0 for r in ranks}, {r: [0] for r in ranks}, [[r] for r in ranks], source=source)


def _from_lines(lines: list[list[int]], source: str, run: Run) -> Topology:
    stage_of: dict[int, int] = {}
    for line in lines:
        for s, r in enumerate(line):
            stage_of[r] = s
    pp = max(len(line) for line in lines)
    topo = Topology(pp, stage_of, {r: [s] for r, s in stage_of.items()}, lines, source=source)
    _virtual_from_labels(topo, run)
    return topo


def _label_stages(tl: RankTimeline) -> list[int]:
    r = tl.ranges
    m = (r.kind == int(RangeKind.LABEL)) & (r.stage >= 0)
    return sorted({int(x) for x in np.unique(r.stage[m])}) if m.any() else []


def _virtual_from_labels(topo: Topology, run: Run) -> None:
    """Interleaved / V placements show as several stage numbers in one rank's labels."""
    per_rank = {tl.rank: _label_stages(tl) for tl in run.ranks}
    counts = {len(v) for v in per_rank.values() if v}
    if not counts or max(counts) <= 1:
        return
    v = max(counts)
    topo.virtual = v
    for r, st in per_rank.items():
        if st:
            topo.chunks_of[r] = st
    p = topo.pp
    v_shape = all(len(st) == 2 and st[0] + st[1] == 2 * p - 1 for st in per_rank.values() if st)
    topo.placement = "v" if v_shape else "loop"


def _p2p_edges(
    run: Run, ops: dict[int, P2POps] | None = None
) -> tuple[dict[tuple[int, int], int], dict[int, list[tuple[int, int, int]]]]:
    """Directed p2p transfer counts (src -> dst) and, per rank, its first p2p events (time, dir, peer).

    One op source per rank (device kernels when it has them, else host issue ops, see
    :func:`~ppdiag.pipeline.clocks.p2p_ops`), so nothing is counted twice; the peers are the
    overlay's (metadata, else timing).
    """
    edges: dict[tuple[int, int], int] = defaultdict(int)
    events: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    ranks = {tl.rank for tl in run.ranks}
    if ops is None:
        ops = {tl.rank: p2p_ops(tl) for tl in run.ranks}
    for r, o in ops.items():
        m = (o.peer >= 0) & (o.direction > 0)
        t, d, p = o.start[m], o.direction[m], o.peer[m]
        if p.size == 0:
            continue
        # (peer, direction) pairs as one key, in the same order: a 1-D unique is a plain sort, the
        # 2-D one (axis=1) a structured view several times slower; directions are 1..3
        keys, counts = np.unique(p.astype(np.int64) * 4 + d.astype(np.int64), return_counts=True)
        for key, cnt in zip(keys.tolist(), counts.tolist(), strict=True):
            peer, dirn = key >> 2, key & 3
            if peer == r or peer not in ranks:
                continue
            if dirn in (int(Direction.SEND), int(Direction.BOTH)):
                edges[(r, peer)] += cnt
            if dirn in (int(Direction.RECV), int(Direction.BOTH)):
                edges[(peer, r)] += cnt
        order = np.argsort(t, kind="stable")[:64]
        events[r].extend((int(t[i]), int(d[i]), int(p[i])) for i in order)
    return dict(edges), events


def _chain(run: Run, ops: dict[int, P2POps] | None = None, notes: list[str] | None = None) -> Topology | None:
    """Stages from the two-way p2p links when they form chains (or rings); None otherwise, with the
    reason in ``notes`` when p2p was seen but is not a pipeline's."""
    edges, events = _p2p_edges(run, ops)
    if not edges:
        return None
    exchanges = exchange_only(run)
    if exchanges:
        # every transfer both sends and receives at once: grouped send/recv of a collective (an
        # all-to-all of two ranks is one ncclSend and one ncclRecv to the same peer); a pipeline
        # also sends alone (the first activations) and receives alone (the last gradients)
        if notes is not None:
            notes.append(
                f"point-to-point transfers are two-way exchanges only ({exchanges} grouped send+receive "
                "ops, no one-way activation or gradient transfer): a collective built from send/recv "
                "(all-to-all), not a pipeline; no stages are read from them"
            )
        return None
    # Pipeline training sends activations one way and gradients back: both directions per link.
    adj: dict[int, set[int]] = defaultdict(set)
    for a, b in edges:
        if (b, a) in edges:
            adj[a].add(b)
            adj[b].add(a)
    if not adj:
        return None
    comps = _components(adj)
    hubs = sorted(x for x in adj if len(adj[x]) > 2)
    if hubs:
        # a rank with three or more two-way partners: not a chain, so no topology from p2p; say
        # why, or a run whose p2p is not a pipeline's would silently read as pp 1
        if notes is not None:
            x = hubs[0]
            more = f" (and {len(hubs) - 1} more rank(s))" if len(hubs) > 1 else ""
            notes.append(
                f"point-to-point transfers do not form a pipeline chain: rank {x} exchanges data with "
                f"{len(adj[x])} ranks ({', '.join(map(str, sorted(adj[x])[:8]))}){more}; no stages are read "
                "from them (pass --stage-map or --pp if this is a pipeline run)"
            )
        return None
    lines = [_walk(comp, adj, edges, events) for comp in comps if len(comp) > 1]
    if not lines:
        return None
    ring_v = _ring_virtual(lines, edges)
    sizes = {len(x) for x in lines}
    topo = _from_lines(lines, "p2p chain", run)
    _apply_ring(topo, ring_v)
    if len(sizes) > 1:
        topo.warnings.append(f"pipelines of different lengths: {sorted(sizes)}")
    return topo


def exchange_only(run: Run) -> int:
    """The number of p2p ops when every one whose direction the trace gives both sends and receives
    at once (``BOTH``), else 0. Read from the parsed ops, before any timing decision: a stray
    kernel of unknown direction that timing made a send says nothing of the structure."""
    both = one_way = 0
    for tl in run.ranks:
        d = _stated_directions(tl)
        both += int((d == int(Direction.BOTH)).sum())
        one_way += int(((d == int(Direction.SEND)) | (d == int(Direction.RECV))).sum())
    return both if one_way == 0 else 0


def directions_stated(run: Run) -> bool:
    """Whether any p2p op of the parsed traces states its direction (send, receive or both); a
    kernel known only by its name (``SendRecv``) states none, and timing decides it."""
    return any(bool((_stated_directions(tl) > 0).any()) for tl in run.ranks)


def _stated_directions(tl: RankTimeline) -> np.ndarray:
    """The directions the trace gives the rank's p2p ops, the ones p2p_ops reads: its device
    kernels when it has them, else its host p2p ops (gloo, c10d; one way each)."""
    iv = tl.intervals
    m = iv.kind == int(Kind.P2P)
    if m.any() and not tl.cpu_only:
        d: np.ndarray = iv.direction[m]
        return d
    rg = tl.ranges
    h: np.ndarray = rg.direction[(rg.kind == int(RangeKind.COMM_OP)) & (rg.direction > 0)]
    return h


def _components(adj: dict[int, set[int]]) -> list[list[int]]:
    """The connected sets of ranks, each in depth-first order from its lowest rank."""
    seen: set[int] = set()
    comps: list[list[int]] = []
    for start in sorted(adj):
        if start in seen:
            continue
        comp: list[int] = []
        stack = [start]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            comp.append(x)
            stack.extend(adj[x] - seen)
        comps.append(comp)
    return comps


def _walk(
    comp: list[int],
    adj: dict[int, set[int]],
    edges: dict[tuple[int, int], int],
    events: dict[int, list[tuple[int, int, int]]],
) -> list[int]:
    """One chain's ranks in stage order, from the first stage (a line's end, or on a ring the rank
    that sends first) along the direction forward activations flow."""
    ends = [x for x in comp if len(adj[x]) == 1]
    # no two ends: a ring (interleaved placements send from the last stage back to the first)
    first = _first_stage(ends if len(ends) == 2 else sorted(comp), edges, events)
    line = [first]
    prev = None
    cur = first
    while True:
        nxt = sorted(adj[cur] - ({prev} if prev is not None else set()) - set(line))
        if not nxt:
            break
        if len(nxt) > 1:  # ring: follow the direction forward activations flow
            fwd = [n for n in nxt if edges.get((cur, n), 0) >= edges.get((n, cur), 0)]
            nxt = fwd or nxt
        prev, cur = cur, nxt[0]
        line.append(cur)
    return line


def _apply_ring(topo: Topology, ring_v: int) -> None:
    """Interleaved placement without labels: stage s + k*P on rank s, chunks found by counting."""
    if ring_v <= 1 or topo.virtual != 1:
        return
    topo.virtual = ring_v
    topo.placement = "loop"
    topo.ring = True
    p = topo.pp
    for line in topo.pipelines:
        for i, r in enumerate(line):
            topo.chunks_of[r] = [i + k * p for k in range(ring_v)]


def _ring_virtual(lines: list[list[int]], edges: dict[tuple[int, int], int]) -> int:
    """Chunks per rank of a ring: the last rank sends to the first (v-1) times per v times the
    first sends to the second, so v = n(0->1) / (n(0->1) - n(last->0))."""
    vs: list[int] = []
    for line in lines:
        if len(line) < 2:
            continue
        fwd = edges.get((line[0], line[1]), 0)
        back = edges.get((line[-1], line[0]), 0)
        if back == 0 or fwd <= back:
            return 1
        vs.append(round(fwd / (fwd - back)))
    return max(vs) if vs and min(vs) == max(vs) else 1


def _first_stage(
    cands: list[int], edges: dict[tuple[int, int], int], events: dict[int, list[tuple[int, int, int]]]
) -> int:
    """The candidate whose first p2p operation is a send (it produces the first activations)."""
    return min(cands, key=lambda c: (not _sends_first(c, events), c))


def _sends_first(rank: int, events: dict[int, list[tuple[int, int, int]]]) -> bool:
    """Whether the rank's first p2p operation is a send."""
    ev = events.get(rank)
    return ev is not None and len(ev) > 0 and min(ev)[1] == int(Direction.SEND)


def _pp_group(run: Run, notes: list[str], ops: dict[int, P2POps] | None = None) -> Topology | None:
    """Pipelines from a process group that names them (``pg_desc``); the stage order from the
    evidence of direction (:func:`_stage_order`).

    A group claiming more than :data:`~ppdiag.limits.MAX_PP` ranks is no pipeline (it is refused as
    evidence, with a note): the cost stays linear in the traced ranks, whatever the trace lists."""
    lines: dict[tuple[int, ...], list[int]] = {}
    refused: dict[str, int] = {}
    for tl in run.ranks:
        for g in tl.process_groups:
            if not _PP_GROUP.search(g.desc or "") or len(g.ranks) <= 1:
                continue
            if len(g.ranks) > MAX_PP:
                refused[g.name or g.desc] = len(g.ranks)
                continue
            if tl.rank in g.ranks:
                lines[tuple(g.ranks)] = list(g.ranks)
    for name, size in sorted(refused.items()):
        notes.append(
            f"process group {name!r} claims {size} pipeline ranks, more than {MAX_PP} stages: "
            "not used as pipeline evidence"
        )
    if not lines:
        return None
    ordered, how = _stage_order(run, sorted(lines.values()), ops)
    return _from_lines(ordered, f"pipeline process group (stage order from {how})", run)


# what ordered a group's members, weakest first (the weakest over all groups is the one stated)
_ORDER_EVIDENCE = ("listed order", "p2p chain", "labels")


def _stage_order(
    run: Run, groups: list[list[int]], ops: dict[int, P2POps] | None
) -> tuple[list[list[int]], str]:
    """Each pipeline group's ranks in stage order, and what gave it.

    A process group says which ranks form a pipeline, not in which order: torch lists every
    group's ranks sorted. The order comes from the labels that name each member's stage, else
    from the chain of two-way p2p links among the members, walked the way forward activations
    flow; the listed order is the last resort."""
    firsts = {tl.rank: st[0] for tl in run.ranks if (st := _label_stages(tl))}
    edges, events = _p2p_edges(run, ops)
    out: list[list[int]] = []
    weakest = len(_ORDER_EVIDENCE) - 1
    for g in groups:
        if all(r in firsts for r in g) and len({firsts[r] for r in g}) == len(g):
            out.append(sorted(g, key=firsts.__getitem__))
            continue
        chain = _member_chain(g, edges, events)
        out.append(chain if chain is not None else g)
        weakest = min(weakest, 1 if chain is not None else 0)
    return out, _ORDER_EVIDENCE[weakest]


def _member_chain(
    members: list[int], edges: dict[tuple[int, int], int], events: dict[int, list[tuple[int, int, int]]]
) -> list[int] | None:
    """``members`` in the order of the path (or ring) their two-way p2p links form, from the first
    stage; None when those links do not connect every member in one path or ring. When no end
    sends first (the direction is a tie), the listed order orients the path."""
    inside = set(members)
    adj: dict[int, set[int]] = {r: set() for r in members}
    for a, b in edges:
        if a in inside and b in inside and (b, a) in edges:
            adj[a].add(b)
    if any(not 1 <= len(n) <= 2 for n in adj.values()) or len(_components(adj)) != 1:
        return None
    ends = [r for r in members if len(adj[r]) == 1]
    if len(ends) not in (0, 2):
        return None
    line = _walk(members, adj, edges, events)
    if len(line) != len(members):
        return None
    if ends and _sends_first(line[0], events) == _sends_first(line[-1], events):
        pos = {r: i for i, r in enumerate(members)}
        line = line if pos[line[0]] < pos[line[-1]] else line[::-1]
    return line


def _labels(run: Run) -> Topology | None:
    per_rank = {tl.rank: _label_stages(tl) for tl in run.ranks}
    if sum(1 for v in per_rank.values() if v) < 2:
        return None
    firsts = {r: st[0] for r, st in per_rank.items() if st}
    order = sorted(firsts, key=lambda r: firsts[r])
    if len(set(firsts.values())) != len(firsts):
        return None
    return _from_lines([order], "pipeline labels", run)


def parse_stage_map(spec: str) -> list[list[int]]:
    """``--stage-map 0,1,2,3`` (rank per stage); ``;`` separates pipelines of a data-parallel run."""
    lines = []
    try:
        for part in spec.split(";"):
            part = part.strip()
            if part:
                lines.append([int(x) for x in part.split(",") if x.strip()])
    except ValueError:
        raise InputError(
            None, f"--stage-map {spec!r}: expected ranks like 0,1,2,3 (';' between pipelines)"
        ) from None
    flat = [r for line in lines for r in line]
    if not lines or not flat:
        raise InputError(None, "--stage-map is empty")
    if len(set(flat)) != len(flat):
        raise InputError(None, f"--stage-map {spec!r}: a rank appears twice")
    return lines


def pp_disagreement(pp: int, topo: Topology) -> str:
    """The warning when ``--pp`` differs from the stages the trace shows (the trace's are used)."""
    return (
        f"--pp {pp} disagrees with the trace ({topo.source}: {topo.pp} stages); the "
        f"trace's {topo.pp} stages are used (--pp only places ranks in a trace that shows "
        "no pipeline; pass --stage-map to force a placement)"
    )


def infer_topology(
    run: Run, stage_map: str | None = None, pp: int | None = None, ops: dict[int, P2POps] | None = None
) -> Topology:
    """Decide the stage placement of the run (see the module docstring for the order of evidence)."""
    ranks = sorted(tl.rank for tl in run.ranks)
    if stage_map:
        lines = parse_stage_map(stage_map)
        topo = _from_lines(lines, "--stage-map", run)
        missing = sorted(set(ranks) - set(topo.stage_of))
        if missing:
            topo.warnings.append(f"ranks {missing} are not in --stage-map; treated as stage 0")
            for r in missing:
                topo.stage_of[r] = 0
                topo.chunks_of[r] = [0]
        return topo
    notes: list[str] = []  # what a finder refused: said whichever evidence wins
    finders: tuple[Callable[[Run], Topology | None], ...] = (
        lambda r: _pp_group(r, notes, ops),
        _labels,
        lambda r: _chain(r, ops, notes),
    )
    for finder in finders:
        found = finder(run)
        if found is not None and found.pp > 1:
            topo = found
            topo.warnings[:0] = notes
            if topo.virtual == 1 and topo.source != "p2p chain":
                _apply_ring(topo, _ring_virtual(topo.pipelines, _p2p_edges(run, ops)[0]))
            if pp and topo.pp != pp:
                # the trace's placement wins: a stage count its links contradict cannot place ranks
                # without a rank map (--stage-map is that override, and it is used)
                topo.warnings.append(pp_disagreement(pp, topo))
            return topo
    if pp and pp > 1:
        world = max(run.world_size, len(ranks))
        per = max(world // pp, 1)
        # Megatron's default order: tensor- and data-parallel ranks vary fastest, the stage slowest.
        lines_d: dict[int, list[int]] = defaultdict(list)
        for r in ranks:
            lines_d[r % per].append(r)
        lines = [sorted(v, key=lambda x: x // per) for v in lines_d.values()]
        topo = _from_lines(lines, "--pp", run)
        topo.warnings[:0] = notes
        return topo
    topo = no_pp(run)
    topo.warnings.extend(notes)
    return topo
