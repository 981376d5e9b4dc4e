"""p2p partner decision benchmark: time of the timing-based matching against the number of ops.

Simulates a 1F1B pipeline run (:mod:`ppsynth`, GPU-shaped Kineto traces), strips every peer
source from it (comm args on kernels, ``record_param_comms``, process groups, ``nccl:send a->b``
annotations: ``tests/ablate.py``), parses it once, then times, best of ``--repeat``:

* ``decide``: :func:`ppdiag.pipeline.peers.decide_peers` (coarse clock, link fits over every rank
  pair, per-op assignment, directions);
* ``pair``: :func:`ppdiag.pipeline.clocks.match_pairs` on the decided peers.

It does this for each ``--microbatches`` value at the given ``--pp`` and prints the time per op:
linear matching keeps it flat as M (ops per rank pair) grows. The rank pairs themselves grow as
P², each a few vectorized numpy calls. Default: 64 ranks x M = 8, 16, 32 x 3 steps (building the
traces takes about a minute per size; ``--pp 16`` for a quick run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from ablate import ALL_KINETO, strip_kineto_dir  # noqa: E402

from ppdiag.parsers.loader import load_run  # noqa: E402
from ppdiag.pipeline.clocks import match_pairs, p2p_ops  # noqa: E402
from ppdiag.pipeline.peers import decide_peers  # noqa: E402
from ppsynth.kineto import write_kineto  # noqa: E402
from ppsynth.scenario import make_scenario  # noqa: E402


def measure(pp: int, m: int, steps: int, repeat: int, work: Path) -> tuple[int, float, float, int, int]:
    """(ops, decide s, pair s, ops decided, pairs) for one run size."""
    run = make_scenario(schedule="1f1b", pp=pp, microbatches=m, steps=steps)
    meta, bare = work / f"meta_{pp}_{m}", work / f"bare_{pp}_{m}"
    write_kineto(run, meta)
    strip_kineto_dir(meta, bare, ALL_KINETO)
    parsed = load_run([bare])
    best_d = best_p = float("inf")
    decided = pairs = n_ops = 0
    for _ in range(repeat):
        ops = {tl.rank: p2p_ops(tl) for tl in parsed.ranks}
        n_ops = sum(len(o.start) for o in ops.values())
        t0 = time.perf_counter()
        dec = decide_peers(parsed, ops)
        t1 = time.perf_counter()
        pr = match_pairs(ops)
        t2 = time.perf_counter()
        best_d, best_p = min(best_d, t1 - t0), min(best_p, t2 - t1)
        decided, pairs = dec.decided, len(pr)
    return n_ops, best_d, best_p, decided, pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in a.microbatches:
            n, td, tp, dec, pr = measure(a.pp, m, a.steps, a.repeat, Path(tmp))
            rows.append((m, n, td, tp, dec, pr))
            print(
                f"pp {a.pp} M {m:3d} steps {a.steps}: {n:7d} ops, decided {dec:7d}, pairs {pr:7d}; "
                f"decide {td * 1e3:8.1f} ms ({td / n * 1e6:6.2f} µs/op), "
                f"pair {tp * 1e3:7.1f} ms ({tp / n * 1e6:6.2f} µs/op)",
                flush=True,
            )
    if len(rows) >= 2:
        (m0, n0, d0, p0, _, _), (m1, n1, d1, p1, _, _) = rows[0], rows[-1]
        print(
            f"ops x{n1 / n0:.2f} (M {m0} -> {m1}): decide time x{d1 / d0:.2f}, pair time x{p1 / p0:.2f} "
            "(linear: about the ops ratio; quadratic: its square)"
        )


if __name__ == "__main__":
    main()
