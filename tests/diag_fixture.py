"""Builders of realistic :class:`~ppdiag.diagnosis.Diagnosis` objects for the report tests.

``build_pipeline_diagnosis`` simulates a pipeline-parallel run event by event (1F1B or GPipe,
per-stage forward/backward costs, p2p latency, an injected host stall and an optional slow link,
a closing all-reduce and optimizer step), emits per-rank columnar timelines on *per-rank clocks*
(every rank has its own clock offset), a gap table whose causes follow docs/json.md "Time accounting" and
a JSON report computed from the simulated times. It also returns the ground truth (every F/B block on the
common clock) so tests can check what the reports draw against what was simulated, not against
the reports' own output.

``base_report`` is a hand-written JSON report with round numbers for the gate and diff tests.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from report_fill import complete, typed

from ppdiag.analysis import AnalysisContext, Analyzed
from ppdiag.diagnosis import Diagnosis, GapTable, StepWindow
from ppdiag.model import Direction, Intervals, Kind, NameTable, Phase, RangeKind, Ranges, RankTimeline, Run
from ppdiag.report_types import Cause

US = 1000
BASE_NS = 1_700_000_000_000_000_000  # an epoch-like absolute clock, as Kineto gives
EVIL = "<script>alert(1)</script>"

FWD_KERNELS = (
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn",
    "flash_fwd_kernel",
    "vectorized_elementwise_kernel<GeluCUDAKernel>",
    "layer_norm_kernel",
)
BWD_KERNELS = (
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_nt",
    "flash_bwd_dq_dk_dv_loop_kernel",
    "elementwise_kernel<GeluBackwardCUDAKernel>",
    "layer_norm_grad_kernel",
)
KERNEL_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
SEND_KERNEL = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
ALLREDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
OPTIM_KERNEL = "multi_tensor_apply_kernel<AdamFunctor>"
COMPUTE_STREAM = 7
COMM_STREAM = 20


@dataclass
class Spec:
    """What to simulate. Times in µs."""

    pp: int = 4
    microbatches: int = 8
    steps: int = 3
    fwd_us: tuple[int, ...] = (2000, 2000, 3000, 2000)
    bwd_ratio: float = 2.0
    p2p_us: int = 150
    schedule: str = "1f1b"  # or "gpipe"
    host_stall: tuple[int, int, int] | None = (2, 1, 4000)  # rank, step index, µs before its 3rd op
    slow_link: tuple[int, int, int, int] | None = (2, 2, 3, 2500)  # sender stage, step, mb, extra µs
    clock_offsets_us: tuple[int, ...] = (0, 1500, -800, 3000)
    allreduce_us: int = 600
    optim_us: int = 300
    step_gap_us: int = 400
    evil_name: bool = True
    labelled: bool = True
    jitter: float = 0.04  # relative spread of each block's duration (real kernels vary)
    seed: int = 7  # annotate mb/phase on the intervals (as PP labels would)


@dataclass
class Truth:
    """Ground truth of a simulated run (all times on the common clock, ns)."""

    # one row per F/B block: rank, step index, phase ("F"/"B"), mb, start, end
    blocks: list[tuple[int, int, str, int, int, int]] = field(default_factory=list)
    step_windows: list[tuple[int, int]] = field(default_factory=list)  # per step index
    slowest_stage: int = -1
    kernels_total: int = 0


def _sequence(schedule: str, s: int, p: int, m: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(p - 1 - s, m)
    seq = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        seq += [("F", warm + i), ("B", i)]
    seq += [("B", i) for i in range(m - warm, m)]
    return seq


def build_pipeline_diagnosis(spec: Spec | None = None) -> tuple[Analyzed, Truth]:
    """Simulate ``spec`` and return the diagnosis the analysis would produce, plus the truth."""
    sp = spec or Spec()
    p, m = sp.pp, sp.microbatches
    fwd = [int(x) * US for x in sp.fwd_us[:p]]
    bwd = [round(x * sp.bwd_ratio) for x in fwd]
    lat = sp.p2p_us * US
    slowest = int(np.argmax(np.array(fwd) + np.array(bwd))) if len(set(fwd)) > 1 else -1
    truth = Truth(slowest_stage=slowest)
    rng = np.random.default_rng(sp.seed)

    nt = [NameTable() for _ in range(p)]
    cols: list[dict[str, list[int]]] = [
        {
            c: []
            for c in ("start", "end", "stream", "kind", "name", "phase", "mb", "peer", "direction", "bytes")
        }
        for _ in range(p)
    ]
    gaps: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(p)]
    ranges: list[list[tuple[int, int, int, int]]] = [[] for _ in range(p)]
    windows: list[StepWindow] = []

    def emit(
        r: int,
        a: int,
        b: int,
        stream: int,
        kind: Kind,
        name: str,
        phase: Phase,
        mb: int,
        peer: int = -1,
        direction: Direction = Direction.NONE,
        nbytes: int = -1,
    ) -> None:
        c = cols[r]
        c["start"].append(a)
        c["end"].append(b)
        c["stream"].append(stream)
        c["kind"].append(int(kind))
        c["name"].append(nt[r].id(name))
        c["phase"].append(int(phase) if sp.labelled or phase == Phase.OPTIM else int(Phase.UNKNOWN))
        c["mb"].append(mb if sp.labelled else -1)
        c["peer"].append(peer)
        c["direction"].append(int(direction))
        c["bytes"].append(nbytes)

    def gap(r: int, a: int, b: int, cause: Cause, blame: int, step: int) -> None:
        if b > a:
            gaps[r].append((a, b, cause.code, blame, step))

    t = BASE_NS
    for k in range(sp.steps):
        t0 = t
        seqs = [_sequence(sp.schedule, s, p, m) for s in range(p)]
        ptr = [0] * p
        free = [t0] * p
        first = [True] * p
        fend: list[dict[int, int]] = [{} for _ in range(p)]
        bend: list[dict[int, int]] = [{} for _ in range(p)]
        ftaint: list[dict[int, tuple[Cause, int, int] | None]] = [{} for _ in range(p)]
        btaint: list[dict[int, tuple[Cause, int, int] | None]] = [{} for _ in range(p)]
        todo = sum(len(x) for x in seqs)
        while todo:
            moved = False
            for s in range(p):
                while ptr[s] < len(seqs[s]):
                    ph, mb = seqs[s][ptr[s]]
                    src = s - 1 if ph == "F" else s + 1
                    dep_end: int | None = None
                    dep_taint: tuple[Cause, int, int] | None = None
                    if 0 <= src < p:
                        table = fend if ph == "F" else bend
                        if mb not in table[src]:
                            break
                        dep_end = table[src][mb]
                        dep_taint = (ftaint if ph == "F" else btaint)[src][mb]
                    taint: tuple[Cause, int, int] | None = None
                    ready = free[s]
                    if dep_end is not None:
                        extra = 0
                        if (
                            sp.slow_link
                            and ph == "F"
                            and sp.slow_link[0] == src
                            and sp.slow_link[1] == k
                            and sp.slow_link[2] == mb
                        ):
                            extra = sp.slow_link[3] * US
                        arrive = dep_end + lat + extra
                        # the producer's send kernel and this rank's recv kernel (spins while waiting)
                        emit(
                            src,
                            dep_end,
                            dep_end + lat + extra,
                            COMM_STREAM,
                            Kind.P2P,
                            SEND_KERNEL,
                            Phase.FWD if ph == "F" else Phase.BWD,
                            mb,
                            s,
                            Direction.SEND,
                            1 << 22,
                        )
                        emit(
                            s,
                            min(free[s], dep_end),
                            arrive,
                            COMM_STREAM,
                            Kind.P2P,
                            SEND_KERNEL,
                            Phase.FWD if ph == "F" else Phase.BWD,
                            mb,
                            src,
                            Direction.RECV,
                            1 << 22,
                        )
                        if arrive > free[s]:
                            a, b = free[s], arrive
                            if extra:
                                # the data arrived late although the producer had sent it
                                gap(s, max(a, b - extra), b, Cause.COMM_WAIT, src, k)
                                taint = (Cause.COMM_WAIT, src, min(extra, b - a))
                                b = max(a, b - extra)
                            if dep_taint is not None and b > a:
                                # a late producer passes its root cause on, for the delay it caused
                                cut_at = max(a, b - dep_taint[2])
                                gap(s, cut_at, b, dep_taint[0], dep_taint[1], k)
                                taint = taint or (dep_taint[0], dep_taint[1], b - cut_at)
                                b = cut_at
                            if first[s]:
                                gap(s, a, b, Cause.BUBBLE, -1, k)
                            elif slowest >= 0:
                                gap(s, a, b, Cause.IMBALANCE, slowest, k)
                            else:
                                gap(s, a, b, Cause.BUBBLE, -1, k)
                            ready = arrive
                    start = ready
                    if sp.host_stall and sp.host_stall[0] == s and sp.host_stall[1] == k and ptr[s] == 2:
                        stall = sp.host_stall[2] * US
                        gap(s, ready, ready + stall, Cause.HOST, s, k)
                        start = ready + stall
                        taint = (Cause.HOST, s, stall)
                    dur = fwd[s] if ph == "F" else bwd[s]
                    if sp.jitter:
                        dur = int(dur * (1.0 + sp.jitter * float(np.clip(rng.standard_normal(), -2.5, 2.5))))
                    end = start + dur
                    # the block as a few back-to-back kernels
                    names = FWD_KERNELS if ph == "F" else BWD_KERNELS
                    cut = start
                    for i, w in enumerate(KERNEL_WEIGHTS):
                        nxt = end if i == len(KERNEL_WEIGHTS) - 1 else cut + int(dur * w)
                        nm = names[i]
                        if sp.evil_name and s == 1 and ph == "F" and i == 0:
                            nm = EVIL
                        emit(
                            s,
                            cut,
                            nxt,
                            COMPUTE_STREAM,
                            Kind.COMPUTE,
                            nm,
                            Phase.FWD if ph == "F" else Phase.BWD,
                            mb,
                        )
                        cut = nxt
                    truth.blocks.append((s, k, ph, mb, start, end))
                    (fend if ph == "F" else bend)[s][mb] = end
                    (ftaint if ph == "F" else btaint)[s][mb] = taint
                    free[s] = end
                    first[s] = False
                    ptr[s] += 1
                    todo -= 1
                    moved = True
            assert moved, "schedule deadlock"
        # closing all-reduce over all ranks (grad norm / embedding sync), then the optimizer
        last = max(free)
        for s in range(p):
            gap(s, free[s], last, Cause.BUBBLE, -1, k)  # cool-down
            gap(s, last, last + sp.allreduce_us * US, Cause.EXPOSED_COMM, -1, k)
            emit(
                s,
                free[s],
                last + sp.allreduce_us * US,
                COMM_STREAM,
                Kind.COLLECTIVE,
                ALLREDUCE_KERNEL,
                Phase.OPTIM,
                -1,
                -1,
                Direction.NONE,
                1 << 24,
            )
            a = last + sp.allreduce_us * US
            emit(s, a, a + sp.optim_us * US, COMPUTE_STREAM, Kind.COMPUTE, OPTIM_KERNEL, Phase.OPTIM, -1)
        t_end = last + (sp.allreduce_us + sp.optim_us) * US
        for s in range(p):
            windows.append(StepWindow(rank=s, index=k, number=5 + k, start=t0, end=t_end))
            ranges[s].append((t0, t_end, nt[s].id(f"ProfilerStep#{5 + k}"), 5 + k))
        truth.step_windows.append((t0, t_end))
        t = t_end + sp.step_gap_us * US

    offsets = [int(sp.clock_offsets_us[r % len(sp.clock_offsets_us)]) * US for r in range(p)]
    ranks: list[RankTimeline] = []
    gap_tables: dict[int, GapTable] = {}
    for r in range(p):
        c = cols[r]
        n = len(c["start"])
        raw = {k2: np.asarray(v, dtype=np.int64) for k2, v in c.items()}
        raw["start"] = raw["start"] - offsets[r]  # the rank's own clock
        raw["end"] = raw["end"] - offsets[r]
        iv = Intervals.from_columns(n, raw).sorted()
        rg = ranges[r]
        rtab = Ranges.from_columns(
            len(rg),
            {
                "start": [x[0] - offsets[r] for x in rg],
                "end": [x[1] - offsets[r] for x in rg],
                "kind": [int(RangeKind.STEP)] * len(rg),
                "name": [x[2] for x in rg],
                "num": [x[3] for x in rg],
            },
        )
        ranks.append(
            RankTimeline(
                rank=r,
                source=f"rank{r}.pt.trace.json.gz",
                format="kineto",
                names=nt[r].names,
                intervals=iv,
                ranges=rtab,
                world_size=p,
                backend="nccl",
                device=f"cuda:{r}",
                clock_offset_ns=offsets[r],
                events_total=n,
            )
        )
        g = sorted(gaps[r])
        gap_tables[r] = GapTable(
            start=np.array([x[0] for x in g], np.int64),
            end=np.array([x[1] for x in g], np.int64),
            cause=np.array([x[2] for x in g], np.int8),
            blame=np.array([x[3] for x in g], np.int32),
            step=np.array([x[4] for x in g], np.int32),
        )
        truth.kernels_total += n
    run = Run(ranks=ranks, format="kineto", warnings=["rank 3: trace truncated, 12 events lost <b>bold</b>"])
    report = _pipeline_report(sp, truth, gap_tables, ranks, windows)
    diag = Diagnosis(
        run=run,
        result=typed(report),
        steps=windows,
        gaps=gap_tables,
        context=AnalysisContext(stage_of_rank={r: r for r in range(p)}),
    )
    return diag, truth


def _stats(x: list[float]) -> dict[str, float]:
    a = np.asarray(x, dtype=float)
    return {
        "mean": round(float(a.mean()), 4),
        "p50": round(float(np.percentile(a, 50)), 4),
        "p95": round(float(np.percentile(a, 95)), 4),
    }


def _pipeline_report(
    sp: Spec, truth: Truth, gaps: dict[int, GapTable], ranks: list[RankTimeline], windows: list[StepWindow]
) -> dict[str, Any]:
    p, m, nsteps = sp.pp, sp.microbatches, sp.steps
    durs = np.array([(b - a) / 1e6 for a, b in truth.step_windows])
    step_mean = float(durs.mean())
    rank_rows: list[dict[str, Any]] = []
    for r in range(p):
        g = gaps[r]
        lost: dict[str, float] = {
            c: float(((g.end - g.start)[g.cause == i]).sum()) / 1e6 / nsteps for i, c in enumerate(Cause)
        }
        comp = sum(e - s for (rr, _k, _ph, _mb, s, e) in truth.blocks if rr == r) / 1e6 / nsteps
        comp += sp.optim_us / 1000
        rank_rows.append(
            {
                "rank": r,
                "stage": r,
                "step_ms": round(step_mean, 4),
                "compute_ms": round(comp, 4),
                "exposed_p2p_ms": round(lost["comm_wait"], 4),
                "exposed_collective_ms": round(lost["exposed_comm"], 4),
                "idle_ms": round(step_mean - comp - lost["comm_wait"] - lost["exposed_comm"], 4),
                "lost_ms": {c: round(v, 4) for c, v in lost.items()},
            }
        )
    stages: list[dict[str, Any]] = []
    for s in range(p):
        f = [(e - a) / 1e6 for (rr, _k, ph, _mb, a, e) in truth.blocks if rr == s and ph == "F"]
        b = [(e - a) / 1e6 for (rr, _k, ph, _mb, a, e) in truth.blocks if rr == s and ph == "B"]
        stages.append(
            {
                "stage": s,
                "ranks": [s],
                "fwd_ms": _stats(f),
                "bwd_ms": _stats(b),
                "wgrad_ms": None,
                "compute_ms": rank_rows[s]["compute_ms"],
                "lost_ms": dict(rank_rows[s]["lost_ms"]),
                "fwd_samples_ms": [round(x, 4) for x in f],
                "bwd_samples_ms": [round(x, 4) for x in b],
            }
        )
    lost_ms: dict[str, float] = {
        c: round(float(np.mean([rr["lost_ms"][c] for rr in rank_rows])), 4) for c in Cause
    }
    compute = float(np.mean([rr["compute_ms"] for rr in rank_rows]))
    findings: list[dict[str, Any]] = []
    if truth.slowest_stage >= 0:
        s = truth.slowest_stage
        mean_c = float(np.mean([st["compute_ms"] for st in stages]))
        findings.append(
            {
                "code": "PP003",
                "cause": "imbalance",
                "title": f"Stage {s} is the slowest stage",
                "severity": "high",
                "stages": [s],
                "ranks": [s],
                "gain_ms": round(lost_ms["imbalance"], 3),
                "gain_pct": round(100 * lost_ms["imbalance"] / step_mean, 2),
                "evidence": {
                    "stage_compute_ms": round(stages[s]["compute_ms"], 3),
                    "mean_stage_compute_ms": round(mean_c, 3),
                    "top_kernel": EVIL if sp.evil_name else FWD_KERNELS[0],
                },
                "fixes": [
                    f"Move about {max(1, round(100 * (stages[s]['compute_ms'] / mean_c - 1)))}% "
                    f"of stage {s}'s "
                    "layers to its neighbours",
                    "Use per-block costs to choose the split, not layer counts",
                ],
            }
        )
    theo = (p - 1) / (m + p - 1)
    findings.append(
        {
            "code": "PP001",
            "cause": "bubble",
            "title": f"Pipeline bubble with M={m} for P={p}",
            "severity": "medium",
            "stages": list(range(p)),
            "ranks": list(range(p)),
            "gain_ms": round(lost_ms["bubble"] * 0.5, 3),
            "gain_pct": round(50 * lost_ms["bubble"] / step_mean, 2),
            "evidence": {
                "bubble_ratio": round(lost_ms["bubble"] / step_mean, 4),
                "theoretical": round(theo, 4),
            },
            "fixes": [
                f"Raise the micro-batch count to {2 * m} (gradient accumulation)",
                "Try the interleaved 1F1B schedule on fast links",
            ],
        }
    )
    if sp.host_stall:
        findings.append(
            {
                "code": "PP006",
                "cause": "host",
                "title": f"Rank {sp.host_stall[0]} starved its GPU",
                "severity": "low",
                "stages": [sp.host_stall[0]],
                "ranks": [sp.host_stall[0]],
                "gain_ms": round(lost_ms["host"], 3),
                "gain_pct": round(100 * lost_ms["host"] / step_mean, 2),
                "evidence": {"stall_ms": sp.host_stall[2] / 1000, "step": 5 + sp.host_stall[1]},
                "fixes": [
                    "Capture the step with CUDA graphs",
                    "Remove host synchronisations (.item(), print)",
                ],
            }
        )
    findings.sort(key=lambda d: -d["gain_ms"])
    return {
        "schema_version": 1,
        "tool": {"name": "ppdiag", "version": "0.1.0"},
        "run": {
            "world_size": p,
            "ranks": list(range(p)),
            "pp": p,
            "stage_map": {str(s): s for s in range(p)},
            "virtual_stages": 1,
            "schedule": sp.schedule,
            "microbatches": m,
            "steps": [5 + k for k in range(nsteps)],
            "clock_residual_us": 3.2,
            "format": "kineto",
            "warnings": ["rank 3: trace truncated, 12 events lost <b>bold</b>"],
        },
        "summary": {
            "step_ms": round(float(np.median(durs)), 4),
            "step_p95_ms": round(float(np.percentile(durs, 95)), 4),
            "compute_ms": round(compute, 4),
            "lost_ratio": round(sum(lost_ms.values()) / step_mean, 4),
            "lost_ms": lost_ms,
            # what the analysis writes: the slowest stage, and its compute over the mean stage's
            "slowest_stage": truth.slowest_stage if truth.slowest_stage >= 0 else None,
            "stage_ratio": round(max(c) / float(np.mean(c)), 4)
            if (c := [st["compute_ms"] for st in stages])
            else None,
        },
        "bubble": {
            "measured_ratio": round(lost_ms["bubble"] / step_mean, 4),
            "theoretical_ratio": round(theo, 4),
        },
        "stages": stages,
        "ranks": rank_rows,
        "findings": findings,
        "whatif": [
            {
                "scenario": f"M={2 * m}",
                "step_ms": round(step_mean * 0.85, 2),
                "bubble_ratio": round((p - 1) / (2 * m + p - 1), 4),
                "speedup": round(1 / 0.85, 3),
                "note": "same schedule",
            },
            {
                "scenario": "rebalance stages",
                "step_ms": round(step_mean * 0.9, 2),
                "bubble_ratio": None,
                "speedup": round(1 / 0.9, 3),
                "note": "even per-stage cost",
            },
        ],
    }


def build_nopp_diagnosis(n_ranks: int = 2, steps: int = 3) -> Analyzed:
    """A data-parallel run without pipeline parallelism (pp 1, schedule "none")."""
    per_rank: list[RankTimeline] = []
    gap_tables: dict[int, GapTable] = {}
    windows: list[StepWindow] = []
    rows: list[dict[str, Any]] = []
    for r in range(n_ranks):
        nt = NameTable()
        c: dict[str, list[int]] = {k: [] for k in ("start", "end", "stream", "kind", "name", "phase")}
        g: list[tuple[int, int, int, int, int]] = []
        t = BASE_NS
        for k in range(steps):
            t0 = t
            # a data-loader stall, then compute, then the gradient all-reduce left exposed
            stall = (3000 if (r == 1 and k == 1) else 500) * US
            g.append((t0, t0 + stall, Cause.HOST.code, r, k))
            a = t0 + stall
            for nm, dur, ph in (("sgemm_fwd", 8000, Phase.FWD), ("sgemm_bwd", 16000, Phase.BWD)):
                c["start"].append(a)
                c["end"].append(a + dur * US)
                c["stream"].append(COMPUTE_STREAM)
                c["kind"].append(int(Kind.COMPUTE))
                c["name"].append(nt.id(nm))
                c["phase"].append(int(ph))
                a += dur * US
            c["start"].append(a)
            c["end"].append(a + 2000 * US)
            c["stream"].append(COMM_STREAM)
            c["kind"].append(int(Kind.COLLECTIVE))
            c["name"].append(nt.id(ALLREDUCE_KERNEL))
            c["phase"].append(int(Phase.OPTIM))
            g.append((a, a + 2000 * US, Cause.EXPOSED_COMM.code, -1, k))
            end = a + 2000 * US
            windows.append(StepWindow(rank=r, index=k, number=k, start=t0, end=end))
            t = t0 + 30_000 * US
        n = len(c["start"])
        iv = Intervals.from_columns(n, {kk: np.asarray(v) for kk, v in c.items()})
        per_rank.append(
            RankTimeline(
                rank=r,
                source=f"rank{r}.json",
                format="kineto",
                names=nt.names,
                intervals=iv,
                ranges=Ranges.empty(),
                world_size=n_ranks,
            )
        )
        gap_tables[r] = GapTable(
            start=np.array([x[0] for x in g], np.int64),
            end=np.array([x[1] for x in g], np.int64),
            cause=np.array([x[2] for x in g], np.int8),
            blame=np.array([x[3] for x in g], np.int32),
            step=np.array([x[4] for x in g], np.int32),
        )
        host = sum(x[1] - x[0] for x in g if x[2] == Cause.HOST.code) / 1e6 / steps
        lost: dict[str, float] = {kk: 0.0 for kk in Cause}
        lost["host"] = round(host, 4)
        lost["exposed_comm"] = 2.0
        step_ms = 24.0 + 2.0 + host
        rows.append(
            {
                "rank": r,
                "stage": None,
                "step_ms": round(step_ms, 4),
                "compute_ms": 24.0,
                "exposed_p2p_ms": 0.0,
                "exposed_collective_ms": 2.0,
                "idle_ms": round(host, 4),
                "lost_ms": lost,
            }
        )
    lost_ms: dict[str, float] = {
        kk: round(float(np.mean([rr["lost_ms"][kk] for rr in rows])), 4) for kk in Cause
    }
    step_ms = float(np.mean([rr["step_ms"] for rr in rows]))
    report: dict[str, Any] = {
        "schema_version": 1,
        "tool": {"name": "ppdiag", "version": "0.1.0"},
        "run": {
            "world_size": n_ranks,
            "ranks": list(range(n_ranks)),
            "pp": 1,
            "stage_map": {},
            "virtual_stages": 1,
            "schedule": "none",
            "microbatches": None,
            "steps": list(range(steps)),
            "clock_residual_us": None,
            "format": "kineto",
            "warnings": [],
        },
        "summary": {
            "step_ms": round(step_ms, 4),
            "step_p95_ms": round(step_ms * 1.05, 4),
            "compute_ms": 24.0,
            "lost_ratio": round(sum(lost_ms.values()) / step_ms, 4),
            "lost_ms": lost_ms,
        },
        "bubble": {"measured_ratio": None, "theoretical_ratio": None},
        "stages": [],
        "ranks": rows,
        "findings": [
            {
                "code": "PP006",
                "cause": "host",
                "title": "Data loading stalls the GPU",
                "severity": "medium",
                "stages": [],
                "ranks": [1],
                "gain_ms": 1.0,
                "gain_pct": 3.5,
                "evidence": {},
                "fixes": ["More data loader workers"],
            }
        ],
        "whatif": [],
    }
    run = Run(ranks=per_rank, format="kineto")
    return Diagnosis(
        run=run,
        result=typed(report),
        steps=windows,
        gaps=gap_tables,
    )


def base_report(**over: Any) -> dict[str, Any]:
    """A JSON report with round, hand-checkable numbers (P=4, M=8, 1F1B).

    Stage compute 30/30/40/30 ms → stage ratio 40/32.5; step 100 ms, p95 110 ms; lost 30 ms of which
    comm_wait averages 2 ms (2, 4, 1, 1 over the ranks); bubble measured 0.30 vs theoretical 3/11.
    ``over`` replaces top-level sections (deep-copied).
    """
    lost = {
        "bubble": 20.0,
        "imbalance": 6.0,
        "comm_wait": 2.0,
        "exposed_comm": 1.0,
        "host": 1.0,
        "exposed_copy": 0.0,
        "unexplained": 0.0,
    }
    cw = [2.0, 4.0, 1.0, 1.0]
    comp = [30.0, 30.0, 40.0, 30.0]
    ranks: list[dict[str, Any]] = []
    for r in range(4):
        lr = dict(lost)
        lr["comm_wait"] = cw[r]
        ranks.append(
            {
                "rank": r,
                "stage": r,
                "step_ms": 100.0,
                "compute_ms": comp[r],
                "exposed_p2p_ms": cw[r],
                "exposed_collective_ms": 1.0,
                "idle_ms": 27.0,
                "lost_ms": lr,
            }
        )
    stages = [
        {
            "stage": s,
            "ranks": [s],
            "fwd_ms": {"mean": comp[s] / 24, "p50": comp[s] / 24, "p95": comp[s] / 24},
            "bwd_ms": {"mean": comp[s] / 12, "p50": comp[s] / 12, "p95": comp[s] / 12},
            "wgrad_ms": None,
            "compute_ms": comp[s],
            "lost_ms": dict(ranks[s]["lost_ms"]),
            "fwd_samples_ms": [comp[s] / 24] * 8,
            "bwd_samples_ms": [comp[s] / 12] * 8,
        }
        for s in range(4)
    ]
    rep: dict[str, Any] = {
        "schema_version": 1,
        "tool": {"name": "ppdiag", "version": "0.1.0"},
        "run": {
            "world_size": 4,
            "ranks": [0, 1, 2, 3],
            "pp": 4,
            "stage_map": {"0": 0, "1": 1, "2": 2, "3": 3},
            "virtual_stages": 1,
            "schedule": "1f1b",
            "microbatches": 8,
            "steps": [2, 3, 4],
            "clock_residual_us": 1.0,
            "format": "kineto",
            "warnings": [],
        },
        "summary": {
            "step_ms": 100.0,
            "step_p95_ms": 110.0,
            "compute_ms": 70.0,
            "lost_ratio": 0.30,
            "lost_ms": lost,
            # as the analysis writes them: stage 2's compute over the mean stage's (40 / 32.5)
            "slowest_stage": 2,
            "stage_ratio": 40.0 / 32.5,
        },
        "bubble": {"measured_ratio": 0.30, "theoretical_ratio": 3 / 11},
        "stages": stages,
        "ranks": ranks,
        "findings": [
            {
                "code": "PP003",
                "cause": "imbalance",
                "title": "Stage 2 is the slowest stage",
                "severity": "high",
                "stages": [2],
                "ranks": [2],
                "gain_ms": 6.0,
                "gain_pct": 6.0,
                "evidence": {"ratio": 1.23},
                "fixes": ["Move layers off stage 2"],
            },
            {
                "code": "PP001",
                "cause": "bubble",
                "title": "Bubble with M=8 for P=4",
                "severity": "medium",
                "stages": [0, 1, 2, 3],
                "ranks": [0, 1, 2, 3],
                "gain_ms": 5.0,
                "gain_pct": 5.0,
                "evidence": {},
                "fixes": ["Raise M to 16"],
            },
        ],
        "whatif": [],
    }
    for k, v in over.items():
        rep[k] = copy.deepcopy(v)
    # every field of the report's types: the file a real analysis writes has them all
    return complete(rep)
