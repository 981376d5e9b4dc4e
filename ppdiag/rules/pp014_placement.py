"""PP014: the pipeline crosses nodes while data parallelism stays inside them."""

from __future__ import annotations

from ppdiag.report_types import Cause, Evidence, FindingRow
from ppdiag.rules import RuleContext, register
from ppdiag.rules.base import faster, finding, fix_gain_ms, r3


class PlacementEvidence(Evidence, frozen=True):
    """PP014's evidence: the inter-node links of the pipeline and where the ranks run."""

    inter_node_links: list[tuple[int, int, float]]  # (src, dst, median GB/s)
    intra_node_gbps_median: float | None
    tcp_fallback_suspected: bool
    hosts: dict[str, str | None]  # rank -> host


class PlacementRule:
    """What it detects:
    Pipeline links (stage s -> s+1) between ranks on different hosts while the data-parallel
    replicas of each stage share a host: the frequent, latency-bound point-to-point traffic of the
    pipeline goes over the network and the once-per-step gradient all-reduce stays on NVLink.

    Why it matters:
    "Across nodes it runs slower than on one node": every micro-batch's activation and gradient
    cross the slowest link of the job, and the stages wait for them (comm_wait).

    How to fix:
    Place the pipeline inside a node and data parallelism across nodes (Megatron: order the ranks
    so that the pipeline group is intra-node, e.g. a rank order with PP fastest; torchrun: map the
    pipeline stages of one replica to the GPUs of one node). The gain is what-if's replay of the
    run with the normal link time on every pipeline link (the `no_comm_wait` row).

    Example:
    PP=2 x DP=2 on two nodes of two GPUs: stage 0 of both replicas on node00, stage 1 on node01;
    the pipeline links run at 3 GB/s, the DP all-reduce at NVLink speed.
    """

    code = "PP014"
    name = "pipeline-placement"
    cause = Cause.COMM_WAIT
    summary = "The pipeline crosses nodes while data parallelism stays inside them."
    evidence = PlacementEvidence

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        links = ctx.report.links or []
        topo = ctx.pipeline.topology
        if topo.pp < 2 or len(topo.pipelines) < 2:
            return []
        cross = [x for x in links if x.scope == "inter-node"]
        if not cross:
            return []
        hosts = {x.src: x.src_host for x in links} | {x.dst: x.dst_host for x in links}
        if not _dp_inside(topo.pipelines, hosts):
            return []
        gain = fix_gain_ms(ctx, "no_comm_wait")
        if not faster(gain):
            return []
        slow = min(cross, key=lambda x: x.gbps_median)
        intra = [x.gbps_median for x in links if x.scope == "intra-node"]
        title = (
            f"the pipeline crosses nodes ({len(cross)} of {len(links)} links, slowest {slow.src}->"
            f"{slow.dst} at {slow.gbps_median:.1f} GB/s) while data parallelism stays inside them"
        )
        evidence = PlacementEvidence(
            inter_node_links=[(x.src, x.dst, x.gbps_median) for x in cross],
            intra_node_gbps_median=r3(sorted(intra)[len(intra) // 2]) if intra else None,
            tcp_fallback_suspected=any(x.tcp_fallback_suspected for x in cross),
            hosts={str(r): h for r, h in sorted(hosts.items())},
        )
        fixes = [
            "place each pipeline inside one node and data parallelism across nodes (rank order with "
            "the pipeline group intra-node)",
            "if the link is meant to be RDMA: NCCL_DEBUG=INFO shows NET/Socket instead of NET/IB on "
            "a TCP fallback (check NCCL_IB_HCA, NCCL_SOCKET_IFNAME)",
        ]
        ranks = sorted({x.src for x in cross} | {x.dst for x in cross})
        return [
            finding(ctx, self.code, self.cause, title, gain, evidence, fixes, [], ranks, fix="no_comm_wait")
        ]


def _dp_inside(pipelines: list[list[int]], hosts: dict[int, str | None]) -> bool:
    """Whether the replicas of every stage (the ranks at one position of every pipeline) share a host."""
    for s in range(len(pipelines[0])):
        members = {hosts.get(line[s]) for line in pipelines if s < len(line)}
        if None in members or len(members) > 1:
            return False
    return True


register(PlacementRule())
