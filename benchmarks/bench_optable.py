"""Op-table scale benchmark: a simulated production job (default 128 ranks = pp 4 x dp 32, 45
sampled steps, M = 32: about 0.9 M ops, 370 k blocks) written as CSV, then parsed and analysed in
this process. Prints one line per stage with wall seconds, and the peak RSS.

    python benchmarks/bench_optable.py                    # the issue's scale
    python benchmarks/bench_optable.py --dp 4 --steps 10  # quick
"""

from __future__ import annotations

import argparse
import itertools
import resource
import tempfile
import time
from pathlib import Path

from ppdiag.api import Options, diagnose
from ppdiag.synth.optable import OpTableParams, simulate_optable, write_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--dp", type=int, default=32)
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--cv", type=float, default=0.2, help="micro-batch cost variation")
    args = ap.parse_args()
    p = OpTableParams(
        pp=args.pp,
        dp=args.dp,
        microbatches=args.mb,
        steps=tuple(range(1, 2 * args.steps + 1, 2)),
        mb_cv=args.cv,
        slow_worker=(min(5, args.dp - 1), min(2, args.pp - 1), 1.3),
    )
    t0 = time.perf_counter()
    df, truth = simulate_optable(p)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_table(df, Path(tmp) / "ops.csv")
        print(f"generate  {time.perf_counter() - t0:6.1f} s  {len(df)} ops, {args.pp * args.dp} ranks")
        t1 = time.perf_counter()
        c1 = time.process_time()
        marks: list[tuple[str, float]] = []
        d = diagnose(
            [path], Options(progress=False, jobs=1), on_stage=lambda s: marks.append((s, time.perf_counter()))
        )
        t2 = time.perf_counter()
        c2 = time.process_time()
    marks.append(("end", t2))
    # the last stage runs to the end: attribution, what-if, rules and the report
    for (name, a), (_, b) in itertools.pairwise(marks):
        print(f"{name:<24}{b - a:6.1f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    # wall time swings with the machine's load; the CPU time of this process is the stable figure
    print(
        f"analysis  {t2 - t1:6.1f} s wall, {c2 - c1:6.1f} s CPU  peak RSS {rss:.2f} GB (with the generator)"
    )
    print("findings:", ", ".join(f"{f.code} {f.gain_ms or 0:.1f} ms" for f in d.findings))
    print(
        f"truth: slow worker {truth.step_ms - truth.no_slow_worker_ms:.1f} ms, variance (stage means) "
        f"{truth.step_ms - truth.no_variance_ms:.1f} ms"
    )


if __name__ == "__main__":
    main()
