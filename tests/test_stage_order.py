"""A pipeline process group says which ranks form a pipeline, not in which order their stages run.

torch lists every group's ranks sorted. A job whose stages run on ranks 2, 0, 3, 1 is written
here as the same synthetic job with its ranks renamed (every rank the profiler states, every
group listed sorted), in Kineto and in nsys, with and without peer metadata: the stage map must
be the job's and the diagnosis the unpermuted run's, ranks renamed.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from ppdiag.api import Options, diagnose
from ppdiag.model import RangeKind, RankTimeline, Run
from ppdiag.model.structure import Confidence, FactSource
from ppdiag.model.timeline import Intervals, ProcessGroup, Ranges
from ppdiag.pipeline.topology import infer_topology
from ppdiag.report_types import Report
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.run import SynthRun
from ppsynth.scenario import make_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablate import ALL_NSYS, COMM_ARGS, NVTX_NAMES, PARAM_COMMS, SHAPES, strip_kineto_dir, strip_nsys_dir
from metamorphic import differences, sig_of

# stage s of the job runs on rank STAGES[s]
STAGES = [2, 0, 3, 1]
PERM = {s: r for s, r in enumerate(STAGES)}  # the unpermuted job's rank s (stage s) -> its new rank
_TITLE = re.compile(r"^(\w+:(?:send|recv)\s+)(\d+)(\s*(?:->|<-)\s*)(\d+)(.*)$", re.DOTALL)


def permute_ranks(run: SynthRun, perm: dict[int, int]) -> SynthRun:
    """The same job with rank r renamed ``perm[r]`` wherever its profiler states a rank (the rank,
    p2p peers, group members listed sorted as torch lists them, ``nccl:send a->b`` titles). One
    replica only: the pipeline group is the world, so a group rank is the global rank."""
    assert run.dp == 1
    lut = np.array([perm[r] for r in range(run.world_size)], np.int32)

    def peers(a: np.ndarray) -> np.ndarray:
        return np.where(a >= 0, lut[np.clip(a, 0, None)], a).astype(a.dtype)

    def title(name: str) -> str:
        m = _TITLE.match(name)
        if not m:
            return name
        return f"{m[1]}{perm[int(m[2])]}{m[3]}{perm[int(m[4])]}{m[5]}"

    ranks = [
        dataclasses.replace(
            rk,
            rank=perm[rk.rank],
            process_groups=[
                ProcessGroup(g.name, g.desc, sorted(perm[x] for x in g.ranks), g.backend)
                for g in rk.process_groups
            ],
            streams=[dataclasses.replace(s, peer=perm.get(s.peer, s.peer)) for s in rk.streams],
            gpu=dataclasses.replace(rk.gpu, peer=peers(rk.gpu.peer)),
            host=dataclasses.replace(rk.host, peer=peers(rk.host.peer)),
        )
        for rk in run.ranks
    ]
    return dataclasses.replace(
        run, names=[title(n) for n in run.names], ranks=sorted(ranks, key=lambda rk: rk.rank)
    )


@pytest.fixture(scope="module")
def job() -> SynthRun:
    return make_scenario("1f1b", pp=4, microbatches=8, faults=[F.SlowStage(1, 1.5)], steps=2, seed=5)


def _write(run: SynthRun, fmt: str, bare: bool, out: Path) -> Path:
    raw = out / "raw"
    if fmt == "kineto":
        write_kineto(run, raw, groundtruth=False)
    else:
        write_nsys(run, raw, per_rank_files=True)
        (raw / "groundtruth.json").unlink(missing_ok=True)
    if not bare:
        return raw
    # the peers gone (comm args, param comms, shapes, emit_nvtx titles; nsys payloads and NCCL
    # ranges); the Kineto process groups stay, so the group still lists its members sorted
    if fmt == "kineto":
        strip_kineto_dir(raw, out / "bare", (SHAPES, COMM_ARGS, PARAM_COMMS, NVTX_NAMES))
    else:
        strip_nsys_dir(raw, out / "bare", ALL_NSYS)
    return out / "bare"


def _diag(path: Path) -> Report:
    return diagnose([path], Options(progress=False, jobs=1)).result


@pytest.mark.parametrize("bare", [False, True], ids=["peers", "no-peers"])
@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_stages_on_permuted_ranks(job: SynthRun, fmt: str, bare: bool, tmp_path: Path) -> None:
    base = _diag(_write(job, fmt, bare, tmp_path / "base"))
    new = _diag(_write(permute_ranks(job, PERM), fmt, bare, tmp_path / "perm"))
    assert base.run.pp == 4 and base.run.stage_map == {str(s): s for s in range(4)}
    assert new.run.stage_map == {str(s): r for s, r in enumerate(STAGES)}
    diff = differences(sig_of(base), sig_of(new), perm=PERM)
    assert not diff, diff
    # the slow stage is named on the rank that runs it
    assert any(f.code == "PP003" and STAGES[1] in f.ranks for f in new.findings), new.findings
    st = new.run.structure
    assert st is not None and st.established
    if fmt == "kineto":
        # the group gave the members, the chain their order
        assert new.run.stage_source == "pipeline process group (stage order from p2p chain)"
        assert st.pp.source == FactSource.PG_NAME and st.stage_map.source == FactSource.P2P_CHAIN
        assert st.stage_map.confidence == (Confidence.MEDIUM if bare else Confidence.HIGH)


def _group_only_run(listed: list[int], labels: list[int] | None) -> Run:
    """Four ranks with a pipeline group listing ``listed`` and no p2p; rank r's one label names
    stage ``labels[r]`` when given."""
    tls = []
    for r in range(4):
        rg = Ranges.empty()
        if labels is not None:
            one = {"start": [0], "end": [10], "kind": [int(RangeKind.LABEL)], "stage": [labels[r]]}
            rg = Ranges.from_columns(1, one)
        pg = [ProcessGroup("1", "PIPELINE_MODEL_PARALLEL_GROUP", listed)]
        tls.append(
            RankTimeline(r, f"r{r}", "kineto", [""], Intervals.empty(), rg, world_size=4, process_groups=pg)
        )
    return Run(tls, "kineto")


def test_group_order_from_labels_else_as_listed() -> None:
    # labels name each member's stage: they order the group, whatever its listing
    topo = infer_topology(_group_only_run([0, 1, 2, 3], [1, 3, 0, 2]))
    assert topo.pipelines == [[2, 0, 3, 1]]
    assert topo.source == "pipeline process group (stage order from labels)"
    # no evidence of direction at all: the listed order, said to be the last resort
    topo = infer_topology(_group_only_run([0, 1, 2, 3], None))
    assert topo.pipelines == [[0, 1, 2, 3]]
    assert topo.source == "pipeline process group (stage order from listed order)"
