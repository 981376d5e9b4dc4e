"""The claims a report makes about itself, checked: :func:`violations` (``Report.check()``).

A report states the same fact in several places: a share in ``summary.shares`` and in a finding's
title, a slowest stage in ``summary`` and in PP003, ranks in ``run.ranks`` and in each finding. Each
check below is one class of claim (``docs/json.md``, "A report that agrees with itself"); a
violation is one line ``"<class>: <what disagrees>"``. ``ppdiag analyze`` runs them on every
report and turns each violation into an ``internal inconsistency: ...`` warning of the report;
with ``PPDIAG_STRICT_CHECK=1`` (the test suite sets it) a violation is an error instead.

Tolerances are the report's own rounding: ms fields carry 3 to 4 decimals, shares 5, so sums of
up to a dozen rounded terms are compared within 0.01 ms (and 0.1 % of the step) or 1e-3.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable

from ppdiag.report_types import FindingRow, Report, Severity

#: Environment variable that makes a violation an error (:class:`InconsistentReport`).
STRICT_ENV = "PPDIAG_STRICT_CHECK"

#: A finding whose gain removes one cause: its gain is at most that cause's lost time per step.
_ONE_CAUSE: dict[str, str] = {
    "PP004": "comm_wait",
    "PP005": "exposed_comm",
    "PP006": "host",
    "PP011": "exposed_copy",
}
#: Findings about the whole run, not about some ranks or stages: jitter, batch arithmetic.
_RUN_WIDE = frozenset({"PP007", "PP008"})
#: How much a what-if gain may exceed the lost time it removes, beyond the finding's noise: the
#: what-if model is calibrated, not exact (share of the mean step).
GAIN_SLACK = 0.02

_SEVERITY_ORDER = {Severity.HIGH: 0, Severity.MEDIUM: 1, Severity.LOW: 2, Severity.INFO: 3}
# an empty list in a sentence: "rank(s)  is", "ranks ," , "stage(s) ." or a literal [] / ()
_EMPTY_LIST = re.compile(r"\b(?:rank|stage)(?:s|\(s\))?(?:\s{2,}|\s[,;.:)]|\(s\)\s+(?:is|are)\b)|\[\s*\]")
# a time or a ratio quoted in a title: "3.2 ms", "1.27x"
_QUOTED = re.compile(r"(?<![\w.=])(\d+(?:\.\d+)?)(?: ?ms\b|x\b)")
# "N% of the step", "N % of the step": a share of the mean step quoted in a sentence
_SHARE_TEXT = re.compile(r"(\d+(?:\.\d+)?)\s?% of the step")


class InconsistentReport(AssertionError):
    """A report that contradicts itself while ``PPDIAG_STRICT_CHECK`` is set (a bug of ppdiag)."""


def strict() -> bool:
    """Whether violations are errors (``PPDIAG_STRICT_CHECK`` set to anything but ``0``/empty)."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def violations(report: Report) -> list[str]:
    """Every claim of ``report`` that another part of it contradicts (empty: it agrees with itself)."""
    out: list[str] = []
    for check in _CHECKS:
        out.extend(check(report))
    return out


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol


def _step_tol(report: Report) -> float:
    """Rounding tolerance of a sum of rounded ms fields: 0.01 ms or 0.1 % of the step."""
    return max(0.01, 1e-3 * float(report.summary.step_mean_ms or report.summary.step_ms or 0.0))


def _check_world(report: Report) -> Iterable[str]:
    run = report.run
    if run.world_size > 0:
        beyond = sorted(r for r in run.ranks if not 0 <= r < run.world_size)
        if beyond:
            yield f"world size: traced rank(s) {_list(beyond)} outside world size {run.world_size}"
        if run.pp > 1 and run.world_size % run.pp:
            yield f"world size: world size {run.world_size} is not a multiple of pp = {run.pp}"
    for f in report.findings:
        ev = f.evidence.as_dict()
        parts = [ev.get(k) for k in ("world_size", "tp", "pp", "dp")]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in parts):
            world, tp, pp, dp = (int(x) for x in parts)  # type: ignore[call-overload]
            cp = ev.get("cp")
            cp_n = int(cp) if isinstance(cp, int) and cp > 0 else 1
            if world != tp * pp * dp * cp_n:
                yield f"world size: {f.code} says world {world} with tp {tp} x pp {pp} x dp {dp}"
            if pp != run.pp:
                yield f"world size: {f.code} uses pp = {pp}, the run pp = {run.pp}"


def _check_scope(report: Report) -> Iterable[str]:
    """Every finding names its ranks or stages, only traced ranks and stages < pp, and no sentence
    holds an empty list."""
    traced = set(report.run.ranks)
    for f in report.findings:
        if not f.ranks and not f.stages and f.code not in _RUN_WIDE:
            yield f"scope: {f.code} names no rank and no stage"
        ghosts = sorted(set(f.ranks) - traced)
        if ghosts:
            yield f"scope: {f.code} names rank(s) {_list(ghosts)} that are not traced"
        pp = max(report.run.pp, 1)
        bad = sorted(s for s in f.stages if not 0 <= s < pp)
        if bad:
            yield f"scope: {f.code} names stage(s) {_list(bad)} of a pipeline with pp = {pp}"
        for text in (f.title, *f.fixes):
            if _EMPTY_LIST.search(text):
                yield f"empty list: {f.code} says {text!r}"


def _noise(f: FindingRow) -> float:
    n = f.evidence.noise_ms
    return float(n) if isinstance(n, int | float) and not isinstance(n, bool) else 0.0


def _check_gains(report: Report) -> Iterable[str]:
    """A gain is at most the lost time it can remove, plus its noise and the model's slack."""
    s = report.summary
    step = s.step_mean_ms or s.step_ms or 0.0
    lost = sum(s.lost_ms.values())
    for f in report.findings:
        if f.gain_ms is None:
            continue
        if f.gain_ms < 0:
            yield f"gain: {f.code} claims a negative gain ({f.gain_ms} ms)"
        room = _noise(f) + GAIN_SLACK * step + _step_tol(report)
        cause = _ONE_CAUSE.get(f.code)
        if f.code == "PP007":
            # jitter: the slow steps' excess over the median, at most the slowest step's
            excess = max(s.steps_ms, default=0.0) - (s.step_ms or 0.0)
            if f.gain_ms > excess + _step_tol(report):
                yield (
                    f"gain: PP007 claims {f.gain_ms:.3f} ms per step; the slowest step is "
                    f"{excess:.3f} ms over the median"
                )
        elif cause is not None and f.gain_ms > s.lost_ms.get(cause, 0.0) + room:
            yield (
                f"gain: {f.code} claims {f.gain_ms:.3f} ms per step from {cause}, which loses "
                f"{s.lost_ms.get(cause, 0.0):.3f} ms"
            )
        elif f.gain_ms > lost + room:
            yield f"gain: {f.code} claims {f.gain_ms:.3f} ms per step of {lost:.3f} ms lost"


def _check_denominator(report: Report) -> Iterable[str]:
    """Every percentage is of the mean step: ``gain_pct``, the shares and the shares quoted in text."""
    s = report.summary
    step = s.step_mean_ms
    if not step:
        return
    for f in report.findings:
        if f.gain_ms is not None and f.gain_pct is not None:
            want = 100 * f.gain_ms / step
            if not _close(f.gain_pct, want, 0.02 + 1e-3 * abs(want)):
                yield f"denominator: {f.code} gain_pct {f.gain_pct} is not {want:.2f} % of the mean step"
        if f.cause is not None and s.shares is not None:
            share = 100 * s.shares.get(str(f.cause), 0.0)
            for m in _SHARE_TEXT.finditer(f.title):
                if not _close(float(m.group(1)), share, 0.51):
                    yield f"denominator: {f.code} says {m.group(0)!r}, its cause is {share:.1f} % of the step"
    if s.shares is not None:
        for k, v in s.lost_ms.items():
            if k in s.shares and not _close(s.shares[k], v / step, 1e-3):
                yield f"denominator: summary share of {k} {s.shares[k]} is not {v} / {step}"
    if s.lost_ratio is not None and not _close(s.lost_ratio, sum(s.lost_ms.values()) / step, 1e-3):
        yield f"denominator: lost_ratio {s.lost_ratio} is not the lost time over the mean step"


def _check_severity(report: Report) -> Iterable[str]:
    """A high severity clears the noise."""
    for f in report.findings:
        if f.severity == Severity.HIGH and f.gain_ms is not None and f.gain_ms <= _noise(f):
            yield f"severity: {f.code} is high with a gain of {f.gain_ms} ms within noise {_noise(f)} ms"


def _check_sums(report: Report) -> Iterable[str]:
    """Compute plus the causes is the step, per rank and in the summary."""
    tol = _step_tol(report)
    for r in report.ranks:
        total = r.compute_ms + sum(r.lost_ms.values())
        if not _close(total, r.step_ms, max(tol, 1e-3 * r.step_ms)):
            yield f"sums: rank {r.rank} compute + causes = {total:.4f} ms, its step is {r.step_ms} ms"
    s = report.summary
    if s.compute_ms is not None and s.step_mean_ms:
        total = s.compute_ms + sum(s.lost_ms.values())
        if not _close(total, s.step_mean_ms, tol):
            yield f"sums: compute + causes = {total:.4f} ms, the mean step is {s.step_mean_ms} ms"
    if s.shares and not _close(sum(s.shares.values()), 1.0, 2e-3):
        yield f"sums: the summary's shares add up to {sum(s.shares.values()):.4f}"


def _check_pipeline(report: Report) -> Iterable[str]:
    """The pipeline claim agrees with its stages, ranks and links."""
    run = report.run
    if run.pp <= 1:
        if report.stages:
            yield f"pipeline: pp = {run.pp} with {len(report.stages)} stage rows"
        return
    if len(report.stages) != run.pp:
        yield f"pipeline: pp = {run.pp} with {len(report.stages)} stage rows"
    stage_of = {r.rank: r.stage for r in report.ranks}
    for st in report.stages:
        wrong = [r for r in st.ranks if r in stage_of and stage_of[r] != st.stage]
        if wrong:
            yield f"pipeline: stage {st.stage} lists rank(s) {_list(wrong)} of another stage"
    bad = sorted(r for r, s in stage_of.items() if s is None or not 0 <= s < run.pp)
    if bad:
        yield f"pipeline: rank(s) {_list(bad)} have no stage < pp = {run.pp}"
    if any(not 0 <= v < run.world_size for v in run.stage_map.values()) and run.world_size > 0:
        yield "pipeline: the stage map names a rank outside the world"
    for ln in report.links or []:
        a, b = stage_of.get(ln.src), stage_of.get(ln.dst)
        if a is not None and b is not None and a == b:
            yield f"pipeline: link {ln.src} -> {ln.dst} joins two ranks of stage {a}"
    slow = report.summary.slowest_stage
    for f in report.findings:
        if f.code == "PP003" and f.stages != ([slow] if slow is not None else []):
            yield f"pipeline: PP003 names stage(s) {_list(f.stages)}, the slowest stage is {slow}"


def _numbers(value: object, out: list[float], limit: int = 20000) -> None:
    """Every number in a JSON value (nested dicts and lists), up to ``limit`` of them."""
    stack = [value]
    while stack and len(out) < limit:
        v = stack.pop()
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            out.append(float(v))
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)


def _check_quoted(report: Report) -> Iterable[str]:
    """Every time (ms) and ratio (x) a title or a fix quotes is one of the report's own fields: the
    finding's evidence, gain and noise, or the summary's step and lost time, to the digits shown."""
    s = report.summary
    base: list[float] = [*s.lost_ms.values()]
    _numbers([s.step_ms, s.step_mean_ms, s.step_p95_ms, s.compute_ms, s.stage_ratio], base)
    for f in report.findings:
        fields = list(base)
        _numbers([f.evidence.as_dict(), f.gain_ms], fields)
        for m in (m for text in (f.title, *f.fixes) for m in _QUOTED.finditer(text)):
            text = m.group(1)
            digits = len(text.split(".")[1]) if "." in text else 0
            shown, half = float(text), 0.5 * 10.0**-digits + 1e-9
            if not any(abs(v - shown) <= half for v in fields):
                yield f"quoted: {f.code} says {m.group(0)!r}, which no field of the report holds"


def _check_order(report: Report) -> Iterable[str]:
    """Rank and stage rows by index, findings in the order the reports' heading states: how the run
    stopped first, then by severity, then by estimated gain within high and medium."""
    for name, keys in (
        ("ranks[]", [r.rank for r in report.ranks]),
        ("stages[]", [st.stage for st in report.stages]),
        ("run.ranks", list(report.run.ranks)),
    ):
        if any(a >= b for a, b in itertools.pairwise(keys)):
            yield f"order: {name} is not in increasing order without repeats"
    rows = [f for f in report.findings if f.code != "PP013"]
    if any(f.code == "PP013" for f in report.findings) and report.findings[0].code != "PP013":
        yield "order: PP013 (how the run stopped) is not the first finding"
    for a, b in itertools.pairwise(rows):
        sa, sb = _SEVERITY_ORDER[a.severity], _SEVERITY_ORDER[b.severity]
        if sa > sb:
            yield f"order: {a.code} ({a.severity}) before {b.code} ({b.severity})"
        elif sa == sb and sa < 2 and (a.gain_ms or 0.0) < (b.gain_ms or 0.0):
            yield f"order: {a.code} (gain {a.gain_ms}) before {b.code} (gain {b.gain_ms})"


def _list(xs: Iterable[int]) -> str:
    return ", ".join(map(str, xs))


_CHECKS: tuple[Callable[[Report], Iterable[str]], ...] = (
    _check_world,
    _check_scope,
    _check_gains,
    _check_denominator,
    _check_severity,
    _check_sums,
    _check_pipeline,
    _check_quoted,
    _check_order,
)
