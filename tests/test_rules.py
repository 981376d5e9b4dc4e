"""Each rule on a run that has its problem and on one that does not (simulated GPU runs).

Positive: the rule fires, at high or medium severity, naming the right stage or rank, with a gain.
Negative: the same pipeline without that problem gives no finding of that rule (or only a low one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analysis_parts import attribution, context, noise

from ppdiag.api import Options, diagnose
from ppdiag.report_types import FindingRow, Report
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario


def _report(tmp_path: Path, options: Options | None = None, **kw: Any) -> Report:
    kw.setdefault("schedule", "1f1b")
    kw.setdefault("pp", 4)
    kw.setdefault("microbatches", 16)
    kw.setdefault("gpus_per_node", 1)  # a clock per rank, skewed by up to 2 ms (a host's GPUs share one)
    run = make_scenario(steps=kw.pop("steps", 2), clock_skew_ms=2.0, **kw)
    write_kineto(run, tmp_path)
    return diagnose([tmp_path], options or Options()).result


def _find(rep: Report, code: str) -> FindingRow | None:
    return next((f for f in rep.findings if f.code == code), None)


def _fires(rep: Report, code: str, gain: bool = True) -> FindingRow:
    f = _find(rep, code)
    assert f is not None, [x.code for x in rep.findings]
    assert f.severity in ("high", "medium"), f
    assert f.fixes and f.evidence
    if gain:
        assert f.gain_ms is not None and f.gain_ms > 0, f
    return f


def _quiet(rep: Report, code: str) -> None:
    f = _find(rep, code)
    assert f is None or f.severity == "low", f


def test_pp001_small_m(tmp_path: Path) -> None:
    f = _fires(_report(tmp_path / "a", microbatches=4), "PP001")
    assert f.evidence.as_dict()["microbatches"] == 4
    # the bubble holds the normal p2p latency of the transfers that fill and drain the pipe
    # (docs/json.md, "Time accounting"): at P=4 that is 10.7 % of the step with M=32, 6.8 % with M=64
    _quiet(_report(tmp_path / "b", microbatches=64), "PP001")


def test_pp002_gpipe(tmp_path: Path) -> None:
    f = _fires(_report(tmp_path / "a", schedule="gpipe", microbatches=8), "PP002")
    assert f.evidence.as_dict()["activations_in_flight_gpipe"] == 8
    assert _find(_report(tmp_path / "b", microbatches=8), "PP002") is None


def test_pp003_slow_stage(tmp_path: Path) -> None:
    f = _fires(_report(tmp_path / "a", faults=[F.SlowStage(1, 1.5)]), "PP003")
    ev: dict[str, Any] = f.evidence.as_dict()
    assert f.stages == [1]
    assert ev["ratio"] > 1.08
    assert _find(_report(tmp_path / "b"), "PP003") is None


def test_pp004_slow_link(tmp_path: Path) -> None:
    f = _fires(_report(tmp_path / "a", faults=[F.SlowLink(2, delay_ms=0.6)]), "PP004")
    assert f.ranks == [2]
    _quiet(_report(tmp_path / "b"), "PP004")


def test_pp005_exposed_allreduce(tmp_path: Path) -> None:
    _fires(_report(tmp_path / "a", dp=2, faults=[F.ExposedAllReduce(4.0)]), "PP005")
    _quiet(_report(tmp_path / "b", dp=2), "PP005")


def test_pp006_host_stall(tmp_path: Path) -> None:
    f = _fires(_report(tmp_path / "a", faults=[F.HostStall(3, 0.5)]), "PP006")
    assert f.ranks == [3]
    _quiet(_report(tmp_path / "b"), "PP006")


def test_pp007_jitter(tmp_path: Path) -> None:
    f = _fires(_report(tmp_path / "a", steps=5, faults=[F.SlowStep(2, 40.0)]), "PP007")
    ev: dict[str, Any] = f.evidence.as_dict()
    assert len(ev["slow_steps"]) == 1
    assert _find(_report(tmp_path / "b", steps=5), "PP007") is None
    # four steps: the p95 is the slowest step, one slow step is not told from a one-off -> low
    low = _find(_report(tmp_path / "c", steps=4, faults=[F.SlowStep(2, 40.0)]), "PP007")
    assert low is not None and low.severity == "low"


def test_pp008_batch_arithmetic(tmp_path: Path) -> None:
    # world 4 = pp 4 x tp 1 -> dp 1; global 64 / micro 4 -> 16 micro-batches, but the run has 8
    opts = Options(global_batch=64, micro_batch=4, tp=1)
    # a configuration mismatch has no time gain of its own: none is computed
    f = _fires(_report(tmp_path / "a", microbatches=8, options=opts), "PP008", gain=False)
    assert f.gain_ms is None
    ev: dict[str, Any] = f.evidence.as_dict()
    assert any("16" in p for p in ev["problems"])
    ok = Options(global_batch=128, micro_batch=4, tp=1)
    assert _find(_report(tmp_path / "b", microbatches=32, options=ok), "PP008") is None


def test_gaps_name_the_root_rank(tmp_path: Path) -> None:
    """Host-stall gaps on every rank point at the stalled rank (the timeline shows who to look at)."""
    from ppdiag.report_types import Cause

    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=2, faults=[F.HostStall(3, 0.5)])
    write_kineto(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    blamed = {int(b) for g in diag.gaps.values() for b in g.blame[g.cause == Cause.HOST.code]}
    assert blamed == {3}
    other = [g.blame[g.cause == Cause.BUBBLE.code] for g in diag.gaps.values()]
    assert all((b == -1).all() for b in other)


def test_partial_run_keeps_an_exact_replay(tmp_path: Path) -> None:
    """One rank of a 4-stage pipeline: waits on untraced ranks stay where measured, nothing is
    left unexplained, and a warning says the waits could not be traced."""
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=2)
    full = tmp_path / "all"
    full.mkdir()
    write_kineto(run, full)
    one = tmp_path / "one"
    one.mkdir()
    src = next(p for p in full.iterdir() if p.name.startswith("rank1."))
    (one / src.name).write_bytes(src.read_bytes())
    rep = diagnose([one], Options()).result
    assert rep.run.ranks == [1] and rep.run.pp == 4
    lost = rep.ranks[0].lost_ms
    assert rep.summary.step_ms is not None
    assert lost["unexplained"] < 0.02 * rep.summary.step_ms
    assert any("not in the traces" in w for w in rep.run.warnings)


# ---- the noise model and severity ---------------------------------------------------------------


def test_severity_against_noise() -> None:
    from ppdiag.rules.base import severity

    assert severity(12.0) == "high"
    assert severity(5.0, 1.0) == "medium"  # 4 % beyond the noise
    assert severity(11.0, 2.0) == "medium"  # 9 % beyond it
    assert severity(2.0) == "low"
    assert severity(12.0, 15.0) == "low"  # 12 % of the step, but the run varies by 15 %
    assert severity(None) == "low"


def test_noise_model_numbers() -> None:
    from ppdiag.rules.noise import NoiseModel

    # steps 100, 102, 98, 100 ms: sd = sqrt(8/3) = 1.633, error 1.633/2 = 0.8165; jitter 0.01 ms over
    # 22 transfers: 0.01 * sqrt(22) = 0.0469; base = 2 * hypot(0.8165, 0.0469) = 1.6357
    nm = NoiseModel(4, 1.633, 0.8165, 0.01, 22, True, True, 8.0)
    assert nm.comm_jitter_ms == pytest.approx(0.0469, abs=1e-4)
    assert nm.base_ms() == pytest.approx(1.6357, abs=1e-3)
    # oversubscribed host: 90 % of a 10 ms gain is shared by every rank alike -> noise 1.6357 + 9
    assert nm.noise_ms(10.0, 0.9) == pytest.approx(10.6357, abs=1e-3)
    nm.oversubscribed = False
    assert nm.noise_ms(10.0, 0.9) == pytest.approx(1.6357, abs=1e-3)


def test_warmup_outlier() -> None:
    from ppdiag.rules.noise import warmup_outlier

    assert warmup_outlier([300.0, 100.0, 101.0, 99.0])
    assert not warmup_outlier([115.0, 100.0, 101.0, 99.0])  # within 20 %
    assert not warmup_outlier([60.0, 100.0, 101.0, 99.0])  # faster: not a warm-up
    assert warmup_outlier([130.0, 100.0])  # one other step: the relative test alone
    assert not warmup_outlier([100.0])
    # two others 100 and 110: median 105, sd 7.07; relative 20 % = 21, 3.5 sd = 24.75 -> the first
    # must exceed 129.75: 135 is a warm-up, 129 is not
    assert warmup_outlier([135.0, 100.0, 110.0])
    assert not warmup_outlier([129.0, 100.0, 110.0])
    # others that spread widely: 140 is within 3.5 robust sd of them (median 100, MAD 10 -> 14.8)
    assert not warmup_outlier([140.0, 80.0, 120.0, 100.0, 90.0, 110.0])


def test_latency_jitter_ignores_slow_links() -> None:
    from types import SimpleNamespace

    from ppdiag.rules.noise import latency_jitter_ns

    # 5 transfers of 1000 ns, 5 of 2000, 3 slow ones of 50 µs: p50 = 2000, p10 = 1000 (13 values,
    # index 1.2) -> (2000 - 1000) / 1.2816 = 780.3 ns; the slow link does not widen it
    taus = [1000] * 5 + [2000] * 5 + [50_000] * 3
    attr = SimpleNamespace(edges=[(0, 1, t, 0) for t in taus])
    # a stand-in for the attribution: the function reads only its edges
    assert latency_jitter_ns(attr) == pytest.approx(780.3, abs=0.5)  # type: ignore[arg-type]


def test_shared_host() -> None:
    from types import SimpleNamespace

    from ppdiag.rules.noise import shared_host, shared_share, sharing_ranks

    def run(cpu: bool, hosts: list[str | None], backend: str = "gloo") -> Any:
        return SimpleNamespace(
            ranks=[
                SimpleNamespace(rank=i, cpu_only=cpu, meta={"host_name": h} if h else {}, backend=backend)
                for i, h in enumerate(hosts)
            ]
        )

    assert shared_host(run(True, ["vm", "vm", "vm", "vm"]))
    # two hosts of two CPU ranks each: each pair shares its host's cores
    assert sharing_ranks(run(True, ["a", "a", "b", "b"])) == [0, 1, 2, 3]
    # rank 0 alone on its host contends with no one; ranks 1-3 share theirs
    assert sharing_ranks(run(True, ["b", "a", "a", "a"])) == [1, 2, 3]
    assert not shared_host(run(True, ["a", "b"]))  # one rank per host
    assert not shared_host(run(False, ["vm", "vm"]))
    assert shared_host(run(True, [None, None]))  # gloo CPU ranks, no host recorded
    assert not shared_host(run(True, [None, None], backend="mpi"))
    assert shared_share([9.0, 10.0, 10.0, 9.5]) == 1.0  # 2 x smallest 9 / top 10, capped at 1
    assert shared_share([6.0, 9.0, 8.0, 7.0]) == 1.0  # contention spread unevenly: nobody stands out
    assert shared_share([9.0, 90.0, 9.0, 9.0]) == pytest.approx(0.2)  # 2 x 9 / 90
    # a slow rank 1 of four makes links 0->1, 1->0, 1->2, 2->1 late; 2->3 and 3->2 are not
    assert shared_share([50.0, 38.0, 24.0, 51.0, 0.2, 0.5]) == pytest.approx(2 * 0.2 / 51)


def _rules_with(diag: Any, **changes: Any) -> list[FindingRow]:

    from ppdiag.rules import RuleContext, RuleOptions, run_rules

    c = diag.context
    ctx = RuleContext(
        diag.result,
        diag.run,
        c.pipeline,
        c.rank_steps,
        c.attribution,
        RuleOptions(),
        predictions=c.predictions,
        noise=changes.pop("noise", c.noise),
    )
    return run_rules(ctx)


def test_finding_within_noise_is_low(tmp_path: Path) -> None:
    """The same host stall: high against the simulated run's small noise, low when the steps
    spread more than its gain; the evidence carries the noise and the steps used."""
    import dataclasses

    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=2, faults=[F.HostStall(2, 0.5)])
    write_kineto(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    f = next(x for x in diag.result.findings if x.code == "PP006")
    nm = noise(diag)
    assert f.severity == "high" and f.gain_ms is not None
    assert f.evidence.as_dict()["noise_ms"] == pytest.approx(nm.base_ms(), abs=1e-3)
    assert f.evidence.as_dict()["steps_used"] == 2
    noisy = dataclasses.replace(nm, step_error_ms=f.gain_ms)  # 2 errors > the gain
    g = next(x for x in _rules_with(diag, noise=noisy) if x.code == "PP006")
    assert g.severity == "low"
    assert g.evidence.as_dict()["noise_ms"] == pytest.approx(2 * f.gain_ms, rel=0.01)


def test_imbalance_is_judged_by_its_own_spread(tmp_path: Path) -> None:
    """A slow stage measured on every micro-batch: a step total that spreads (contention, jitter)
    does not make it less certain; its noise is the imbalance's own step-to-step error."""
    import dataclasses

    from ppdiag.rules.noise import Z, cause_error_ms

    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=3, faults=[F.SlowStage(1, 1.5)])
    write_kineto(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    err = cause_error_ms(context(diag).rank_steps, attribution(diag), "imbalance")
    assert err is not None
    noisy = dataclasses.replace(noise(diag), step_error_ms=100.0)
    f = next(x for x in _rules_with(diag, noise=noisy) if x.code == "PP003")
    assert f.severity == "high"
    assert f.evidence.as_dict()["noise_ms"] == pytest.approx(Z * err, abs=1e-3)  # no latency jitter here


def test_oversubscribed_host_shared_stalls_are_low(tmp_path: Path) -> None:
    """On an oversubscribed host, late launches every rank shows alike are contention (low); a rank
    that stands out stays a fault."""
    import dataclasses

    every = [F.HostStall(r, 0.4) for r in range(4)]
    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=2, faults=every)
    write_kineto(run, tmp_path / "all")
    diag = diagnose([tmp_path / "all"], Options())
    f = next(x for x in diag.result.findings if x.code == "PP006")
    assert f.severity in ("high", "medium")  # a GPU run: every rank starved is a real fault
    over = dataclasses.replace(noise(diag), oversubscribed=True, shared_host=True)
    g = next(x for x in _rules_with(diag, noise=over) if x.code == "PP006")
    assert g.severity == "low" and g.evidence.as_dict()["oversubscribed_host"]

    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=2, faults=[F.HostStall(2, 0.5)])
    write_kineto(run, tmp_path / "one")
    diag = diagnose([tmp_path / "one"], Options())
    over = dataclasses.replace(noise(diag), oversubscribed=True, shared_host=True)
    g = next(x for x in _rules_with(diag, noise=over) if x.code == "PP006")
    assert g.severity in ("high", "medium") and g.ranks == [2]


def test_warmup_first_step_left_out(tmp_path: Path) -> None:
    """A slow first step (warm-up) is left out with a warning: no jitter finding, steps used 3."""
    # SlowStep counts the recorded steps from 0: its step 0 is the first profiled step (the delay
    # before the step's first kernel lies inside that step's window, which starts at the host's
    # ProfilerStep)
    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=4, faults=[F.SlowStep(0, 40.0)])
    write_kineto(run, tmp_path)
    rep = diagnose([tmp_path], Options()).result
    assert rep.noise.first_step_excluded and rep.noise.steps_used == 3
    assert len(rep.summary.steps_ms) == 3 and rep.run.steps == [6, 7, 8]
    assert any("warm-up" in w for w in rep.run.warnings)
    assert _find(rep, "PP007") is None
    # a slow step later in the run is jitter, not warm-up
    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=4, faults=[F.SlowStep(2, 40.0)])
    write_kineto(run, tmp_path / "late")
    rep = diagnose([tmp_path / "late"], Options()).result
    assert not rep.noise.first_step_excluded and _find(rep, "PP007") is not None


# ---- overrides that disagree with the trace ---------------------------------------------------


def test_overrides_that_disagree_warn(tmp_path: Path) -> None:
    run = make_scenario(schedule="1f1b", pp=4, microbatches=8, steps=2)
    write_kineto(run, tmp_path)

    def warned(**kw: Any) -> list[str]:
        rep = diagnose([tmp_path], Options(**kw)).result
        return [w for w in rep.run.warnings if "disagrees with the trace" in w]

    assert warned() == []
    assert warned(microbatches=8) == [] and warned(schedule="1f1b") == []
    assert warned(stage_map="0,1,2,3") == []
    (m,) = warned(microbatches=4)
    assert "--microbatches 4" in m and "8 micro-batches" in m
    (s,) = warned(schedule="gpipe")
    assert "--schedule gpipe" in s and "1f1b" in s
    (sm,) = warned(stage_map="3,2,1,0")
    assert "--stage-map 3,2,1,0" in sm and "0,1,2,3" in sm
    (p,) = warned(pp=2)
    assert "--pp 2" in p


def test_oversubscribed_host_late_links(tmp_path: Path) -> None:
    """A slow link stays a fault on an oversubscribed host unless every rank's late-launch time
    (what a descheduled process costs) covers its late waits."""
    import dataclasses

    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=2, faults=[F.SlowLink(1, delay_ms=0.4)])
    write_kineto(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    f = next(x for x in diag.result.findings if x.code == "PP004")
    assert f.severity in ("high", "medium") and f.gain_ms is not None
    ev: dict[str, Any] = f.evidence.as_dict()  # free-form JSON: this rule's keys are known here
    top = max(ev["late_wait_ms_per_step_by_link"].values())
    nm = noise(diag)
    small = dataclasses.replace(nm, oversubscribed=True, shared_host=True, contention_ms=0.0)
    g = next(x for x in _rules_with(diag, noise=small) if x.code == "PP004")
    assert g.severity == f.severity  # the far links are on time: it stands out
    # the noise of a slow link is the links' spread (not the step's): the contention adds to it
    link_noise = g.evidence.as_dict()["noise_ms"]
    assert isinstance(link_noise, float) and link_noise == pytest.approx(
        f.evidence.as_dict()["noise_ms"], abs=2e-3
    )
    large = dataclasses.replace(nm, oversubscribed=True, shared_host=True, contention_ms=2 * top)
    g = next(x for x in _rules_with(diag, noise=large) if x.code == "PP004")
    assert g.severity == "low"
    assert g.evidence.as_dict()["noise_ms"] == pytest.approx(link_noise + f.gain_ms, abs=2e-3)


def test_pp008_small_m_graded_as_its_gain(tmp_path: Path) -> None:
    """M < 2P alone: PP008's fix is PP001's (M x 2), with the same gain against the same noise, so
    the report grades both alike rather than calling one gain medium and low at once."""
    rep = _report(tmp_path / "a", microbatches=6)
    f8, f1 = _find(rep, "PP008"), _find(rep, "PP001")
    assert f8 is not None and f1 is not None, [x.code for x in rep.findings]
    problems: list[str] = f8.evidence.as_dict()["problems"]  # type: ignore[assignment]
    assert len(problems) == 1 and "< 2 × pp" in problems[0], problems
    assert f8.gain_ms == f1.gain_ms and f8.evidence.noise_ms == f1.evidence.noise_ms
    assert f8.severity == f1.severity


def test_pp004_across_hosts_counts_what_the_offset_may_be_off(tmp_path: Path) -> None:
    """A link between two hosts is timed across their fitted offset: it is slow only when it stands
    out by the offset's standard error as well, and the finding's noise counts that error on the
    slow links' transfers. Rank 2's sends leave 0.6 ms late (links 2 -> 1 and 2 -> 3)."""
    import dataclasses

    from ppdiag.rules import RuleContext, RuleOptions, run_rules

    run = make_scenario(schedule="1f1b", pp=4, microbatches=16, steps=2, faults=[F.SlowLink(2, delay_ms=0.6)])
    write_kineto(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    one_host = next(x for x in diag.result.findings if x.code == "PP004")
    assert one_host.ranks == [2]

    def pp004(se_us: float, alone: tuple[int, ...] = (2,)) -> FindingRow | None:
        # the ranks of ``alone`` on host-b, whose offset against host-a is known to ``se_us``
        ranks = [
            dataclasses.replace(
                tl,
                clock_domain="host-b" if tl.rank in alone else "host-a",
                clock_se_ns=int(se_us * 1000) if tl.rank in alone else 0,
            )
            for tl in diag.run.ranks
        ]
        c = context(diag)
        assert c.pipeline is not None and c.attribution is not None
        ctx = RuleContext(
            diag.result,
            dataclasses.replace(diag.run, ranks=ranks),
            c.pipeline,
            c.rank_steps,
            c.attribution,
            RuleOptions(),
            predictions=c.predictions,
            noise=c.noise,
        )
        return next((x for x in run_rules(ctx) if x.code == "PP004"), None)

    def noise_ms(f: FindingRow | None) -> float:
        assert f is not None
        v = f.evidence.as_dict()["noise_ms"]
        assert isinstance(v, float)
        return v

    # the offset known exactly: the run on one host
    exact = pp004(0.0)
    assert exact is not None and exact.ranks == [2] and noise_ms(exact) == noise_ms(one_host)
    # known to 20 µs (a thirtieth of the 600 µs late): still slow, and less certain
    near = pp004(20.0)
    assert near is not None and near.ranks == [2] and noise_ms(near) > noise_ms(one_host)
    # known to 6 ms, ten times the lateness: no link of rank 2 stands out of what the clocks may
    # be off, and no rank is named
    assert pp004(6000.0) is None
    # rank 3 alone on host-b: link 2 -> 1 stays on one clock and still names rank 2; the finding
    # is at least as uncertain as if 2 -> 3 were counted slow
    far = pp004(6000.0, alone=(3,))
    assert far is not None and far.ranks == [2] and noise_ms(far) >= noise_ms(one_host)
