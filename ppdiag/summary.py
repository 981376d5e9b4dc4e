"""Aggregate per-(rank, step) results into the typed report sections of docs/json.md
(``docs/json.md``): run, summary, bubble, stages[] and ranks[]."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.attribution.causes import Attribution, RankStep
from ppdiag.diagnosis import SCHEMA_VERSION
from ppdiag.facts import (
    StageBalance,
    measured_bubble,
    stage_balance,
    step_spans,
    theoretical_bubble,
    top_kernels,
    whole_span,
)
from ppdiag.model import Phase, Run
from ppdiag.model.memory import MemoryRow
from ppdiag.pipeline import Pipeline
from ppdiag.report_types import (
    Bubble,
    Cause,
    CriticalStep,
    Dist,
    FindingRow,
    Hang,
    HostClockInfo,
    LinkRow,
    NoiseInfo,
    Peers,
    RankKernels,
    RankRow,
    Report,
    RunInfo,
    StageRow,
    Summary,
    Tool,
    WhatifRow,
)
from ppdiag.version import __version__

NS_PER_MS = 1e6


@dataclass(frozen=True)
class Sections:
    """The report sections measured from the run (findings, what-if and noise come later)."""

    run: RunInfo
    summary: Summary
    bubble: Bubble
    stages: list[StageRow]
    ranks: list[RankRow]
    kernels: list[RankKernels] | None = None

    def report(
        self,
        noise: NoiseInfo,
        warnings: list[str] | None = None,
        *,
        hang: Hang | None = None,
        memory: list[MemoryRow] | None = None,
        links: list[LinkRow] | None = None,
        critical_path: list[CriticalStep] | None = None,
        findings: list[FindingRow] | None = None,
        whatif: list[WhatifRow] | None = None,
    ) -> Report:
        """The :class:`Report` of these sections with ``noise`` and the sections measured beside
        them (``hang``, ``memory``, ``links``, ``critical_path``), and the rules' ``findings`` and
        ``whatif`` rows once they ran (:func:`ppdiag.api.analyze_run` assembles every report here);
        ``warnings`` replaces ``run.warnings`` when given."""
        run = self.run if warnings is None else _replace_warnings(self.run, warnings)
        return Report(
            schema_version=SCHEMA_VERSION,
            tool=Tool(name="ppdiag", version=__version__),
            run=run,
            summary=self.summary,
            bubble=self.bubble,
            stages=self.stages,
            ranks=self.ranks,
            findings=findings or [],
            whatif=whatif or [],
            noise=noise,
            critical_path=critical_path,
            hang=hang,
            memory=memory,
            links=links,
            kernels=self.kernels,
        )


def _replace_warnings(run: RunInfo, warnings: list[str]) -> RunInfo:
    return msgspec.structs.replace(run, warnings=list(warnings))


def _ms(v: Any) -> float:
    return round(float(v) / NS_PER_MS, 4)


def _dist(vals_ns: Sequence[int] | I64) -> Dist | None:
    if not len(vals_ns):
        return None
    a = np.asarray(vals_ns, dtype=np.float64) / NS_PER_MS
    return Dist(
        round(float(a.mean()), 4),
        round(float(np.percentile(a, 50)), 4),
        round(float(np.percentile(a, 95)), 4),
        int(a.size),
    )


def _shares(compute_ns: float, causes_ns: dict[str, float], step_ns: float) -> dict[str, float]:
    """Compute and each cause as a fraction of the mean step (they add up to 1)."""
    if step_ns <= 0:
        return {k: 0.0 for k in ("compute", *Cause)}
    out = {"compute": round(compute_ns / step_ns, 5)}
    out.update({k: round(v / step_ns, 5) for k, v in causes_ns.items()})
    return out


def build_report(
    run: Run,
    pipe: Pipeline,
    steps: list[RankStep],
    attr: Attribution,
    balance: StageBalance | None = None,
) -> Sections:
    """The measured sections of the report (findings are added by the rules layer). ``balance``
    is the run's :func:`~ppdiag.facts.stage_balance` when the caller computed it already.
    ``run`` is the pipeline's aligned view (``pipe.aligned``) or the parsed run."""
    topo = pipe.topology
    means = _rank_means(pipe, steps, attr)
    theo = theoretical_bubble(pipe.schedule, topo.pp, pipe.microbatches, topo.virtual)
    measured = measured_bubble(means.waits_ns, means.windows_ns) if topo.pp > 1 else None
    balance = balance if balance is not None else stage_balance(pipe)
    bubble = Bubble(
        measured_ratio=round(measured, 4) if measured is not None else None,
        theoretical_ratio=round(theo, 4) if theo is not None else None,
    )
    warnings = list(run.warnings) + list(pipe.warnings) + list(attr.notes)
    return Sections(
        run=_run_info(run, pipe, steps, warnings),
        summary=_summary(means, _step_values(steps), balance),
        bubble=bubble,
        stages=_stages(pipe, means.rows, balance) if topo.pp > 1 else [],
        ranks=means.rows,
        kernels=_kernels(run, steps, attr),
    )


def _kernels(run: Run, steps: list[RankStep], attr: Attribution) -> list[RankKernels] | None:
    """Each rank's top compute kernels over the analyzed steps (the whole capture without step
    markers); None when no rank has any."""
    spans = step_spans((s.step, s.w0, s.w1) for s in steps)
    if not spans:
        whole = whole_span(run, attr.gaps)
        spans = [whole] if whole else []
    return top_kernels(run, spans) or None


@dataclass(frozen=True)
class _RankMeans:
    """Each rank's row and its per-step means (ns, in rank order), and every (rank, step)'s
    pipeline waits and window for the measured bubble."""

    rows: list[RankRow]
    win_ns: list[float]
    compute_ns: list[float]
    causes_ns: dict[str, list[float]]
    waits_ns: list[float]
    windows_ns: list[float]


def _rank_means(pipe: Pipeline, steps: list[RankStep], attr: Attribution) -> _RankMeans:
    """The ``ranks[]`` rows and the per-rank means the summary averages."""
    topo = pipe.topology
    per_rank: dict[int, list[RankStep]] = {}
    for rs in steps:
        per_rank.setdefault(rs.rank, []).append(rs)
    out = _RankMeans([], [], [], {k: [] for k in Cause}, [], [])
    # DP replica index of each rank's pipeline (topology order), for grouping by replica
    replica_of = {x: i for i, line in enumerate(topo.pipelines) for x in line} if topo.pp > 1 else {}
    for r in sorted(per_rank):
        rss = per_rank[r]
        n = len(rss)
        causes: dict[str, float] = {k: sum(attr.causes[(x.rank, x.step)][k] for x in rss) / n for k in Cause}
        win = sum(x.acct.window for x in rss) / n
        stage = topo.stage_of.get(r, 0) if topo.pp > 1 else None
        out.rows.append(_rank_row(r, stage, replica_of.get(r), rss, causes, win))
        out.win_ns.append(win)
        out.compute_ns.append(sum(x.acct.compute for x in rss) / n)
        for k in Cause:
            out.causes_ns[k].append(causes[k])
        for x in rss:
            c = attr.causes[(x.rank, x.step)]
            out.waits_ns.append(c["bubble"] + c["imbalance"])
            out.windows_ns.append(x.acct.window)
    return out


def _step_values(steps: list[RankStep]) -> list[float]:
    """Step time per analyzed step: the mean window over ranks for that step position (ns)."""
    by_pos: dict[int, list[int]] = {}
    for rs in steps:
        by_pos.setdefault(rs.number if rs.number >= 0 else rs.step, []).append(rs.acct.window)
    return [float(np.mean(v)) for _, v in sorted(by_pos.items())]


def _summary(means: _RankMeans, step_vals: list[float], balance: StageBalance) -> Summary:
    """The ``summary`` section. One denominator for every share (docs/json.md): per-step means over
    the same (rank, step) windows as the cause means, so compute + causes = the mean step exactly."""
    step_mean = float(np.mean(means.win_ns)) if means.win_ns else 0.0
    comp_mean = float(np.mean(means.compute_ns)) if means.compute_ns else 0.0
    lost_mean_ns = {k: float(np.mean(v)) if v else 0.0 for k, v in means.causes_ns.items()}
    return Summary(
        step_ms=_ms(np.median(step_vals)) if step_vals else None,
        step_p95_ms=_ms(np.percentile(step_vals, 95)) if step_vals else None,
        step_mean_ms=_ms(step_mean) if means.win_ns else None,
        compute_ms=_ms(comp_mean) if means.rows else None,
        lost_ratio=round(sum(lost_mean_ns.values()) / step_mean, 4) if step_mean > 0 else None,
        lost_ms={k: _ms(v) for k, v in lost_mean_ns.items()},
        shares=_shares(comp_mean, lost_mean_ns, step_mean) if means.win_ns else None,
        steps_ms=[_ms(v) for v in step_vals],
        slowest_stage=balance.slowest,
        stage_ratio=round(balance.ratio, 4) if balance.ratio is not None else None,
    )


def _rank_row(
    rank: int,
    stage: int | None,
    pipeline: int | None,
    rss: list[RankStep],
    causes: dict[str, float],
    win: float,
) -> RankRow:
    """One rank's ``ranks[]`` row: the means over its steps ``rss`` (``causes`` and ``win`` in ns)."""
    n = len(rss)
    return RankRow(
        rank=rank,
        stage=stage,
        pipeline=pipeline,
        steps=n,
        step_ms=_ms(win),
        compute_ms=_ms(sum(x.acct.compute for x in rss) / n),
        exposed_p2p_ms=_ms(sum(x.acct.exposed_p2p for x in rss) / n),
        exposed_collective_ms=_ms(sum(x.acct.exposed_collective for x in rss) / n),
        exposed_copy_ms=_ms(sum(x.acct.exposed_copy for x in rss) / n),
        idle_ms=_ms(sum(x.acct.idle for x in rss) / n),
        lost_ms={k: _ms(v) for k, v in causes.items()},
        shares=_shares(sum(x.acct.compute for x in rss) / n, causes, win),
    )


def run_format(name: str) -> str:
    """``name`` once a registered parser names it as its run format (``run.format``): the registry
    is the one list of formats, so a new format is its parser module alone."""
    from ppdiag.parsers import PARSERS, load_builtin

    load_builtin()
    known = sorted({p.format for p in PARSERS.values()})
    if name not in known:
        raise ValueError(f"run format {name!r} is not one a registered parser names ({', '.join(known)})")
    return name


def _peers(pipe: Pipeline) -> Peers | None:
    """``run.peers``: how the peer decision reports itself."""
    return pipe.peers.to_report() if pipe.peers is not None else None


def _run_info(run: Run, pipe: Pipeline, steps: list[RankStep], warnings: list[str]) -> RunInfo:
    topo = pipe.topology
    residual = pipe.clocks.residual_us
    offsets = pipe.clocks.offsets  # the fitted offsets (the parsed ranks carry none)
    stage_map = topo.stage_map() if topo.pp > 1 else {}
    world = _world_size(run, stage_map, warnings)
    return RunInfo(
        world_size=world,
        ranks=[tl.rank for tl in run.ranks],
        pp=topo.pp,
        stage_map=stage_map,
        stage_source=topo.source,
        virtual_stages=topo.virtual,
        schedule=pipe.schedule,
        microbatches=pipe.microbatches,
        steps=sorted({rs.number for rs in steps}),
        clock_residual_us=round(residual, 3) if residual is not None else None,
        clock_method=pipe.clocks.method,
        clock_residual_by_rank_us={str(r): round(v, 3) for r, v in pipe.clocks.residual_by_rank_us.items()},
        peer_source=pipe.peers.source if pipe.peers is not None else "none",
        peers=_peers(pipe),
        clock_offsets_us={str(r): round(offsets.get(r, 0) / 1000, 3) for r in (tl.rank for tl in run.ranks)},
        format=run_format(run.format),
        cpu_only=all(tl.cpu_only for tl in run.ranks),
        sources={str(tl.rank): tl.source for tl in run.ranks},
        rank_sources={str(tl.rank): tl.rank_source for tl in run.ranks},
        warnings=warnings,
        structure=pipe.structure,
        clocks=[
            HostClockInfo(
                host=c.host,
                ranks=list(c.ranks),
                offset_us=round(c.offset_ns / 1000, 3),
                residual_us=None if c.residual_ns is None else round(c.residual_ns / 1000, 3),
                method=c.method,
            )
            for c in pipe.clocks.hosts
        ],
    )


def _world_size(run: Run, stage_map: dict[str, int], warnings: list[str]) -> int:
    """The run's world size: what the traces state, raised to the ranks the pipeline names (a
    process group that lists ranks beyond the stated world contradicts it), with a warning."""
    world = run.world_size
    named = max(stage_map.values(), default=-1) + 1
    if named > world:
        warnings.append(
            f"the pipeline names ranks up to {named - 1}, beyond the world size {world} the traces "
            f"state; the world size is taken as {named}"
        )
        world = named
    return world


I64 = npt.NDArray[np.int64]
_PHASES = (int(Phase.FWD), int(Phase.BWD), int(Phase.WGRAD))


def _stages(pipe: Pipeline, ranks_out: list[RankRow], balance: StageBalance) -> list[StageRow]:
    """The ``stages[]`` rows: each stage's block times, compute and lost time over its ranks."""
    topo = pipe.topology
    # ranks of each stage in one pass: a scan per stage is quadratic on very wide jobs
    of_stage: dict[int, list[int]] = {}
    for r, st in topo.stage_of.items():
        of_stage.setdefault(st, []).append(r)
    row_of = {x.rank: x for x in ranks_out}
    out: list[StageRow] = []
    for s in range(topo.pp):
        ranks = sorted(of_stage.get(s, []))
        vals, samples = _block_times(pipe, ranks)
        rank_rows = [row_of[r] for r in ranks if r in row_of]
        lost: dict[str, float] = {
            k: round(float(np.mean([x.lost_ms[k] for x in rank_rows])), 4) if rank_rows else 0.0
            for k in Cause
        }
        fwd, bwd, wgrad = _PHASES
        out.append(
            StageRow(
                stage=s,
                ranks=ranks,
                chunks=sorted({c for r in ranks for c in topo.chunks_of.get(r, [s])}),
                fwd_ms=_dist(vals[fwd]),
                bwd_ms=_dist(vals[bwd]),
                wgrad_ms=_dist(vals[wgrad]),
                compute_ms=round(float(np.mean([x.compute_ms for x in rank_rows])), 4) if rank_rows else None,
                block_ms=round(balance.stage_ms[s], 4) if s in balance.stage_ms else None,
                lost_ms=lost,
                fwd_samples_ms=[_ms(np.mean(v)) for _, v in sorted(samples[fwd].items())],
                bwd_samples_ms=[_ms(np.mean(v)) for _, v in sorted(samples[bwd].items())],
                wgrad_samples_ms=[_ms(np.mean(v)) for _, v in sorted(samples[wgrad].items())],
            )
        )
    return out


def _block_times(pipe: Pipeline, ranks: list[int]) -> tuple[dict[int, I64], dict[int, dict[int, I64]]]:
    """The busy time (ns) of every forward / backward / weight-gradient block of ``ranks``, per
    phase, and the same per phase and micro-batch (ranks in order, each rank's blocks in order)."""
    bl = [b for r in ranks if (b := pipe.blocks.get(r)) is not None and len(b)]
    phase = np.concatenate([b.phase for b in bl]) if bl else np.zeros(0, np.int8)
    busy = np.concatenate([b.busy for b in bl]).astype(np.int64) if bl else np.zeros(0, np.int64)
    mbs = np.concatenate([b.mb for b in bl]).astype(np.int64) if bl else np.zeros(0, np.int64)
    vals: dict[int, I64] = {}
    samples: dict[int, dict[int, I64]] = {}
    for ph in _PHASES:
        m = phase == ph
        vals[ph] = busy[m]
        # per micro-batch, in the order above: a stable sort keeps it within one micro-batch
        o = np.argsort(mbs[m], kind="stable")
        keys, first = np.unique(mbs[m][o], return_index=True)
        parts = np.split(vals[ph][o], first[1:]) if keys.size else []
        samples[ph] = dict(zip(keys.tolist(), parts, strict=True))
    return vals, samples
