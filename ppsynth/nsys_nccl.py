"""NCCL as nsys sees it in a synthetic export: the communicators of every rank (keyed as
PyTorch keys them) and NCCL's own NVTX ranges, with their binary payloads, around every NCCL kernel
launch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ppdiag.model.timeline import Direction, Kind
from ppsynth.nsys_tables import (
    COLL_API,
    NCCL_DOMAIN_ID,
    NVTX_DOMAIN_CREATE,
    SCHEMA_ALLREDUCE,
    SCHEMA_COLL,
    SCHEMA_COMM_INIT,
    SCHEMA_SENDRECV,
    Clock,
    ExportRows,
    comm_hash,
    global_tid,
    nvtx_row,
    payload_blob,
)
from ppsynth.run import SynthRank, SynthRun


@dataclass
class Comm:
    """One NCCL communicator as a rank sees it."""

    id: int
    nranks: int
    local: int  # this rank's rank in the communicator


def first_time(r: SynthRank) -> int:
    """The rank's earliest event (true clock)."""
    vals = [int(a.min()) for a in (r.gpu.start, r.runtime.start, r.host.start) if len(a)]
    return min(vals) if vals else 0


def communicators(run: SynthRun) -> dict[int, dict[tuple[Any, ...], Comm]]:
    """Per rank: the NCCL communicators it uses, keyed like PyTorch keys them."""
    out: dict[int, dict[tuple[Any, ...], Comm]] = {r.rank: {} for r in run.ranks}
    for r in run.ranks:
        g = r.gpu
        comm_rows = np.flatnonzero((g.kind == Kind.P2P) | (g.kind == Kind.COLLECTIVE))
        for i in comm_rows.tolist():
            key, comm = _comm_of(r, int(g.kind[i]), int(g.peer[i]), int(g.group[i]))
            out[r.rank].setdefault(key, comm)
    return out


def _comm_of(r: SynthRank, kind: int, peer: int, group: int) -> tuple[tuple[Any, ...], Comm]:
    if kind == Kind.P2P and peer >= 0:
        # ProcessGroupNCCL: one 2-rank communicator per peer pair, the lower global rank is rank 0.
        lo, hi = min(r.rank, peer), max(r.rank, peer)
        key: tuple[Any, ...] = ("p2p", lo, hi)
        return key, Comm(comm_hash(*key), 2, 0 if r.rank == lo else 1)
    ranks = r.process_groups[group].ranks if 0 <= group < len(r.process_groups) else []
    if not ranks or r.rank not in ranks:
        ranks = list(range(r.world_size))
    key = ("pg", tuple(ranks))
    return key, Comm(comm_hash(*key), len(ranks), ranks.index(r.rank))


def add_nccl(
    f: ExportRows,
    run: SynthRun,
    r: SynthRank,
    clock: Clock,
    comms: dict[tuple[Any, ...], Comm],
    payloads: bool,
    comm_init: bool,
) -> None:
    """NCCL's own NVTX ranges around every NCCL kernel launch, plus communicator creation."""
    g, rt, h = r.gpu, r.runtime, r.host
    comm_rows = np.flatnonzero(((g.kind == Kind.P2P) | (g.kind == Kind.COLLECTIVE)) & (g.correlation >= 0))
    if not len(comm_rows) and not comms:
        return
    s = f.strings
    gpid_main = global_tid(r.pid, r.tid)
    first = clock.one(first_time(r))
    f.nvtx.append(
        nvtx_row(
            first - 2_000_000,
            None,
            gpid_main,
            text="NCCL",
            event_type=NVTX_DOMAIN_CREATE,
            domain=NCCL_DOMAIN_ID,
        )
    )
    if comm_init:
        _add_comm_init(f, r, first - 1_900_000, gpid_main, comms, payloads)
    rt_order = np.argsort(rt.correlation, kind="stable")
    rt_corr = rt.correlation[rt_order]
    rpc = np.flatnonzero(h.name == _name_id(run, "record_param_comms"))
    rpc_ext = h.ext_id[rpc]
    for i in comm_rows.tolist():
        j = int(np.searchsorted(rt_corr, g.correlation[i]))
        if j >= len(rt_corr) or rt_corr[j] != g.correlation[i]:
            continue
        call = int(rt_order[j])
        c_start, c_end, tid = int(rt.start[call]), int(rt.end[call]), int(rt.tid[call])
        lo, hi = c_start - 1_000, c_end + 1_000
        k = np.flatnonzero(rpc_ext == g.ext_id[i]) if g.ext_id[i] >= 0 else np.empty(0, np.int64)
        if len(k):
            # NCCL's API call runs inside PyTorch's record_param_comms op.
            lo = max(lo, int(h.start[rpc[k[0]]]) + 200)
            hi = min(hi, int(h.end[rpc[k[0]]]) - 200)
        _, comm = _comm_of(r, int(g.kind[i]), int(g.peer[i]), int(g.group[i]))
        gtid = global_tid(r.pid, tid)
        nbytes = max(int(g.bytes[i]), 0)
        for text, t0, t1, schema, vals in _api_ranges(run, r, i, comm, lo, hi, nbytes):
            blob = payload_blob(schema, vals) if payloads and schema else None
            f.nvtx.append(
                nvtx_row(
                    clock.one(t0), clock.one(t1), gtid, text_id=s.id(text), domain=NCCL_DOMAIN_ID, blob=blob
                )
            )


def _api_ranges(
    run: SynthRun, r: SynthRank, i: int, comm: Comm, lo: int, hi: int, nbytes: int
) -> list[tuple[str, int, int, int, dict[str, int]]]:
    """The NCCL API ranges (name, start, end, schema, payload) of one NCCL kernel's launch."""
    g = r.gpu
    base = {"NCCL communicator ID": comm.id, "Message size [bytes]": nbytes}
    if int(g.kind[i]) == Kind.P2P:
        peer_local = 1 - comm.local if comm.nranks == 2 else -1
        d = int(g.direction[i])
        ops = {
            Direction.SEND: ["ncclSend"],
            Direction.RECV: ["ncclRecv"],
            Direction.BOTH: ["ncclSend", "ncclRecv"],
        }.get(Direction(d), [])
        if len(ops) == 1:
            return [(ops[0], lo, hi, SCHEMA_SENDRECV, {**base, "Peer rank": peer_local})]
        # A grouped call: ops are queued, the fused kernel is launched inside ncclGroupEnd.
        out: list[tuple[str, int, int, int, dict[str, int]]] = [
            ("ncclGroupStart", lo - 3_000, lo - 2_500, 0, {})
        ]
        for n, op in enumerate(ops):
            out.append(
                (
                    op,
                    lo - 2_400 + 800 * n,
                    lo - 1_900 + 800 * n,
                    SCHEMA_SENDRECV,
                    {**base, "Peer rank": peer_local},
                )
            )
        out.append(("ncclGroupEnd", lo, hi, 0, {}))
        return out
    coll = run.name(int(g.coll[i])).lower()
    api = COLL_API.get(coll)
    if api is None and "all_to_all" in coll.replace("alltoall", "all_to_all"):
        # all-to-all is grouped send/recv with every member
        out = [("ncclGroupStart", lo - 3_000, lo - 2_800, 0, {})]
        t = lo - 2_700
        for p in range(comm.nranks):
            if p == comm.local:
                continue
            for op in ("ncclSend", "ncclRecv"):
                out.append((op, t, t + 50, SCHEMA_SENDRECV, {**base, "Peer rank": p}))
                t += 60
        out.append(("ncclGroupEnd", lo, hi, 0, {}))
        return out
    api = api or "ncclAllReduce"
    schema = SCHEMA_ALLREDUCE if api in ("ncclAllReduce", "ncclReduceScatter", "ncclReduce") else SCHEMA_COLL
    return [(api, lo, hi, schema, {**base, "Reduction operation": 0})]


def _name_id(run: SynthRun, name: str) -> int:
    try:
        return run.names.index(name)
    except ValueError:
        return -2


def _add_comm_init(
    f: ExportRows, r: SynthRank, t: int, gtid: int, comms: dict[tuple[Any, ...], Comm], payloads: bool
) -> None:
    """One ``ncclCommInitRank`` range per communicator, from ``t`` on."""
    s = f.strings
    for comm in comms.values():
        blob = (
            payload_blob(
                SCHEMA_COMM_INIT,
                {
                    "NCCL communicator ID": comm.id,
                    "No. of ranks": comm.nranks,
                    "Rank": comm.local,
                    "CUDA device": r.device_index,
                },
            )
            if payloads
            else None
        )
        f.nvtx.append(
            nvtx_row(
                t,
                t + 150_000,
                gtid,
                text_id=s.id("ncclCommInitRank"),
                domain=NCCL_DOMAIN_ID,
                blob=blob,
            )
        )
        t += 200_000
