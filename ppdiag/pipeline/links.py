"""Achieved bandwidth of every pipeline link (sender -> receiver), and where its ranks run.

A matched send and receive move the payload while both are posted: from the later of the two
starts to the earlier end (before that the first one waits for its partner), so payload bytes over
that time is the bandwidth the link achieved, without the wait. On a link the k-th send meets the
k-th receive; links whose counts differ (lost events, a cut trace) are left out. Hosts come from
the trace (Kineto ``host_name``; the ``<host>_<pid>`` worker names of ``tensorboard_trace_handler``
files); a link is intra-node when both ranks share a host.

Link classes, with the per-direction figures their vendors publish (GB/s = 1e9 B/s), as the
reference a measured link is compared with:

* NVLink 4 (H100): 450 GB/s per direction (900 GB/s bidirectional, NVIDIA H100 datasheet).
* PCIe Gen4 x16: 32 GB/s per direction (PCI-SIG, 16 GT/s x 16 lanes, 128b/130b).
* InfiniBand NDR / RoCE 400G: 50 GB/s per port (400 Gb/s); HDR 200 Gb/s: 25 GB/s.
* TCP sockets over Ethernet (NCCL's NET/Socket fallback): 1.25-3 GB/s on 10-25 GbE.

An inter-node link below :data:`TCP_SUSPECT_GBPS` is slower than any RDMA class: NCCL likely fell
back to sockets (check ``NCCL_DEBUG=INFO`` for ``NET/Socket`` vs ``NET/IB``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ppdiag.model import Direction, RankTimeline, Run
from ppdiag.pipeline.clocks import P2POps
from ppdiag.report_types import LinkRow

#: The most ranks one node can hold in a ``--hosts`` spec (a bound on what the user may state).
MAX_RANKS_PER_NODE = 4096

LINK_CLASSES_GBPS: dict[str, float] = {"nvlink": 450.0, "pcie": 32.0, "infiniband": 50.0, "tcp": 3.0}
#: Below this, an inter-node link is no RDMA link: TCP fallback suspected.
TCP_SUSPECT_GBPS = 5.0
_WORKER = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json")


@dataclass(frozen=True)
class HostSpec:
    """Where the ranks run, as the user states it (``--hosts``), over what the traces say.

    ``per_node``: ranks ``0..N-1`` on node ``node0``, ``N..2N-1`` on ``node1`` and so on (the
    launchers' default placement); ``named``: rank -> host for the ranks listed explicitly.
    """

    per_node: int | None = None
    named: Mapping[int, str] = field(default_factory=dict)

    def host(self, rank: int) -> str | None:
        """The stated host of ``rank``, or None when the spec does not place it."""
        if rank in self.named:
            return self.named[rank]
        return f"node{rank // self.per_node}" if self.per_node else None


def parse_hosts(spec: str) -> HostSpec:
    """``--hosts``: ``8`` (ranks per node, consecutive) or ``nodeA=0-7,nodeB=8-15`` (a host per rank
    range, ranks given singly or as ``lo-hi``). Raises ValueError with the reason."""
    text = spec.strip()
    if text.isdigit():
        n = int(text)
        if not 1 <= n <= MAX_RANKS_PER_NODE:
            raise ValueError(f"ranks per node must be 1..{MAX_RANKS_PER_NODE}, got {n}")
        return HostSpec(per_node=n)
    named: dict[int, str] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        host, sep, ranks = part.partition("=")
        host = host.strip()
        if not sep or not host:
            raise ValueError(f"{part!r} is not HOST=RANKS (e.g. nodeA=0-7) or a number of ranks per node")
        lo_s, dash, hi_s = ranks.strip().partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()):
            raise ValueError(f"{ranks.strip()!r} is not a rank or a rank range lo-hi")
        lo, hi = int(lo_s), int(hi_s) if dash else int(lo_s)
        if hi < lo or hi - lo >= MAX_RANKS_PER_NODE:
            raise ValueError(f"rank range {lo}-{hi} is empty or longer than {MAX_RANKS_PER_NODE}")
        for r in range(lo, hi + 1):
            if named.setdefault(r, host) != host:
                raise ValueError(f"rank {r} is placed on both {named[r]!r} and {host!r}")
    if not named:
        raise ValueError("no host given")
    return HostSpec(named=named)


def host_of(tl: RankTimeline, spec: HostSpec | None = None) -> str | None:
    """The rank's host: ``--hosts`` when it places the rank, else the trace's ``host_name``
    (Kineto), its node (Nsight Systems ``TARGET_INFO_SYSTEM_ENV`` Hostname, kept hashed), or a
    ``tensorboard_trace_handler`` file name."""
    stated = spec.host(tl.rank) if spec is not None else None
    if stated is not None:
        return stated
    for key in ("host_name", "node"):
        h = tl.meta.get(key)
        if isinstance(h, str) and h:
            return h
    m = _WORKER.match(tl.source.rsplit("/", 1)[-1])
    return m.group("host") if m else None


def _bytes(tl: RankTimeline, o: P2POps, rows: np.ndarray) -> np.ndarray:
    t = tl.intervals if o.table == "intervals" else tl.ranges
    idx = o.index[rows]
    ok = (idx >= 0) & (idx < len(t))
    out = np.full(rows.shape, -1, np.int64)
    out[ok] = t.bytes[idx[ok]]
    return out


def _klass(gbps: float, inter: bool | None) -> str:
    if inter:
        return "tcp" if gbps < TCP_SUSPECT_GBPS else "infiniband"
    if inter is False:
        return "pcie" if gbps <= LINK_CLASSES_GBPS["pcie"] * 1.2 else "nvlink"
    return "unknown"


def link_rows(run: Run, ops: dict[int, P2POps], hosts_spec: HostSpec | None = None) -> list[LinkRow]:
    """Every link with matched transfers that carry their payload size, in (src, dst) order;
    ``hosts_spec`` (``--hosts``) places ranks over what the traces say."""
    tls = run.by_rank()
    hosts = {r: host_of(tl, hosts_spec) for r, tl in tls.items()}
    raw = []
    for src, o in sorted(ops.items()):
        if not len(o.start) or src not in tls:
            continue
        send = (o.direction == int(Direction.SEND)) | (o.direction == int(Direction.BOTH))
        for dst in sorted(set(o.peer[send & (o.peer >= 0)].tolist())):
            q = ops.get(dst)
            if q is None or dst not in tls:
                continue
            si = np.flatnonzero(send & (o.peer == dst))
            recv = (q.direction == int(Direction.RECV)) | (q.direction == int(Direction.BOTH))
            ri = np.flatnonzero(recv & (q.peer == src))
            if len(si) != len(ri) or not len(si):
                continue
            offs, offd = tls[src].clock_offset_ns, tls[dst].clock_offset_ns
            start = np.maximum(o.start[si] + offs, q.start[ri] + offd)
            end = np.minimum(o.end[si] + offs, q.end[ri] + offd)
            b = _bytes(tls[src], o, si)
            ok = (end > start) & (b > 0)
            if not ok.any():
                continue
            dur = (end - start)[ok].astype(np.float64)
            gbps = b[ok] / dur  # bytes per ns = GB/s
            raw.append((src, dst, gbps, b[ok], dur))
    if not raw:
        return []
    run_median = float(np.median([np.median(g) for _, _, g, _, _ in raw]))
    out = []
    for src, dst, g, b, dur in raw:
        hs, hd = hosts.get(src), hosts.get(dst)
        inter = None if hs is None or hd is None else hs != hd
        med = float(np.median(g))
        out.append(
            LinkRow(
                src=src,
                dst=dst,
                transfers=int(g.size),
                bytes_median=float(np.median(b)),
                gbps_median=round(med, 3),
                gbps_p10=round(float(np.percentile(g, 10)), 3),
                gbps_p90=round(float(np.percentile(g, 90)), 3),
                transfer_ms_median=round(float(np.median(dur)) / 1e6, 4),
                src_host=hs,
                dst_host=hd,
                scope="unknown" if inter is None else ("inter-node" if inter else "intra-node"),
                likely_class=_klass(med, inter),
                tcp_fallback_suspected=bool(inter) and med < TCP_SUSPECT_GBPS,
                slow_vs_median=round(run_median / med, 3) if med > 0 else None,
            )
        )
    return out
