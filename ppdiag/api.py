"""The one analysis: ``diagnose(paths, options) -> Diagnosis`` (or ``analyze_run`` on a parsed run).

Every route into the analysis goes through :func:`analyze_run`: the ``analyze``, ``check`` and
``diff`` commands, ``whatif``, ``demo``, the notebook API and the tests. It checks the run against
the flags (:func:`ppdiag.pipeline.checks.checked_run`), rebuilds the pipeline (hang trimming and
the override warnings included), attributes the lost time, predicts the fixes, runs the rules and
returns one immutable result: nothing in it is filled in or changed after it is built.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from ppdiag.analysis import AnalysisContext, Analyzed
from ppdiag.attribution.causes import Attribution, RankStep, attribute
from ppdiag.attribution.critical_path import Transfers, critical_paths
from ppdiag.attribution.paint_map import MappedSteps, painter_on
from ppdiag.attribution.rank_steps import (
    RankItem,
    StepWindowSpec,
    rank_steps,
    rank_steps_batch,
    shippable,
    unpack_steps,
)
from ppdiag.diagnosis import Diagnosis, GapTable, StepWindow
from ppdiag.errors import InputError
from ppdiag.facts import StageBalance, stage_balance
from ppdiag.model import Run
from ppdiag.model.memory import MemoryRow
from ppdiag.options import Options as Options
from ppdiag.parsers import ParseOptions
from ppdiag.parsers.scaleout import ReplicaMap, dask_map, scheduler_address
from ppdiag.pipeline import Pipeline, PipelineOptions, rebuild
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.checks import check_steps, checked_run
from ppdiag.pipeline.hangs import run_origin
from ppdiag.pipeline.links import link_rows, parse_hosts
from ppdiag.pipeline.memory import memory_section
from ppdiag.report_check import InconsistentReport
from ppdiag.report_check import strict as strict_check
from ppdiag.report_types import Cause, CriticalStep, FindingRow, LinkRow, Report, WhatifRow
from ppdiag.rules import RuleContext, RuleOptions, run_rules
from ppdiag.rules.noise import NoiseModel, build_noise, oversubscription_warning, warmup_outlier
from ppdiag.summary import Sections, build_report
from ppdiag.whatif.batch import check_batch
from ppdiag.whatif.scenarios import predict_fixes


def check_options(opts: Options) -> Options:
    """``opts`` once its ``steps`` and ``hosts`` parse (else one clear :class:`InputError`, before
    any work): what the commands check as they read their flags, and :func:`diagnose` again."""
    check_steps(opts.steps)
    if opts.hosts is not None:
        try:
            parse_hosts(opts.hosts)
        except ValueError as exc:
            raise InputError(None, f"--hosts {opts.hosts!r}: {exc}") from None
    return opts


def load(paths: Sequence[str | Path], options: Options | None = None) -> Run:
    """Parse the trace files (or directories) of one run."""
    from ppdiag.parsers.loader import load_run

    opts = options or Options()
    return load_run(
        list(paths),
        ParseOptions(nsys_cache_dir=opts.nsys_cache_dir),
        jobs=opts.jobs,
        progress=opts.progress,
        scheduler=opts.scheduler,
    )


def diagnose(
    paths: Sequence[str | Path], options: Options | None = None, on_stage: Callable[[str], None] | None = None
) -> Analyzed:
    """Parse, rebuild the pipeline, attribute lost time and run the rules."""
    opts = check_options(options or Options())
    if on_stage:
        on_stage("parsing")
    run = load(paths, opts)
    return analyze_run(run, opts, on_stage)


@dataclass(frozen=True)
class _Measured:
    """The analysis before the rules: the measured sections, the report so far (no findings, no
    what-if rows, no critical path) and what it was built from."""

    pipe: Pipeline
    steps: list[RankStep]
    windows: list[StepWindow]
    attr: Attribution
    noise: NoiseModel
    sections: Sections
    paths: list[CriticalStep]
    warnings: list[str]
    balance: StageBalance  # computed once, read by the report and the rules
    memory: list[MemoryRow]
    links: list[LinkRow]

    def report(
        self,
        warnings: list[str] | None = None,
        findings: list[FindingRow] | None = None,
        whatif: list[WhatifRow] | None = None,
        final: bool = False,
    ) -> Report:
        """The report, assembled here only: the measured sections with ``warnings`` (default: the
        measured ones) and, once the rules ran (``final``), the findings, the what-if rows and the
        critical path."""
        return self.sections.report(
            self.noise.to_report(),
            self.warnings if warnings is None else warnings,
            hang=self.pipe.hang,
            memory=self.memory,
            links=self.links,
            critical_path=list(self.paths) if final else None,
            findings=findings or [],
            whatif=whatif or [],
        )


def _measured(
    run: Run, opts: Options, on_stage: Callable[[str], None] | None, replica_map: ReplicaMap | None
) -> _Measured:
    """Rebuild the pipeline (hangs trimmed, overrides checked), attribute the lost time, and
    measure the report's sections (``replica_map``: see :func:`analyze_run`)."""
    pipe = rebuild(
        run, PipelineOptions(opts.pp, opts.stage_map, opts.microbatches, opts.schedule, opts.steps)
    )
    run = pipe.aligned  # the parsed ranks on the common clock, labelled: what every later layer reads
    skip = _warmup_step(pipe) if not opts.steps else None
    steps, windows, mapped = _rank_steps(run, pipe, skip, replica_map)
    if on_stage:
        on_stage("attributing lost time")
    last_stage = pipe.topology.pp * pipe.topology.virtual - 1
    # the gap tables are painted on the same map as the accounting, from the steps it returned
    painter = painter_on(replica_map, mapped) if replica_map is not None and mapped is not None else None
    attr = attribute(
        steps,
        run.by_rank(),
        pipe.ops,
        last_stage,
        pipe.topology.pp > 1,
        pipe.collectives,
        painter,
        p2p_waits=not pipe.unread_chain,
    )
    balance = stage_balance(pipe)
    sections = build_report(run, pipe, steps, attr, balance)
    warnings = list(sections.run.warnings)
    # the chain of blocks, transfers and gaps that sets each step's length
    paths = critical_paths(
        windows,
        pipe.blocks,
        Transfers.from_pairs(pipe.pairs, pipe.clocks.offsets),
        attr.gaps,
        pipe.topology.stage_of,
    )
    if skip is not None:
        first = next((w.number for ws in pipe.windows.values() for w in ws[:1]), -1)
        warnings.append(
            f"the first profiled step ({first}) is an outlier (warm-up) and was left out; "
            "pass --steps to analyze it"
        )
    noise = build_noise(
        run, pipe, steps, attr, sections.summary.steps_ms, first_step_excluded=skip is not None
    )
    over = oversubscription_warning(noise, len(run.ranks))
    if over:
        warnings.append(over)
    memory = memory_section(run, pipe, run_origin(run))
    links = link_rows(run, pipe.ops, parse_hosts(opts.hosts) if opts.hosts else None)
    return _Measured(pipe, steps, windows, attr, noise, sections, paths, warnings, balance, memory, links)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (back to its former state after it).

    The analysis builds hundreds of thousands of small containers that live until the report
    (path pieces, wait records, per-block rows) and none that form cycles, so every collection
    the allocations trigger only traverses live objects: on a 128-step run a tenth of the
    analysis's CPU. Reference counting still frees everything as usual."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def analyze_run(
    run: Run,
    options: Options | None = None,
    on_stage: Callable[[str], None] | None = None,
    replica_map: ReplicaMap | None = None,
) -> Analyzed:
    """Everything after parsing, on an already loaded run (``run`` is not changed).

    ``replica_map`` runs the phases that read one DP replica (a whole pipeline) given the run's
    facts a batch of replicas per task (:mod:`ppdiag.parsers.scaleout`); by default, an op
    table's run analyzed with a Dask scheduler (``Options.scheduler`` or its environment
    variable) maps them on that cluster, and any other run computes them here. The result is
    the same either way."""
    opts = options or Options()
    run = checked_run(run, opts.pp, opts.microbatches)  # flags the traces cannot hold: InputError
    if replica_map is None:
        replica_map = _default_map(run, opts)
    with _gc_paused():
        return _analyze(run, opts, on_stage, replica_map)


def _default_map(run: Run, opts: Options) -> ReplicaMap | None:
    """The Dask map for an op table's run (every rank of one job in one table: the size that needs
    it) when a scheduler is named, else None (in this process)."""
    address = scheduler_address(opts.scheduler)
    if address is None or len(run.ranks) < 2 or any(tl.format != "optable" for tl in run.ranks):
        return None
    return dask_map(address)


def _traced_tp(run: Run) -> int:
    """The tensor-parallel size the traces state (op tables in Megatron's rank order), when every
    rank states the same one; 0 when none does."""
    sizes = {int(tl.meta.get("tp_size", 0) or 0) for tl in run.ranks}
    return sizes.pop() if len(sizes) == 1 else 0


def _analyze(
    run: Run, opts: Options, on_stage: Callable[[str], None] | None, replica_map: ReplicaMap | None
) -> Analyzed:
    """The body of :func:`analyze_run`: each step's output is a value the next one takes."""
    if on_stage:
        on_stage("rebuilding the pipeline")
    m = _measured(run, opts, on_stage, replica_map)
    pipe, report = m.pipe, m.report()
    run = pipe.aligned  # ``run`` itself stays as parsed
    # what-if predictions of every fix, before the rules: a finding's gain is its fix's prediction
    predictions, unpredicted = predict_fixes(run, report, pipe, m.attr, m.steps)
    batch = check_batch(
        run.world_size,
        pipe.topology.pp,
        int(opts.tp or _traced_tp(run) or 1),
        opts.micro_batch,
        opts.global_batch,
        pipe.microbatches,
    )
    ctx = RuleContext(
        report,
        run,
        pipe,
        m.steps,
        m.attr,
        RuleOptions(global_batch=opts.global_batch),
        predictions=predictions,
        noise=m.noise,
        batch=batch,
        balance=m.balance,
    )
    findings = sorted(run_rules(ctx), key=lambda f: f.code != "PP013")  # how the run stopped first
    used = [
        f.evidence.whatif_fix
        for f in findings
        if isinstance(f.evidence.whatif_fix, str) and f.evidence.whatif_fix
    ]
    result = _checked(
        m.report(
            [*m.warnings, *unpredicted],
            findings,
            predictions.report_rows(used) if predictions is not None else [],
            final=True,
        )
    )
    gaps = _blamed(m.attr.gaps, findings)
    return Diagnosis(
        run=run,
        result=result,
        steps=m.windows,
        gaps=gaps,
        context=AnalysisContext(
            stage_of_rank=dict(pipe.topology.stage_of),
            pipeline=pipe,
            attribution=m.attr,
            rank_steps=m.steps,
            noise=m.noise,
            predictions=predictions,
            overrides=tuple(pipe.overrides),
        ),
    )


def _checked(report: Report) -> Report:
    """The report with every claim it contradicts (:meth:`Report.check`) as an "internal
    inconsistency" warning; an error instead under ``PPDIAG_STRICT_CHECK`` (the test suite)."""
    problems = report.check()
    if not problems:
        return report
    if strict_check():
        raise InconsistentReport("; ".join(problems))
    warnings = [*report.run.warnings, *(f"internal inconsistency: {p}" for p in problems)]
    return msgspec.structs.replace(report, run=msgspec.structs.replace(report.run, warnings=warnings))


def _rank_steps(
    run: Run, pipe: Pipeline, skip: int | None, replica_map: ReplicaMap | None = None
) -> tuple[list[RankStep], list[StepWindow], MappedSteps | None]:
    """Every analyzed (rank, step) with its blocks, and its window; step index ``skip`` left out.

    With ``replica_map``, the accounting of each rank runs in a task of its replica's batch (it
    reads the rank alone, on the aligned clock the reducer fitted); the steps come back in rank
    order, the same values as here, and the packed steps the tasks sent are returned too (the
    gap tables' map sends them out again, see :mod:`ppdiag.attribution.paint_map`)."""
    steps: list[RankStep] = []
    windows: list[StepWindow] = []
    per_rank = _step_specs(run, pipe, skip)
    packed: MappedSteps | None = None
    if replica_map is not None and len(per_rank) > 1:
        groups = _replica_groups([tl.rank for tl, _ in per_rank], pipe.topology.pipelines)
        got = replica_map(rank_steps_batch, [[shippable(*per_rank[i]) for i in g] for g in groups])
        by_index = dict(zip((i for g in groups for i in g), got, strict=True))
        packed = MappedSteps([by_index[i] for i in range(len(per_rank))], groups)
        mapped = [unpack_steps(p, specs) for p, (_, specs) in zip(packed.packed, per_rank, strict=True)]
    else:
        mapped = [rank_steps(tl, specs) for tl, specs in per_rank]
    for (tl, specs), rs in zip(per_rank, mapped, strict=True):
        steps.extend(rs)
        windows.extend(StepWindow(tl.rank, w.step, w.number, w.w0, w.w1) for w in specs)
    return steps, windows, packed


def _replica_groups(ranks: list[int], pipelines: list[list[int]]) -> list[list[int]]:
    """Indices into ``ranks`` grouped by pipeline (a DP replica), in pipeline order; ranks in no
    pipeline (or in a second one) form one last group."""
    at = {r: i for i, r in enumerate(ranks)}
    seen: set[int] = set()
    groups: list[list[int]] = []
    for p in pipelines:
        g = [at[r] for r in p if r in at and at[r] not in seen]
        seen.update(g)
        if g:
            groups.append(g)
    rest = [i for i in range(len(ranks)) if i not in seen]
    return [*groups, rest] if rest else groups


def _step_specs(run: Run, pipe: Pipeline, skip: int | None) -> list[RankItem]:
    """Each rank with its analyzed steps (windows and blocks); step index ``skip`` left out."""
    out: list[RankItem] = []
    for tl in run.ranks:
        specs = [
            StepWindowSpec(i, w.number, w.start, w.end, blocks)
            for (i, w), blocks in zip(
                enumerate(pipe.windows.get(tl.rank, [])),
                _blocks_by_step(pipe.blocks.get(tl.rank)),
                strict=False,  # the blocks never end
            )
            if i != skip
        ]
        out.append((tl, specs))
    return out


def _blocks_by_step(b: Blocks | None) -> Iterator[Blocks]:
    """The rank's blocks of step 0, 1, 2, ... (each in time order), for ever: one stable sort by
    step instead of one mask over all the rank's blocks per step."""
    if b is None or not len(b):
        while True:
            yield Blocks.empty()
    order = np.argsort(b.step, kind="stable")
    cut = np.searchsorted(b.step[order], np.arange(max(int(b.step.max()), 0) + 2), side="left")
    for i in range(cut.size - 1):
        yield b.take(order[cut[i] : cut[i + 1]])
    while True:
        yield b.take(order[:0])


def _warmup_step(pipe: Pipeline) -> int | None:
    """0 when the first analyzed step is a warm-up outlier (mean window over the ranks far from the
    other steps') and the run has more steps, else None."""
    n = min((len(ws) for ws in pipe.windows.values() if ws), default=0)
    if n < 2:
        return None
    dur = np.array(
        [[ws[i].end - ws[i].start for i in range(n)] for ws in pipe.windows.values() if ws], dtype=np.float64
    ).mean(axis=0)
    return 0 if warmup_outlier(dur.tolist()) else None


def _blamed(gaps: dict[int, GapTable], findings: list[FindingRow]) -> dict[int, GapTable]:
    """The attribution's gap tables with the root rank of each gap whose cause a finding traced to
    one rank (host stalls, slow links, a slow stage), so the timeline and the Perfetto overlay can
    show who to look at: new tables (``Diagnosis.gaps``); the attribution's stay as it painted them."""
    out = {r: dataclasses.replace(g, blame=g.blame.copy()) for r, g in gaps.items()}
    for f in findings:
        if f.cause is None or len(f.ranks) != 1:
            continue
        cause = Cause(f.cause).code
        for g in out.values():
            g.blame[g.cause == cause] = f.ranks[0]
    return out
