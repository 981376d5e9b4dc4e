"""A pipeline process group that lists far more ranks than a pipeline has: bounded and linear."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import TEST_DATA

from ppdiag.limits import MAX_PP
from ppdiag.parsers.loader import load_run
from ppdiag.pipeline.topology import infer_topology


def _run_with_group(tmp_path: Path, n: int, desc: str = "PIPELINE_MODEL_PARALLEL_GROUP") -> Path:
    d = json.loads((TEST_DATA / "gpu_pp_rank0.json").read_text())
    d["distributedInfo"]["pg_config"].append({"pg_name": "9", "pg_desc": desc, "ranks": list(range(n))})
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(d, separators=(",", ":")))
    return p


def test_million_rank_group_is_refused_as_pipeline_evidence(tmp_path: Path) -> None:
    p = _run_with_group(tmp_path, 10**6)
    run = load_run([str(p)], jobs=1, progress=False)
    assert len(run.ranks[0].process_groups[-1].ranks) == 10**6  # the parser keeps what the trace says
    t0 = time.perf_counter()
    topo = infer_topology(run)
    took = time.perf_counter() - t0
    assert topo.pp == 1 and topo.source != "pipeline process group"
    assert any("claims 1000000 pipeline ranks" in w for w in topo.warnings)
    # linear in the traced ranks: one rank's topology, the ~10^6 listed ranks scanned a few times
    ref = time.perf_counter()
    sum(1 for r in run.ranks[0].process_groups[-1].ranks if r < 0)
    scan = time.perf_counter() - ref
    assert took < 20 * scan + 0.5


def test_group_at_the_bound_is_still_a_pipeline(tmp_path: Path) -> None:
    # MAX_PP ranks are accepted (the stage count the trace claims), one more is refused
    run = load_run([str(_run_with_group(tmp_path, MAX_PP))], jobs=1, progress=False)
    topo = infer_topology(run)
    assert topo.source.startswith("pipeline process group") and topo.pp == MAX_PP
    run = load_run([str(_run_with_group(tmp_path, MAX_PP + 1))], jobs=1, progress=False)
    topo = infer_topology(run)
    assert topo.pp == 1 and any(f"claims {MAX_PP + 1} pipeline ranks" in w for w in topo.warnings)


def test_p2p_that_is_not_a_chain_says_why() -> None:
    """Rank 0 exchanges data both ways with ranks 1, 2 and 3 (a parameter server, or all-to-all by
    p2p): no pipeline chain, and the reason is kept instead of a silent pp 1."""
    from types import SimpleNamespace

    import numpy as np

    from ppdiag.model import Direction
    from ppdiag.pipeline.clocks import P2POps
    from ppdiag.pipeline.topology import _chain

    def ops(peers: list[int], dirs: list[int]) -> P2POps:
        n = len(peers)
        t = np.arange(n, dtype=np.int64) * 1000
        return P2POps(t, t + 500, np.asarray(peers, np.int32), np.asarray(dirs, np.int8), device=True)

    s, r = int(Direction.SEND), int(Direction.RECV)
    by_rank = {0: ops([1, 1, 2, 2, 3, 3], [s, r, s, r, s, r])} | {k: ops([0, 0], [r, s]) for k in (1, 2, 3)}
    from ppdiag.model.timeline import Intervals, Ranges

    # a stand-in for the run: the chain reads its ranks' numbers and their parsed p2p (none here:
    # the ops above are the ones given)
    run = SimpleNamespace(
        ranks=[
            SimpleNamespace(rank=k, intervals=Intervals.empty(), ranges=Ranges.empty(), cpu_only=False)
            for k in range(4)
        ]
    )
    notes: list[str] = []
    assert _chain(run, by_rank, notes) is None  # type: ignore[arg-type]
    assert len(notes) == 1 and "rank 0 exchanges data with 3 ranks (1, 2, 3)" in notes[0]
