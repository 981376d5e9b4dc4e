"""Run-level NCCL peer resolution for nsys exports: communicator-local and process-group peers
mapped to global ranks once every file of a run is parsed and ranked.

One export maps the peers it can (:mod:`ppdiag.parsers.nsys_rank`); what needs the other files'
communicator memberships or rank numbers is left in ``meta`` (``nccl_pending``,
``nvtx_p2p_pending``) and resolved here by :func:`resolve_nccl_peers`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppdiag.model.timeline import Intervals, Kind, RankTimeline

I64 = npt.NDArray[np.int64]

# How a p2p kernel's peer was decided (``meta["p2p_peer_how"]``, one code per interval).
PEER_NONE, PEER_METADATA, PEER_NVTX_NAME = 0, 1, 2
PEER_HOW_NAMES = {PEER_NONE: "none", PEER_METADATA: "metadata", PEER_NVTX_NAME: "nvtx name"}


def lookup(members: dict[int, int], local: I64) -> I64:
    """Global rank of each communicator-local rank in ``local`` (-1 when not a known member)."""
    if not members:
        return np.full(len(local), -1, dtype=np.int64)
    keys = np.array(sorted(members), dtype=np.int64)
    vals = np.array([members[k] for k in keys.tolist()], dtype=np.int64)
    pos = np.minimum(np.searchsorted(keys, local), len(keys) - 1)
    return np.where(keys[pos] == local, vals[pos], -1)


def peer_source_counts(iv: Intervals, how: npt.NDArray[np.int8]) -> dict[str, int]:
    """``meta["p2p_peer_source"]``: how many p2p kernels got their peer from each source
    (``metadata``: NCCL payloads; ``nvtx name``: PyTorch ``nccl:send a->b`` ranges; ``none``)."""
    p2p = iv.kind == Kind.P2P
    if len(how) != len(iv):
        return {}
    known = p2p & (iv.peer >= 0)
    return {
        PEER_HOW_NAMES[PEER_METADATA]: int((known & (how == PEER_METADATA)).sum()),
        PEER_HOW_NAMES[PEER_NVTX_NAME]: int((known & (how == PEER_NVTX_NAME)).sum()),
        # a peer decided by nothing, or named but never mapped to a global rank
        PEER_HOW_NAMES[PEER_NONE]: int((p2p & ~known).sum()),
    }


def _group_stride(triples: I64, ranks: set[int]) -> tuple[int | None, str]:
    """Map PyTorch's process-group ranks to global ranks: (stride, how) or (None, why not).

    ``triples`` holds distinct (global rank, own group rank, peer group rank) columns. Groups of
    a regular layout hold ranks ``base + i * stride`` (stride 1: consecutive ranks, as a world or
    node-local group; larger: Megatron-style pipeline groups), so the peer's global rank is
    ``rank + (peer - own) * stride``. A stride is accepted when every op's peer is then a traced
    rank that names this rank back (its own group rank and peer swapped); when every process's
    group rank equals its global rank the group is the world (stride 1) even without that check.
    """
    r, g, h = triples
    if (r == g).all():
        return 1, "group ranks equal global ranks"
    moving = h != g
    if not moving.any():
        return None, "every op names its own rank as the peer"
    # Keys of (rank, own, peer) for membership tests; the mirror of (r, g, h) is (t, h, g).
    span = int(max(int(triples.max()), max(ranks, default=0))) + 1
    known = np.unique((r * span + g) * span + h)
    rank_arr = np.array(sorted(ranks), dtype=np.int64)
    # Candidate strides come from the first moving op: the ranks that name it back.
    i0 = int(np.flatnonzero(moving)[0])
    back = r[(g == h[i0]) & (h == g[i0])]
    step = int(h[i0] - g[i0])
    cands = sorted({int(d) // step for d in (back - r[i0]).tolist() if d and d % step == 0 and d // step > 0})
    fits: list[int] = []
    for stride in cands:
        tgt = r + (h - g) * stride
        in_run = np.isin(tgt, rank_arr)
        mirrored = np.isin((tgt * span + h) * span + g, known)
        if (in_run & mirrored).all():
            fits.append(stride)
    if len(fits) == 1:
        return fits[0], f"group ranks map to global ranks with stride {fits[0]}"
    if not fits:
        return None, "no regular group layout fits every send and its matching receive"
    return None, f"several group layouts fit (strides {fits})"


def _resolve_named_peers(ranks: list[RankTimeline]) -> list[str]:
    """Global peers for the PyTorch-named p2p ops (``meta["nvtx_p2p_pending"]``)."""
    pend = [(tl, tl.meta.pop("nvtx_p2p_pending", None)) for tl in ranks]
    pend = [(tl, p) for tl, p in pend if p]
    if not pend:
        return []
    cols = [
        np.stack([np.full(len(v["me"]), tl.rank, dtype=np.int64), v["me"], v["peer"]])
        for tl, p in pend
        for v in p.values()
        if len(v["me"])
    ]
    triples = np.unique(np.concatenate(cols, axis=1), axis=1)
    stride, how = _group_stride(triples, {tl.rank for tl in ranks})
    if stride is None:
        n = sum(len(p.get("interval", {}).get("index", ())) for _, p in pend)
        for tl, p in pend:
            tl.meta["nvtx_p2p_pending"] = p  # kept: a later call with more ranks may map them
        return [
            f"{n} p2p kernel(s) name their peers by process-group rank (PyTorch 'nccl:send a->b') "
            f"and the group's global ranks are unknown ({how}); their peers stay unknown"
        ]
    for tl, p in pend:
        for table, rows in (("interval", tl.intervals), ("range", tl.ranges)):
            v = p.get(table)
            if not v:
                continue
            idx = v["index"]
            ok = idx < len(rows)
            glob = tl.rank + (v["peer"] - v["me"]) * stride
            rows.peer[idx[ok]] = glob[ok].astype(rows.peer.dtype)
        how_arr = tl.meta.get("p2p_peer_how")
        if how_arr is not None:
            tl.meta["p2p_peer_source"] = peer_source_counts(tl.intervals, how_arr)
    return []


def resolve_nccl_peers(ranks: list[RankTimeline]) -> list[str]:
    """Map communicator-local NCCL peers to global ranks across the files of one run.

    Each nsys rank records which communicators it belongs to and its local rank there
    (``meta["nccl_comms"]``); intervals and ranges whose peer could not be mapped from their own file
    are listed in ``meta["nccl_pending"]``. Peers named only by PyTorch's ``nccl:send a->b`` ranges
    (process-group ranks, ``meta["nvtx_p2p_pending"]``) are mapped to global ranks here too
    (:func:`_group_stride`), and ``meta["p2p_peer_source"]`` is brought up to date. Call once after
    parsing and rank resolution, before anything reorders the tables; calling it again is
    harmless. Returns run-level warnings.
    """
    members: dict[str, dict[int, int]] = {}
    for tl in ranks:
        for comm, info in (tl.meta.get("nccl_comms") or {}).items():
            members.setdefault(comm, {})[int(info["rank"])] = tl.rank
    unresolved = 0
    for tl in ranks:
        # Communicators' members, for every rank: one whose p2p peers needed no mapping (or whose
        # p2p payloads are missing) still holds collectives on communicators made in other files.
        for pg in tl.process_groups:
            key = pg.name.removeprefix("nccl:")
            mem = members.get(key)
            if pg.backend == "nccl" and mem and not pg.ranks and sorted(mem) == list(range(len(mem))):
                pg.ranks = [mem[i] for i in range(len(mem))]
        pend = tl.meta.pop("nccl_pending", None)
        if not pend:
            continue
        for table, rows in (("interval", tl.intervals), ("range", tl.ranges)):
            p = pend.get(table)
            if not p:
                continue
            idx, comm, local = p["index"], p["comm"], p["local"]
            for c in np.unique(comm).tolist():
                m = comm == c
                g = lookup(members.get(f"{c & 0xFFFFFFFFFFFFFFFF:016x}", {}), local[m])
                ok = (g >= 0) & (idx[m] < len(rows))
                rows.peer[idx[m][ok]] = g[ok]
                unresolved += int((~ok).sum())
    out = _resolve_named_peers(ranks)
    for tl in ranks:
        how_arr = tl.meta.get("p2p_peer_how")
        if how_arr is not None:
            tl.meta["p2p_peer_source"] = peer_source_counts(tl.intervals, how_arr)
    if unresolved:
        out.insert(
            0,
            f"{unresolved} NCCL p2p operation(s) keep an unknown peer: their communicator's other "
            "members are not among the parsed files",
        )
    return out
