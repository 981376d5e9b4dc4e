"""Cause-split accuracy on simulated runs: how far each cause lands from the counterfactual truth.

Every case is simulated (:mod:`ppsynth`), written to a temporary folder in each requested
way, analysed like a user's run, and compared per rank with the simulator's own counterfactuals
(``groundtruth.json``: the bubble at the mean stage cost with the normal transfer latency, every
other cause the growth of idle when its fault is added). One line per case and format:

* ``max``: the largest error of any cause on any rank, in % of the step, less the few-µs gaps
  between the kernels of one block (measured lost time the truth books apart, in any cause);
* ``loud``: findings above ``low`` other than PP001 / PP002 / PP008 (a healthy run has none);
* ``bubble``: measured / theoretical / balanced-simulation bubble ratio, %;
* then every cause off by 0.5 % of the step or more, with the rank where it is worst.

The last line counts the cases within 1 % and 2 % of the step and the quiet healthy ones.

Formats: ``kineto``, ``nsys``, ``kineto-bare`` (no comm args, ``record_param_comms`` or
``nccl:*`` titles) and ``nsys-bare`` (no NCCL payloads), ``-old`` for NCCL's <= 2.18 kernel names
(``kineto-old-bare``...).

    python benchmarks/bench_causes.py                        # healthy matrix + fault scenarios
    python benchmarks/bench_causes.py --set faults --formats kineto,nsys,nsys-old-bare
    python benchmarks/bench_causes.py --set healthy --pp 4 --only interleaved
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from ablate import write_variant  # noqa: E402

from ppdiag.api import Options, diagnose  # noqa: E402
from ppdiag.report_types import Cause  # noqa: E402
from ppdiag.simulate.schedules import SCHEDULES  # noqa: E402
from ppsynth import faults as F  # noqa: E402
from ppsynth.scenario import make_scenario  # noqa: E402

QUIET = {"PP001", "PP002", "PP008"}


def healthy_cases(pps: list[int]) -> dict[str, dict[str, Any]]:
    """Every simulated schedule, balanced, no fault (M = 2P; split-backward schedules with a W
    block as long as the forward and pipeline labels)."""
    out: dict[str, dict[str, Any]] = {}
    for s in SCHEDULES:
        for p in pps:
            kw: dict[str, Any] = dict(schedule=s, pp=p, microbatches=2 * p)
            if s == "interleaved_1f1b":
                kw["virtual"] = 2
            if s in ("zero_bubble", "zbv", "dualpipev"):
                kw.update(bwd_ms=1.0, wgrad_ms=1.0, annotations="pp")
            out[f"ok-{s}-P{p}"] = kw
    return out


def fault_cases() -> dict[str, dict[str, Any]]:
    """One fault of each kind at P=4, M=8 (1F1B unless named), plus data parallelism, two slow
    senders (most links slow) and a slow direction at P=2 (half the links slow)."""
    base: dict[str, Any] = dict(schedule="1f1b", pp=4, microbatches=8)
    cases: dict[str, dict[str, Any]] = {
        "slow_stage_x2": dict(faults=[F.SlowStage(2, 2.0)]),
        "slow_link": dict(faults=[F.SlowLink(1, delay_ms=0.5)]),
        "slow_link_x25": dict(faults=[F.SlowLink(1, factor=25.0)]),
        # two slow senders: 4 of the 6 links are slow, and must not set the fault-free latency
        "slow_links_2_ranks": dict(faults=[F.SlowLink(1, delay_ms=0.5), F.SlowLink(2, delay_ms=0.5)]),
        "slow_link_P2": dict(pp=2, microbatches=4, faults=[F.SlowLink(0, delay_ms=0.5)]),
        "host_stall": dict(faults=[F.HostStall(1, 0.5)]),
        "exposed_allreduce_dp2": dict(dp=2, faults=[F.ExposedAllReduce(3.0)]),
        "slow_stage_dp2": dict(dp=2, faults=[F.SlowStage(2, 2.0)]),
        "interleaved_slow_stage": dict(schedule="interleaved_1f1b", virtual=2, faults=[F.SlowStage(1, 2.0)]),
        "interleaved_p2p_0.3ms": dict(schedule="interleaved_1f1b", virtual=2, p2p_ms=0.3),
    }
    return {k: {**base, **v} for k, v in cases.items()}


def measure(kw: dict[str, Any], fmt: str, out: Path) -> dict[str, Any]:
    """Analyse one case written as ``fmt``: the worst error per cause (% of step, signed) and
    the rank where it is, the loud findings, the top finding and the bubble ratios."""
    kw = dict(kw)
    run = make_scenario(steps=kw.pop("steps", 2), clock_skew_ms=kw.pop("clock_skew_ms", 5.0), **kw)
    rep = diagnose([write_variant(run, fmt, out)], Options()).result
    truth = run.truth
    worst = {k: (0.0, -1) for k in Cause}
    for r in rep.ranks:
        t = truth["ranks"][str(r.rank)]
        for k in Cause:
            diff = r.lost_ms[k] - float(t["causes_ms"].get(k, 0.0))
            # the kernel gaps may land in any cause: they widen every comparison by their size
            err = 100 * math.copysign(max(abs(diff) - t["kernel_gaps_ms"], 0.0), diff) / t["step_ms"]
            if abs(err) > abs(worst[k][0]):
                worst[k] = (err, r.rank)
    b = rep.bubble
    return {
        "max": max(abs(e) for e, _ in worst.values()),
        "worst": worst,
        "loud": [
            f"{f.code}:{f.severity}"
            for f in rep.findings
            if f.severity in ("high", "medium") and f.code not in QUIET
        ],
        "top": rep.findings[0].code if rep.findings else "-",
        "bubble": (b.measured_ratio, b.theoretical_ratio, truth["bubble"]["balanced_sim_ratio"]),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--set", choices=["all", "healthy", "faults"], default="all")
    ap.add_argument("--formats", default="kineto,nsys", help="comma-separated (see the module docstring)")
    ap.add_argument("--pp", default="2,4,8", help="stage counts of the healthy matrix")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    a = ap.parse_args(argv)
    cases: dict[str, dict[str, Any]] = {}
    if a.set in ("all", "healthy"):
        cases.update(healthy_cases([int(x) for x in a.pp.split(",")]))
    if a.set in ("all", "faults"):
        cases.update(fault_cases())
    work = Path(tempfile.mkdtemp(prefix="ppdiag-bench-causes-"))
    results: list[tuple[str, dict[str, Any]]] = []
    try:
        for i, (name, kw) in enumerate(cases.items()):
            if a.only and a.only not in name:
                continue
            for fmt in a.formats.split(","):
                t0 = time.perf_counter()
                m = measure(kw, fmt, work / f"{i}-{fmt}")
                results.append((name, m))
                off = " ".join(f"{k}={e:+.1f}@{r}" for k, (e, r) in m["worst"].items() if abs(e) >= 0.5)
                print(
                    f"{name:26s} {fmt:15s} max={m['max']:5.2f}% top={m['top']} "
                    f"loud={','.join(m['loud']) or '-'} bubble={'/'.join(_pct(x) for x in m['bubble'])} "
                    f"{off} [{time.perf_counter() - t0:.1f}s]",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(results)
    ok1 = sum(m["max"] <= 1.0 for _, m in results)
    ok2 = sum(m["max"] <= 2.0 for _, m in results)
    healthy = [m for name, m in results if name.startswith("ok-")]
    quiet = sum(not m["loud"] for m in healthy)
    print(
        f"{n} analyses: {ok1} within 1 % of the step, {ok2} within 2 %; "
        f"{quiet} of {len(healthy)} healthy quiet"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
