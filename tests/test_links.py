"""Per-link bandwidth, hosts and link classes (ppdiag/pipeline/links.py, report ``links[]``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ppdiag.api import Options, diagnose
from ppdiag.report_types import LinkRow
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

# the synthetic activations: 8 Mi bf16 elements = 16 MiB, moved in p2p_ms = 0.05 ms on a normal
# link: 16777216 B / 50000 ns = 335.5 GB/s
NORMAL_GBPS = 16777216 / 50_000


def _links(path: Path, options: Options | None = None) -> list[LinkRow]:
    """The ``links[]`` rows of an analysis of ``path`` (an analysis always writes the section)."""
    rows = diagnose([path], options or Options()).result.links
    assert rows is not None
    return rows


def _with_hosts(paths: list[Path], hosts: dict[int, str]) -> None:
    """Add Kineto's top-level ``host_name`` to each rank's trace (as newer PyTorch writes it)."""
    for p in paths:
        with gzip.open(p, "rt") as fh:
            d = json.load(fh)
        d["host_name"] = hosts[int(d["distributedInfo"]["rank"])]
        with gzip.open(p, "wt") as fh:
            json.dump(d, fh)


def test_one_link_20x_slower(tmp_path: Path) -> None:
    write_kineto(make_scenario(steps=2, faults=[F.SlowLink(1, factor=20.0)]), tmp_path)
    links = {(x.src, x.dst): x for x in _links(tmp_path)}
    assert set(links) == {(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)}
    for key, x in links.items():
        truth = NORMAL_GBPS / 20.0 if key[0] == 1 else NORMAL_GBPS  # rank 1 sends slowly
        assert x.gbps_median == pytest.approx(truth, rel=0.10), key
        assert x.gbps_p10 <= x.gbps_median <= x.gbps_p90
        assert x.slow_vs_median == pytest.approx(20.0 if key[0] == 1 else 1.0, rel=0.10)
        assert x.scope == "unknown"  # no host in the traces


def test_two_hosts_classify_the_links(tmp_path: Path) -> None:
    # ranks 0, 1 on node00 and 2, 3 on node01; the link between the nodes is 100x slower
    # (3.4 GB/s: below any RDMA class -> TCP fallback suspected)
    run = make_scenario(steps=2, faults=[F.SlowLink(1, factor=100.0)])
    paths = write_kineto(run, tmp_path)
    _with_hosts(paths, {0: "node00", 1: "node00", 2: "node01", 3: "node01"})
    links = {(x.src, x.dst): x for x in _links(tmp_path)}
    assert links[(0, 1)].scope == "intra-node" and links[(0, 1)].likely_class == "nvlink"
    cross = links[(1, 2)]
    assert cross.scope == "inter-node" and (cross.src_host, cross.dst_host) == ("node00", "node01")
    assert cross.gbps_median == pytest.approx(NORMAL_GBPS / 100, rel=0.10)
    assert cross.tcp_fallback_suspected and cross.likely_class == "tcp"
    # the other direction is fast: RDMA-class, no suspicion
    assert links[(2, 1)].scope == "inter-node" and not links[(2, 1)].tcp_fallback_suspected


def test_placement_finding_pipeline_across_dp_inside(tmp_path: Path) -> None:
    # PP=2 x DP=2, Megatron order (global rank = pp_rank * dp + dp_rank): stage 0 = ranks 0, 1 on
    # node00, stage 1 = ranks 2, 3 on node01; stage 0 sends 50x slower (the network link)
    run = make_scenario(pp=2, dp=2, steps=2, faults=[F.SlowLink(0, factor=50.0)])
    paths = write_kineto(run, tmp_path)
    _with_hosts(paths, {0: "node00", 1: "node00", 2: "node01", 3: "node01"})
    rep = diagnose([tmp_path], Options()).result
    (f,) = [x for x in rep.findings if x.code == "PP014"]
    assert f.gain_ms is not None and f.gain_ms > 0 and f.evidence.as_dict()["whatif_fix"] == "no_comm_wait"
    assert sorted(f.ranks) == [0, 1, 2, 3]
    # ablation: the same run with every rank on one host has no placement finding
    one = tmp_path / "one"
    paths = write_kineto(run, one)
    _with_hosts(paths, dict.fromkeys(range(4), "node00"))
    assert not [x for x in diagnose([one], Options()).result.findings if x.code == "PP014"]


def test_pp004_names_the_suspected_tcp_link(tmp_path: Path) -> None:
    run = make_scenario(steps=2, faults=[F.SlowLink(1, factor=100.0)])
    paths = write_kineto(run, tmp_path)
    _with_hosts(paths, {0: "node00", 1: "node00", 2: "node01", 3: "node01"})
    rep = diagnose([tmp_path], Options()).result
    (f,) = [x for x in rep.findings if x.code == "PP004"]
    suspected = f.evidence.as_dict()["tcp_fallback_suspected"]
    assert isinstance(suspected, list)
    assert [s.split(":")[0] for s in suspected] == ["1->2"]


def test_hosts_flag_places_ranks_the_traces_do_not(tmp_path: Path) -> None:
    # the same run as test_two_hosts_classify_the_links, without host_name in the traces: --hosts
    # states the placement (2 ranks per node: ranks 0, 1 on node0 and 2, 3 on node1)
    run = make_scenario(steps=2, faults=[F.SlowLink(1, factor=100.0)])
    write_kineto(run, tmp_path)
    for spec in ("2", "a=0-1,b=2-3"):
        links = {(x.src, x.dst): x for x in _links(tmp_path, Options(hosts=spec))}
        assert links[(0, 1)].scope == "intra-node"
        assert links[(1, 2)].scope == "inter-node" and links[(1, 2)].tcp_fallback_suspected
    # ablation: without the flag nothing is known about the hosts
    assert {x.scope for x in _links(tmp_path)} == {"unknown"}


def test_hosts_flag_overrides_the_trace(tmp_path: Path) -> None:
    # the traces say two hosts; the user says one node of 4 ranks: every link is intra-node
    run = make_scenario(steps=2)
    paths = write_kineto(run, tmp_path)
    _with_hosts(paths, {0: "node00", 1: "node00", 2: "node01", 3: "node01"})
    assert {x.scope for x in _links(tmp_path, Options(hosts="4"))} == {"intra-node"}


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("0", "ranks per node"),
        ("a=3-1", "empty"),
        ("a=0-1,b=1-2", "both"),
        ("a", "HOST=RANKS"),
        ("a=x", "rank range"),
        (",", "no host"),
    ],
)
def test_bad_hosts_spec_is_one_clear_error(spec: str, why: str) -> None:
    from ppdiag.pipeline.links import parse_hosts

    with pytest.raises(ValueError, match=why):
        parse_hosts(spec)


def test_bad_hosts_flag_exits_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    write_kineto(make_scenario(steps=1), tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(tmp_path), "--hosts", "a=0-1,b=1-2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2
    assert "--hosts" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_nsys_node_names_the_host() -> None:
    # Nsight Systems exports keep the node (TARGET_INFO_SYSTEM_ENV Hostname, hashed) in meta["node"]
    from types import SimpleNamespace
    from typing import cast

    from ppdiag.model import RankTimeline
    from ppdiag.pipeline.links import HostSpec, host_of

    tl = cast(RankTimeline, SimpleNamespace(rank=3, meta={"node": "3f2a9c"}, source="r3.sqlite"))
    assert host_of(tl) == "3f2a9c"
    assert host_of(tl, HostSpec(per_node=2)) == "node1"  # --hosts wins
    assert host_of(tl, HostSpec(named={0: "a"})) == "3f2a9c"  # a spec that does not place rank 3
