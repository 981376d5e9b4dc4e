"""Ground truth of a synthetic pipeline scenario: the ladder of simulations per step whose
differences are the lost time per cause, and the ``groundtruth.json`` object (the definitions are in
:mod:`ppsynth.scenario`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ppdiag.model.timeline import Kind
from ppdiag.simulate import SimConfig, SimResult, closed_form_bubble, simulate
from ppdiag.simulate.schedules import canonical_schedule, default_virtual
from ppsynth.faults import (
    CommOnCompute,
    ExposedAllReduce,
    HostStall,
    LateReplica,
    SlowLink,
    SlowStage,
    SlowStep,
    SlowWorker,
    fault_json,
)
from ppsynth.run import SynthRun
from ppsynth.scenario_params import MS, TRUTH_CAUSES, US, ScenarioParams, Topo, ns, per_stage

GROUNDTRUTH_SCHEMA = "ppdiag-synth-groundtruth/1"


@dataclass
class Ladder:
    """The simulations of one step whose differences give the truth."""

    s0: SimResult
    s1: SimResult
    steps: list[tuple[str, SimResult]] = field(default_factory=list)

    @property
    def full(self) -> SimResult:
        return self.steps[-1][1] if self.steps else self.s1


def ladder(prm: ScenarioParams, step: int) -> Ladder:
    """S0, S1 and the cumulative simulations of one step, each tagged with its cause."""
    pure, fwd, bwd, wgr = _measured_config(prm)
    p2p = ns(prm.p2p_ms)

    def mean(xs: list[int]) -> list[int]:
        return [round(sum(xs) / len(xs))] * len(xs)

    s0 = simulate(pure.replace(fwd_ns=mean(fwd), bwd_ns=mean(bwd), wgrad_ns=mean(wgr)))
    lad = Ladder(s0, simulate(pure))
    # then, in the order of docs/json.md "Time accounting": slow links, host, exposed communication
    link = [0] * prm.pp
    for f in prm.faults:
        if isinstance(f, SlowLink):
            link[f.rank] += ns(f.delay_ms) + round(p2p * (f.factor - 1.0))
    cfg = pure
    if any(link):
        cfg = cfg.replace(link_delay_ns=list(link))
        lad.steps.append(("comm_wait", simulate(cfg)))
    cfg = _host_rungs(prm, step, cfg, lad)
    _exposed_comm_rungs(prm, cfg, lad)
    return lad


def _measured_config(prm: ScenarioParams) -> tuple[SimConfig, list[int], list[int], list[int]]:
    """The schedule with the measured stage costs (slow stages applied) and normal links, and
    those per-stage forward, backward and weight-gradient costs (ns). The normal p2p transfer time
    that fills and drains the pipe is part of the bubble (docs/json.md "Time accounting")."""
    sched = canonical_schedule(prm.schedule)
    v = default_virtual(sched, prm.virtual)
    n_st = prm.pp * v
    fwd = per_stage(prm.fwd_ms, n_st, "fwd_ms")
    bwd = per_stage(prm.bwd_ms, n_st, "bwd_ms")
    wgr = per_stage(prm.wgrad_ms, n_st, "wgrad_ms")
    for f in prm.faults:
        if isinstance(f, SlowStage):
            fwd[f.stage] = round(fwd[f.stage] * f.factor)
            bwd[f.stage] = round(bwd[f.stage] * f.factor)
            wgr[f.stage] = round(wgr[f.stage] * f.factor)
    opt = ns(prm.optimizer_ms)
    pure = SimConfig(sched, prm.pp, prm.microbatches, v, fwd_ns=fwd, bwd_ns=bwd, wgrad_ns=wgr, optim_ns=opt)
    return pure.replace(p2p_ns=ns(prm.p2p_ms)), fwd, bwd, wgr


def _host_rungs(prm: ScenarioParams, step: int, cfg: SimConfig, lad: Ladder) -> SimConfig:
    """The host's rungs of the ladder: launch latencies, host stalls and this step's delays (each
    simulated onto ``lad``); returns the configuration they leave."""
    cfg = cfg.replace(
        launch_latency_ns=round(prm.launch_latency_us * US),
        host_issue_ns=round(prm.host_issue_us * US),
        host_lookahead=prm.host_lookahead,
        end_latency_ns=round(prm.end_latency_us * US),
        sync_ns=0,
    )
    lad.steps.append(("host", simulate(cfg)))
    stall = [0] * prm.pp
    for f in prm.faults:
        if isinstance(f, HostStall):
            stall[f.rank] = max(stall[f.rank], ns(f.delay_ms))
    if any(stall):
        cfg = cfg.replace(host_stall_ns=list(stall))
        lad.steps.append(("host", simulate(cfg)))
    sdelay = [0] * prm.pp
    for f in prm.faults:
        if isinstance(f, SlowStep) and f.step == step:
            for r in range(prm.pp) if f.rank is None else [f.rank]:
                sdelay[r] += ns(f.delay_ms)
    if any(sdelay):
        cfg = cfg.replace(start_delay_ns=list(sdelay))
        lad.steps.append(("host", simulate(cfg)))
    return cfg


def _exposed_comm_rungs(prm: ScenarioParams, cfg: SimConfig, lad: Ladder) -> None:
    """The exposed communication's rungs: the gradient-norm sync, transfers on the compute stream
    and the exposed all-reduce (each simulated onto ``lad``)."""
    cfg = cfg.replace(sync_ns=ns(prm.sync_ms))
    lad.steps.append(("exposed_comm", simulate(cfg)))
    on_comp = [False] * prm.pp
    for f in prm.faults:
        if isinstance(f, CommOnCompute):
            for r in f.ranks if f.ranks is not None else range(prm.pp):
                on_comp[r] = True
    if any(on_comp):
        cfg = cfg.replace(comm_on_compute=list(on_comp))
        lad.steps.append(("exposed_comm", simulate(cfg)))
    tail = 0
    for f in prm.faults:
        if isinstance(f, ExposedAllReduce):
            tail += ns(f.ms)
    if tail:
        cfg = cfg.replace(tail_comm_ns=tail)
        lad.steps.append(("exposed_comm", simulate(cfg)))


def coupled_tails(
    prm: ScenarioParams, by_rep: dict[int, list[Ladder]]
) -> list[tuple[list[int], int, int, list[int], int]]:
    """Per step, the tail of replicas that meet in the data-parallel all-reduce of each pipeline
    rank: (all-reduce end per pipeline rank, sync end, optimizer start, optimizer end per pipeline
    rank, step time), in ns from the step start. The all-reduce of pipeline rank ``p`` ends when
    its last replica arrives plus the transfer; the gradient-norm sync, the optimizer and the step
    end follow as in the simulator (:func:`ppdiag.simulate.simulate`)."""
    out = []
    for k in range(prm.steps):
        res = [by_rep[d][k].full for d in range(prm.dp)]
        r0 = res[0]
        xfer = r0.tail_end_ns - r0.last_end_ns
        ar_end = np.max([r.last_end_ns for r in res], axis=0) + xfer
        sync_end = float(ar_end.max()) + float(r0.sync_end_ns[0] - r0.tail_end_ns.max())
        opt_start = sync_end + float(r0.optim_start_ns[0] - r0.sync_end_ns[0])
        opt_end = opt_start + np.max([r.optim_end_ns - r.optim_start_ns for r in res], axis=0)
        step = float(opt_end.max()) + float(r0.step_ns - r0.optim_end_ns.max())
        ends = [round(x) for x in ar_end]
        out.append((ends, round(sync_end), round(opt_start), [round(x) for x in opt_end], round(step)))
    return out


def coupled_truth(by_rep: dict[int, list[Ladder]], steps: int) -> dict[int, list[dict[str, np.ndarray]]]:
    """Truth per replica and step when replicas differ (a slow worker) and meet in the
    data-parallel all-reduce: every replica's step lasts as long as the slowest replica's, so a
    rank's idle in each simulation of the ladder is its own idle plus the time its replica waits
    for the slowest one. The differences are taken on these coupled idles, as in :func:`_truth_of`;
    the balanced simulation spreads the work of every replica evenly (one mean over all of them).
    """
    reps = sorted(by_rep)
    out: dict[int, list[dict[str, np.ndarray]]] = {d: [] for d in reps}
    for k in range(steps):
        lads = {d: by_rep[d][k] for d in reps}

        def coupled(res: dict[int, SimResult]) -> dict[int, np.ndarray]:
            top = max(r.step_ns for r in res.values())
            return {d: r.per_rank_idle_ns + (top - r.step_ns) for d, r in res.items()}

        cfgs = [lads[d].s1.config for d in reps]
        mean = {
            name: [round(float(v.mean()))] * v.shape[1]
            for name in ("fwd_ns", "bwd_ns", "wgrad_ns")
            for v in [np.array([getattr(c, name) for c in cfgs], dtype=np.float64)]
        }
        s0 = simulate(cfgs[0].replace(**mean))
        i0 = {d: s0.per_rank_idle_ns for d in reps}  # the same balanced pipeline everywhere
        i1 = coupled({d: lads[d].s1 for d in reps})
        causes = {d: {c: np.zeros_like(i1[d]) for c in TRUTH_CAUSES} for d in reps}
        prev = i1
        for d in reps:
            causes[d]["bubble"] = np.minimum(i0[d], i1[d])
            causes[d]["imbalance"] = i1[d] - causes[d]["bubble"]
        for j, (cause, _) in enumerate(lads[reps[0]].steps):
            cur = coupled({d: lads[d].steps[j][1] for d in reps})
            for d in reps:
                causes[d][cause] = causes[d][cause] + (cur[d] - prev[d])
            prev = cur
        for d in reps:
            out[d].append(causes[d])
    return out


def _truth_of(lad: Ladder) -> dict[str, np.ndarray]:
    """Per pipeline rank, ns of each cause in one step (they add up to the full sim's idle)."""
    i0, i1 = lad.s0.per_rank_idle_ns, lad.s1.per_rank_idle_ns
    out = {c: np.zeros_like(i1) for c in TRUTH_CAUSES}
    out["bubble"] = np.minimum(i0, i1)
    out["imbalance"] = i1 - out["bubble"]
    prev = i1
    for cause, res in lad.steps:
        cur = res.per_rank_idle_ns
        out[cause] = out[cause] + (cur - prev)
        prev = cur
    return out


def groundtruth(
    prm: ScenarioParams,
    run: SynthRun,
    ladders: list[Ladder],
    starts: list[int],
    topo: Topo,
    by_rep: dict[int, list[Ladder]] | None = None,
) -> dict[str, Any]:
    """The ground-truth JSON object (see :mod:`ppsynth.scenario` for the definitions)."""
    by_rep = by_rep or {d: ladders for d in range(prm.dp)}
    if all(lads is ladders for lads in by_rep.values()):
        truth_of = {d: [_truth_of(lad) for lad in ladders] for d in by_rep}
    else:
        truth_of = coupled_truth(by_rep, prm.steps)
    ranks_out = _ranks_truth(prm, run, starts, by_rep, truth_of)
    faults_out, blame = _faults_truth(prm, topo)
    return {
        "schema": GROUNDTRUTH_SCHEMA,
        "schedule": run.schedule,
        "pp": prm.pp,
        "dp": prm.dp,
        "virtual": run.virtual,
        "microbatches": prm.microbatches,
        "world_size": run.world_size,
        "steps": prm.steps,
        "step_numbers": [prm.first_step + k for k in range(prm.steps)],
        **_layout(prm, topo),
        "faults": faults_out,
        "blame": blame,
        "clock_skew_ns": {str(r.rank): r.clock_skew_ns for r in run.ranks},
        "clock_offset_ns": {str(r.rank): -r.clock_skew_ns for r in run.ranks},
        "step_windows_ns": [[starts[k], starts[k + 1]] for k in range(prm.steps)],
        "step_ms": [(starts[k + 1] - starts[k]) / MS for k in range(prm.steps)],
        "bubble": {
            "theoretical_ratio": closed_form_bubble(run.schedule, prm.pp, prm.microbatches, run.virtual),
            "balanced_sim_ratio": ladders[0].s0.bubble_ratio,
        },
        "causes": list(TRUTH_CAUSES),
        "definitions": _DEFINITIONS,
        "config": run.config,
        "ranks": ranks_out,
    }


def _ranks_truth(
    prm: ScenarioParams,
    run: SynthRun,
    starts: list[int],
    by_rep: dict[int, list[Ladder]],
    truth_of: dict[int, list[dict[str, np.ndarray]]],
) -> dict[str, Any]:
    """Per global rank (as a string key), its truth object with one entry per step."""
    gap_ns = _kernel_gaps(run)
    late_ns = sum(ns(f.delay_ms) for f in prm.faults if isinstance(f, LateReplica))
    ranks_out: dict[str, Any] = {}
    for rk in run.ranks:
        per_step = [
            _step_truth(
                prm, lad.full, rk.pp_rank, k, starts, truth_of[rk.dp_rank][k], gap_ns[rk.rank], late_ns
            )
            for k, lad in enumerate(by_rep[rk.dp_rank])
        ]
        ranks_out[str(rk.rank)] = _rank_truth(
            rk.rank, rk.pp_rank, rk.dp_rank, rk.stages, rk.clock_skew_ns, per_step
        )
    return ranks_out


def _layout(prm: ScenarioParams, topo: Topo) -> dict[str, Any]:
    """The stage placement and the process groups, in the ground truth's key order."""
    return {
        "stage_to_pp_rank": list(topo.s2r),
        "stage_map": {str(s): [topo.glob(q, d) for d in range(prm.dp)] for s, q in enumerate(topo.s2r)},
        "pp_groups": [pg.ranks for pg in topo.groups if pg.desc == "PIPELINE_MODEL_PARALLEL_GROUP"],
        "dp_groups": [pg.ranks for pg in topo.groups if pg.desc == "DATA_PARALLEL_GROUP"],
    }


_DEFINITIONS = {
    "lost": "step window - union of compute blocks (first to last kernel of each block)",
    "kernel_gaps": "idle gaps between kernels inside a block; lost on kernels = lost + kernel_gaps",
    "bubble": "min(idle with mean stage costs and normal links, "
    "idle with measured stage costs and normal links)",
    "imbalance": "idle with measured stage costs and normal links - bubble",
    "other causes": "growth of lost time when the ingredient is added to the simulation",
}


def _step_truth(
    prm: ScenarioParams,
    res: SimResult,
    p: int,
    k: int,
    starts: list[int],
    causes_ns: dict[str, np.ndarray],
    gaps: list[int],
    late_ns: int,
) -> dict[str, Any]:
    """One step of pipeline rank ``p``: window, compute, lost time and its causes (ms)."""
    window = starts[k + 1] - starts[k]
    compute = float(res.per_rank_busy_ns[p])
    causes = {c: float(causes_ns[c][p]) / MS for c in TRUTH_CAUSES}
    # a late replica: its ranks idle at the step start, the others wait for it in the
    # data-parallel all-reduce; both are the late replica's host (its data loader)
    causes["host"] += late_ns / MS
    return {
        "step": prm.first_step + k,
        "window_ms": window / MS,
        "compute_ms": compute / MS,
        "lost_ms": (window - compute) / MS,
        "kernel_gaps_ms": gaps[k] / MS,
        "causes_ms": causes,
    }


def _rank_truth(
    rank: int, pp_rank: int, dp_rank: int, stages: list[int], skew: int, steps_out: list[dict[str, Any]]
) -> dict[str, Any]:
    """One rank's truth: the per-step entries and their means."""
    n = len(steps_out)
    return {
        "rank": rank,
        "pp_rank": pp_rank,
        "dp_rank": dp_rank,
        "stages": stages,
        "clock_skew_ns": skew,
        "step_ms": sum(s["window_ms"] for s in steps_out) / n,
        "compute_ms": sum(s["compute_ms"] for s in steps_out) / n,
        "lost_ms": sum(s["lost_ms"] for s in steps_out) / n,
        "kernel_gaps_ms": sum(s["kernel_gaps_ms"] for s in steps_out) / n,
        "causes_ms": {c: sum(s["causes_ms"][c] for s in steps_out) / n for c in TRUTH_CAUSES},
        "steps": steps_out,
    }


def _fault_pp_ranks(prm: ScenarioParams, topo: Topo, f: Any) -> list[int]:
    """The pipeline ranks a fault acts on."""
    if isinstance(f, SlowStage):
        return [topo.s2r[f.stage]]
    if isinstance(f, (SlowLink, HostStall)):
        return [f.rank]
    if isinstance(f, SlowStep):
        return list(range(prm.pp)) if f.rank is None else [f.rank]
    if isinstance(f, CommOnCompute):
        return list(f.ranks) if f.ranks is not None else list(range(prm.pp))
    if isinstance(f, SlowWorker):
        return [f.pp_rank]
    return list(range(prm.pp))


def _faults_truth(prm: ScenarioParams, topo: Topo) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Every fault with the global ranks it acts on, and the ranks to blame per cause."""
    blame: dict[str, list[int]] = {}
    faults_out = []
    for f in prm.faults:
        fj = fault_json(f)
        pr = _fault_pp_ranks(prm, topo, f)
        fj["ranks"] = sorted(topo.glob(q, d) for q in pr for d in range(prm.dp))
        if isinstance(f, LateReplica):  # the late replica's ranks only: the others wait for them
            fj["ranks"] = sorted(topo.glob(q, f.dp_rank) for q in range(prm.pp))
        if isinstance(f, SlowWorker):  # one worker, not its stage in every replica
            fj["ranks"] = [topo.glob(f.pp_rank, f.dp_rank)]
        blame.setdefault(f.cause, [])
        blame[f.cause] = sorted(set(blame[f.cause]) | set(fj["ranks"]))
        faults_out.append(fj)
    return faults_out, blame


def _kernel_gaps(run: SynthRun) -> dict[int, list[int]]:
    """Per rank and step: ns between the kernels of one block (compute stream, same block)."""
    out: dict[int, list[int]] = {}
    for rk in run.ranks:
        gpu = rk.gpu
        sel = np.flatnonzero(gpu.kind == int(Kind.COMPUTE))
        per = [0] * run.steps
        st, en = gpu.start[sel], gpu.end[sel]
        lab = np.stack([gpu.step[sel], gpu.stage[sel], gpu.mb[sel], gpu.phase[sel]], axis=1)
        for a in range(1, len(sel)):
            if (lab[a] == lab[a - 1]).all():
                per[int(lab[a][0])] += int(st[a] - en[a - 1])
        out[rk.rank] = per
    return out


def groundtruth_json(run: SynthRun) -> dict[str, Any]:
    """The ground truth of ``run`` (what ``groundtruth.json`` holds)."""
    return run.truth


def write_groundtruth(run: SynthRun, out_dir: str | Path) -> Path:
    """Write ``groundtruth.json`` into ``out_dir`` and return its path."""
    path = Path(out_dir) / "groundtruth.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run.truth, indent=1, sort_keys=False))
    return path
