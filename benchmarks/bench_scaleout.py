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
* the reducer's peak RSS (``getrusage``).

``--local`` also runs the same analysis with the local process pool (``--workers`` processes) in
another fresh child and says whether the two reports are identical.

    python benchmarks/bench_scaleout.py                      # 4096 ranks, 2 workers
    python benchmarks/bench_scaleout.py --dp 64 --local      # 256 ranks, quick, with the check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test-support package ppsynth


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
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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


def _child(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PPDIAG_NO_CACHE="1")
    out = subprocess.run(
        [sys.executable, __file__, *args], env=env, check=True, capture_output=True, text=True
    ).stdout
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--dp", type=int, default=1024)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--local", action="store_true", help="also run the local pool and compare")
    ap.add_argument("--keep", type=Path, help="build the traces here and keep them")
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
