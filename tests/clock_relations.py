"""What a clock transformation (ranks moved to another host, timestamps skewed) must not change
in a diagnosis, and the transformations themselves: the clock metamorphic tests' definition, which
``benchmarks/bench_clock_relations.py`` reuses (a test-support module, imported by bare name)."""

from __future__ import annotations

from ppdiag.analysis import Analyzed
from ppdiag.demo.skew import Move
from ppdiag.report_types import FindingRow

MS = 1_000_000
# the skews of issue "runs that span hosts", both ahead and behind (ms)
SKEWS_MS = (1.0, -1.0, 20.0, -20.0, 2500.0, -2500.0, 60_000.0, -60_000.0)
# two hosts of half the ranks each, both moved, with different skews (ms)
TWO_HOSTS_MS = ((1.0, 60_000.0), (-20.0, 2500.0))
CAUSE_TOL = 0.015  # of the step


def clock_cases(n: int) -> dict[str, dict[int, Move]]:
    """Every clock transformation of an ``n``-rank run, by name: the last rank alone, the first rank
    alone (the reference host moves) and the upper half of the ranks moved to another host with
    each skew of :data:`SKEWS_MS` (``last+20``, ``first-2500``, ``half+60000``...), then two hosts
    of half the ranks each with the skews of :data:`TWO_HOSTS_MS` (``2x2+1/+60000``)."""
    out: dict[str, dict[int, Move]] = {}
    for place, ranks in (("last", (n - 1,)), ("first", (0,)), ("half", tuple(range(n // 2, n)))):
        for s in SKEWS_MS:
            out[f"{place}{s:+g}"] = {r: Move("other-node", int(s * MS)) for r in ranks}
    h = n // 2
    for sa, sb in TWO_HOSTS_MS:
        out[f"2x2{sa:+g}/{sb:+g}"] = {
            r: Move("host-a" if r < h else "host-b", int((sa if r < h else sb) * MS)) for r in range(n)
        }
    return out


def clock_structure(a: Analyzed) -> dict[str, object]:
    """What no clock may change: pp, stage map, schedule, M and the findings (codes and ranks)."""
    run = a.result.run
    return {
        "pp": run.pp,
        "stage_map": run.stage_map,
        "schedule": str(run.schedule),
        "M": run.microbatches,
        "findings": sorted((f.code, tuple(sorted(f.ranks))) for f in a.result.findings),
    }


def within_noise(f: FindingRow) -> bool:
    """Whether a finding's gain is within the noise it was judged against (its evidence's
    ``noise_ms``): a finding the run's own variation could make or unmake. One without a gain is
    never within the noise."""
    noise = f.evidence.noise_ms
    return f.gain_ms is not None and isinstance(noise, (int, float)) and f.gain_ms <= noise


def finding_changes(base: Analyzed, moved: Analyzed) -> list[str]:
    """The findings a clock transformation changed (a code gained or lost, or other ranks named),
    leaving out those within their noise wherever they appear: a finding whose gain the run's own
    variation covers flips on any perturbation of its timestamps (a re-recording of the same run,
    or an offset placed within its residual), as a test of the run's noise rather than of its
    clocks. A finding that stands out of its noise in either run must be the same in both."""
    b, m = _by_code(base), _by_code(moved)
    out: list[str] = []
    for code in sorted(b.keys() | m.keys()):
        fb, fm = b.get(code, []), m.get(code, [])
        rb, rm = _ranks(fb), _ranks(fm)
        if rb == rm or all(within_noise(f) for f in fb + fm):
            continue
        out.append(f"{code}: {rb or None} -> {rm or None}")
    return out


def _by_code(a: Analyzed) -> dict[str, list[FindingRow]]:
    out: dict[str, list[FindingRow]] = {}
    for f in a.result.findings:
        out.setdefault(f.code, []).append(f)
    return out


def _ranks(fs: list[FindingRow]) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(sorted(f.ranks)) for f in fs))


def cause_error(base: Analyzed, moved: Analyzed) -> float:
    """The largest change of one rank's cause, as a share of the step."""
    b = {r.rank: r.shares for r in base.result.ranks}
    return max(abs(v - b[r.rank][c]) for r in moved.result.ranks for c, v in r.shares.items())


def offset_error(base: Analyzed, moved: Analyzed, moves: dict[int, Move]) -> tuple[float, bool]:
    """The largest error (µs) of any rank's fitted offset against the skew applied, relative to
    the reference rank (whose host may have moved too: then every rank left behind moved relative
    to it), and whether every one is within its host's residual (1 µs of rounding allowed)."""
    ob, om = base.result.run.clock_offsets_us, moved.result.run.clock_offsets_us
    resid = {r: c.residual_us for c in moved.result.run.clocks for r in c.ranks}
    ref = min(om, key=int)
    skew_ref = moves[int(ref)].skew_ns if int(ref) in moves else 0
    worst, ok = 0.0, True
    for key in om:
        r = int(key)
        skew = moves[r].skew_ns if r in moves else 0
        if key == ref:
            continue
        want = -(skew - skew_ref) / 1000.0
        err = abs((om[key] - om[ref]) - (ob[key] - ob[ref]) - want)
        worst = max(worst, err)
        ok = ok and err <= (resid.get(r) or moved.result.run.clock_residual_us or 0.0) + 1.0
    return worst, ok


def broken(
    base: Analyzed, moved: Analyzed, moves: dict[int, Move], offsets: bool = True, every_finding: bool = False
) -> list[str]:
    """Which relations ``moved`` (``base`` with ``moves`` applied) breaks: empty when it keeps the
    structure and the findings that stand out of their noise (:func:`finding_changes`), every
    rank's causes within :data:`CAUSE_TOL` of the step and (with ``offsets``) every rank's offset
    within its host's residual of the skew (:func:`offset_error`). ``every_finding``: findings
    within their noise must be alike too (against a control on the same hosts, where only the
    skew differs and nothing at all may change)."""
    out: list[str] = []
    want, got = clock_structure(base), clock_structure(moved)
    keys = list(want) if every_finding else [k for k in want if k != "findings"]
    out += [f"{k}: {want[k]} -> {got[k]}" for k in keys if want[k] != got[k]]
    if not every_finding:
        out += [f"findings: {c}" for c in finding_changes(base, moved)]
    ce = cause_error(base, moved)
    if ce > CAUSE_TOL:
        out.append(f"causes moved by {100 * ce:.2f} % of the step")
    oe, within = offset_error(base, moved, moves)
    if offsets and not within:
        out.append(f"offset {oe:.0f} µs off the skew, beyond the residual")
    return out


__all__ = [
    "CAUSE_TOL",
    "SKEWS_MS",
    "TWO_HOSTS_MS",
    "broken",
    "cause_error",
    "clock_cases",
    "clock_structure",
    "finding_changes",
    "offset_error",
    "within_noise",
]
