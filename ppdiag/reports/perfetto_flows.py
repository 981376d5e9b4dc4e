"""The matched-communication tracks of the Perfetto overlay: p2p sends and receives with an arrow
from every send to its receive, and matched collective instances with an arrow from each
instance's last arriver to every member that waited for it.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

import numpy as np

from ppdiag.analysis import context_of
from ppdiag.reports.perfetto_events import (
    TID_COLL,
    TID_RECVS,
    TID_SENDS,
    Meta,
    Tids,
    emit_slices,
    flow_pair,
    lanes,
    meta_event,
)

if TYPE_CHECKING:
    from ppdiag.analysis import Analyzed


def emit_flows(
    out: IO[str], first: list[bool], meta: Meta, diag: Analyzed, t0: int, tids_by_rank: dict[int, Tids]
) -> tuple[int, int, int]:
    """Matched p2p sends and receives and matched collective instances on their own tracks, with a
    flow arrow from every send to its receive and from each collective's last arriver to every
    member that waited for it. Returns (events, p2p flows, collective flows)."""
    events = 0
    p2p_flows = 0
    coll_flows = 0
    pipe = context_of(diag).pipeline
    pairs = pipe.pairs if pipe is not None else None
    traced = {rt.rank for rt in diag.run.ranks}
    fid = 1
    if pipe is not None and pairs is not None and len(pairs):
        offs = pipe.clocks.offsets
        src = pairs.src.astype(np.int64)
        dst = pairs.dst.astype(np.int64)
        o_s = np.array([offs.get(int(r), 0) for r in src], np.int64)
        o_d = np.array([offs.get(int(r), 0) for r in dst], np.int64)
        ss, se = pairs.send_start + o_s, pairs.send_end + o_s
        rs, re = pairs.recv_start + o_d, pairs.recv_end + o_d
        keep = np.isin(src, list(traced)) & np.isin(dst, list(traced))
        n = int(keep.sum())
        tid_s = np.zeros(len(pairs), np.int64)
        tid_r = np.zeros(len(pairs), np.int64)
        for side, ranks_, a, z, base, label, tid_arr in (
            ("send", src, ss, se, TID_SENDS, "p2p sends (matched)", tid_s),
            ("recv", dst, rs, re, TID_RECVS, "p2p recvs (matched)", tid_r),
        ):
            for r in np.unique(ranks_[keep]).tolist():
                m = keep & (ranks_ == r)
                tids = tids_by_rank.setdefault(r, Tids(meta, r))
                meta(meta_event("thread_name", r, base, {"name": label}))
                meta(meta_event("thread_sort_index", r, base, {"sort_index": 1 if side == "send" else 2}))
                tid_arr[m] = tids.of(base, lanes(a[m], z[m]), label, 1 if side == "send" else 2, device=False)
                idx = np.flatnonzero(m)
                ts = ((a[idx] - t0) / 1000.0).tolist()
                dur = (np.maximum(z[idx] - a[idx], 0) / 1000.0).tolist()
                peer = (dst if side == "send" else src)[idx].tolist()
                args = [f'{{"peer":{p},"pair":{i}}}' for p, i in zip(peer, idx.tolist(), strict=True)]
                events += emit_slices(
                    out,
                    first,
                    r,
                    tid_arr[idx].tolist(),
                    ts,
                    dur,
                    [f'"{side}"'],
                    [0] * len(idx),
                    "p2p_matched",
                    args,
                )
        for i in np.flatnonzero(keep).tolist():
            d_us = max(0.0, (re[i] - rs[i]) / 1000.0)
            flow_pair(
                out,
                first,
                fid,
                (int(src[i]), int(tid_s[i]), (ss[i] - t0) / 1000.0),
                (int(dst[i]), int(tid_r[i]), (re[i] - t0) / 1000.0 - min(0.001, d_us / 2)),
                "p2p",
            )
            fid += 1
        p2p_flows = n
        events += 2 * n
    coll = _collective_flows(out, first, meta, diag, t0, fid, tids_by_rank)
    events += coll[0]
    coll_flows = coll[1]
    return events, p2p_flows, coll_flows


def _collective_flows(
    out: IO[str],
    first: list[bool],
    meta: Meta,
    diag: Analyzed,
    t0: int,
    fid: int,
    tids_by_rank: dict[int, Tids],
) -> tuple[int, int]:
    """Matched collective instances (the pipeline's ``collectives``, the match the attribution
    splits into waits): each member's op on a ``collectives (matched)`` track and an
    arrow from the last member to arrive to every other one (the waiters)."""
    pipe = diag.context.pipeline if diag.context is not None else None
    if not diag.run.ranks or pipe is None:
        return 0, 0
    cm = pipe.collectives  # matched once by the pipeline, as the attribution reads them
    if not len(cm) or not len(cm.rank):
        return 0, 0
    shift = cm.shift if cm.shift is not None else np.zeros(cm.start.shape[0], np.int64)
    st, en = cm.start + shift, cm.end + shift
    rank = cm.rank.astype(np.int64)
    tid_of = np.zeros(rank.shape[0], np.int64)
    events = 0
    for r in np.unique(rank).tolist():
        m = rank == r
        tids = tids_by_rank.setdefault(r, Tids(meta, r))
        meta(meta_event("thread_name", r, TID_COLL, {"name": "collectives (matched)"}))
        meta(meta_event("thread_sort_index", r, TID_COLL, {"sort_index": 3}))
        tid_of[m] = tids.of(TID_COLL, lanes(st[m], en[m]), "collectives (matched)", 3, device=False)
        idx = np.flatnonzero(m)
        events += emit_slices(
            out,
            first,
            r,
            tid_of[idx].tolist(),
            ((st[idx] - t0) / 1000.0).tolist(),
            (np.maximum(en[idx] - st[idx], 0) / 1000.0).tolist(),
            ['"collective"'],
            [0] * len(idx),
            "collective_matched",
            [f'{{"instance":{i}}}' for i in cm.inst[idx].tolist()],
        )
    # per instance (member rows sorted by instance): the last arriver is the latest start
    first_row = cm.first[cm.count >= 2]
    cnt = cm.count[cm.count >= 2]
    flows = 0
    for f0, c in zip(first_row.tolist(), cnt.tolist(), strict=True):
        rows = np.arange(f0, f0 + c)
        last = int(rows[np.argmax(st[rows])])
        for w in rows.tolist():
            if w == last:
                continue
            d_us = max(0.0, (en[w] - st[w]) / 1000.0)
            flow_pair(
                out,
                first,
                fid,
                (int(rank[last]), int(tid_of[last]), (st[last] - t0) / 1000.0),
                (int(rank[w]), int(tid_of[w]), (en[w] - t0) / 1000.0 - min(0.001, d_us / 2)),
                "last arriver",
            )
            fid += 1
            flows += 1
    return events + 2 * flows, flows
