"""The CI gate (docs/ci.md): a budget (:mod:`ppdiag.reports.budget`) checked against a report.

``run_gate(report, budget, baseline)`` runs every configured check and returns a
:class:`GateResult` whose ``exit_code`` is 0 (pass), 1 (fail) or 3 (inconclusive);
``format_gate(result)`` gives the lines the CLI prints; ``load_report`` reads a report file
(a baseline) into its types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ppdiag.diagnosis import SCHEMA_VERSION
from ppdiag.errors import InputError
from ppdiag.facts import report_slowest_stage, report_stage_values, share_of
from ppdiag.report_types import Cause, CheckKind, CheckState, Gate, GateCheck, GateStatus, Report, decode
from ppdiag.reports.budget import (
    BUDGET_KEYS,
    DEFAULT_STEP_PCT,
    REGRESSION_KEYS,
    Budget,
    budget_from_dict,
    budget_help,
    load_budget,
)
from ppdiag.reports.coverage import Coverage, coverage_of, run_gaps
from ppdiag.reports.style import cause_label
from ppdiag.rules import load_builtin

__all__ = [
    "BUDGET_KEYS",
    "DEFAULT_STEP_PCT",
    "REGRESSION_KEYS",
    "Budget",
    "Check",
    "Coverage",
    "GateResult",
    "budget_from_dict",
    "budget_help",
    "comm_wait_ratio",
    "comparable",
    "coverage_of",
    "format_gate",
    "load_baseline",
    "load_budget",
    "load_report",
    "run_gaps",
    "run_gate",
    "stage_ratio",
]


@dataclass
class Check:
    """One gate check. ``passed`` is None when the check could not be evaluated."""

    name: str
    kind: str  # "budget" | "regression"
    measured: float | None
    limit: float | None
    passed: bool | None
    text: str
    note: str = ""
    unit: str = ""  # "" (ratio), "%" or "pts"

    @property
    def state(self) -> str:
        """``pass``, ``fail``, ``skip`` (not computable here) or ``inconclusive`` (nothing comparable)."""
        if self.passed is True:
            return "pass"
        if self.passed is False:
            return "fail"
        return "inconclusive" if self.kind == "regression" else "skip"

    def to_report(self) -> GateCheck:
        """The report's ``gate.checks[]`` row."""
        return GateCheck(
            name=self.name,
            kind=CheckKind(self.kind),
            measured=_r(self.measured),
            limit=_r(self.limit),
            state=CheckState(self.state),
            text=self.text,
            note=self.note,
        )


@dataclass
class GateResult:
    """All checks and the overall outcome of one gate run."""

    checks: list[Check] = field(default_factory=list)
    status: str = "pass"  # "pass" | "fail" | "inconclusive"
    reasons: list[str] = field(default_factory=list)  # why inconclusive / notes on the comparison
    budget_source: str | None = None
    baseline_source: str | None = None
    coverage: Coverage | None = None
    partial: list[str] = field(default_factory=list)  # ranks / checks that did not take part
    allow_partial: bool = False
    warnings: list[str] = field(default_factory=list)  # e.g. overrides that change the bubble

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 3 inconclusive (docs/ci.md, *Exit codes*)."""
        return {"pass": 0, "fail": 1, "inconclusive": 3}[self.status]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    def to_report(self) -> Gate:
        """The report's ``gate`` section."""
        return Gate(
            status=GateStatus(self.status),
            exit_code=self.exit_code,
            reasons=list(self.reasons),
            budget=self.budget_source,
            baseline=self.baseline_source,
            checks=[c.to_report() for c in self.checks],
            coverage=self.coverage.to_report() if self.coverage else None,
            partial=list(self.partial),
            allow_partial=self.allow_partial,
            warnings=list(self.warnings),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``gate`` section as the JSON file holds it."""
        doc: dict[str, Any] = msgspec.to_builtins(self.to_report())
        return doc


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 6)


# ----------------------------------------------------------------------------------------------
# reading reports


def load_report(path: str | Path, what: str = "report") -> Report:
    """Read a ppdiag JSON report (a baseline, or one side of a diff) as a :class:`Report`: its
    schema version checked, every field decoded into its type (a field missing or of the wrong
    type is an :class:`InputError` naming the file and the field)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(str(p), f"no such {what} file") from None
    except IsADirectoryError:
        raise InputError(str(p), f"is a directory, expected a ppdiag JSON {what}") from None
    except OSError as exc:
        raise InputError(str(p), f"cannot read: {exc.strerror or exc}") from None
    try:
        data = msgspec.json.decode(raw, type=_Versioned)
    except RecursionError:  # msgspec decodes nesting on Python's stack: a bounded decode
        raise InputError(str(p), f"not a ppdiag JSON {what}: values nested too deeply to decode") from None
    except msgspec.ValidationError:  # valid JSON, not an object (a DecodeError subclass: first)
        raise InputError(str(p), "not a ppdiag JSON report (no schema_version)") from None
    except msgspec.DecodeError as exc:
        raise InputError(
            str(p), f"not valid JSON ({exc}); expected a report written by 'ppdiag analyze --json'"
        ) from None
    ver = data.schema_version
    if ver is msgspec.UNSET:
        raise InputError(str(p), "not a ppdiag JSON report (no schema_version)")
    # true == 1 and 1.0 == 1 in Python: the version is the JSON integer 1, nothing else
    if type(ver) is not int or ver != SCHEMA_VERSION:
        raise InputError(
            str(p), f"report schema_version {ver!r} is not supported (this ppdiag reads {SCHEMA_VERSION})"
        )
    load_builtin()  # each finding's evidence decodes as its rule's type
    try:
        return decode(raw)
    except RecursionError:
        raise InputError(str(p), f"not a ppdiag JSON {what}: values nested too deeply to decode") from None
    except msgspec.ValidationError as exc:
        raise InputError(
            str(p), f"not a ppdiag JSON {what} of schema version {SCHEMA_VERSION}: {exc}"
        ) from None


class _Versioned(msgspec.Struct):
    """The one key read before the rest: which schema the file claims."""

    schema_version: object = msgspec.UNSET


def load_baseline(path: str | Path) -> Report:
    """Read the baseline JSON report of ``ppdiag check --baseline`` (see :func:`load_report`)."""
    return load_report(path, what="baseline")


def stage_ratio(report: Report) -> tuple[float | None, str]:
    """Slowest stage compute / mean stage compute as the analysis wrote it (``summary.stage_ratio``
    and ``summary.slowest_stage``, :class:`ppdiag.facts.StageBalance`, the measure PP003 and the
    reports use), and a note naming the slowest stage."""
    ratio = report.summary.stage_ratio
    if ratio is None:
        few = len(report.stages) < 2
        return None, "fewer than 2 pipeline stages" if few else "no stage compute measured"
    i = report_slowest_stage(report)
    vals = report_stage_values(report.stages)
    if i is None or vals is None:
        return ratio, "no stage stands out of the mean"
    mean = sum(vals) / len(vals)
    return ratio, f"slowest stage {report.stages[i].stage}: {vals[i]:.2f} ms vs mean {mean:.2f} ms"


def comm_wait_ratio(report: Report) -> tuple[float | None, str]:
    """Recv / NCCL wait time over step time, mean over ranks (from the summary when no ranks)."""
    ratios = [
        r.lost_ms["comm_wait"] / r.step_ms for r in report.ranks if "comm_wait" in r.lost_ms and r.step_ms
    ]
    if ratios:
        worst = max(ratios)
        return sum(ratios) / len(ratios), f"worst rank {worst:.3f}"
    cw, st = report.summary.lost_ms.get("comm_wait"), report.summary.step_ms
    if cw is None or not st:
        return None, "no recv / NCCL wait figures"
    return cw / st, ""


def comparable(
    report: Report, baseline: Report, base_name: str = "baseline", new_name: str = "this run"
) -> list[str]:
    """Why ``baseline`` cannot be compared with ``report`` (empty when it can)."""
    why = []
    if baseline.schema_version != report.schema_version:
        why.append(
            f"{base_name} schema_version {baseline.schema_version!r}, {new_name} {report.schema_version!r}"
        )
    a, b = baseline.run, report.run
    for label, va, vb in (
        ("pp", a.pp, b.pp),
        ("schedule", a.schedule, b.schedule),
        ("micro-batches (M)", a.microbatches, b.microbatches),
        ("virtual stages", a.virtual_stages or 1, b.virtual_stages or 1),
    ):
        if va != vb:
            why.append(f"{base_name} has {label} {va}, {new_name} {vb}")
    return why


# ----------------------------------------------------------------------------------------------
# checking


def _limit_check(
    name: str,
    label: str,
    measured: float | None,
    limit: float,
    note: str,
    unit: str = "",
    kind: str = "budget",
) -> Check:
    if measured is None:
        return Check(name, kind, None, limit, None, f"{label}: not checked ({note})", note, unit)
    ok = measured <= limit + 1e-12
    op = "<=" if ok else ">"
    if unit == "%":
        text = f"{label} {measured:+.1f} % {op} +{limit:.1f} %"
    elif unit == "pts":
        text = f"{label} {measured:+.2f} pts {op} +{limit:.2f} pts"
    else:
        # enough digits that a failing value never prints equal to its limit (1.0004 > 1.000)
        d = 3
        while d < 9 and f"{measured:.{d}f}" == f"{limit:.{d}f}" and measured != limit:
            d += 1
        text = f"{label} {measured:.{d}f} {op} {limit:.{d}f}"
    if note:
        text += f"  ({note})"
    return Check(name, kind, measured, limit, ok, text, note, unit)


def run_gate(
    report: Report,
    budget: Budget,
    baseline: Report | None = None,
    baseline_source: str | None = None,
    coverage: Coverage | None = None,
    allow_partial: bool = False,
) -> GateResult:
    """Run every check ``budget`` configures on ``report`` (and against ``baseline`` when given).

    Status: ``fail`` when any check failed; otherwise ``inconclusive`` when the baseline is not
    comparable (another pp, schedule, M or virtual stages) or when nothing could be checked;
    otherwise ``pass``. Budget checks whose input is absent (no pipeline, one stage) are skipped
    with a note; like a rank without a trace or steps (``coverage``), they make a gate that
    would pass ``inconclusive`` unless ``allow_partial``.
    """
    res = GateResult(budget_source=budget.source, baseline_source=baseline_source)
    res.checks += _budget_checks(report, budget)
    incomparable: list[str] = []
    if baseline is not None:
        incomparable = comparable(report, baseline)
        res.reasons += incomparable
        res.checks += _regression_checks(report, baseline, budget, incomparable)
    res.allow_partial = allow_partial
    res.coverage = coverage
    if coverage is not None:
        res.partial += coverage.gaps()
    res.partial += [
        f"check {c.name} could not be computed ({c.note or c.text})"
        for c in res.checks
        if c.passed is None and not incomparable
    ]
    _verdict(res, bool(incomparable), allow_partial)
    return res


def _verdict(res: GateResult, incomparable: bool, allow_partial: bool) -> None:
    """Set ``res.status`` (and the reasons of an inconclusive gate) from its checks."""
    if any(c.passed is False for c in res.checks):
        res.status = "fail"  # a limit exceeded on part of the run is exceeded on the run
    elif incomparable:
        res.status = "inconclusive"
    elif not any(c.passed is True for c in res.checks):
        res.status = "inconclusive"
        if not res.checks:
            res.reasons.append("the budget sets no limit and no baseline was given: nothing to check")
        else:
            res.reasons.append("no configured check could be evaluated on this run")
    elif res.partial and not allow_partial:
        res.status = "inconclusive"
        res.reasons.append("partial data: " + "; ".join(res.partial) + " (pass --allow-partial to accept)")
    else:
        res.status = "pass"


def _budget_checks(report: Report, budget: Budget) -> list[Check]:
    """The limits on this run alone: lost ratio, bubble excess, stage ratio, comm wait, p95."""
    out: list[Check] = []
    summ = report.summary
    if budget.max_lost_ratio is not None:
        note = "" if summ.lost_ratio is not None else "no lost_ratio in the report"
        out.append(
            _limit_check("lost_ratio", "lost time / step", summ.lost_ratio, budget.max_lost_ratio, note)
        )
    if budget.max_bubble_excess is not None:
        meas, theo = report.bubble.measured_ratio, report.bubble.theoretical_ratio
        if meas is None or theo is None:
            missing = "measured" if meas is None else "theoretical"
            why = f"no {missing} bubble ratio: no pipeline schedule identified"
            out.append(_limit_check("bubble_excess", "bubble excess", None, budget.max_bubble_excess, why))
        else:
            note = f"measured {meas:.3f} - theoretical {theo:.3f}"
            out.append(
                _limit_check("bubble_excess", "bubble excess", meas - theo, budget.max_bubble_excess, note)
            )
    if budget.max_stage_ratio is not None:
        v, note = stage_ratio(report)
        out.append(_limit_check("stage_ratio", "slowest / mean stage", v, budget.max_stage_ratio, note))
    if budget.max_comm_wait_ratio is not None:
        v, note = comm_wait_ratio(report)
        out.append(
            _limit_check("comm_wait_ratio", "recv/NCCL wait / step", v, budget.max_comm_wait_ratio, note)
        )
    if budget.max_step_p95_ratio is not None:
        p95, med = summ.step_p95_ms, summ.step_ms
        v = p95 / med if (p95 is not None and med) else None
        note = f"p95 {p95:.2f} ms vs median {med:.2f} ms" if v is not None else "no step p95 / median"
        out.append(_limit_check("step_p95_ratio", "step p95 / median", v, budget.max_step_p95_ratio, note))
    return out


def _regression_checks(
    report: Report, baseline: Report, budget: Budget, incomparable: list[str]
) -> list[Check]:
    """Step time (``step_pct`` %) and each cause (``lost_pct`` points of step) vs the baseline."""
    step_limit = budget.step_pct if budget.step_pct is not None else DEFAULT_STEP_PCT
    if incomparable:
        why = "; ".join(incomparable)
        text = f"step time vs baseline: inconclusive ({why})"
        out = [Check("regression.step", "regression", None, step_limit, None, text, why, "%")]
        if budget.lost_pct is not None:
            out.append(_lost_inconclusive(budget.lost_pct, why))
        return out
    new, old = report.summary.step_ms, baseline.summary.step_ms
    if new is None or not old or old < 0 or not math.isfinite(old):
        why = _step_why(new, baseline)
        text = f"step time vs baseline: inconclusive ({why})"
        out = [Check("regression.step", "regression", None, step_limit, None, text, why, "%")]
    else:
        growth = (new - old) / old * 100.0
        note = f"{old:.2f} → {new:.2f} ms"
        out = [
            _limit_check(
                "regression.step", "step time vs baseline", growth, step_limit, note, "%", "regression"
            )
        ]
    if budget.lost_pct is not None:
        out += _cause_checks(report, baseline, budget.lost_pct)
    return out


def _cause_checks(report: Report, baseline: Report, limit: float) -> list[Check]:
    """Each cause's share of the step vs the baseline's, in points."""
    out: list[Check] = []
    absent = [
        c for c in Cause if share_of(baseline.summary, c) is None or share_of(report.summary, c) is None
    ]
    if absent:
        # a cause the baseline (or this run) lacks cannot be compared: say so, never drop the
        # check silently
        side = "baseline" if any(share_of(baseline.summary, c) is None for c in absent) else "this run"
        out.append(
            _lost_inconclusive(
                limit, f"{side} has no valid summary.lost_ms / step_ms for {', '.join(absent)}"
            )
        )
    for c in Cause:
        a, b = share_of(baseline.summary, c), share_of(report.summary, c)
        if a is None or b is None:
            continue
        note = f"{100 * a:.1f} % → {100 * b:.1f} % of step"
        label = f"{cause_label(c)} vs baseline"
        out.append(_limit_check(f"regression.{c}", label, (b - a) * 100.0, limit, note, "pts", "regression"))
    return out


def _lost_inconclusive(limit: float, why: str) -> Check:
    """The lost-time regression check when it cannot be computed (inconclusive, with the reason)."""
    return Check(
        "regression.lost",
        "regression",
        None,
        limit,
        None,
        f"lost time by cause vs baseline: inconclusive ({why})",
        why,
        "pts",
    )


def _step_why(new: float | None, baseline: Report) -> str:
    if new is None:
        return "this run has no step time"
    raw = baseline.summary.step_ms
    if raw is None:
        return "baseline has no summary.step_ms"
    return f"baseline summary.step_ms is {raw!r}, not a positive number"


def format_gate(result: GateResult) -> list[str]:
    """The lines ``ppdiag check`` prints: a verdict, then one line per check."""
    n_fail = len(result.failed)
    n = len(result.checks)
    head = {
        "pass": f"PASS: all {sum(c.passed is True for c in result.checks)} checks within budget",
        "fail": f"FAIL: {n_fail} of {n} checks over the limit",
        "inconclusive": "INCONCLUSIVE: nothing comparable",
    }[result.status]
    if result.status == "inconclusive" and result.reasons:
        head = f"INCONCLUSIVE: {'; '.join(result.reasons)}"
    elif result.status == "pass" and result.partial:
        head += f" (partial data accepted by --allow-partial: {len(result.partial)} gap(s) below)"
    lines = [f"ppdiag check {head}"]
    if result.coverage is not None:
        lines.append(f"  took part: {result.coverage.line()}")
    ran = [c.name for c in result.checks if c.passed is not None]
    lines.append(f"  checks computed: {', '.join(ran) or 'none'}")
    for p in result.partial:
        lines.append(f"  {'NOTE' if result.allow_partial else 'MISSING'}  {p}")
    for w in result.warnings:
        lines.append(f"  WARN  {w}")
    tag = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP", "inconclusive": "N/A "}
    for c in result.checks:
        lines.append(f"  {tag[c.state]}  {c.text}")
    return lines
