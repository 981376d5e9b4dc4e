"""Diagnosis rules (PP001...), registered by code. A new rule is one module that calls :func:`register`.

Each rule carries linter-like metadata: ``code``, ``name``, ``cause``, ``summary``, the type of its
findings' evidence (``evidence``, a :class:`~ppdiag.report_types.Evidence` Struct the module
defines) and a docstring with the sections *What it detects*, *Why it matters*, *How to fix*,
*Example* (``ppdiag rules CODE``).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ppdiag.attribution.causes import Attribution, RankStep
    from ppdiag.facts import StageBalance
    from ppdiag.model import Run
    from ppdiag.pipeline import Pipeline
    from ppdiag.report_evidence import Evidence
    from ppdiag.report_types import Cause, FindingRow, Report
    from ppdiag.rules.noise import NoiseModel
    from ppdiag.whatif.batch import BatchCheck
    from ppdiag.whatif.scenarios import FixPredictions


@dataclass(frozen=True)
class RuleOptions:
    """What the user told the analysis that rules read (the rest of the options shape the layers
    below and reach the rules through them)."""

    global_batch: int | None = None  # --global-batch: the samples per optimizer step


@dataclass(frozen=True)
class RuleContext:
    """What a rule may look at: the typed report so far (no findings or what-if rows yet) and the
    layers below it.

    ``predictions`` are the what-if answers for every fix (computed before the rules run, by the
    same model as the report's what-if table): a finding's gain is the prediction of its own fix.
    ``noise`` is the run's noise model (severity), ``batch`` the batch-size arithmetic.
    """

    report: Report
    run: Run
    pipeline: Pipeline
    steps: list[RankStep]
    attribution: Attribution
    options: RuleOptions = field(default_factory=lambda: RuleOptions())
    predictions: FixPredictions | None = None
    noise: NoiseModel | None = None
    batch: BatchCheck | None = None
    balance: StageBalance | None = None  # ppdiag.facts.stage_balance of the run, computed once

    @property
    def step_ms(self) -> float:
        """The mean step (ms): the one denominator of every share and gain in the report (its
        causes add up to it); the median for a report written before the mean existed."""
        return self.report.summary.step_mean_ms or self.report.summary.step_ms or 0.0


class Rule(Protocol):
    """A registered rule (metadata are read-only attributes of the rule object)."""

    @property
    def code(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def cause(self) -> Cause | None: ...
    @property
    def summary(self) -> str: ...
    @property
    def evidence(self) -> type[Evidence]: ...

    def check(self, ctx: RuleContext) -> list[FindingRow]:
        """Findings of this rule for the run (empty when it does not apply)."""
        ...


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.code in RULES:
        raise ValueError(f"rule code {rule.code} registered twice")
    RULES[rule.code] = rule
    # imported here: ``ppdiag rules`` reads this package without loading msgspec
    from ppdiag.report_evidence import register_evidence

    register_evidence(rule.code, rule.evidence)
    return rule


def load_builtin() -> None:
    """Import every ``ppdiag.rules.pp*`` module so it registers itself."""
    import ppdiag.rules as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        if mod.startswith("pp"):
            importlib.import_module(f"ppdiag.rules.{mod}")


def run_rules(ctx: RuleContext) -> list[FindingRow]:
    """All findings, most severe first, then by estimated gain (largest first). Severity comes
    first because a gain within the run's noise (``low``) does not rank against one outside it;
    among ``low`` findings those with a cause and a rank or stage to look at come first, the one
    closest to standing out (gain / noise) first."""
    load_builtin()
    found: list[FindingRow] = []
    for code in sorted(RULES):
        found.extend(RULES[code].check(ctx))
    topo = ctx.pipeline.topology
    where = (len(ctx.run.ranks), max(topo.pp * topo.virtual, 1))
    found.sort(key=lambda f: _order(f, where))
    return found


_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}


def _points_somewhere(f: FindingRow, where: tuple[int, int]) -> bool:
    """Whether ``f`` names some of the run's ranks or stages (``where``: how many there are), not
    none and not every one."""
    n_ranks, n_stages = where
    return 0 < len(set(f.ranks)) < n_ranks or 0 < len(set(f.stages)) < n_stages


def _order(f: FindingRow, where: tuple[int, int]) -> tuple[int, int, float, str]:
    gain = f.gain_ms or 0.0
    noise = f.evidence.noise_ms
    general = 0
    if f.severity == "low":
        # within the noise: a cause comes before a general remark (jitter, sizes), and a cause at
        # a place to look at (some ranks or stages, not all) before one alike everywhere: with
        # gains this close, the finding that points somewhere is the one to read first
        general = (0 if _points_somewhere(f, where) else 1) if f.cause else 2
        if isinstance(noise, float) and noise > 0:
            gain = gain / float(noise)
    return (_SEVERITY_ORDER.get(f.severity, 4), general, -gain, f.code)
