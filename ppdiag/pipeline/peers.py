"""Point-to-point partners decided from pipeline labels and cross-rank timing when the trace
names no peer.

gloo runs recorded with ``torch.profiler`` defaults (no ``record_shapes``), NCCL kernels without
comm args and nsys kernels without NVTX payloads carry a transfer's direction at best, never its
peer. In order (DESIGN.md §4.3):

0. Pipeline labels: a transfer inside torch.distributed.pipelining's ``PP:<s>SEND_F<mb>`` range
   (or next to a labelled block) belongs to stage ``s``; its peer is the rank holding ``s +- 1``.
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
   (eager sends) are placed by the data flow of step 2 instead. Direction-unknown kernels take
   the direction the timing and the per-link balance of activations and gradients give.

Ops nothing places stay unknown and are counted in a warning; ambiguous answers warn and fall
back, never guess silently. Everything is sorting, ``searchsorted`` and histograms per rank pair:
linear in the ops of a pair. The result is an overlay on :class:`~ppdiag.pipeline.clocks.P2POps`
(copies owned by the pipeline layer): the parser's arrays are never written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ppdiag.model import Direction, Kind, Phase, RangeKind, RankTimeline, Run
from ppdiag.pipeline.clocks import P2POps

# how a peer was decided (``P2POps.how``)
HOW_UNKNOWN = 0
HOW_METADATA = 1
HOW_TIMING = 2
HOW_LABELS = 3
HOW_NAMES = {
    HOW_UNKNOWN: "unknown",
    HOW_METADATA: "metadata",
    HOW_TIMING: "timing",
    HOW_LABELS: "pipeline labels",
}

_BIN_NS = 10_000  # histogram bin of the key-time differences
_PEAK_BINS = 5  # a link's peak is searched as the densest run of this many bins
_MIN_LINK_OPS = 2
_MAX_DIFFS_PER_OP = 64  # bounds the work per op when ops are dense in the search window
# a pair this close to a rank's weakest accepted partner in support is a tie that timing cannot
# break (replicas in lockstep); a schedule's echo through several stages stays a few % weaker
_TIE = 0.98
_COLL_SPREAD_NS = 500_000
_REFINED_WINDOW_NS = 500_000  # the second fit's window, on clocks the first fit's links set
_REFINED_UNC_NS = 50_000  # k-th collectives that end further apart are not one collective
_SAME_OP_NS = 50_000  # host ops of one transfer in the intervals and the ranges start this close


@dataclass
class LinkFit:
    """The timing fit of one directed link ``src -> dst``.

    ``shift_ns`` is the peak of ``key(recv on dst) - key(send on src)`` on the coarse common clock,
    ``tol_ns`` the half-width of the peak, ``support`` the sends whose counterpart falls inside it.
    """

    src: int
    dst: int
    shift_ns: int
    tol_ns: int
    support: int
    floor: float  # the count a non-partner would give inside the same width (random coincidences)


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

    def to_json(self) -> dict[str, object]:
        """The ``run.peers`` JSON object (docs/json.md)."""
        return {
            "source": self.source,
            "decided_by_timing": self.decided,
            "decided_by_labels": self.by_labels,
            "undecided": self.undecided,
            "confidence": None if self.confidence is None else round(self.confidence, 3),
            "coarse_clock": self.coarse_method,
            "links": [
                {
                    "src": f.src,
                    "dst": f.dst,
                    "ops": f.support,
                    "shift_us": round(f.shift_ns / 1000.0, 1),
                    "tol_us": round(f.tol_ns / 1000.0, 1),
                }
                for f in sorted(self.links.values(), key=lambda x: (x.src, x.dst))
            ],
        }


def can_send(direction: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    """Ops that may carry a send (a grouped or direction-unknown op may)."""
    return (direction == int(Direction.SEND)) | (direction == int(Direction.BOTH)) | (direction == 0)


def can_recv(direction: npt.NDArray[np.int8]) -> npt.NDArray[np.bool_]:
    """Ops that may carry a receive."""
    return (direction == int(Direction.RECV)) | (direction == int(Direction.BOTH)) | (direction == 0)


@dataclass
class Coarse:
    """Coarse clock offsets (ns to add to each rank's clock) and how far to trust them."""

    offsets: dict[int, int]
    window_ns: int  # the search window for the link fits
    method: str
    uncertainty_ns: int  # the error these offsets may still carry


def coarse_offsets(run: Run) -> tuple[dict[int, int], int, str]:
    """Offsets (ns to add to each rank's clock), the search window they leave, and their method."""
    c = coarse_clock(run)
    return c.offsets, c.window_ns, c.method


def coarse_clock(run: Run) -> Coarse:
    """The coarse offsets: one clock per host, else the collectives, else the step starts."""
    ranks = sorted(tl.rank for tl in run.ranks)
    zero = {r: 0 for r in ranks}
    hosts = {str(tl.meta.get("host_name") or "") for tl in run.ranks}
    if all(tl.cpu_only for tl in run.ranks) and len(hosts) == 1:
        # one host (or no host named: the CPU runs ppdiag sees are single-node): one clock
        return Coarse(zero, 2_000_000, "one host clock", 50_000)
    ends: dict[int, npt.NDArray[np.int64]] = {}
    for tl in run.ranks:
        iv = tl.intervals
        m = iv.kind == int(Kind.COLLECTIVE)
        if m.any() and not tl.cpu_only:
            ends[tl.rank] = np.sort(iv.end[m])
    sizes = {v.size for v in ends.values()}
    if len(ends) == len(ranks) and len(sizes) == 1 and ranks:
        # every rank ran the same number of collectives: the k-th ones end together
        ref = ends[ranks[0]]
        off = {r: int(np.median(ref - ends[r])) for r in ranks}
        spread = max(float(np.max(np.abs((ref - ends[r]) - off[r]))) for r in ranks)
        if spread <= _COLL_SPREAD_NS:
            window = int(min(max(4 * spread, 500_000), 5_000_000))
            return Coarse(off, window, "collectives", int(max(4 * spread, 2 * _BIN_NS)))
        # the k-th collectives do not end together: different groups (data-parallel replicas
        # reduce apart from the pipeline's own all-reduce), which only their group could sort out
    starts: dict[int, dict[int, int]] = {}
    for tl in run.ranks:
        rg = tl.ranges
        m = rg.kind == int(RangeKind.STEP)
        starts[tl.rank] = {int(n): int(s) for n, s in zip(rg.num[m], rg.start[m], strict=True)}
    common = set.intersection(*(set(v) for v in starts.values())) if starts else set()
    if common and ranks:
        nums = sorted(common)
        ref_s = np.array([starts[ranks[0]][n] for n in nums], dtype=np.int64)
        off = {}
        spread = 0.0
        for r in ranks:
            d = ref_s - np.array([starts[r][n] for n in nums], dtype=np.int64)
            off[r] = int(np.median(d))
            spread = max(spread, float(np.max(np.abs(d - off[r]))))
        window = int(min(max(4 * spread, 2_000_000), 20_000_000))
        return Coarse(off, window, "step starts", window)
    return Coarse(zero, 20_000_000, "none", 20_000_000)


def _keys(
    start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], ends_meet: bool, send: bool
) -> npt.NDArray[np.int64]:
    return end if (ends_meet or not send) else start


def _window_diffs(
    s: npt.NDArray[np.int64], r: npt.NDArray[np.int64], lo_ns: int, hi_ns: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """All ``r[j] - s[i]`` within ``[lo_ns, hi_ns]`` (``r`` sorted), with their ``i`` and ``j``."""
    lo = np.searchsorted(r, s + lo_ns, side="left")
    hi = np.searchsorted(r, s + hi_ns, side="right")
    cnt = np.minimum(hi - lo, _MAX_DIFFS_PER_OP)
    total = int(cnt.sum())
    if total == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    i = np.repeat(np.arange(s.size), cnt)
    first = np.cumsum(cnt) - cnt
    j = np.repeat(lo, cnt) + (np.arange(total) - np.repeat(first, cnt))
    return (r[j] - s[i]).astype(np.int64), i.astype(np.int64), j.astype(np.int64)


def fit_link(
    s_key: npt.NDArray[np.int64], r_key: npt.NDArray[np.int64], window_ns: int, min_shift_ns: int
) -> tuple[int, int, int, float] | None:
    """Peak of ``r_key - s_key`` in ``[min_shift_ns, window_ns]`` (keys on the coarse common clock,
    ``r_key`` sorted): (shift, tolerance, support, floor), or None when there is no peak."""
    peaks = fit_peaks(s_key, r_key, window_ns, min_shift_ns, 1)
    return peaks[0] if peaks else None


def fit_peaks(
    s_key: npt.NDArray[np.int64],
    r_key: npt.NDArray[np.int64],
    window_ns: int,
    min_shift_ns: int,
    n_peaks: int = 3,
) -> list[tuple[int, int, int, float]]:
    """The ``n_peaks`` strongest separate peaks of ``r_key - s_key`` (see :func:`fit_link`).

    A schedule's echo can out-vote the real link inside one pair's window (a synthetic run's
    costs repeat exactly), so the runners-up are kept for the cross-pair checks to choose from.
    """
    if s_key.size == 0 or r_key.size == 0:
        return []
    d, i, _ = _window_diffs(s_key, r_key, min_shift_ns, window_ns)
    if d.size < _MIN_LINK_OPS:
        return []
    nb = max(int((window_ns - min_shift_ns) // _BIN_NS) + 1, 1)
    h = np.bincount(((d - min_shift_ns) // _BIN_NS).astype(np.int64), minlength=nb)[:nb]
    run_sum = np.convolve(h, np.ones(_PEAK_BINS, dtype=np.int64), mode="valid") if nb >= _PEAK_BINS else h
    run_sum = run_sum.astype(np.int64)
    out: list[tuple[int, int, int, float]] = []
    for _ in range(n_peaks):
        k = int(np.argmax(run_sum))
        if run_sum[k] < _MIN_LINK_OPS:
            break
        run_sum[max(k - _PEAK_BINS, 0) : k + _PEAK_BINS + 1] = 0  # the next peak lies apart
        lo = min_shift_ns + k * _BIN_NS
        hi = lo + _PEAK_BINS * _BIN_NS
        inside = (d >= lo) & (d < hi)
        if int(inside.sum()) < _MIN_LINK_OPS:
            continue
        center = int(np.median(d[inside]))
        dev = np.abs(d[inside] - center)
        tol = int(max(4 * float(np.median(dev)), 2 * _BIN_NS))
        near = np.abs(d - center) <= tol
        support = int(np.unique(i[near]).size)
        # what a flat floor of differences would put into a window of the same width
        floor = d.size * (2 * tol + 1) / max(window_ns - min_shift_ns, 1)
        out.append((center, tol, support, float(floor)))
    return out


def _nearest(keys: npt.NDArray[np.int64], t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per ``t``, the distance to the nearest of the sorted ``keys`` (int64 max when none)."""
    if keys.size == 0:
        return np.full(t.shape, np.iinfo(np.int64).max, np.int64)
    j = np.searchsorted(keys, t)
    a = np.abs(keys[np.clip(j - 1, 0, keys.size - 1)] - t)
    b = np.abs(keys[np.clip(j, 0, keys.size - 1)] - t)
    return np.minimum(a, b)


def _latest_before(keys: npt.NDArray[np.int64], t: npt.NDArray[np.int64], tol: int) -> npt.NDArray[np.int64]:
    """Per ``t``, ``t - k`` for the latest key ``k <= t + tol`` (int64 max when none)."""
    if keys.size == 0:
        return np.full(t.shape, np.iinfo(np.int64).max, np.int64)
    j = np.searchsorted(keys, t + tol, side="right") - 1
    out = t - keys[np.clip(j, 0, None)]
    return np.where(j >= 0, out, np.iinfo(np.int64).max)


def _earliest_after(keys: npt.NDArray[np.int64], t: npt.NDArray[np.int64], tol: int) -> npt.NDArray[np.int64]:
    """Per ``t``, ``k - t`` for the earliest key ``k >= t - tol`` (int64 max when none)."""
    if keys.size == 0:
        return np.full(t.shape, np.iinfo(np.int64).max, np.int64)
    j = np.searchsorted(keys, t - tol, side="left")
    out = keys[np.clip(j, 0, keys.size - 1)] - t
    return np.where(j < keys.size, out, np.iinfo(np.int64).max)


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


_RECV_SLACK_NS = 1_000_000  # a receive is posted this close before the block that consumes it


def _from_labels(run: Run, ops: dict[int, P2POps]) -> int:
    """Peers of unknown ops from the pipeline stage the trace's labels put them in.

    A transfer inside a labelled comm range (torch.distributed.pipelining's ``PP:<s>SEND_F<mb>``,
    ``PP:<s>RECV_B<mb>``) or, failing that, next to a labelled compute block (a send after the
    block that produced it, a receive before the block that consumes it) belongs to stage ``s``
    and phase F or B: a forward send goes to the rank holding ``s + 1``, a forward receive comes
    from ``s - 1``, and the reverse for the backward. Stages held by no or by several ranks decide
    nothing. Returns the ops decided.
    """
    owner: dict[int, set[int]] = {}
    for tl in run.ranks:
        rg = tl.ranges
        m = (rg.stage >= 0) & np.isin(rg.kind, (int(RangeKind.LABEL), int(RangeKind.COMM_OP)))
        for st in np.unique(rg.stage[m]):
            owner.setdefault(int(st), set()).add(tl.rank)
    if len(owner) < 2:
        return 0
    n_st = max(owner) + 1
    rank_of = np.full(n_st + 2, -1, np.int64)  # index stage + 1 (stage -1 and n_st map to -1)
    for st, rs in owner.items():
        if len(rs) == 1:
            rank_of[st + 1] = next(iter(rs))
    decided = 0
    tls = run.by_rank()
    for r, v in ops.items():
        t_r = tls.get(r)
        unk = np.flatnonzero((v.peer < 0) & (v.direction > 0))
        if t_r is None or unk.size == 0:
            continue
        rg = t_r.ranges
        stage = np.full(unk.size, -1, np.int64)
        phase = np.zeros(unk.size, np.int64)
        send = (v.direction[unk] == int(Direction.SEND)) | (v.direction[unk] == int(Direction.BOTH))
        # 1. labelled comm ranges around the op, of the same direction
        cm = np.flatnonzero((rg.kind == int(RangeKind.COMM_OP)) & (rg.stage >= 0) & (rg.direction > 0))
        if cm.size:
            cm = cm[np.argsort(rg.start[cm], kind="stable")]
            j = np.searchsorted(rg.start[cm], v.start[unk], side="right") - 1
            jc = np.clip(j, 0, None)
            ok = (j >= 0) & (v.start[unk] <= rg.end[cm][jc]) & (rg.direction[cm][jc] == v.direction[unk])
            stage[ok] = rg.stage[cm][jc[ok]]
            phase[ok] = rg.phase[cm][jc[ok]]
        # 2. labelled compute blocks: the producer of a send, the consumer of a receive
        lm = np.flatnonzero(
            (rg.kind == int(RangeKind.LABEL))
            & (rg.stage >= 0)
            & np.isin(rg.phase, (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD)))
        )
        rest = stage < 0
        if lm.size and rest.any():
            by_end = lm[np.argsort(rg.end[lm], kind="stable")]
            by_start = lm[np.argsort(rg.start[lm], kind="stable")]
            js = np.searchsorted(rg.end[by_end], v.start[unk], side="right") - 1
            jr = np.searchsorted(rg.start[by_start], v.end[unk] - _RECV_SLACK_NS, side="left")
            ok_s = rest & send & (js >= 0)
            ok_r = rest & ~send & (jr < by_start.size)
            stage[ok_s] = rg.stage[by_end[js[ok_s]]]
            phase[ok_s] = rg.phase[by_end[js[ok_s]]]
            jr_c = np.clip(jr, 0, max(by_start.size - 1, 0))
            stage[ok_r] = rg.stage[by_start[jr_c[ok_r]]]
            phase[ok_r] = rg.phase[by_start[jr_c[ok_r]]]
        fwd = phase == int(Phase.FWD)
        # forward: send downstream, receive from upstream; backward the reverse
        step = np.where(fwd == send, 1, -1)
        known = (stage >= 0) & (phase > 0)
        tgt = np.where(known, np.clip(stage + step, -1, n_st), -1)
        peer = rank_of[tgt + 1]
        ok = known & (peer >= 0) & (peer != r)
        v.peer[unk[ok]] = peer[ok].astype(np.int32)
        v.how[unk[ok]] = HOW_LABELS
        v.conf[unk[ok]] = 1.0
        decided += int(ok.sum())
    return decided


def _known_source(run: Run) -> str:
    """What named the peers the trace carries: comm metadata (payloads, args, op inputs), the
    profiler's ``nccl:send a->b`` range names (nsys parser's ``meta["p2p_peer_source"]``), or both."""
    named = sum(int(tl.meta.get("p2p_peer_source", {}).get("nvtx name", 0)) for tl in run.ranks)
    meta = sum(int(tl.meta.get("p2p_peer_source", {}).get("metadata", 0)) for tl in run.ranks)
    no_counts = any("p2p_peer_source" not in tl.meta for tl in run.ranks)
    if named and (meta or no_counts):
        return "metadata and nvtx name"
    return "nvtx name" if named else "metadata"


def _decide(run: Run, ops: dict[int, P2POps], lines: list[list[int]] | None) -> PeerDecision:
    o = ops
    unknown = {r: v.peer < 0 for r, v in o.items()}
    n_unknown = sum(int(u.sum()) for u in unknown.values())
    n_known = sum(int((~u).sum()) for u in unknown.values())
    coarse = coarse_clock(run)
    off, window, method = coarse.offsets, coarse.window_ns, coarse.method
    dec = PeerDecision("metadata" if n_known else "none", off, method)
    if n_unknown == 0:
        return dec
    if all(not v.ends_meet for v in o.values() if len(v.start)):
        flow = _decide_by_flow(run, o, off, unknown)
        if flow is not None:
            dec.links, dec.decided, conf, warns = flow
            dec.warnings.extend(warns)
            dec.undecided = sum(int((v.peer < 0).sum()) for v in o.values())
            dec.confidence = conf
            dec.source = "metadata and timing" if n_known else "timing"
            if dec.undecided:
                dec.warnings.append(
                    f"p2p peers: {dec.undecided} of {n_unknown} ops without a peer could not be "
                    "placed by the data flow and stay unmatched"
                )
            return dec
    ranks = sorted(r for r in o if unknown[r].any())
    allowed = _pipeline_neighbours(run, lines)
    all_meet = all(bool(v.ends_meet) for v in o.values() if len(v.start))
    try:
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
                dec.coarse_method = f"{method}, refined on the matched transfers"
    except _Ambiguous as amb:
        dec.undecided = n_unknown
        dec.warnings.append(
            f"p2p peers unknown for {n_unknown} ops and ambiguous by timing ({amb}); not guessed: "
            "give --stage-map, or record the peers (record_shapes=True, NCCL comm args, nsys "
            "--include-blobs)"
        )
        return dec
    send_idx, recv_idx, send_key, recv_key = key_sets
    linked = {x for k in links for x in k}
    if set(ranks) - linked:
        # Some ranks' transfers never end together with a partner's (eager sends, receives that
        # cannot be posted ahead): the data flow may still place them all.
        trial = {r: _copy_ops(v) for r, v in o.items()}
        flow = _decide_by_flow(run, trial, off, unknown)
        if flow is not None and flow[0] and not flow[3] and {x for k in flow[0] for x in k} >= set(ranks):
            for r, v in trial.items():
                o[r].peer[:], o[r].how[:], o[r].conf[:] = v.peer, v.how, v.conf
            dec.links, dec.decided, dec.confidence = flow[0], flow[1], flow[2]
            dec.undecided = sum(int((v.peer < 0).sum()) for v in o.values())
            if dec.undecided:
                dec.warnings.append(
                    f"p2p peers: {dec.undecided} of {n_unknown} ops without a peer could not be "
                    "placed by the data flow and stay unmatched"
                )
            return dec
    dec.links = links
    if not links:
        dec.undecided = n_unknown
        dec.warnings.append(
            f"p2p peers unknown for {n_unknown} ops and no cross-rank timing pattern names them "
            f"(coarse clock: {method}); the pipeline cannot be rebuilt from timing"
        )
        return dec
    # 3. assign each unknown op to its best link
    margins: list[npt.NDArray[np.float64]] = []
    decided = 0
    for r in ranks:
        v = o[r]
        for side in ("send", "recv"):
            idx = send_idx[r] if side == "send" else recv_idx[r]
            keys = send_key[r] if side == "send" else recv_key[r]
            cands = (
                [(b, f) for (a, b), f in links.items() if a == r]
                if side == "send"
                else [(a, f) for (a, b), f in links.items() if b == r]
            )
            if idx.size == 0 or not cands:
                continue
            resid = np.empty((len(cands), idx.size), np.float64)
            for c, (p, lf) in enumerate(cands):
                if v.ends_meet:
                    other = recv_key[p] if side == "send" else send_key[p]
                    t = keys + lf.shift_ns if side == "send" else keys - lf.shift_ns
                    dist = _nearest(other, t).astype(np.float64)
                elif side == "recv":
                    # the latest send of the candidate before this receive ended
                    dist = np.abs(
                        _latest_before(send_key[p], keys, lf.tol_ns).astype(np.float64) - lf.shift_ns
                    )
                else:
                    dist = np.abs(
                        _earliest_after(recv_key[p], keys, lf.tol_ns).astype(np.float64) - lf.shift_ns
                    )
                resid[c] = dist / max(lf.tol_ns, 1)
            best = np.argmin(resid, axis=0)
            b_res = resid[best, np.arange(idx.size)]
            second = np.partition(resid, 1, axis=0)[1] if len(cands) > 1 else np.full(idx.size, np.inf)
            # within the link's tolerance, or the only partner this rank has on that side
            ok = (b_res <= 1.0) | ((len(cands) == 1) & np.isfinite(b_res))
            peers = np.array([p for p, _ in cands], dtype=np.int32)
            v.peer[idx[ok]] = peers[best[ok]]
            v.how[idx[ok]] = HOW_TIMING
            # confidence: how much farther (in link tolerances) the second candidate lies
            conf = np.clip((second - b_res) / 2.0, 0.0, 1.0)
            conf = np.where(b_res <= 1.0, conf, 0.5 * conf)
            v.conf[idx[ok]] = conf[ok].astype(np.float32)
            decided += int(ok.sum())
        _stream_vote(run, r, v)
        sel = v.how == HOW_TIMING
        margins.append(v.conf[sel].astype(np.float64))
    low = sum(int(((v.how == HOW_TIMING) & (v.conf < 0.5)).sum()) for v in o.values())
    if low:
        dec.warnings.append(
            f"p2p peers by timing: {low} ops fit two partners about equally well and were given the "
            "nearer one (low confidence)"
        )
    _directions(run, o, links, off)
    dec.decided = decided
    dec.undecided = sum(int((v.peer < 0).sum()) for v in o.values())
    dec.confidence = float(np.median(np.concatenate(margins))) if margins and decided else None
    dec.source = "metadata and timing" if n_known else "timing"
    if dec.undecided:
        dec.warnings.append(
            f"p2p peers: {dec.undecided} of {n_unknown} ops without a peer fit no link by timing "
            "and stay unmatched"
        )
    return dec


def _fit_pass(
    o: dict[int, P2POps],
    unknown: dict[int, npt.NDArray[np.bool_]],
    ranks: list[int],
    off: dict[int, int],
    window: int,
    unc: int,
    allowed: set[tuple[int, int]] | None,
    all_meet: bool,
) -> tuple[dict[tuple[int, int], LinkFit], tuple[dict[int, npt.NDArray[np.int64]], ...]]:
    """One fit of the links on the clock ``off``: the accepted links and, per rank, the sorted
    indices and keys of its unknown send- and receive-capable ops (raises :class:`_Ambiguous`)."""
    # per rank: sorted keys of its unknown send-capable / receive-capable ops on the coarse clock
    send_idx: dict[int, npt.NDArray[np.int64]] = {}
    recv_idx: dict[int, npt.NDArray[np.int64]] = {}
    send_key: dict[int, npt.NDArray[np.int64]] = {}
    recv_key: dict[int, npt.NDArray[np.int64]] = {}
    for r in ranks:
        v = o[r]
        si = np.flatnonzero(unknown[r] & can_send(v.direction))
        ri = np.flatnonzero(unknown[r] & can_recv(v.direction))
        sk = _keys(v.start, v.end, bool(v.ends_meet), True)[si] + off.get(r, 0)
        rk = _keys(v.start, v.end, bool(v.ends_meet), False)[ri] + off.get(r, 0)
        so, ro = np.argsort(sk, kind="stable"), np.argsort(rk, kind="stable")
        send_idx[r], send_key[r] = si[so], sk[so]
        recv_idx[r], recv_key[r] = ri[ro], rk[ro]
    # link fits per ordered pair
    fits: dict[tuple[int, int], list[LinkFit]] = {}
    for a in ranks:
        if send_key[a].size == 0:
            continue
        ends_meet = o[a].ends_meet
        for b in ranks:
            if b == a or recv_key[b].size == 0 or (allowed is not None and (a, b) not in allowed):
                continue
            # ends meet: the offset is unknown by +-window; else a receive ends after its send began
            lo = -window if ends_meet else -window // 4
            peaks = fit_peaks(send_key[a], recv_key[b], window, lo)
            if peaks:
                fits[(a, b)] = [LinkFit(a, b, *pk) for pk in peaks]
    links = _accept(fits, unc, all_meet)
    return links, (send_idx, recv_idx, send_key, recv_key)


def _link_offsets(links: dict[tuple[int, int], LinkFit], ranks: list[int]) -> dict[int, int]:
    """Clock corrections the accepted links imply (``e_dst - e_src = shift``; the two directions
    of a link averaged), by a walk from the lowest rank of each linked set (0 for unlinked ranks)."""
    adj: dict[int, list[tuple[int, int]]] = {}
    for (a, b), f in links.items():
        g = links.get((b, a))
        shift = (f.shift_ns - g.shift_ns) // 2 if g is not None else f.shift_ns
        adj.setdefault(a, []).append((b, shift))
        adj.setdefault(b, []).append((a, -shift))
    e: dict[int, int] = {}
    for root in ranks:
        if root in e:
            continue
        e[root] = 0
        stack = [root]
        while stack:
            x = stack.pop()
            for y, sh in adj.get(x, []):
                if y not in e:
                    e[y] = e[x] + sh
                    stack.append(y)
    return e


def _pipeline_neighbours(run: Run, given: list[list[int]] | None = None) -> set[tuple[int, int]] | None:
    """Rank pairs next to each other in a pipeline process group the trace describes (``pg_desc``
    naming it, e.g. Megatron's PIPELINE_MODEL_PARALLEL_GROUP) or ``given`` (``--stage-map``), the
    ring's wrap included; None when neither exists.

    With data parallelism every replica runs the same schedule, so timing alone may not tell a
    rank's partner from the same stage of another replica; the group does.
    """
    from ppdiag.pipeline.topology import _PP_GROUP

    lines: set[tuple[int, ...]] = {tuple(x) for x in given or [] if len(x) > 1}
    for tl in run.ranks:
        for g in tl.process_groups:
            if not given and _PP_GROUP.search(g.desc or "") and len(g.ranks) > 1:
                lines.add(tuple(g.ranks))
    if not lines:
        return None
    out: set[tuple[int, int]] = set()
    for line in lines:
        for x, y in zip(line, line[1:] + line[:1], strict=True):
            out.update(((x, y), (y, x)))
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


def _stream_vote(run: Run, rank: int, v: P2POps) -> None:
    """Device ops on one stream talk to one peer (PyTorch keeps a NCCL communicator and stream per
    peer pair): where a stream's confidently placed ops agree (4 of 5 at least), its ambiguous ops
    take that peer. Streams that mix peers (one grouped communicator) change nothing."""
    tl = run.by_rank().get(rank)
    if tl is None or v.table != "intervals" or not v.index.size or (v.index < 0).any():
        return
    stream = tl.intervals.stream[v.index]
    timed = v.how == HOW_TIMING
    sure = timed & (v.conf >= 0.5)
    weak = timed & (v.conf < 0.5)
    if not weak.any():
        return
    for st in np.unique(stream[weak]):
        on = stream == st
        peers, counts = np.unique(v.peer[on & sure], return_counts=True)
        if counts.size == 0 or counts.sum() < 3:
            continue
        k = int(np.argmax(counts))
        if counts[k] >= 0.8 * counts.sum():
            fix = on & weak
            v.peer[fix] = peers[k]
            v.conf[fix] = 0.5


def _accept(
    fits: dict[tuple[int, int], list[LinkFit]], unc: int, ends_meet: bool = True
) -> dict[tuple[int, int], LinkFit]:
    """Links whose peaks stand clear of the floor and agree on one clock per rank.

    A pipeline sends both ways on every link (activations one way, gradients back). Where a send
    and its receive end together, the two directions of a real link peak at opposite shifts (the
    same clock offset seen from either side), while a schedule's periodic echo (a rank's send
    ending as a rank two stages away receives) has a forward and a backward delay of its own: only
    reciprocal pairs of peaks are candidates. The peaks of real links also add up around any
    cycle. Candidates are taken strongest first: those whose shift the coarse clock's own
    uncertainty ``unc`` explains before any other, then by supporting ops, then by the smallest
    shift; a pair joining two ranks already linked is kept only when its shift agrees with the
    offsets the stronger pairs set. A pipeline rank has at most two partners.
    """
    good = {
        k: [f for f in fs if f.support >= _MIN_LINK_OPS and f.support >= 5 * f.floor + 1]
        for k, fs in fits.items()
    }
    pairs: list[tuple[LinkFit, LinkFit]] = []
    for (x, y), fs in good.items():
        gs = good.get((y, x), [])
        if x >= y:
            continue
        for f in fs:
            for g in gs:
                if ends_meet and abs(f.shift_ns + g.shift_ns) > max(f.tol_ns, g.tol_ns, 2 * _BIN_NS):
                    continue
                pairs.append((f, g))
    pairs.sort(key=lambda p: (abs(p[0].shift_ns) > unc, -(p[0].support + p[1].support), abs(p[0].shift_ns)))
    parent: dict[int, int] = {}
    pot: dict[int, int] = {}  # offset of a rank relative to its component's root

    def find(x: int) -> tuple[int, int]:
        if parent.setdefault(x, x) == x:
            pot.setdefault(x, 0)
            return x, 0
        root, p_off = find(parent[x])
        pot[x] = pot[x] + p_off if parent[x] != root else pot[x]
        parent[x] = root
        return root, pot[x]

    out: dict[tuple[int, int], LinkFit] = {}
    degree: dict[int, int] = {}
    weakest: dict[int, tuple[bool, int]] = {}  # per rank: (explained by the coarse clock, support)
    for f, g in pairs:
        if (f.src, f.dst) in out:
            continue
        shift = (f.shift_ns - g.shift_ns) // 2 if ends_meet else f.shift_ns
        ra, ea = find(f.src)
        rb, eb = find(f.dst)
        strength = (abs(f.shift_ns) <= unc, f.support + g.support)
        if degree.get(f.src, 0) >= 2 or degree.get(f.dst, 0) >= 2:
            consistent = ra != rb or abs((eb - ea) - shift) <= max(f.tol_ns, 2 * _BIN_NS)
            full = [x for x in (f.src, f.dst) if degree.get(x, 0) >= 2]
            if consistent and all(
                weakest[x][0] == strength[0] and strength[1] >= _TIE * weakest[x][1] for x in full
            ):
                # as strong as a partner already taken: the timing cannot tell them apart (e.g.
                # data-parallel replicas that run in lockstep)
                raise _Ambiguous(f"ranks {f.src} and {f.dst} fit a link as well as {sorted(full)}'s partners")
            continue
        if ra != rb:
            # e_dst - e_src = shift
            parent[rb] = ra
            pot[rb] = ea + shift - eb
        elif ends_meet and abs((eb - ea) - shift) > max(f.tol_ns, 2 * _BIN_NS):
            continue
        out[(f.src, f.dst)] = f
        out[(g.src, g.dst)] = g
        degree[f.src] = degree.get(f.src, 0) + 1
        degree[f.dst] = degree.get(f.dst, 0) + 1
        for x in (f.src, f.dst):
            if x not in weakest or strength < weakest[x]:
                weakest[x] = strength
    return out


class _Ambiguous(Exception):
    """The timing fits more partners than a pipeline rank can have, equally well."""


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


_FWD, _BWD = 1, 2
_VOTE_OPS = 3  # compute ops around a transfer that vote on its flow


def _flow_class(tl: RankTimeline, v: P2POps, idx: npt.NDArray[np.int64], send: bool) -> npt.NDArray[np.int8]:
    """Per op: forward flow (activations) or backward flow (gradients), 0 when unknown.

    A received tensor is consumed by the compute that follows it, a sent one produced by the
    compute before it: backward (autograd) ops there mean a gradient, other ops an activation.
    Needs phases on the compute (CPU ops carry them; bare kernels may not).
    """
    iv = tl.intervals
    cm = np.flatnonzero((iv.kind == int(Kind.COMPUTE)) & (iv.phase != int(Phase.OPTIM)))
    out = np.zeros(idx.size, np.int8)
    if cm.size == 0 or idx.size == 0:
        return out
    bw_all = np.isin(iv.phase[cm], (int(Phase.BWD), int(Phase.WGRAD)))
    if not bw_all.any():
        return out
    if send:
        order = np.argsort(iv.end[cm], kind="stable")
        t = iv.end[cm][order]
        bw = bw_all[order].astype(np.int64)
        j = np.searchsorted(t, v.start[idx], side="right")  # ops [j-K, j) ended before the send
        lo, hi = np.maximum(j - _VOTE_OPS, 0), j
    else:
        order = np.argsort(iv.start[cm], kind="stable")
        t = iv.start[cm][order]
        bw = bw_all[order].astype(np.int64)
        j = np.searchsorted(t, v.end[idx], side="left")  # ops [j, j+K) started after the receive
        lo, hi = j, np.minimum(j + _VOTE_OPS, t.size)
    cum = np.r_[0, np.cumsum(bw)]
    n = hi - lo
    nb = cum[hi] - cum[lo]
    out[(n > 0) & (2 * nb > n)] = _BWD
    out[(n > 0) & (2 * nb < n)] = _FWD
    out[(n > 0) & (2 * nb == n)] = _BWD if not send else _FWD
    return out


def _step_of(tl: RankTimeline, t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Step number of each time (-1 outside every step)."""
    rg = tl.ranges
    m = rg.kind == int(RangeKind.STEP)
    if not m.any():
        return np.zeros(t.shape, np.int64)
    o = np.argsort(rg.start[m], kind="stable")
    st, en, num = rg.start[m][o], rg.end[m][o], rg.num[m][o]
    j = np.searchsorted(st, t, side="right") - 1
    ok = (j >= 0) & (t < en[np.clip(j, 0, None)])
    return np.where(ok, num[np.clip(j, 0, None)], -1).astype(np.int64)


def _flow_score(
    s_key: npt.NDArray[np.int64],
    s_step: npt.NDArray[np.int64],
    r_key: npt.NDArray[np.int64],
    r_step: npt.NDArray[np.int64],
    tol: int,
) -> tuple[float, float, int]:
    """The k-th send of each step against the k-th receive of the same step: the share that is
    causal (the receive ends after the send began), the median gap, and the pairs compared."""
    gaps: list[npt.NDArray[np.int64]] = []
    for st in np.intersect1d(np.unique(s_step[s_step >= 0]), np.unique(r_step[r_step >= 0])):
        a = s_key[s_step == st]
        b = r_key[r_step == st]
        if a.size != b.size:  # a lost or duplicated event: this step cannot be compared by order
            continue
        gaps.append(b - a)
    if not gaps:
        return 0.0, float("inf"), 0
    g = np.concatenate(gaps)
    return float(np.mean(g >= -tol)), float(np.median(g)), int(g.size)


def _decide_by_flow(
    run: Run, o: dict[int, P2POps], off: dict[int, int], unknown: dict[int, npt.NDArray[np.bool_]]
) -> tuple[dict[tuple[int, int], LinkFit], int, float | None, list[str]] | None:
    """Host ops: split each rank's transfers into forward (activations) and backward (gradient)
    flows, then give each rank the partner whose receives of that flow follow its sends in the
    same order per step, causally and soonest. Each rank has one partner per flow and direction
    in a chain or ring; the forward and backward answers must agree."""
    tls = run.by_rank()
    streams: dict[tuple[int, int, bool], tuple[npt.NDArray[np.int64], ...]] = {}
    for r, v in o.items():
        if r not in tls or not unknown[r].any():
            continue
        for send in (True, False):
            dmask = (v.direction == int(Direction.SEND)) if send else (v.direction == int(Direction.RECV))
            idx = np.flatnonzero(unknown[r] & dmask)
            if idx.size == 0:
                continue
            cls = _flow_class(tls[r], v, idx, send)
            key = (v.start[idx] if send else v.end[idx]).astype(np.int64)
            for c in (_FWD, _BWD):
                sel = idx[cls == c]
                k = key[cls == c]
                order = np.argsort(k, kind="stable")
                sel, k = sel[order], k[order]
                streams[(r, c, send)] = (sel, k + off.get(r, 0), _step_of(tls[r], k))
    if not streams:
        return None
    tol = 2_000_000 // 2  # the gloo spans' own jitter on a loaded host: 1 ms
    partner: dict[tuple[int, int], int] = {}  # (sender, flow) -> receiver
    scores: dict[tuple[int, int], float] = {}
    for (a, c, send), (_, s_key, s_step) in streams.items():
        if not send or s_key.size == 0:
            continue
        best: tuple[float, int, float] | None = None
        for (b, c2, send2), (_, r_key, r_step) in streams.items():
            if send2 or c2 != c or b == a or r_key.size == 0:
                continue
            causal, med, n = _flow_score(s_key, s_step, r_key, r_step, tol)
            if n == 0 or causal < 0.75:
                continue
            if best is None or med < best[0]:
                best = (med, b, causal)
        if best is not None:
            partner[(a, c)] = best[1]
            scores[(a, c)] = best[2]
    if not partner:
        return None
    warnings: list[str] = []
    # forward a -> b must come back as backward b -> a
    for (a, c), b in list(partner.items()):
        if c == _FWD and partner.get((b, _BWD), a) != a:
            warnings.append(
                f"p2p peers by timing: rank {a} sends activations to {b}, but {b} sends gradients "
                f"to {partner[(b, _BWD)]}; these peers are ambiguous"
            )
    receivers: dict[tuple[int, int], list[int]] = {}
    for (a, c), b in partner.items():
        receivers.setdefault((b, c), []).append(a)
    for (b, c), senders in receivers.items():
        if len(senders) > 1:
            warnings.append(
                f"p2p peers by timing: ranks {sorted(senders)} all look like the "
                f"{'forward' if c == _FWD else 'backward'} source of rank {b}; ambiguous"
            )
    if warnings:
        warnings.append("p2p peers left undecided (no pipeline built from timing)")
        return {}, 0, None, warnings
    links: dict[tuple[int, int], LinkFit] = {}
    decided = 0
    confs: list[float] = []
    for (a, c), b in partner.items():
        s_sel = streams[(a, c, True)][0]
        r_sel = streams.get((b, c, False), (np.zeros(0, np.int64),))[0]
        o[a].peer[s_sel] = b
        o[a].how[s_sel] = HOW_TIMING
        o[a].conf[s_sel] = scores[(a, c)]
        o[b].peer[r_sel] = a
        o[b].how[r_sel] = HOW_TIMING
        o[b].conf[r_sel] = scores[(a, c)]
        decided += int(s_sel.size + r_sel.size)
        confs.append(scores[(a, c)])
        f = links.get((a, b))
        n = int(s_sel.size) + (f.support if f else 0)
        links[(a, b)] = LinkFit(a, b, 0, tol, n, 0.0)
    return links, decided, float(np.median(confs)) if confs else None, warnings
