"""Host clock benchmark: one offset per host for a CPU (gloo) pipeline run without peers.

Builds, in memory, a GPipe run of ``--pp`` stages x ``--dp`` replicas whose ranks sit on
``--hosts`` hosts (pipeline rank outermost, as Megatron orders them, consecutive ranks per host),
each host's clock skewed by up to +-2.5 s, with the host ops a gloo run records (``gloo:send`` /
``gloo:recv`` spans without peers, forward and backward compute, ``ProfilerStep`` ranges). Then it
times, best of ``--repeat``, for each ``--microbatches`` value:

* ``coarse``: :func:`ppdiag.pipeline.host_clocks.coarse_host_offsets` (partners by the width of
  their causal interval, the hosts placed by them);
* ``peers``: :func:`ppdiag.pipeline.peers.decide_peers` (which runs the above, then the data flow);
* ``fit``: :func:`ppdiag.pipeline.clocks.match_pairs` and
  :func:`ppdiag.pipeline.host_clocks.fit_host_clocks` on the decided peers;

and prints the hosts whose fitted offset is off the applied skew by more than its residual. The
exponent is the slope of log(time) over log(ops) between the sizes.

    python benchmarks/bench_clocks.py                       # 256 stages on 32 hosts, M = 4, 8, 16
    python benchmarks/bench_clocks.py --pp 8 --dp 32         # 8 x 32 replicas: partners ambiguous
    python benchmarks/bench_clocks.py --pp 4 --dp 4 --hosts 4 --microbatches 4 8

Data-parallel replicas run in near lockstep, so without peers in the trace their ranks look alike
to timing: the fit then abstains (step starts) rather than pair replicas; the default is one
pipeline of 256 stages, 8 per host.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ppdiag.model import Direction, Intervals, Kind, Phase, RangeKind, Ranges, RankTimeline, Run  # noqa: E402
from ppdiag.pipeline.clocks import match_pairs, p2p_ops  # noqa: E402
from ppdiag.pipeline.host_clocks import coarse_host_offsets, fit_host_clocks  # noqa: E402
from ppdiag.pipeline.peers import decide_peers  # noqa: E402

US = 1000
NAMES = ["", "gloo:send", "gloo:recv", "ProfilerStep#", "fwd", "bwd"]


def _pipeline(pp: int, m: int, steps: int, rng: np.random.Generator) -> list[list[tuple[int, ...]]]:
    """One GPipe pipeline on the true clock: per stage, the rows (kind, start, end, phase,
    direction, step) of its compute blocks, transfers and steps (ns)."""
    rows: list[list[tuple[int, ...]]] = [[] for _ in range(pp)]
    t0 = 0
    for st in range(steps):
        # forward: stage s runs mb k after its previous block and the activation's arrival
        f_end = np.zeros((pp, m), np.int64)
        arrive = np.zeros((pp, m), np.int64)
        free = np.full(pp, t0 + 200 * US, np.int64)
        for k in range(m):
            for s in range(pp):
                start = free[s]
                if s:
                    r0 = max(free[s], start)
                    r1 = max(r0, arrive[s, k]) + 20 * US
                    rows[s].append((1, r0, r1, 0, int(Direction.RECV), st))
                    start = r1
                dur = int(4000 * US * (1 + 0.05 * rng.standard_normal()))
                f_end[s, k] = start + dur
                rows[s].append((0, start, start + dur, int(Phase.FWD), 0, st))
                free[s] = start + dur
                if s < pp - 1:
                    lat = int((100 + 50 * rng.random()) * US)
                    rows[s].append((1, free[s], free[s] + lat, 0, int(Direction.SEND), st))
                    arrive[s + 1, k] = free[s] + lat
                    free[s] += 30 * US
        arrive_b = np.zeros((pp, m), np.int64)
        for k in range(m):
            for s in reversed(range(pp)):
                start = free[s]
                if s < pp - 1:
                    r1 = max(free[s], arrive_b[s, k]) + 20 * US
                    rows[s].append((1, free[s], r1, 0, int(Direction.RECV), st))
                    start = r1
                dur = int(8000 * US * (1 + 0.05 * rng.standard_normal()))
                rows[s].append((0, start, start + dur, int(Phase.BWD), 0, st))
                free[s] = start + dur
                if s:
                    lat = int((100 + 50 * rng.random()) * US)
                    rows[s].append((1, free[s], free[s] + lat, 0, int(Direction.SEND), st))
                    arrive_b[s - 1, k] = free[s] + lat
                    free[s] += 30 * US
        end = int(free.max()) + 500 * US
        for s in range(pp):
            rows[s].append((2, t0, end, 0, 0, st))
        t0 = end
    return rows


def _timeline(rank: int, rows: list[tuple[int, ...]], skew: int, host: str) -> RankTimeline:
    a = np.array(rows, dtype=np.int64)
    comp, comm, step = a[a[:, 0] == 0], a[a[:, 0] == 1], a[a[:, 0] == 2]
    # each block as the few ops a layer runs (the data flow votes over the ops around a transfer)
    parts = 4
    cut = comp[:, 1:2] + (comp[:, 2:3] - comp[:, 1:2]) * np.arange(parts + 1) // parts
    comp = np.repeat(comp, parts, axis=0)
    comp[:, 1], comp[:, 2] = cut[:, :-1].ravel(), cut[:, 1:].ravel()
    iv = Intervals.from_columns(
        len(comp),
        {
            "start": comp[:, 1] + skew,
            "end": comp[:, 2] + skew,
            "kind": np.full(len(comp), int(Kind.COMPUTE)),
            "phase": comp[:, 3],
            "name": np.where(comp[:, 3] == int(Phase.FWD), 4, 5),
        },
    ).sorted()
    n_c, n_s = len(comm), len(step)
    rg = Ranges.from_columns(
        n_c + n_s,
        {
            "start": np.r_[comm[:, 1], step[:, 1]] + skew,
            "end": np.r_[comm[:, 2], step[:, 2]] + skew,
            "kind": np.r_[np.full(n_c, int(RangeKind.COMM_OP)), np.full(n_s, int(RangeKind.STEP))],
            "name": np.r_[np.where(comm[:, 4] == int(Direction.SEND), 1, 2), np.full(n_s, 3)],
            "direction": np.r_[comm[:, 4], np.zeros(n_s, np.int64)],
            "num": np.r_[np.full(n_c, -1), step[:, 5]],
        },
    )
    return RankTimeline(
        rank, f"rank{rank}", "kineto", NAMES, iv, rg, cpu_only=True, backend="gloo", meta={"host_name": host}
    )


def build(pp: int, dp: int, hosts: int, m: int, steps: int, seed: int) -> tuple[Run, dict[str, int]]:
    """The run and each host's applied skew (ns its clock reads ahead)."""
    rng = np.random.default_rng(seed)
    world = pp * dp
    per = -(-world // hosts)
    skew = {f"h{h}": 0 if h == 0 else int(rng.integers(-2_500_000, 2_500_000)) * US for h in range(hosts)}
    ranks = []
    for d in range(dp):
        rows = _pipeline(pp, m, steps, rng)
        for s in range(pp):
            r = s * dp + d  # the pipeline rank outermost
            h = f"h{r // per}"
            ranks.append(_timeline(r, rows[s], skew[h], h))
    ranks.sort(key=lambda tl: tl.rank)
    return Run(ranks, "kineto"), skew


def measure(
    pp: int, dp: int, hosts: int, m: int, steps: int, repeat: int
) -> tuple[int, float, float, float, int, int]:
    """(ops, coarse s, peers s, fit s, hosts off the skew beyond their residual, hosts placed by
    matched transfers)."""
    run, skew = build(pp, dp, hosts, m, steps, seed=m)
    best = [math.inf] * 3
    bad = by_transfers = 0
    n_ops = 0
    for _ in range(repeat):
        ops = {tl.rank: p2p_ops(tl) for tl in run.ranks}
        n_ops = sum(len(o.start) for o in ops.values())
        t0 = time.perf_counter()
        coarse_host_offsets(run, ops)
        t1 = time.perf_counter()
        decide_peers(run, ops)
        t2 = time.perf_counter()
        got = fit_host_clocks(run, match_pairs(ops))
        t3 = time.perf_counter()
        best = [min(b, x) for b, x in zip(best, (t1 - t0, t2 - t1, t3 - t2), strict=True)]
        bad = 0
        if got is None:
            bad = hosts
            continue
        by_transfers = sum(c.method.startswith("causal") for c in got[1])
        for c in got[1]:
            tol = (c.residual_ns or 0) + 1000
            if abs(c.offset_ns + skew[c.host]) > tol:
                bad += 1
    return n_ops, best[0], best[1], best[2], bad, by_transfers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{a.pp * a.dp} ranks ({a.pp} stages x {a.dp} replicas) on {a.hosts} hosts, {a.steps} steps")
    print(f"{'M':>4} {'ops':>8} {'coarse s':>9} {'peers s':>9} {'fit s':>8} {'us/op':>7}  off  by transfers")
    sizes: list[tuple[int, float]] = []
    for m in a.microbatches:
        n, c, p, f, bad, tr = measure(a.pp, a.dp, a.hosts, m, a.steps, a.repeat)
        total = p + f
        sizes.append((n, total))
        per_op = 1e6 * total / n
        print(f"{m:>4} {n:>8} {c:>9.3f} {p:>9.3f} {f:>8.3f} {per_op:>7.1f}  {bad:>3}  {tr}/{a.hosts - 1}")
    if len(sizes) >= 2:
        (n0, t0), (n1, t1) = sizes[0], sizes[-1]
        print(f"exponent in ops (peers + fit): {math.log(t1 / t0) / math.log(n1 / n0):.2f}")


if __name__ == "__main__":
    main()
