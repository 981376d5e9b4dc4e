"""Scale-out benchmark: thousands of small synthetic ranks mapped on a Dask LocalCluster.

Builds a simulated 1F1B job of ``--pp`` x ``--dp`` ranks (default 4 x 1024 = 4096 ranks, small
Kineto traces: ``--microbatches`` 4, ``--steps`` 1, one kernel per block) in a child process, starts
a ``LocalCluster`` of ``--workers`` worker processes (one thread each), and then, in a fresh child
process that connects to it (so that its peak memory is the reducer's own, not the build's or the
scheduler's):

* ``map``: ``load_run(..., scheduler=ADDRESS)``: every file parsed on a worker, its digest sent back
  and decoded;
* ``reduce``: ``ppdiag.api.analyze_run`` on the ranks (matching, clocks, replay, rules);
* the digests' total size (the ranks re-encoded as the workers sent them) against the raw JSON;
* the reducer's peak RSS (its own ``VmHWM``: :mod:`peak_rss`).

``--local`` also runs the same analysis with the local process pool (``--workers`` processes) in
another fresh child and says whether the two reports are identical.

    python benchmarks/bench_scaleout.py                      # 4096 ranks, 2 workers
    python benchmarks/bench_scaleout.py --dp 64 --local      # 256 ranks, quick, with the check

``--optable`` runs the same for one op table holding every rank (default 10,240 ranks = pp 16 x
dp 640, 3 sampled steps, M = 16: about 2.9 M ops), written as Parquet sorted by ``dp_rank``: the
map is a task per batch of replicas (:mod:`ppdiag.parsers.optable_replicas`), after the plan's
pass over six columns in the reducer; the analysis maps its rank-step accounting, and after the
reducer has settled the causes its per-gap cause tables, on the same workers (``--phases`` shows
what each leaves on the reducer: ``api._rank_steps`` and ``paint_map.paint_replicas``, the
building of the tasks and the reading of their results). ``--sizes`` takes several dp values
and fits the exponent in ranks of the reducer's CPU and peak RSS; ``--local`` compares the
report with the whole-table parse in one process (``jobs=1``, no Dask), byte for byte.

    python benchmarks/bench_scaleout.py --optable                       # 10,240 ranks
    python benchmarks/bench_scaleout.py --optable --sizes 16 64 --local  # 256 and 1,024 ranks, checked
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test-support package ppsynth
sys.path.insert(0, str(REPO / "benchmarks"))  # reduce_phases, peak_rss

from peak_rss import peak_rss_mb  # noqa: E402


def _build(out: Path, pp: int, dp: int, m: int, steps: int) -> None:
    from ppsynth.kineto import write_kineto
    from ppsynth.scenario import make_scenario

    run = make_scenario(steps=steps, pp=pp, microbatches=m, dp=dp, kernels_per_block=(1, 1))
    write_kineto(run, out, groundtruth=False)


def _analyze(run_dir: Path, scheduler: str | None, jobs: int) -> dict[str, object]:
    import msgspec

    from ppdiag.api import Options, analyze_run
    from ppdiag.parsers import cache
    from ppdiag.parsers.loader import load_run

    t0 = time.perf_counter()
    c0 = time.process_time()
    run = load_run([run_dir], jobs=jobs, progress=False, scheduler=scheduler)
    t1 = time.perf_counter()
    c1 = time.process_time()
    diag = analyze_run(run, Options(progress=False, jobs=jobs))
    t2 = time.perf_counter()
    c2 = time.process_time()
    rss = peak_rss_mb()
    digest = sum(len(cache.encode_ranks([tl]) or b"") for tl in run.ranks)
    report = json.dumps(msgspec.to_builtins(diag.result), sort_keys=True, default=str).encode()
    return {
        "ranks": len(run.ranks),
        "map_s": t1 - t0,
        "map_cpu_s": c1 - c0,
        "reduce_s": t2 - t1,
        "reduce_cpu_s": c2 - c1,
        "peak_rss_mb": rss,
        "digest_bytes": digest,
        "findings": [f.code for f in diag.findings],
        "report_sha": hashlib.sha256(report).hexdigest()[:16],
    }


def _build_table(out: Path, pp: int, dp: int, m: int, steps: int) -> int:
    """An op table of pp x dp ranks as Parquet, sorted by replica in row groups of 8 replicas."""
    import numpy as np

    from ppsynth.optable import OpTableParams, simulate_optable

    params = OpTableParams(
        pp=pp,
        dp=dp,
        microbatches=m,
        steps=tuple(range(1, 2 * steps + 1, 2)),
        mb_cv=0.2,
        slow_worker=(min(5, dp - 1), min(2, pp - 1), 1.3),
    )
    df, _ = simulate_optable(params)
    df = df.sort_values("dp_rank", kind="stable")
    df["start_ts"] = df["start_ts"].astype(np.float32)
    df["duration"] = df["duration"].astype(np.float32)
    df.to_parquet(out, index=False, row_group_size=max(1, len(df) // dp) * 8)
    return len(df)


def _analyze_table(path: Path, scheduler: str | None, phases: bool = False) -> dict[str, object]:
    """The op table's map (by replica on Dask, or the whole-table parse) and the analysis
    (``phases``: its CPU by phase, from :mod:`reduce_phases`)."""
    from contextlib import AbstractContextManager, nullcontext

    from reduce_phases import timed_phases

    from ppdiag.api import Options, analyze_run
    from ppdiag.parsers import optable_replicas
    from ppdiag.parsers.loader import load_run
    from ppdiag.reports.json_report import dumps

    sizes: list[int] = []
    plan_s: list[float] = []
    reduce = optable_replicas.reduce_replicas
    plan = optable_replicas.plan_table

    def count(p: Any, digests: Any) -> Any:
        def each() -> Any:
            for d in digests:
                sizes.append(d.nbytes)
                yield d

        return reduce(p, each())

    def timed_plan(path: Any) -> Any:
        t = time.perf_counter()
        out = plan(path)
        plan_s.append(time.perf_counter() - t)
        return out

    optable_replicas.reduce_replicas = count  # type: ignore[assignment]
    optable_replicas.plan_table = timed_plan
    t0, c0 = time.perf_counter(), time.process_time()
    run = load_run([path], jobs=1, progress=False, scheduler=scheduler)
    t1, c1 = time.perf_counter(), time.process_time()
    timer: AbstractContextManager[dict[str, float]] = timed_phases() if phases else nullcontext({})
    with timer as cpu:
        # with a scheduler, the one-replica phases the analysis maps run on its workers too
        diag = analyze_run(run, Options(progress=False, jobs=1, scheduler=scheduler))
    t2, c2 = time.perf_counter(), time.process_time()
    report = dumps(diag.result).encode()
    pipe = diag.context.pipeline if diag.context is not None else None
    structure = pipe.structure if pipe is not None else None
    return {
        "phases": cpu,
        "established": structure is None or structure.established,
        "ranks": len(run.ranks),
        "plan_s": sum(plan_s),
        "map_s": t1 - t0,
        "map_cpu_s": c1 - c0,
        "reduce_s": t2 - t1,
        "reduce_cpu_s": c2 - c1,
        "peak_rss_mb": peak_rss_mb(),
        "digest_bytes": sum(sizes),
        "tasks": len(sizes),
        "findings": [f.code for f in diag.findings],
        "report_sha": hashlib.sha256(report).hexdigest()[:16],
    }


def _fit(xs: list[float], ys: list[float]) -> float:
    """Slope of the least-squares line through (log x, log y): the exponent."""
    import math

    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / den if den else float("nan")


def _worker_peak_mb(cluster: Any) -> float:
    """The largest peak RSS of the cluster's worker processes (MB)."""
    from distributed import Client

    def peak() -> float:
        # VmHWM read here, not imported: the function runs in the workers, which cannot import the
        # benchmarks' modules; ru_maxrss of a worker, spawned by its nanny, would carry the
        # nanny's peak over exec (see peak_rss)
        with open("/proc/self/status") as fh:
            return next((int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:")), 0) / 1024

    with Client(cluster) as client:
        return float(max(client.run(peak).values()))


def _optable(a: argparse.Namespace) -> None:
    """``--optable``: one op table per size, mapped by replica on a LocalCluster."""
    from distributed import LocalCluster
    from reduce_phases import format_phases

    print(f"load average {os.getloadavg()[0]:.1f}; {a.workers} workers; pp {a.pp}, M {a.microbatches}")
    rows: list[tuple[int, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="ppdiag-optable-") as tmp:
        for dp in a.sizes or [a.dp]:
            path = Path(tmp) / f"ops-{dp}.parquet"
            t = time.perf_counter()
            shape = ["--pp", str(a.pp), "--dp", str(dp), "--microbatches", str(a.microbatches)]
            shape += ["--steps", str(a.steps)]
            n_ops = _child([*shape, "--_build_table", str(path)])["ops"]
            mb = path.stat().st_size / 1e6
            print(
                f"built {a.pp} x {dp} = {a.pp * dp} ranks, {n_ops} ops, {a.steps} steps, "
                f"{mb:.0f} MB Parquet in {time.perf_counter() - t:.0f} s"
            )
            with LocalCluster(
                n_workers=a.workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=40,
            ) as cluster:
                more = ["--_phases"] if a.phases else []
                d = _child(["--_analyze_table", str(path), "--_scheduler", cluster.scheduler_address, *more])
                worker_mb = _worker_peak_mb(cluster)
            print(
                f"  dask: plan {d['plan_s']:.1f} s, map {d['map_s']:.1f} s wall ({d['tasks']} tasks, reducer "
                f"CPU {d['map_cpu_s']:.1f} s), reduce {d['reduce_s']:.1f} s wall / {d['reduce_cpu_s']:.1f} s "
                f"CPU, reducer peak RSS {d['peak_rss_mb']:.0f} MB, digests {d['digest_bytes'] / 1e6:.1f} MB "
                f"({d['digest_bytes'] / d['ranks'] / 1e3:.1f} kB per rank), "
                f"worker peak RSS {worker_mb:.0f} MB; "
                f"findings {', '.join(d['findings'])}"
            )
            if not d["established"]:
                print("  NOTE: the analysis rejected the pipeline structure (see the report's warnings)")
            if a.phases:
                print(format_phases(d["phases"], float(d["reduce_cpu_s"])))
            if a.local:
                loc = _child(["--_analyze_table", str(path)])
                print(
                    f"  one process: parse {loc['map_s']:.1f} s wall / {loc['map_cpu_s']:.1f} s CPU, "
                    f"analysis {loc['reduce_s']:.1f} s wall / {loc['reduce_cpu_s']:.1f} s CPU, peak RSS "
                    f"{loc['peak_rss_mb']:.0f} MB; report byte-identical: "
                    f"{loc['report_sha'] == d['report_sha']}"
                )
            rows.append((a.pp * dp, d))
            path.unlink()
    if len(rows) > 1:
        xs = [float(r) for r, _ in rows]
        fits = {
            c: _fit(xs, [float(d[c]) for _, d in rows])
            for c in ("map_cpu_s", "reduce_cpu_s", "reduce_s", "peak_rss_mb", "digest_bytes")
        }
        print(
            f"exponent in ranks ({rows[0][0]}..{rows[-1][0]}): "
            + "  ".join(f"{c} {v:.2f}" for c, v in fits.items())
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def _child(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PPDIAG_NO_CACHE="1")
    proc = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    if proc.returncode:  # the child's own error, not just its exit status
        sys.stderr.write(proc.stderr)
        proc.check_returncode()
    out = proc.stdout
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pp", type=int, help="default 4 (--optable: see above)")
    ap.add_argument("--dp", type=int, help="default 1024 (--optable: see above)")
    ap.add_argument("--microbatches", type=int, help="default 4 (--optable: see above)")
    ap.add_argument("--steps", type=int, help="default 1 (--optable: see above)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--local", action="store_true", help="also run the local pool and compare")
    ap.add_argument("--keep", type=Path, help="build the traces here and keep them")
    ap.add_argument("--optable", action="store_true", help="one op table (Parquet) mapped by replica")
    ap.add_argument("--sizes", type=int, nargs="+", help="--optable: dp values to sweep (exponent in ranks)")
    ap.add_argument("--phases", action="store_true", help="--optable: the reducer's analysis CPU by phase")
    ap.add_argument("--_phases", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_build_table", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_analyze_table", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_build", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_analyze", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_scheduler", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._build:
        _build(a._build, a.pp, a.dp, a.microbatches, a.steps)
        print(json.dumps({"ok": True}))
        return
    if a._analyze:
        print(json.dumps(_analyze(a._analyze, a._scheduler, a.workers)))
        return
    if a._build_table:
        print(json.dumps({"ops": _build_table(a._build_table, a.pp, a.dp, a.microbatches, a.steps)}))
        return
    if a._analyze_table:
        print(json.dumps(_analyze_table(a._analyze_table, a._scheduler, a._phases)))
        return
    # the defaults: 4096 small Kineto files, or one 10,240-rank op table
    for name, per_file, per_table in (
        ("pp", 4, 16),
        ("dp", 1024, 640),
        ("microbatches", 4, 16),
        ("steps", 1, 3),
    ):
        if getattr(a, name) is None:
            setattr(a, name, per_table if a.optable else per_file)
    if a.optable:
        _optable(a)
        return

    from distributed import LocalCluster

    tmp = tempfile.TemporaryDirectory(prefix="ppdiag-scale-") if a.keep is None else None
    run_dir = Path(tmp.name) if tmp is not None else a.keep
    run_dir.mkdir(parents=True, exist_ok=True)
    shape = ["--pp", str(a.pp), "--dp", str(a.dp), "--microbatches", str(a.microbatches)]
    shape += ["--steps", str(a.steps), "--workers", str(a.workers)]
    t = time.perf_counter()
    _child([*shape, "--_build", str(run_dir)])
    files = sorted(run_dir.iterdir())
    raw = sum(p.stat().st_size for p in files)
    print(
        f"built {len(files)} traces ({a.pp} x {a.dp}, M={a.microbatches}, {a.steps} step(s)), "
        f"{raw / 1e6:.1f} MB gzip, in {time.perf_counter() - t:.1f} s"
    )
    import gzip

    raw_json = (
        sum(len(gzip.decompress(p.read_bytes())) for p in files[:64]) * len(files) / min(64, len(files))
    )
    env_keep = os.environ.get("PPDIAG_NO_CACHE")
    os.environ["PPDIAG_NO_CACHE"] = "1"  # the workers inherit it: every file is parsed
    with LocalCluster(
        n_workers=a.workers, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as cluster:
        d = _child([*shape, "--_analyze", str(run_dir), "--_scheduler", cluster.scheduler_address])
    if env_keep is None:
        os.environ.pop("PPDIAG_NO_CACHE", None)
    print(
        f"dask ({a.workers} workers): {d['ranks']} ranks, map {d['map_s']:.1f} s "
        f"(reducer CPU {d['map_cpu_s']:.1f} s), reduce {d['reduce_s']:.1f} s, "
        f"reducer peak RSS {d['peak_rss_mb']:.0f} MB"
    )
    db = int(d["digest_bytes"])
    print(
        f"digests: {db / 1e6:.1f} MB in all, {db / max(len(files), 1) / 1e3:.1f} kB per rank, "
        f"{db / raw_json:.2f}x the raw JSON ({raw_json / 1e6:.0f} MB, estimated from 64 files)"
    )
    print(f"findings: {', '.join(map(str, d['findings']))}")
    if a.local:
        loc = _child([*shape, "--_analyze", str(run_dir)])
        same = loc["report_sha"] == d["report_sha"]
        print(
            f"local pool ({a.workers} processes): map {loc['map_s']:.1f} s, reduce {loc['reduce_s']:.1f} s, "
            f"peak RSS {loc['peak_rss_mb']:.0f} MB; report identical to the Dask run: {same}"
        )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
