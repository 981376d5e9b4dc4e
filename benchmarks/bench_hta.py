"""ppdiag against Holistic Trace Analysis on the same traces, wall and CPU, and the cache re-run.

Builds the multi-rank Kineto input of ``bench_parse.py`` (default 4 ranks x 62 MB raw JSON, gzip,
replicated from a real trace; ``--dir`` reads an existing run directory instead), then measures,
each in a fresh child process, one after the other in one run:

* ``floor``: read + gunzip (ppdiag's inflater) + one typed msgspec decode of every file (the
  fields ppdiag reads, ``ppdiag.parsers.kineto.trace_decoder()``), in as many processes as
  ppdiag's parse uses (``--jobs``), nothing else: the least a parse of these files can cost;
* ``ppdiag``: ``load_run`` + ``analyze_run`` with the parse cache off;
* ``ppdiag, cache fill`` then ``ppdiag, cache hit``: what ``ppdiag analyze`` calls
  (:func:`ppdiag.result_cache.analysis_of`: the result cache, else the parse, through the parse
  cache, and the analysis) with a fresh cache folder, twice: the fill parses, analyses and stores,
  the hit hashes every file and reads the stored report. Only what the command has loaded before
  it calls are imported before the clock (the analysis is imported inside it, as the command does);
* ``ppdiag analyze`` itself, whole processes: ``ppdiag analyze DIR -q --json FILE`` with the caches
  off and warm, alternating, best of 3 each (with the load average);
* ``HTA``: ``TraceAnalysis(trace_dir=...)`` + ``get_temporal_breakdown`` + ``get_idle_time_breakdown``
  (the per-rank time accounting, like for like), run by ``--hta-python`` (a Python that imports
  ``hta``: HTA pins its own dependencies, so it usually lives in its own venv:
  ``python3 -m venv /tmp/hta && /tmp/hta/bin/pip install HolisticTraceAnalysis==0.5.0``). Skipped when
  no such Python is given and this one cannot import ``hta``.

ppdiag's modules are byte-compiled first (``compileall``, as an install does): with
``PYTHONDONTWRITEBYTECODE`` set, a source checkout would otherwise compile every module in every
child (~0.3 s CPU of a whole process), which HTA, installed with its bytecode, never pays.

CPU is user + system time of the child and all its worker processes (``RUSAGE_CHILDREN`` counts
HTA's multiprocessing pool and ppdiag's parse pool alike: both are joined before the child
reads it). Imports are timed apart (before the clock starts) for both tools: HTA's
``hta.trace_analysis``, ppdiag's api, loader and parser modules. Each child is also timed whole from
outside (start-up, imports and exit included: ``whole processes``), for HTA / ppdiag and for the
cache hit against the cold run. Wall times on a shared
machine swing with load; the CPU ratios are the stable ones.

    python benchmarks/bench_hta.py --hta-python /tmp/hta/bin/python
    python benchmarks/bench_hta.py --ranks 2 --mb 20 --hta-python /tmp/hta/bin/python   # quick
    python benchmarks/bench_hta.py --dir RUN_DIR --no-hta        # floor, ppdiag and the cache only
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peak_rss import peak_rss_kib  # benchmarks/, on sys.path as the script's folder

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _child(kind: str, folder: str, jobs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # imports first and timed apart: the figures below are the work on the traces
    t_imp = time.perf_counter()
    if kind == "hta":
        from hta.trace_analysis import TraceAnalysis
    elif kind == "floor":
        sys.path.insert(0, str(HERE))
        from bench_parse import _floor_one

        import ppdiag.parsers.kineto  # noqa: F401  (what _floor_one imports, loaded before the clock)
    elif kind == "entry":
        from ppdiag.options import Options
        from ppdiag.result_cache import Cached, analysis_of
    else:
        from ppdiag.api import Options, analyze_run
        from ppdiag.parsers import load_builtin
        from ppdiag.parsers.loader import load_run

        load_builtin()  # the parser modules, which load_run would import on its first call
    out["import_s"] = time.perf_counter() - t_imp
    t0, c0 = time.perf_counter(), _cpu()
    if kind == "floor":
        # the decode floor: read + gunzip (ppdiag's inflater) + one typed msgspec decode of each
        # file, in as many processes as ppdiag's parse uses, nothing else
        files = sorted(str(p) for p in Path(folder).iterdir() if p.is_file())
        if jobs == 1:
            out["events"] = sum(map(_floor_one, files))
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
                out["events"] = sum(pool.map(_floor_one, files))
    elif kind == "entry":
        got = analysis_of([folder], Options(jobs=jobs))
        out["served"] = isinstance(got, Cached)
        report = got.report if isinstance(got, Cached) else got.result
        out["findings"] = [f.code for f in report.findings]
    elif kind == "hta":
        analyzer = TraceAnalysis(trace_dir=folder)
        out["parse_s"] = time.perf_counter() - t0
        analyzer.get_temporal_breakdown(visualize=False)
        analyzer.get_idle_time_breakdown(visualize=False)
    else:
        run = load_run([folder], jobs=jobs, progress=False)
        out["load_s"] = time.perf_counter() - t0
        out["load_cpu_s"] = _cpu() - c0
        t1 = time.perf_counter()
        diag = analyze_run(run, Options(jobs=jobs))
        out["analysis_s"] = time.perf_counter() - t1
        out["events"] = sum(r.events_total for r in run.ranks)
        out["findings"] = [f.code for f in diag.findings]
    out["wall_s"] = time.perf_counter() - t0
    out["cpu_s"] = _cpu() - c0
    out["rss_mb"] = (
        max(
            # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forked parent across
            # exec (the bench process that built the input)
            peak_rss_kib(),
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        / 1024
    )
    return out


def _run(python: str, kind: str, folder: Path, jobs: int, env_extra: dict[str, str]) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PPDIAG_NO_CACHE", None)
    env.update(env_extra)
    if kind != "hta":
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # the whole process as well: interpreter start-up, imports and exit included (the child's and
    # its workers' CPU, which the child's own clock does not see before its imports)
    t0 = time.perf_counter()
    k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [python, __file__, "--child", kind, str(folder), str(jobs)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    whole_s = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    res: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    res["whole_wall_s"] = whole_s
    res["whole_cpu_s"] = k1.ru_utime + k1.ru_stime - k0.ru_utime - k0.ru_stime
    return res


def _cli_pairs(
    folder: Path, cache_dir: Path, rounds: int = 3
) -> tuple[tuple[float, float], tuple[float, float], str]:
    """``ppdiag analyze FOLDER -q --json FILE`` as a user runs it, whole processes: with the caches
    off and warm (filled by one run first), alternating so that both see the same load; the best
    wall and the best CPU of ``rounds`` each, and the load average before the first."""
    env = {k: v for k, v in os.environ.items() if k != "PPDIAG_NO_CACHE"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PPDIAG_CACHE_DIR"] = str(cache_dir)
    out = cache_dir / "report.json"
    cmd = [sys.executable, "-m", "ppdiag", "analyze", str(folder), "-q", "--json", str(out)]

    def once(extra: dict[str, str]) -> tuple[float, float]:
        t0, k0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, env={**env, **extra}, check=True, capture_output=True)
        k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.perf_counter() - t0, k1.ru_utime + k1.ru_stime - k0.ru_utime - k0.ru_stime

    once({})  # fill
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    cold: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    for _ in range(rounds):
        cold.append(once({"PPDIAG_NO_CACHE": "1"}))
        warm.append(once({}))

    def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
        return min(w for w, _ in runs), min(c for _, c in runs)

    return best(cold), best(warm), load


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=float, default=62.0, help="raw JSON MB per rank")
    ap.add_argument("--dir", type=Path, help="an existing run directory (nothing is built)")
    ap.add_argument("--jobs", type=int, default=None, help="ppdiag processes (default: min(ranks, CPUs))")
    ap.add_argument("--hta-python", default=None, help="a Python that imports hta")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA (e.g. for hundreds of ranks)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, folder, jobs = a.child
        print(json.dumps(_child(kind, folder, int(jobs))))
        return 0
    tmp: Path | None = None
    if a.dir is not None:
        folder = a.dir
        n = len([p for p in folder.iterdir() if p.is_file()])
    else:
        sys.path.insert(0, str(HERE))
        from bench_parse import DEFAULT_SOURCE, build_run

        tmp = folder = Path(tempfile.mkdtemp(prefix="ppdiag-bench-hta-"))
        raw, disk = build_run(DEFAULT_SOURCE, folder, a.ranks, a.mb, True)
        n = a.ranks
        print(f"input: {n} ranks x {raw / n / 1e6:.0f} MB raw JSON ({disk / 1e6:.0f} MB gzip)")
    jobs = a.jobs or min(n, os.cpu_count() or 1)
    hta_py = a.hta_python or (sys.executable if importlib.util.find_spec("hta") else None)
    if a.no_hta:
        hta_py = None
    # as installed: bytecode compiled once, not in every child (see the docstring)
    compileall.compile_dir(str(REPO / "ppdiag"), quiet=1)
    cache_dir = Path(tempfile.mkdtemp(prefix="ppdiag-bench-hta-cache-"))
    try:
        res: dict[str, dict[str, Any]] = {}
        res["floor"] = _run(sys.executable, "floor", folder, jobs, {})
        res["ppdiag"] = _run(sys.executable, "ppdiag", folder, jobs, {"PPDIAG_NO_CACHE": "1"})
        res["fill"] = _run(sys.executable, "entry", folder, jobs, {"PPDIAG_CACHE_DIR": str(cache_dir)})
        res["hit"] = _run(sys.executable, "entry", folder, jobs, {"PPDIAG_CACHE_DIR": str(cache_dir)})
        cli = _cli_pairs(folder, cache_dir)
        if hta_py:
            res["hta"] = _run(hta_py, "hta", folder, jobs, {})
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    for name, label in (
        ("ppdiag", "ppdiag parse + analysis"),
        ("fill", "ppdiag, cache filling"),
        ("hit", "ppdiag, cache hit"),
    ):
        r = res[name]
        if "error" in r:
            print(f"{label}: failed ({r['error']})")
            continue
        what = (
            f"load {r['load_s']:.2f} s, analysis {r['analysis_s']:.2f} s"
            if "load_s" in r
            else ("served from the result cache" if r["served"] else "parsed, analysed, stored")
        )
        print(
            f"{label:32s} wall {r['wall_s']:6.2f} s  CPU {r['cpu_s']:6.2f} s  "
            f"({what}; imports {r['import_s']:.2f} s before)  peak RSS {r['rss_mb']:.0f} MB"
        )
    pp, hit, fl = res["ppdiag"], res["hit"], res["floor"]
    if "error" in fl:
        print(f"floor: failed ({fl['error']})")
    else:
        print(
            f"{f'floor ({jobs} processes)':32s} wall {fl['wall_s']:6.2f} s  CPU {fl['cpu_s']:6.2f} s  "
            f"(gunzip + one typed decode per file)  peak RSS {fl['rss_mb']:.0f} MB"
        )
        if "error" not in pp:
            print(
                f"ppdiag / floor: {pp['wall_s'] / fl['wall_s']:.2f}x wall, "
                f"{pp['cpu_s'] / fl['cpu_s']:.2f}x CPU (goal: <= 1.2x)"
            )
    if "error" not in hit and "error" not in pp:
        print(f"findings: {', '.join(pp['findings'])} (cache hit: {', '.join(hit['findings'])})")
    h = res.get("hta")
    if h is None:
        print("HTA: not measured (give --hta-python, a Python that imports hta)")
    elif "error" in h:
        print(f"HTA: failed ({h['error']})")
    else:
        print(
            f"{'HTA parse + temporal + idle':32s} wall {h['wall_s']:6.2f} s  CPU {h['cpu_s']:6.2f} s  "
            f"(parse {h['parse_s']:.2f} s; imports {h['import_s']:.2f} s before)  "
            f"peak RSS {h['rss_mb']:.0f} MB"
        )
        if "error" not in pp:
            print(
                f"HTA / ppdiag: {h['wall_s'] / pp['wall_s']:.1f}x wall, {h['cpu_s'] / pp['cpu_s']:.1f}x CPU "
                f"(cache hit: {h['wall_s'] / hit['wall_s']:.1f}x wall)"
            )
            print(
                f"whole processes (start-up and imports included): HTA {h['whole_wall_s']:.2f} s wall, "
                f"{h['whole_cpu_s']:.2f} s CPU; ppdiag {pp['whole_wall_s']:.2f} s, "
                f"{pp['whole_cpu_s']:.2f} s: "
                f"HTA / ppdiag {h['whole_wall_s'] / pp['whole_wall_s']:.1f}x wall, "
                f"{h['whole_cpu_s'] / pp['whole_cpu_s']:.1f}x CPU (goal: >= 10x)"
            )
    if "error" not in hit and "error" not in pp:
        print(
            f"warm re-run / cold, whole processes: {hit['whole_wall_s'] / pp['whole_wall_s']:.2f}x wall, "
            f"{hit['whole_cpu_s'] / pp['whole_cpu_s']:.2f}x CPU; work alone: "
            f"{hit['wall_s'] / pp['wall_s']:.2f}x wall, {hit['cpu_s'] / pp['cpu_s']:.2f}x CPU "
            "(goal: <= 0.35x wall)"
        )
    (cw, cc), (ww, wc), load = cli
    print(
        f"ppdiag analyze -q --json, whole processes, best of 3 (load average {load}): caches off "
        f"{cw:.2f} s wall, {cc:.2f} s CPU; warm {ww:.2f} s wall, {wc:.2f} s CPU: warm / cold "
        f"{ww / cw:.2f}x wall, {wc / cc:.2f}x CPU (goal: <= 0.35x wall)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
