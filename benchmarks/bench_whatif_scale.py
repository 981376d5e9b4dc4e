"""What-if at scale: the simulator's cost per block as the pipeline grows, and a run whose pipeline
process group lists thousands of ranks of which two were traced.

* ``simulate``: one 1F1B step at P = ``--small`` and P = ``--large`` stages (M = 4); the time per
  block at both sizes and their ratio (about 1 when the simulator is linear in the blocks);
* ``listed``: ``diagnose`` of a 2-stage synthetic run whose ``PIPELINE_MODEL_PARALLEL_GROUP`` lists
  ``--large`` ranks: the what-if refuses to simulate a pipeline the trace shows 2 stages of, so the
  analysis costs what the two traced ranks cost; ``--unbounded`` lifts that bound to time the linear
  what-if on the listed size (every unseen stage at the traced mean).

    python benchmarks/bench_whatif_scale.py
    python benchmarks/bench_whatif_scale.py --large 3000 --unbounded
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ppdiag.api import diagnose  # noqa: E402
from ppdiag.simulate import SimConfig, simulate  # noqa: E402
from ppdiag.whatif import costs  # noqa: E402
from ppsynth.kineto import write_kineto  # noqa: E402
from ppsynth.scenario import make_scenario  # noqa: E402


def _per_block(pp: int) -> float:
    cfg = SimConfig("1f1b", pp, 4, fwd_ns=[1.0 + s % 7 for s in range(pp)], bwd_ns=2.0, p2p_ns=0.3)
    simulate(cfg)  # the block orders are cached after the first call
    t0 = time.perf_counter()
    res = simulate(cfg)
    return (time.perf_counter() - t0) / len(res)


def _listed(n: int) -> tuple[float, int]:
    d = Path(tempfile.mkdtemp(prefix="ppdiag-bench-"))
    write_kineto(make_scenario(pp=2, microbatches=4, steps=2), d, gzip=False, groundtruth=False)
    for p in d.glob("*.pt.trace.json"):
        t = json.loads(p.read_text())
        for g in t["distributedInfo"]["pg_config"]:
            if g["pg_desc"] == "PIPELINE_MODEL_PARALLEL_GROUP":
                g["ranks"] = list(range(n))
        p.write_text(json.dumps(t))
    t0 = time.perf_counter()
    diag = diagnose([d])
    return time.perf_counter() - t0, len(diag.result.whatif or [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=500)
    ap.add_argument("--large", type=int, default=3000)
    ap.add_argument("--unbounded", action="store_true", help="lift the what-if's trace-coverage bound")
    a = ap.parse_args()
    small, large = _per_block(a.small), _per_block(a.large)
    print(f"simulate: {small * 1e6:.1f} us/block at P={a.small}, {large * 1e6:.1f} us/block at P={a.large}")
    print(f"simulate: per-block ratio large/small = {large / small:.2f} (1 = linear)")
    took, rows = _listed(a.large)
    print(f"listed {a.large} / traced 2: diagnose {took:.2f} s, {rows} what-if rows")
    if a.unbounded:
        costs._check_coverage = lambda seen, n_st: None
        took, rows = _listed(a.large)
        print(f"listed {a.large} / traced 2, unbounded what-if: diagnose {took:.2f} s, {rows} what-if rows")


if __name__ == "__main__":
    main()
