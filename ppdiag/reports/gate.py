"""The CI gate (DESIGN.md §8): a budget read from TOML, checked against a JSON report.

``load_budget(path)`` reads ``[budget]`` / ``[regression]`` from a budget file, or
``[tool.ppdiag.budget]`` / ``[tool.ppdiag.regression]`` from ``pyproject.toml``;
``run_gate(report, budget, baseline)`` runs every configured check and returns a
:class:`GateResult` whose ``exit_code`` is 0 (pass), 1 (fail) or 3 (inconclusive);
``format_gate(result)`` gives the lines the CLI prints.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppdiag.diagnosis import CAUSE_KEYS, SCHEMA_VERSION
from ppdiag.errors import InputError
from ppdiag.reports.style import cause_label, share

try:  # Python >= 3.11
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python 3.10 with the tomli backport installed
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ModuleNotFoundError:
        _toml = None  # type: ignore[assignment]


BUDGET_KEYS: dict[str, str] = {
    "max_lost_ratio": "lost time / step time, mean over ranks",
    "max_bubble_excess": "measured bubble ratio minus the theoretical one",
    "max_stage_ratio": "slowest stage compute / mean stage compute",
    "max_comm_wait_ratio": "recv / NCCL wait time / step time, mean over ranks",
    "max_step_p95_ratio": "step time p95 / median",
}
REGRESSION_KEYS: dict[str, str] = {
    "step_pct": "allowed step-time growth vs the baseline, %",
    "lost_pct": "allowed growth of each cause vs the baseline, points of step time",
}
DEFAULT_STEP_PCT = 5.0

# Keys whose value is a fraction of step time: a value above 1 is almost surely a percentage.
_RATIO_KEYS = ("max_lost_ratio", "max_bubble_excess", "max_comm_wait_ratio")
# Keys whose measured value can never be below 1.
_AT_LEAST_ONE = ("max_stage_ratio", "max_step_p95_ratio")


@dataclass
class Budget:
    """Limits of the gate; ``None`` = not checked."""

    max_lost_ratio: float | None = None
    max_bubble_excess: float | None = None
    max_stage_ratio: float | None = None
    max_comm_wait_ratio: float | None = None
    max_step_p95_ratio: float | None = None
    step_pct: float | None = None  # None = DEFAULT_STEP_PCT when a baseline is given
    lost_pct: float | None = None
    source: str | None = None

    def is_empty(self) -> bool:
        """True when the budget sets no limit at all."""
        return all(getattr(self, k) is None for k in (*BUDGET_KEYS, *REGRESSION_KEYS))


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

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "measured": _r(self.measured),
            "limit": _r(self.limit),
            "state": self.state,
            "text": self.text,
            "note": self.note,
        }


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
        """0 pass, 1 fail, 3 inconclusive (DESIGN.md §1)."""
        return {"pass": 0, "fail": 1, "inconclusive": 3}[self.status]

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "reasons": self.reasons,
            "budget": self.budget_source,
            "baseline": self.baseline_source,
            "checks": [c.to_json() for c in self.checks],
            "coverage": self.coverage.to_json() if self.coverage else None,
            "partial": self.partial,
            "allow_partial": self.allow_partial,
            "warnings": self.warnings,
        }


@dataclass
class Coverage:
    """Which ranks and steps of the run the gate's figures come from."""

    world_size: int = 0
    traced: list[int] = field(default_factory=list)  # ranks whose trace was read
    analyzed: list[int] = field(default_factory=list)  # ranks with at least one analysed step
    steps: list[int] = field(default_factory=list)  # step numbers analysed
    skipped_files: list[str] = field(default_factory=list)  # trace-like files that could not be read
    step_filter: str | None = None
    doubts: list[str] = field(default_factory=list)  # ranks that disagree with the others

    @property
    def expected(self) -> int:
        """Ranks the job has: ``world_size``, or (when no trace says it) up to the highest rank
        traced, since ranks are numbered from 0."""
        return self.world_size or (max(self.traced) + 1 if self.traced else 0)

    @property
    def missing(self) -> list[int]:
        """Ranks of ``0..expected-1`` without a trace (the first 1000 of a huge job)."""
        have = set(self.traced)
        out: list[int] = []
        for r in range(self.expected):
            if r not in have:
                out.append(r)
                if len(out) >= 1000:
                    break
        return out

    @property
    def no_steps(self) -> list[int]:
        """Traced ranks that contributed no step (all excluded by ``--steps``, or none found)."""
        got = set(self.analyzed)
        return [r for r in self.traced if r not in got]

    def gaps(self) -> list[str]:
        """Why the run is only partly covered (empty when every rank took part)."""
        out = []
        missing = self.missing
        if missing:
            of = f"world size {self.world_size}" if self.world_size else f"ranks 0-{self.expected - 1}"
            n = self.expected - len(set(self.traced) & set(range(self.expected)))
            out.append(f"{n} rank(s) {_ranges(missing)} of {of} have no trace")
        if self.no_steps:
            why = f" (excluded by --steps {self.step_filter})" if self.step_filter else ""
            out.append(f"rank(s) {_ranges(self.no_steps)} have no analysed step{why}")
        for f in self.skipped_files:
            out.append(f"unreadable trace file {f}")
        out += self.doubts
        return out

    def line(self) -> str:
        """One line: which ranks and steps took part."""
        world = f"world size {self.world_size}" if self.world_size else "world size unknown"
        steps = f"steps {_ranges(self.steps)}" if self.steps else "no step"
        return f"ranks {_ranges(self.analyzed) or 'none'} ({world}); {steps}"

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "traced": self.traced,
            "analyzed": self.analyzed,
            "steps": self.steps,
            "missing": self.missing,
            "no_steps": self.no_steps,
            "skipped_files": self.skipped_files,
            "doubts": self.doubts,
        }


def _ranges(xs: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    xs = sorted(set(xs))
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    if len(out) > 12:
        out = [*out[:12], f"... ({len(xs)} in all)"]
    return ", ".join(out)


def coverage_of(
    report: dict[str, Any], skipped_files: list[str] | None = None, step_filter: str | None = None
) -> Coverage:
    """The :class:`Coverage` a JSON report describes (``run.world_size``, ``run.ranks``, ``ranks``)."""
    run = report.get("run") or {}
    traced = [int(r) for r in run.get("ranks") or [] if isinstance(r, int) and not isinstance(r, bool)]
    analyzed = [
        int(r["rank"])
        for r in report.get("ranks") or []
        if isinstance(r, dict) and isinstance(r.get("rank"), int) and (r.get("steps", 1) or 0) > 0
    ]
    world = run.get("world_size")
    world = int(world) if isinstance(world, int) and not isinstance(world, bool) and world > 0 else 0
    steps = [int(s) for s in run.get("steps") or [] if isinstance(s, int) and s >= 0]
    return Coverage(world, traced, analyzed, steps, list(skipped_files or []), step_filter)


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 6)


# ----------------------------------------------------------------------------------------------
# loading


def _read_toml(path: Path) -> dict[str, Any]:
    if _toml is None:  # pragma: no cover - only on Python 3.10 without tomli
        raise InputError(str(path), "reading TOML needs Python >= 3.11 or the 'tomli' package")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(str(path), "no such budget file") from None
    except IsADirectoryError:
        raise InputError(str(path), "is a directory, expected a TOML budget file") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(str(path), "not a TOML file (not UTF-8 text)") from None
    try:
        data: dict[str, Any] = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise InputError(str(path), f"not valid TOML: {exc}") from None
    return data


def _number(path: str, where: str, key: str, value: Any) -> float:
    # TOML booleans are Python bools, which are ints: refuse them explicitly
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(path, f"{where}.{key} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise InputError(path, f"{where}.{key} must be a finite number, got {value!r}")
    if v < 0:
        raise InputError(path, f"{where}.{key} must not be negative, got {value!r}")
    if key in _RATIO_KEYS and v > 1:
        raise InputError(
            path,
            f"{where}.{key} is a ratio of step time between 0 and 1, got {value!r}"
            f" (for {value!r} % write {v / 100:g})",
        )
    if key in _AT_LEAST_ONE and v < 1:
        raise InputError(
            path, f"{where}.{key} must be >= 1 (the measured ratio is never below 1), got {value!r}"
        )
    return v


def _table(path: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(path, f"[{where}] must be a table, got {type(value).__name__} {value!r}")
    return value


def _unknown(path: str, where: str, keys: list[str], known: list[str]) -> InputError:
    return InputError(
        path, f"unknown key(s) in [{where}]: {', '.join(sorted(keys))} (known: {', '.join(known)})"
    )


def budget_from_dict(data: dict[str, Any], path: str, prefix: str = "") -> Budget:
    """Validate a parsed ``{budget: {...}, regression: {...}}`` mapping into a :class:`Budget`.

    ``prefix`` (``"tool.ppdiag."`` for pyproject.toml) only changes how errors name the tables.
    """
    known_tables = ["budget", "regression"]
    extra = [k for k in data if k not in known_tables]
    if extra:
        where = prefix.rstrip(".") or "top level"
        raise InputError(
            path,
            f"unknown key(s) in [{where}]: {', '.join(sorted(extra))} "
            f"(known: {', '.join(f'[{prefix}{t}]' for t in known_tables)})",
        )
    b = Budget(source=path)
    for tname, keys in (("budget", BUDGET_KEYS), ("regression", REGRESSION_KEYS)):
        if tname not in data:
            continue
        where = f"{prefix}{tname}"
        tab = _table(path, where, data[tname])
        bad = [k for k in tab if k not in keys]
        if bad:
            raise _unknown(path, where, bad, list(keys))
        for k, v in tab.items():
            setattr(b, k, _number(path, where, k, v))
    return b


def load_budget(path: str | Path) -> Budget:
    """Read a budget file (``[budget]``/``[regression]``) or a pyproject.toml (``[tool.ppdiag.*]``).

    Raises :class:`InputError` naming the file for a missing file, invalid TOML, an unknown table
    or key, a non-number, a negative value or a ratio given as a percentage.
    """
    p = Path(path)
    data = _read_toml(p)
    if p.name == "pyproject.toml" or ("tool" in data and "budget" not in data and "regression" not in data):
        # pyproject.toml: other tools' tables and [project] are none of our business
        tool = data.get("tool")
        if not isinstance(tool, dict) or "ppdiag" not in tool:
            raise InputError(str(p), "no [tool.ppdiag.budget] or [tool.ppdiag.regression] table")
        sub = _table(str(p), "tool.ppdiag", tool["ppdiag"])
        return budget_from_dict(sub, str(p), prefix="tool.ppdiag.")
    return budget_from_dict(data, str(p))


def load_report(path: str | Path, what: str = "report") -> dict[str, Any]:
    """Read a ppdiag JSON report (a baseline, or one side of a diff) and check its schema version."""
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
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(
            str(p), f"not valid JSON ({exc}); expected a report written by 'ppdiag analyze --json'"
        ) from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError(str(p), "not a ppdiag JSON report (no schema_version)")
    ver = data["schema_version"]
    # true == 1 and 1.0 == 1 in Python: the version is the JSON integer 1, nothing else
    if type(ver) is not int or ver != SCHEMA_VERSION:
        raise InputError(
            str(p), f"report schema_version {ver!r} is not supported (this ppdiag reads {SCHEMA_VERSION})"
        )
    if not isinstance(data.get("summary"), dict) or not isinstance(data.get("run"), dict):
        raise InputError(str(p), "ppdiag JSON report without 'run' and 'summary' sections")
    return data


def load_baseline(path: str | Path) -> dict[str, Any]:
    """Read the baseline JSON report of ``ppdiag check --baseline`` (see :func:`load_report`)."""
    return load_report(path, what="baseline")


# ----------------------------------------------------------------------------------------------
# measuring


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x)
    return None if math.isnan(v) else v


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def stage_ratio(report: dict[str, Any]) -> tuple[float | None, str]:
    """Slowest stage compute / mean stage compute (:class:`ppdiag.facts.StageBalance`, the measure
    PP003 and the reports use), and a note naming the heaviest stage."""
    from ppdiag.facts import balance_of
    from ppdiag.reports.style import stage_values

    stages = [s for s in report.get("stages") or [] if isinstance(s, dict)]
    vals = stage_values(stages) if len(stages) >= 2 else None
    if vals is None:
        return None, "fewer than 2 pipeline stages"
    bal = balance_of(dict(enumerate(vals)))
    if bal.ratio is None or bal.heaviest is None or bal.mean_ms is None:
        return None, "no stage compute measured"
    i = bal.heaviest
    return bal.ratio, f"slowest stage {stages[i].get('stage')}: {vals[i]:.2f} ms vs mean {bal.mean_ms:.2f} ms"


def comm_wait_ratio(report: dict[str, Any]) -> tuple[float | None, str]:
    """Recv / NCCL wait time over step time, mean over ranks (from the summary when no ranks)."""
    ratios = []
    for r in report.get("ranks") or []:
        cw, st = _num(_get(r, "lost_ms", "comm_wait")), _num(r.get("step_ms"))
        if cw is not None and st:
            ratios.append(cw / st)
    if ratios:
        worst = max(ratios)
        return sum(ratios) / len(ratios), f"worst rank {worst:.3f}"
    cw, st = _num(_get(report, "summary", "lost_ms", "comm_wait")), _num(_get(report, "summary", "step_ms"))
    if cw is None or not st:
        return None, "no recv / NCCL wait figures"
    return cw / st, ""


def _cause_share(report: dict[str, Any], cause: str) -> float | None:
    summ = report.get("summary")
    return share(summ, cause) if isinstance(summ, dict) else None


def comparable(
    report: dict[str, Any], baseline: dict[str, Any], base_name: str = "baseline", new_name: str = "this run"
) -> list[str]:
    """Why ``baseline`` cannot be compared with ``report`` (empty when it can)."""
    why = []
    if baseline.get("schema_version") != report.get("schema_version"):
        why.append(
            f"{base_name} schema_version {baseline.get('schema_version')!r}, "
            f"{new_name} {report.get('schema_version')!r}"
        )
    for key, label in (
        ("pp", "pp"),
        ("schedule", "schedule"),
        ("microbatches", "micro-batches (M)"),
        ("virtual_stages", "virtual stages"),
    ):
        a, b = _get(baseline, "run", key), _get(report, "run", key)
        if key == "virtual_stages":
            a, b = a or 1, b or 1  # absent and 1 mean the same
        if a != b:
            why.append(f"{base_name} has {label} {a}, {new_name} {b}")
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
    report: dict[str, Any],
    budget: Budget,
    baseline: dict[str, Any] | None = None,
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
    summ = report.get("summary") or {}

    if budget.max_lost_ratio is not None:
        res.checks.append(
            _limit_check(
                "lost_ratio",
                "lost time / step",
                _num(summ.get("lost_ratio")),
                budget.max_lost_ratio,
                "" if _num(summ.get("lost_ratio")) is not None else "no lost_ratio in the report",
            )
        )
    if budget.max_bubble_excess is not None:
        meas, theo = (
            _num(_get(report, "bubble", "measured_ratio")),
            _num(_get(report, "bubble", "theoretical_ratio")),
        )
        if meas is None or theo is None:
            missing = "measured" if meas is None else "theoretical"
            res.checks.append(
                _limit_check(
                    "bubble_excess",
                    "bubble excess",
                    None,
                    budget.max_bubble_excess,
                    f"no {missing} bubble ratio: no pipeline schedule identified",
                )
            )
        else:
            res.checks.append(
                _limit_check(
                    "bubble_excess",
                    "bubble excess",
                    meas - theo,
                    budget.max_bubble_excess,
                    f"measured {meas:.3f} - theoretical {theo:.3f}",
                )
            )
    if budget.max_stage_ratio is not None:
        v, note = stage_ratio(report)
        res.checks.append(
            _limit_check("stage_ratio", "slowest / mean stage", v, budget.max_stage_ratio, note)
        )
    if budget.max_comm_wait_ratio is not None:
        v, note = comm_wait_ratio(report)
        res.checks.append(
            _limit_check("comm_wait_ratio", "recv/NCCL wait / step", v, budget.max_comm_wait_ratio, note)
        )
    if budget.max_step_p95_ratio is not None:
        p95, med = _num(summ.get("step_p95_ms")), _num(summ.get("step_ms"))
        v = p95 / med if (p95 is not None and med) else None
        note = f"p95 {p95:.2f} ms vs median {med:.2f} ms" if v is not None else "no step p95 / median"
        res.checks.append(
            _limit_check("step_p95_ratio", "step p95 / median", v, budget.max_step_p95_ratio, note)
        )

    incomparable: list[str] = []
    if baseline is not None:
        incomparable = comparable(report, baseline)
        step_limit = budget.step_pct if budget.step_pct is not None else DEFAULT_STEP_PCT
        if incomparable:
            res.reasons += incomparable
            why = "; ".join(incomparable)
            res.checks.append(
                Check(
                    "regression.step",
                    "regression",
                    None,
                    step_limit,
                    None,
                    f"step time vs baseline: inconclusive ({why})",
                    why,
                    "%",
                )
            )
            if budget.lost_pct is not None:
                res.checks.append(_lost_inconclusive(budget.lost_pct, why))
        else:
            new, old = _num(summ.get("step_ms")), _num(_get(baseline, "summary", "step_ms"))
            if new is None or not old or old < 0 or not math.isfinite(old):
                res.checks.append(
                    Check(
                        "regression.step",
                        "regression",
                        None,
                        step_limit,
                        None,
                        f"step time vs baseline: inconclusive ({_step_why(new, baseline)})",
                        _step_why(new, baseline),
                        "%",
                    )
                )
            else:
                growth = (new - old) / old * 100.0
                res.checks.append(
                    _limit_check(
                        "regression.step",
                        "step time vs baseline",
                        growth,
                        step_limit,
                        f"{old:.2f} → {new:.2f} ms",
                        unit="%",
                        kind="regression",
                    )
                )
            if budget.lost_pct is not None:
                absent = [
                    c
                    for c in CAUSE_KEYS
                    if _cause_share(baseline, c) is None or _cause_share(report, c) is None
                ]
                if absent:
                    # a cause the baseline (or this run) lacks cannot be compared: say so, never
                    # drop the check silently
                    side = (
                        "baseline" if any(_cause_share(baseline, c) is None for c in absent) else "this run"
                    )
                    why = f"{side} has no valid summary.lost_ms / step_ms for {', '.join(absent)}"
                    res.checks.append(_lost_inconclusive(budget.lost_pct, why))
                for c in CAUSE_KEYS:
                    a, b = _cause_share(baseline, c), _cause_share(report, c)
                    if a is None or b is None:
                        continue
                    pts = (b - a) * 100.0
                    res.checks.append(
                        _limit_check(
                            f"regression.{c}",
                            f"{cause_label(c)} vs baseline",
                            pts,
                            budget.lost_pct,
                            f"{100 * a:.1f} % → {100 * b:.1f} % of step",
                            unit="pts",
                            kind="regression",
                        )
                    )

    res.allow_partial = allow_partial
    res.coverage = coverage
    if coverage is not None:
        res.partial += coverage.gaps()
    res.partial += [
        f"check {c.name} could not be computed ({c.note or c.text})"
        for c in res.checks
        if c.passed is None and not incomparable
    ]
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
    return res


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


def _step_why(new: float | None, baseline: dict[str, Any]) -> str:
    if new is None:
        return "this run has no step time"
    raw = _get(baseline, "summary", "step_ms")
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


def budget_help() -> list[str]:
    """One line per budget key with its meaning (for ``--help`` texts and docs)."""
    out = [f"[budget] {k}: {v}" for k, v in BUDGET_KEYS.items()]
    out += [f"[regression] {k}: {v}" for k, v in REGRESSION_KEYS.items()]
    return out
