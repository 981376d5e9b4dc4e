"""Scaling benchmark: analysis time against the number of steps and of micro-batches.

Synthetic pipeline runs (``ppsynth``, Kineto or nsys) are written once per size, parsed,
and then analysed (pipeline rebuild, attribution, what-if, rules) in this process. For each sweep
the script prints the CPU seconds of the analysis per size and the exponent of a least-squares
fit of log(time) against log(size): 1.0 is linear, and the attribution and block building must
stay at or below 1.1 (no per-wait or per-step scan over a whole rank).

    python benchmarks/bench_scaling.py                       # steps 4..32 at M=16, M 8..64 at 4 steps
    python benchmarks/bench_scaling.py --fmt nsys --pp 8
    python benchmarks/bench_scaling.py --steps 4 8 16 32 64 --mb 16 32 64 128
    python benchmarks/bench_scaling.py --fmt nsys --e2e 4 256 128   # + end to end against the floor

With ``--e2e P M STEPS`` (nsys) it first writes that run and times, each in a fresh process, the
floor (``SELECT`` of the kernel columns of every file into numpy, one file after the other) and
``ppdiag analyze DIR --json ... --no-cache`` end to end (wall, and CPU of the process and its
parse workers), and prints their ratio; ``--e2e-dir DIR`` reuses a run written before. The floor
is Python's ``sqlite3`` (one Python object per value, as the reader's fallback path pays); with the
``nsys`` extra installed the analysis reads its big integer queries through ADBC (Arrow columns),
so its part of the ratio can drop below what any sqlite3 reader could reach.

CPU time (``time.process_time``) is used because wall time on a shared machine swings with load;
each size is timed ``--repeat`` times and the fastest is kept. Exit status 1 when an exponent
exceeds ``--max-exponent``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test-support package ppsynth

import numpy as np  # noqa: E402

from ppdiag.api import Options, analyze_run, load  # noqa: E402
from ppsynth.kineto import write_kineto  # noqa: E402
from ppsynth.nsys import write_nsys  # noqa: E402
from ppsynth.scenario import make_scenario  # noqa: E402


def _time_one(fmt: str, pp: int, mb: int, steps: int, repeat: int) -> tuple[float, float]:
    """(parse CPU s, analysis CPU s) of one synthetic run, the fastest of ``repeat``."""
    run = make_scenario(schedule="1f1b", pp=pp, microbatches=mb, steps=steps, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (write_kineto if fmt == "kineto" else write_nsys)(run, d)
        opts = Options(progress=False, jobs=1)
        best_parse = best_an = float("inf")
        for _ in range(repeat):
            c0 = time.process_time()
            loaded = load([d], opts)
            c1 = time.process_time()
            analyze_run(loaded, opts)
            c2 = time.process_time()
            best_parse = min(best_parse, c1 - c0)
            best_an = min(best_an, c2 - c1)
    return best_parse, best_an


_FLOOR = r"""
import json, sqlite3, sys, time
from pathlib import Path
import numpy as np
SQL = ('SELECT start, "end", deviceId, streamId, correlationId, globalPid, demangledName '
       'FROM CUPTI_ACTIVITY_KIND_KERNEL')
dt = np.dtype([(c, np.int64) for c in ("s", "e", "d", "st", "c", "p", "n")])
t, n = time.perf_counter(), 0
for p in sorted(Path(sys.argv[1]).glob("*.sqlite")):
    conn = sqlite3.connect(f"file:{p}?mode=ro&immutable=1", uri=True)
    n += len(np.fromiter(conn.execute(SQL), dtype=dt))
print(json.dumps({"s": time.perf_counter() - t, "rows": n}))
"""


def _child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of the child and its own children, stdout) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out


def end_to_end(pp: int, mb: int, steps: int, run_dir: Path | None, repeat: int) -> float:
    """Print ``ppdiag analyze`` of a P x M x steps nsys run against the kernel-SELECT floor; the
    wall-time ratio (best of ``repeat`` each, the two interleaved)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = run_dir or Path(tmp) / "run"
        if not any(d.glob("*.sqlite")):
            t = time.perf_counter()
            d.mkdir(parents=True, exist_ok=True)
            write_nsys(make_scenario(schedule="1f1b", pp=pp, microbatches=mb, steps=steps, seed=1), d)
            print(f"wrote {d} in {time.perf_counter() - t:.0f} s")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        floor, full = [], []
        for _ in range(repeat):
            w, c, out = _child([sys.executable, "-c", _FLOOR, str(d)])
            floor.append((w, c, json.loads(out)["rows"]))
            cmd = [sys.executable, "-m", "ppdiag", "analyze", str(d), "--no-cache", "--json", f"{tmp}/r.json"]
            w, c, _ = _child(cmd, env)
            full.append((w, c, 0))
    fw, fc, rows = min(floor)
    aw, ac, _ = min(full)
    print(f"end to end, nsys P={pp} M={mb} {steps} steps, {rows} kernels (best of {repeat})")
    print(f"  floor (kernel SELECT into numpy)  {fw:7.2f} s wall {fc:7.2f} s CPU")
    print(f"  ppdiag analyze --json --no-cache  {aw:7.2f} s wall {ac:7.2f} s CPU")
    print(f"  ratio to the floor: {aw / fw:.1f}x wall, {ac / fc:.1f}x CPU\n")
    return aw / fw


def _exponent(sizes: list[int], times: list[float]) -> float:
    """Slope of log(time) against log(size)."""
    return float(np.polyfit(np.log(sizes), np.log(times), 1)[0])


def _sweep(label: str, sizes: list[int], timed: list[tuple[float, float]]) -> float:
    print(f"{label:<8}{'parse CPU s':>12}{'analysis CPU s':>16}")
    for n, (p, a) in zip(sizes, timed, strict=True):
        print(f"{n:<8}{p:12.3f}{a:16.3f}")
    exp_a = _exponent(sizes, [a for _, a in timed])
    exp_p = _exponent(sizes, [p for p, _ in timed])
    print(f"fitted exponent over {label}: analysis {exp_a:.2f}, parse {exp_p:.2f}\n")
    return exp_a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", choices=("kineto", "nsys"), default="kineto")
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--steps", type=int, nargs="+", default=[4, 8, 16, 32], help="step counts")
    ap.add_argument("--mb", type=int, nargs="+", default=[8, 16, 32, 64], help="micro-batch counts")
    ap.add_argument("--fixed-mb", type=int, default=16, help="M of the steps sweep")
    ap.add_argument("--fixed-steps", type=int, default=4, help="steps of the M sweep")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-exponent", type=float, default=1.1)
    ap.add_argument("--e2e", type=int, nargs=3, metavar=("P", "M", "STEPS"), help="end to end, nsys")
    ap.add_argument("--e2e-dir", type=Path, default=None, help="the --e2e run (written when empty)")
    args = ap.parse_args()
    if args.e2e:
        pp, mb, steps = args.e2e
        end_to_end(pp, mb, steps, run_dir=args.e2e_dir, repeat=args.repeat)
    print(f"{args.fmt}, P={args.pp}, 1F1B; CPU seconds, fastest of {args.repeat}\n")
    steps_t = [_time_one(args.fmt, args.pp, args.fixed_mb, s, args.repeat) for s in args.steps]
    e_steps = _sweep("steps", args.steps, steps_t)
    mb_t = [_time_one(args.fmt, args.pp, m, args.fixed_steps, args.repeat) for m in args.mb]
    e_mb = _sweep("M", args.mb, mb_t)
    worst = max(e_steps, e_mb)
    verdict = "ok" if worst <= args.max_exponent else "TOO STEEP"
    print(f"largest analysis exponent {worst:.2f} (limit {args.max_exponent}): {verdict}")
    sys.exit(0 if worst <= args.max_exponent else 1)


if __name__ == "__main__":
    main()
