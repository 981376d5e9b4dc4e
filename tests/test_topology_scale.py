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
    assert topo.source == "pipeline process group" and topo.pp == MAX_PP
    run = load_run([str(_run_with_group(tmp_path, MAX_PP + 1))], jobs=1, progress=False)
    topo = infer_topology(run)
    assert topo.pp == 1 and any(f"claims {MAX_PP + 1} pipeline ranks" in w for w in topo.warnings)
