"""p2p partners of host ops from the data flow (step 2 of
:mod:`ppdiag.pipeline.peers`): each transfer is an activation or a gradient by the compute beside
it, and per flow and step the k-th send pairs with the k-th receive of the same flow; each rank's
partner is the one whose receives follow its sends causally and soonest.

Device kernels whose ends meet (a matched send and receive end together) are compared without a
clock: a fused exchange (``ncclDevKernel_SendRecv``, direction BOTH) carries a send of the flow of
the compute before it and a receive of the flow of the compute after it, and a real link carries
both flows, activations one way and gradients back. The k-th forward send of ``a`` ends with the
k-th forward receive of its partner ``b`` and the k-th backward send of ``b`` with the k-th
backward receive of ``a``: the two median gaps are the same clock offset with opposite signs and
add up to about zero, whatever the offset. A rank two stages away adds its compute in both flows
(a positive sum), an upstream rank receives before the send (a negative one).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.model import Kind, Phase, RangeKind, RankTimeline, Run
from ppdiag.pipeline.clocks import P2POps
from ppdiag.pipeline.peer_links import HOW_TIMING, LinkFit, can_recv, can_send

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
    g = _step_gaps(s_key, s_step, r_key, r_step)
    if g.size == 0:
        return 0.0, float("inf"), 0
    return float(np.mean(g >= -tol)), float(np.median(g)), int(g.size)


def _step_gaps(
    s_key: npt.NDArray[np.int64],
    s_step: npt.NDArray[np.int64],
    r_key: npt.NDArray[np.int64],
    r_step: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """``r_key - s_key`` of the k-th send and the k-th receive of each step both ran (keys sorted);
    steps whose counts differ (a lost or duplicated event) cannot be paired by order and are left
    out."""
    gaps: list[npt.NDArray[np.int64]] = [np.zeros(0, np.int64)]
    for st in np.intersect1d(np.unique(s_step[s_step >= 0]), np.unique(r_step[r_step >= 0])):
        a = s_key[s_step == st]
        b = r_key[r_step == st]
        if a.size == b.size:
            gaps.append((b - a).astype(np.int64))
    return np.concatenate(gaps)


# per (rank, flow, sends?): the ops' indices, keys on the coarse clock and step numbers, by key
_Streams = dict[tuple[int, int, bool], tuple[npt.NDArray[np.int64], ...]]
_FLOW_TOL_NS = 2_000_000 // 2  # the gloo spans' own jitter on a loaded host: 1 ms


def _decide_by_flow(
    run: Run,
    o: dict[int, P2POps],
    off: dict[int, int],
    unknown: dict[int, npt.NDArray[np.bool_]],
    candidates: dict[tuple[int, int], set[int]] | None = None,
) -> tuple[dict[tuple[int, int], LinkFit], int, float | None, list[str]] | None:
    """Host ops: split each rank's transfers into forward (activations) and backward (gradient)
    flows, then give each rank the partner whose receives of that flow follow its sends in the
    same order per step, causally and soonest. Each rank has one partner per flow and direction
    in a chain or ring; the forward and backward answers must agree. ``candidates``: per (sender,
    flow) the receivers to compare (all when None or absent)."""
    streams = _flow_streams(run, o, off, unknown)
    if not streams:
        return None
    if all(bool(v.ends_meet) for v in o.values() if len(v.start)):
        partner, scores = _meeting_partners(streams, _FLOW_TOL_NS)
    else:
        partner, scores = _flow_partners(streams, _FLOW_TOL_NS, candidates)
    if not partner:
        return None
    warnings = _flow_conflicts(partner)
    if warnings:
        warnings.append("p2p peers left undecided (no pipeline built from timing)")
        return {}, 0, None, warnings
    links: dict[tuple[int, int], LinkFit] = {}
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
        confs.append(scores[(a, c)])
        f = links.get((a, b))
        n = int(s_sel.size) + (f.support if f else 0)
        links[(a, b)] = LinkFit(a, b, 0, _FLOW_TOL_NS, n, 0.0)
    # a fused exchange is in a send and a receive stream: each op counts once
    decided = sum(int((unknown[r] & (v.peer >= 0)).sum()) for r, v in o.items() if r in unknown)
    return links, decided, float(np.median(confs)) if confs else None, warnings


def _flow_streams(
    run: Run, o: dict[int, P2POps], off: dict[int, int], unknown: dict[int, npt.NDArray[np.bool_]]
) -> _Streams:
    """Each rank's unknown sends and receives split by flow (forward, backward), sorted by key
    (a send's start, or its end where ends meet; a receive's end). A fused exchange (BOTH) is in
    a send stream and a receive stream."""
    tls = run.by_rank()
    streams: _Streams = {}
    for r, v in o.items():
        if r not in tls or not unknown[r].any():
            continue
        known_dir = v.direction > 0  # a direction-unknown op belongs to no flow
        for send in (True, False):
            dmask = (can_send(v.direction) if send else can_recv(v.direction)) & known_dir
            idx = np.flatnonzero(unknown[r] & dmask)
            if idx.size == 0:
                continue
            cls = _flow_class(tls[r], v, idx, send)
            key = (v.start[idx] if send and not v.ends_meet else v.end[idx]).astype(np.int64)
            for c in (_FWD, _BWD):
                sel = idx[cls == c]
                k = key[cls == c]
                order = np.argsort(k, kind="stable")
                sel, k = sel[order], k[order]
                streams[(r, c, send)] = (sel, k + off.get(r, 0), _step_of(tls[r], k))
    return streams


def _flow_partners(
    streams: _Streams, tol: int, candidates: dict[tuple[int, int], set[int]] | None = None
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], float]]:
    """Per (sender, flow): the receiver whose receives of that flow follow the sends causally (3
    in 4 at least) and soonest (median gap), and the share that was causal.

    ``tol`` is the spans' jitter on a host of ordinary load; a busy host delays them more. A sender
    left without a partner is compared again with the jitter this run shows: the spread of the
    gaps on the links already decided (what their k-th receives wait beyond their median)."""
    partner, scores = _partners_within(streams, tol, candidates, {})
    gaps = []
    for (a, c), b in partner.items():
        _, s_key, s_step = streams[(a, c, True)]
        _, r_key, r_step = streams[(b, c, False)]
        gaps.append(_gap_spread(s_key, s_step, r_key, r_step))
    loose = int(max(gaps, default=0.0))
    if loose > tol:
        more, more_scores = _partners_within(streams, loose, candidates, partner)
        partner.update(more)
        scores.update(more_scores)
    return partner, scores


def _gap_spread(
    s_key: npt.NDArray[np.int64],
    s_step: npt.NDArray[np.int64],
    r_key: npt.NDArray[np.int64],
    r_step: npt.NDArray[np.int64],
) -> float:
    """Robust spread (1.4826 MAD) of the k-th send to k-th receive gaps of one link, per step."""
    gaps = [
        r_key[r_step == st] - s_key[s_step == st]
        for st in np.intersect1d(np.unique(s_step[s_step >= 0]), np.unique(r_step[r_step >= 0]))
        if (s_step == st).sum() == (r_step == st).sum()
    ]
    if not gaps:
        return 0.0
    g = np.concatenate(gaps).astype(np.float64)
    return 1.4826 * float(np.median(np.abs(g - np.median(g))))


def _partners_within(
    streams: _Streams,
    tol: int,
    candidates: dict[tuple[int, int], set[int]] | None,
    decided: dict[tuple[int, int], int],
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], float]]:
    """:func:`_flow_partners` at one tolerance, for the senders not in ``decided``."""
    partner: dict[tuple[int, int], int] = {}  # (sender, flow) -> receiver
    scores: dict[tuple[int, int], float] = {}
    # every pair is compared when no candidates narrow it: those of one shape at once
    known = _grouped_scores(streams, tol) if candidates is None else {}
    for (a, c, send), (_, s_key, s_step) in streams.items():
        if not send or s_key.size == 0 or (a, c) in decided:
            continue
        best: tuple[float, int, float] | None = None
        allowed = candidates.get((a, c), set()) if candidates is not None else None
        for (b, c2, send2), (_, r_key, r_step) in streams.items():
            if send2 or c2 != c or b == a or r_key.size == 0 or (allowed is not None and b not in allowed):
                continue
            got = known.get((a, b, c))
            causal, med, n = got if got is not None else _flow_score(s_key, s_step, r_key, r_step, tol)
            if n == 0 or causal < 0.75:
                continue
            if best is None or med < best[0]:
                best = (med, b, causal)
        if best is not None:
            partner[(a, c)] = best[1]
            scores[(a, c)] = best[2]
    return partner, scores


_CHUNK = 1 << 22  # gaps compared in one array (senders x receivers x transfers)


def _grouped_scores(streams: _Streams, tol: int) -> dict[tuple[int, int, int], tuple[float, float, int]]:
    """:func:`_flow_score` of every (sender, receiver, flow) whose streams have the same steps and
    counts per step (then the k-th send meets the k-th receive in one array), without a loop over
    pairs: per such shape, ``receivers - senders`` as one array, senders in chunks."""
    shapes: dict[tuple[int, bytes], tuple[list[int], list[int]]] = {}  # senders, receivers
    keys: dict[tuple[int, int, bool], npt.NDArray[np.int64]] = {}
    for (r, c, send), (_, key, step) in streams.items():
        m = step >= 0
        if not m.any():
            continue
        k, st = key[m], step[m]
        o = np.lexsort((np.arange(k.size), st))  # by step, each step's own order kept
        keys[(r, c, send)] = k[o]
        g = shapes.setdefault((c, st[o].tobytes()), ([], []))
        (g[0] if send else g[1]).append(r)
    out: dict[tuple[int, int, int], tuple[float, float, int]] = {}
    for (c, _), (snd, rcv) in shapes.items():
        if not snd or not rcv:
            continue
        r_mat = np.stack([keys[(b, c, False)] for b in rcv])
        k = r_mat.shape[1]
        step_n = max(_CHUNK // max(len(rcv) * k, 1), 1)
        for i in range(0, len(snd), step_n):
            part = snd[i : i + step_n]
            s_mat = np.stack([keys[(a, c, True)] for a in part])
            gaps = r_mat[None, :, :] - s_mat[:, None, :]
            causal = np.mean(gaps >= -tol, axis=2)
            med = np.median(gaps, axis=2)
            for x, a in enumerate(part):
                for y, b in enumerate(rcv):
                    out[(a, b, c)] = (float(causal[x, y]), float(med[x, y]), k)
    return out


def _meeting_partners(
    streams: _Streams, tol: int
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], float]]:
    """Per (sender, flow), where a matched send and receive end together: the receiver whose
    link adds up to the smallest non-negative delay over both flows (the module docstring), and
    the share of its pairs that are causal on the clock the link implies. No clock is needed: the
    offset cancels in the sum. Two receivers within ``tol`` of each other (replicas in lockstep)
    decide nothing."""
    partner: dict[tuple[int, int], int] = {}
    scores: dict[tuple[int, int], float] = {}
    for (a, c, send), (_, s_key, s_step) in streams.items():
        if not send or s_key.size == 0:
            continue
        back = _BWD if c == _FWD else _FWD
        found: list[tuple[float, int, float]] = []
        for (b, c2, send2), (_, r_key, r_step) in streams.items():
            b_send, a_recv = streams.get((b, back, True)), streams.get((a, back, False))
            if send2 or c2 != c or b == a or b_send is None or a_recv is None:
                continue
            there = _step_gaps(s_key, s_step, r_key, r_step)
            again = _step_gaps(b_send[1], b_send[2], a_recv[1], a_recv[2])
            if there.size == 0 or again.size == 0:
                continue
            total = float(np.median(there) + np.median(again))
            if total >= -2 * tol:
                shift = (float(np.median(there)) - float(np.median(again))) / 2
                found.append((total, b, float(np.mean(there - shift >= -tol))))
        found.sort()
        if found and (len(found) == 1 or found[1][0] - found[0][0] > tol):
            partner[(a, c)] = found[0][1]
            scores[(a, c)] = found[0][2]
    return partner, scores


def _flow_conflicts(partner: dict[tuple[int, int], int]) -> list[str]:
    """Why the partners cannot be a pipeline: a forward link that does not come back as the
    backward one, or several sources of one flow into one rank (empty when they can)."""
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
    return warnings
