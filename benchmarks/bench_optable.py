"""Op-table scale benchmark: a simulated production job (default 128 ranks = pp 4 x dp 32, 45
sampled steps, M = 32: about 0.9 M ops, 370 k blocks) written as an op table, then parsed and
analysed. Prints one line per stage with wall seconds, and the peak RSS.

    python benchmarks/bench_optable.py                    # the issue's scale, CSV
    python benchmarks/bench_optable.py --dp 4 --steps 10  # quick
    python benchmarks/bench_optable.py --ranks 32 64 128 256 --forms csv parquet chrome

With ``--ranks`` it sweeps the job size (dp = ranks / pp): each size and form is written once, then
analysed in a fresh process of its own (its peak RSS is the analysis alone, without the
generator), and the last lines give the exponent of a log-log least-squares fit of each stage's
CPU time (of the whole analysis's CPU and wall time, and of the peak RSS) against the ranks: 1.0
is linear. Stages are timed in CPU seconds of the process, which a shared machine's load does not
inflate as it does the wall time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peak_rss import peak_rss_kib  # benchmarks/, on sys.path as the script's folder

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test-support package ppsynth

from ppsynth.optable import OpTableParams, simulate_optable, write_chrome, write_table  # noqa: E402

SUFFIX = {"csv": "ops.csv", "parquet": "ops.parquet", "jsonl": "ops.jsonl", "chrome": "timeline.json"}
STAGES = {"parsing": "parse", "rebuilding the pipeline": "rebuild", "attributing lost time": "attribution"}


def _params(args: argparse.Namespace, dp: int) -> OpTableParams:
    return OpTableParams(
        pp=args.pp,
        dp=dp,
        microbatches=args.mb,
        steps=tuple(range(1, 2 * args.steps + 1, 2)),
        mb_cv=args.cv,
        slow_worker=(min(5, dp - 1), min(2, args.pp - 1), 1.3),
    )


def _write(df: Any, folder: Path, form: str) -> Path:
    path = folder / SUFFIX[form]
    return write_chrome(df, path) if form == "chrome" else write_table(df, path)


def _analyse(path: Path) -> dict[str, Any]:
    """Analyse one table in this process: seconds per stage, CPU, peak RSS, findings."""
    from ppdiag.api import Options, diagnose

    t1, c1 = time.perf_counter(), time.process_time()
    marks: list[tuple[str, float, float]] = []
    d = diagnose(
        [path],
        Options(progress=False, jobs=1),
        on_stage=lambda s: marks.append((s, time.perf_counter(), time.process_time())),
    )
    t2, c2 = time.perf_counter(), time.process_time()
    marks.append(("end", t2, c2))
    # the last stage runs to the end: attribution, what-if, rules and the report
    pairs = list(itertools.pairwise(marks))
    stages = {STAGES.get(a[0], a[0]): b[1] - a[1] for a, b in pairs}
    stages_cpu = {STAGES.get(a[0], a[0]): b[2] - a[2] for a, b in pairs}
    return {
        "stages": stages,
        "stages_cpu": stages_cpu,
        "wall": t2 - t1,
        "cpu": c2 - c1,
        "rss_gb": _peak_rss_gb(),
        "findings": [f"{f.code} {f.gain_ms or 0:.1f} ms" for f in d.findings],
    }


def _peak_rss_gb() -> float:
    """This process's peak RSS (:mod:`peak_rss`: ``VmHWM``, not ``ru_maxrss``, which a sweep's
    child carried over from the generator: 1.95 GB at 1,024 ranks x 5 steps, where the analysis
    peaks at about 0.9 GB). kB / 1e6, as before, so earlier figures compare."""
    return peak_rss_kib() / 1e6


def _exponent(xs: list[float], ys: list[float]) -> float:
    """Slope of the least-squares line through (log x, log y)."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / den if den else float("nan")


def _single(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    df, truth = simulate_optable(_params(args, args.dp))
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(df, Path(tmp), args.forms[0])
        print(f"generate  {time.perf_counter() - t0:6.1f} s  {len(df)} ops, {args.pp * args.dp} ranks")
        res = _analyse(path)
    for name, sec in res["stages"].items():
        print(f"{name:<24}{sec:6.1f} s")
    # wall time swings with the machine's load; the CPU time of this process is the stable figure
    print(
        f"analysis  {res['wall']:6.1f} s wall, {res['cpu']:6.1f} s CPU  peak RSS {res['rss_gb']:.2f} GB "
        "(with the generator)"
    )
    print("findings:", ", ".join(res["findings"]))
    print(
        f"truth: slow worker {truth.step_ms - truth.no_slow_worker_ms:.1f} ms, variance (stage means) "
        f"{truth.step_ms - truth.no_variance_ms:.1f} ms"
    )


def _sweep(args: argparse.Namespace) -> None:
    print(f"load average {os.getloadavg()[0]:.1f}; pp {args.pp}, {args.steps} steps, M = {args.mb}")
    print(
        "CPU seconds per stage (parse, rebuild, attribution: to the end of the report), CPU and wall in all"
    )
    cols = ("parse", "rebuild", "attribution", "cpu", "wall", "rss_gb")
    rows: dict[str, list[tuple[int, dict[str, float]]]] = {f: [] for f in args.forms}
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            dp = max(1, ranks // args.pp)
            df, _ = simulate_optable(_params(args, dp))
            folder = Path(tmp) / str(ranks)
            folder.mkdir()
            paths = {f: _write(df, folder, f) for f in args.forms}
            n_ops = len(df)
            del df
            for form, path in paths.items():
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(path)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                res = json.loads(out.strip().rsplit("\n", 1)[-1])
                st = res["stages_cpu"]
                rec = {
                    "parse": st.get("parse", 0.0),
                    "rebuild": st.get("rebuild", 0.0),
                    "attribution": st.get("attribution", 0.0),
                    "cpu": res["cpu"],
                    "wall": res["wall"],
                    "rss_gb": res["rss_gb"],
                }
                rows[form].append((args.pp * dp, rec))
                mb = path.stat().st_size / 2**20
                print(
                    f"{form:<8}{args.pp * dp:>6} ranks {n_ops:>9} ops {mb:8.0f} MiB  "
                    + "  ".join(f"{c} {rec[c]:6.2f}" for c in cols)
                )
                path.unlink()
    for form, recs in rows.items():
        if len(recs) < 2:
            continue
        xs = [float(r) for r, _ in recs]
        fits = "  ".join(f"{c} {_exponent(xs, [rec[c] for _, rec in recs]):.2f}" for c in cols)
        print(f"exponent in ranks ({form}, {recs[0][0]}..{recs[-1][0]} ranks): {fits}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--dp", type=int, default=32)
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--cv", type=float, default=0.2, help="micro-batch cost variation")
    ap.add_argument("--ranks", type=int, nargs="+", help="sweep these job sizes (dp = ranks / pp)")
    ap.add_argument(
        "--forms", nargs="+", choices=sorted(SUFFIX), default=["csv"], help="op-table forms (default csv)"
    )
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        # imported before the clock starts (a fixed cost that would blur the fit): the analysis
        # and pandas, which the op-table reader loads
        import pandas  # noqa: F401

        import ppdiag.api  # noqa: F401

        print(json.dumps(_analyse(args.child)))
    elif args.ranks:
        _sweep(args)
    else:
        _single(args)


if __name__ == "__main__":
    main()
