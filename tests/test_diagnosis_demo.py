"""The diagnosis engine on real recorded CPU pipeline runs (torch.distributed.pipelining over gloo).

Each run is recorded once per module by the demo recorder in sleep mode with one injected fault
whose ground truth is known; the assertions are the diagnosis a user must get. A busy host stretches
every sleep and the glue around it, so each recording is first judged on its own ground truth
(tests/demo_noise.py): the fault must stand out of the noise the run measured, or the schedule's
shape must not be buried in late wake-ups; a recording that falls short is recorded once more with
its costs and fault scaled to that noise, and a second shortfall fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from analysis_parts import attribution, context, pipeline
from demo_noise import (
    COMPUTE,
    RunNoise,
    Scale,
    Support,
    fault_support,
    host_ms_by_rank,
    intervals,
    kept_costs,
    measure,
    quiet,
    record_supported,
    report,
    send_delay_ms,
    total_ms,
    waits_after_posts,
)

from ppdiag.analysis import Analyzed
from ppdiag.demo.config import DemoConfig
from ppdiag.model import Phase
from ppdiag.report_types import Cause, FindingRow

pytestmark = pytest.mark.slow

CONFIGS: dict[str, DemoConfig] = {
    "1f1b": DemoConfig(schedule="1f1b", microbatches=8, steps=3),
    "gpipe": DemoConfig(schedule="gpipe", microbatches=4, steps=3),
    "gpipe8": DemoConfig(schedule="gpipe", microbatches=8, steps=3),  # ppdiag demo --schedule gpipe
    "slow": DemoConfig(schedule="1f1b", microbatches=8, steps=3, slow_stage=2, slow_factor=2.0),
    "delay": DemoConfig(schedule="1f1b", microbatches=8, steps=3, comm_delay_ms=10.0, comm_delay_rank=1),
    "stall": DemoConfig(schedule="1f1b", microbatches=8, steps=3, host_stall_ms=10.0, host_stall_rank=1),
    "interleaved": DemoConfig(schedule="interleaved_1f1b", microbatches=8, steps=2),
    # three steps: the first is often a warm-up outlier the analysis leaves out, and the noise
    # checks need the spread of at least two analysed steps (one step's error is not measurable)
    "zero_bubble": DemoConfig(schedule="zero_bubble", microbatches=8, steps=3),
    "zbv": DemoConfig(schedule="zbv", microbatches=8, steps=3),
    "dualpipev": DemoConfig(schedule="dualpipev", microbatches=8, steps=3),
}


#: How far the trace clock (Kineto) and the recorder's time.time_ns() may disagree on one host.
CLOCK_SLACK_NS = 100_000

#: Each demo configuration's diagnosis and ground truth.
Runs = dict[str, tuple[Analyzed, dict[str, Any]]]


def _stall_ms(truth: dict[str, Any], noise: RunNoise) -> float:
    """The host stall per step that the stalled rank measured."""
    (fault,) = truth["faults"]
    return total_ms(truth, fault["rank"], intervals(truth, fault["rank"], ("stall",), noise.steps)) / len(
        noise.steps
    )


def _slow_excess_ms(truth: dict[str, Any], noise: RunNoise) -> float:
    """Per step, how much longer the slow stage's hold ops held than those of any other rank."""
    (fault,) = truth["faults"]
    held = {
        rt["rank"]: total_ms(truth, rt["rank"], intervals(truth, rt["rank"], COMPUTE, noise.steps), "held_ns")
        for rt in truth["ranks"]
    }
    slow = held.pop(fault["rank"])
    return (slow - max(held.values())) / len(noise.steps)


def _gpipe_fix_ms(truth: dict[str, Any], noise: RunNoise) -> float:
    """Per step, the bubble GPipe's fix wins back at the costs the run measured: 1F1B with twice
    the micro-batches at half the cost (the memory 1F1B frees pays for them) idles (P-1)(f+b)/2
    less, f+b being a micro-batch's held compute on the costliest stage. P=4, M=8 at the demo's
    costs (f+b = 12 ms): 3 x 12 / 2 = 18 ms of a ~150 ms step."""
    p, m = int(truth["pp"]), int(truth["microbatches"])
    per_mb = max(
        total_ms(truth, rt["rank"], intervals(truth, rt["rank"], COMPUTE, noise.steps), "held_ns")
        for rt in truth["ranks"]
    ) / (len(noise.steps) * m)
    return (p - 1) * per_mb / 2


#: How far a fault run's holds may overrun their cost (late wake-ups not given back).
FAULT_OVERRUN = 0.25

#: Per recording, what it must show for the assertions on it to mean anything (measured on its own
#: ground truth): the injected fault stands out of the run's noise, or the schedule's shape is not
#: buried in late wake-ups. A recording that falls short is recorded once more, with larger costs.
SUPPORT: dict[str, tuple[Support, Scale | None]] = {
    # the fault-free run must show no finding above low: holds that overran unevenly (late wake-ups
    # not given back: +45 % on one rank under load) are a real micro-batch cost variance, and PP010
    # rightly finds it; such a recording cannot say the fault-free run is clean
    "1f1b": (kept_costs(FAULT_OVERRUN), None),
    "gpipe": (quiet, None),
    # GPipe is this run's fault (PP002 or PP001 must lead): its fix must stand out of the noise
    # and twice above the host time any rank measured, else a true PP006 (host-bound, with the
    # advice to check the oversubscribed cores) rightly outranks it. With three busy loops the
    # ranks measured 21-32 ms per step against the fix's 18 ms, and PP006 claimed 14-19 ms against
    # PP002's 0-2 ms (what-if launches the fix's twice as many micro-batches late twice as often);
    # a CI run with both cores busy led with a medium PP006. Quiet, 7-10 ms (PP006 low, 4-5 ms):
    # the demo's own costs carry the test about half the time, else it is recorded again x6
    "gpipe8": fault_support(_gpipe_fix_ms, "GPipe's bubble that its fix wins back", quiet),
    # a fault run's holds must keep their costs within a quarter: uneven late wake-ups are a
    # micro-batch cost variance (PP010) or late links of their own, and the test asks that the
    # injected fault be the only finding above low
    "slow": fault_support(_slow_excess_ms, "the slow stage's extra hold", kept_costs(FAULT_OVERRUN)),
    "delay": fault_support(send_delay_ms, "the delayed sends' hold", kept_costs(FAULT_OVERRUN)),
    "stall": fault_support(_stall_ms, "the host stall", kept_costs(FAULT_OVERRUN)),
    "zero_bubble": (quiet, None),
    "zbv": (quiet, None),
    "dualpipev": (quiet, None),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    out: Runs = {}
    for name, cfg in CONFIGS.items():
        support, scale = SUPPORT.get(name, (None, None))
        out[name] = record_supported(name, cfg, tmp_path_factory.mktemp(f"demo_{name}"), support, scale)
    yield out
    print("\n" + report())


def _finding(diag: Analyzed, code: str) -> FindingRow | None:
    return next((f for f in diag.result.findings if f.code == code), None)


def _host_measured(diag: Analyzed, truth: dict[str, Any], f: FindingRow) -> bool:
    """Whether ``f`` is a PP006 finding the recording measured: every rank it names spent at least
    the late launches it claims for that rank in host time (its wall time outside sleeps and
    waits, :func:`demo_noise.host_ms_by_rank`). A loaded host deschedules the ranks between their
    ops; on the rank the pipeline waits for, that is host time the run really lost, and the
    finding that says so (with its advice to check the oversubscribed cores) is true, not a false
    alarm: a CI run with both cores busy measured rank 2, the slow stage, launching 19.8 ms late
    per step. A claim beyond what the rank measured is still a false alarm."""
    if f.code != "PP006" or not f.ranks:
        return False
    claimed = f.evidence.as_dict()["direct_host_ms_per_rank"]
    assert isinstance(claimed, dict)
    host = host_ms_by_rank(truth, diag.result.run.steps)
    slack_ms = 2 * CLOCK_SLACK_NS / 1e6  # the two clocks at either end of a step
    return all(float(claimed[str(r)]) <= host.get(r, 0.0) + slack_ms for r in f.ranks)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_accounting_and_causes_add_up(runs: Runs, name: str) -> None:
    diag, _ = runs[name]
    attr, rank_steps = attribution(diag), context(diag).rank_steps
    assert not [w for w in diag.result.run.warnings if "differs from the measurement" in w]
    for rs in rank_steps:
        a = rs.acct
        assert a.compute + a.exposed_p2p + a.exposed_collective + a.exposed_copy + a.idle == a.window
        causes = attr.causes[(rs.rank, rs.step)]
        assert sum(causes.values()) == a.lost, (rs.rank, rs.step, causes, a.lost)
        assert all(v >= 0 for v in causes.values())
    # the per-gap cause table paints exactly the lost time, cause by cause
    for rank, gaps in diag.gaps.items():
        rss = [rs for rs in rank_steps if rs.rank == rank]
        assert int((gaps.end - gaps.start).sum()) == sum(rs.acct.lost for rs in rss)
        for ci, key in enumerate(Cause):
            painted = int((gaps.end - gaps.start)[gaps.cause == ci].sum())
            assert painted == sum(attr.causes[(rs.rank, rs.step)][key] for rs in rss), (rank, key)
    for r in diag.result.ranks:
        total = r.compute_ms + sum(r.lost_ms[k] for k in Cause)
        assert total == pytest.approx(r.step_ms, abs=0.01)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stage_map_and_microbatches(runs: Runs, name: str) -> None:
    diag, truth = runs[name]
    run = diag.result.run
    assert run.pp == truth["pp"]
    assert run.stage_map == {str(s): r for s, r in enumerate(truth["stage_to_rank"][: truth["pp"]])}
    assert run.microbatches == truth["microbatches"]
    assert run.schedule == truth["schedule"]
    # a warm-up first step that is an outlier is left out (with a warning), the others are analyzed
    skipped = diag.result.noise.first_step_excluded
    assert run.steps == (truth["steps"][1:] if skipped else truth["steps"])


def test_microbatch_blocks_match_ground_truth(runs: Runs) -> None:
    """Every forward / backward block the engine labels is the measured one: it holds all the time
    the block's sleep ops held inside it, and it reaches into no neighbouring compute block (the
    slack is the run's own: the Python glue a loaded host stretches, never a fixed number of ms)."""
    diag, truth = runs["1f1b"]
    pipe = pipeline(diag)
    kinds = {"fwd": int(Phase.FWD), "bwd": int(Phase.BWD)}
    checked = 0
    for rt in truth["ranks"]:
        r = rt["rank"]
        b = pipe.blocks[r]
        numbers = [w.number for w in pipe.windows[r]]
        iv = rt["intervals"]
        comp = [i for i, k in enumerate(iv["kind"]) if k in kinds]
        comp.sort(key=lambda i: iv["start_ns"][i])
        for j, k in enumerate(comp):
            kind, step, mb = iv["kind"][k], iv["step"][k], iv["mb"][k]
            s, e, held_ns = iv["start_ns"][k], iv["end_ns"][k], iv["held_ns"][k]
            m = (b.phase == kinds[kind]) & (b.mb == mb) & (b.step == numbers.index(step))
            assert m.sum() == 1, (r, kind, step, mb)
            i = int(np.flatnonzero(m)[0])
            bs, be = int(b.start[i]), int(b.end[i])
            # the sleep time measured inside the truth block is inside the parsed block
            assert min(be, e) - max(bs, s) >= held_ns - CLOCK_SLACK_NS, (r, kind, step, mb)
            # and it holds none of the sleep of the truth's previous and next compute blocks: it
            # may reach into them only by their own glue (their time not held in a sleep op)
            for n in (comp[j - 1] if j else None, comp[j + 1] if j + 1 < len(comp) else None):
                if n is None:
                    continue
                ns, ne = iv["start_ns"][n], iv["end_ns"][n]
                glue = (ne - ns) - iv["held_ns"][n]
                overlap = max(0, min(be, ne) - max(bs, ns))
                assert overlap <= glue + CLOCK_SLACK_NS, (r, kind, step, mb, overlap, glue)
            checked += 1
    assert checked == truth["pp"] * truth["microbatches"] * 2 * len(truth["steps"])


def test_fault_free_1f1b_has_no_severe_fault_findings(runs: Runs) -> None:
    diag, truth = runs["1f1b"]
    for f in diag.result.findings:
        if f.code in ("PP003", "PP004", "PP006") and not _host_measured(diag, truth, f):
            assert f.severity != "high", f


def _bubble_slack(diag: Analyzed, truth: dict[str, Any]) -> float:
    """How far a recorded run's measured bubble may stand from the schedule's closed form, beyond
    the closed form's own approximation: the closed form assumes free links, and the measured
    bubble also holds the normal latency of the transfers that fill and drain the pipe (2 (P - 1)
    on the critical path), measured on this run; and 4 ranks on 2 shared cores wake late unevenly,
    which moves idle into and out of the bubble's replay (a rank late to launch its block in the
    fill turns idle into host time): the run measures that jitter itself (the step's spread, the
    host contention the analysis saw, the glue around the hold ops the ranks measured)."""
    pp = diag.result.run.pp
    lat_ms = attribution(diag).normal_latency_ns / 1e6
    step_ms = diag.result.summary.step_mean_ms
    assert step_ms is not None
    noise = diag.result.noise
    glue = measure(truth, diag.result.run.steps).glue_ms
    jitter = ((noise.step_spread_ms or 0.0) + (noise.contention_ms or 0.0) + glue) / step_ms
    return 2 * (pp - 1) * lat_ms / step_ms + jitter


def test_gpipe_bubble(runs: Runs) -> None:
    diag, truth = runs["gpipe"]
    b = diag.result.bubble
    assert diag.result.run.schedule == "gpipe"
    assert b.theoretical_ratio == pytest.approx(3 / 7, abs=1e-3)
    # a recording under load measured 0.339 with 10 % of each step in late launches: the slack is
    # what the run itself measured, never a fixed share
    assert b.measured_ratio is not None and abs(b.measured_ratio - 3 / 7) < 0.08 + _bubble_slack(diag, truth)
    assert _finding(diag, "PP002") is not None


def test_slow_stage_is_the_top_finding(runs: Runs) -> None:
    diag, truth = runs["slow"]
    top = diag.result.findings[0]
    assert top.code == "PP003"
    assert top.stages == [2]
    slow_rank = truth["stage_to_rank"][2]
    ranks = diag.result.ranks
    # what the slow stage adds per step over the mean stage, as this run measured it (late wake-ups
    # on a loaded host stretch every stage, so the nominal factor is not the truth): with every
    # stage at the mean cost the step would be about that much shorter, and the other ranks idle
    # for it. Half of it is a bound that holds on any load.
    compute = [r.compute_ms for r in ranks]
    excess = next(r.compute_ms for r in ranks if r.rank == slow_rank) - sum(compute) / len(compute)
    assert excess > 0
    late_data_ms = _late_data_ms(truth, diag.result.run.steps)
    # (a receive op ends in the trace when its rank got the core back after the data arrived: up to
    # the Python glue this run measured around its compute, per step)
    glue_ms = measure(truth, diag.result.run.steps).glue_ms
    for r in ranks:
        if r.rank == slow_rank:
            continue
        lost = r.lost_ms
        # the largest cause but the schedule's own bubble (with a 2x stage at M=8 the two are about
        # equal by design: a loaded host tips one over the other) and the recv waits, which a
        # loaded host makes real: no more of those than this run measured data arriving after
        # its send was posted, on any link
        others = [v for k, v in lost.items() if k not in ("bubble", "comm_wait")]
        assert lost["imbalance"] == max(others), r
        assert lost["comm_wait"] <= late_data_ms + glue_ms, (r, late_data_ms, glue_ms)
        assert lost["imbalance"] > 0.5 * excess, (r, excess)


def _late_data_ms(truth: dict[str, Any], steps: list[int]) -> float:
    """Per step (of ``steps``), the time receivers of the run waited for data after its send was
    posted (the transport's lateness the recorder measured), summed over every link."""
    late = sum(
        max(0, end - max(post, start)) for step, start, end, post in waits_after_posts(truth) if step in steps
    )
    return late / 1e6 / max(len(steps), 1)


def test_slow_link_blames_the_delayed_rank(runs: Runs) -> None:
    diag, _ = runs["delay"]
    top = diag.result.findings[0]
    assert top.code == "PP004"
    assert top.ranks == [1]


def test_host_stall_blames_the_stalled_rank(runs: Runs) -> None:
    diag, truth = runs["stall"]
    f = _finding(diag, "PP006")
    assert f is not None and f.ranks == [1]
    assert f.severity in ("high", "medium")
    # most of the stall rank 1 measured before its forwards (the injected sleeps, as long as the
    # host's load made them) is charged to host on rank 1, more than any cause other than the
    # schedule's own bubble
    r1 = next(r for r in diag.result.ranks if r.rank == 1).lost_ms
    assert r1["host"] >= 0.5 * _stall_ms(truth, measure(truth, diag.result.run.steps))
    assert r1["host"] == max(v for k, v in r1.items() if k != "bubble")


@pytest.mark.parametrize("name", ["zero_bubble", "zbv", "dualpipev"])
def test_split_backward_schedules(runs: Runs, name: str) -> None:
    """Weight-gradient blocks are found and the measured bubble stays near the schedule's."""
    diag, truth = runs[name]
    assert diag.result.run.virtual_stages == 2
    stages = diag.result.stages
    assert all(st.wgrad_ms is not None for st in stages)
    b = diag.result.bubble
    assert b.measured_ratio is not None and b.theoretical_ratio is not None
    assert abs(b.measured_ratio - b.theoretical_ratio) < 0.1 + _bubble_slack(diag, truth)


@pytest.mark.parametrize("name", ["zero_bubble", "zbv", "dualpipev"])
def test_split_backward_is_no_backward_heavy_stage(runs: Runs, name: str) -> None:
    """Every stage's backward (input and weight gradients, split or not) is asked to hold twice its
    forward: no stage's is out of proportion, as the ranks' holds measured it. A balanced DualPipeV
    recording read rank 0's backward as 1.95x its forward against 1.03x elsewhere (a median block
    compared a full backward with half of one) and got a high PP015."""
    diag, truth = runs[name]
    steps = tuple(diag.result.run.steps)
    ratio: dict[int, float] = {}
    for rt in truth["ranks"]:
        r = rt["rank"]
        fwd = total_ms(truth, r, intervals(truth, r, ("fwd",), steps), "held_ns")
        back = total_ms(truth, r, intervals(truth, r, ("bwd", "bwd_input", "wgrad"), steps), "held_ns")
        ratio[r] = back / fwd
    # a recording whose holds kept their proportions (PP015 asks for 1.25x the other stages')
    if max(ratio.values()) < 1.1 * min(ratio.values()):
        assert _finding(diag, "PP015") is None, (ratio, _finding(diag, "PP015"))


def test_interleaved_is_recognised(runs: Runs) -> None:
    diag, truth = runs["interleaved"]
    run = diag.result.run
    assert run.virtual_stages == 2
    p, m = int(truth["pp"]), int(truth["microbatches"])
    assert diag.result.bubble.theoretical_ratio == pytest.approx((p - 1) / (2 * m + p - 1), abs=1e-3)


# ---- findings agree with the what-if table; the injected fault stands out of the noise ------------

# The fault of each recording and the findings that may come first. GPipe with M = 2P has two
# schedule findings that both stand out of the noise: PP002 (1F1B: same bubble, far less memory)
# and PP001 (the bubble itself: more micro-batches or a zero-bubble schedule win time); which one
# leads depends on the run's noise, and both must be there.
FAULT_FINDING = {"slow": ("PP003",), "delay": ("PP004",), "stall": ("PP006",), "gpipe8": ("PP002", "PP001")}


@pytest.mark.parametrize("name", ["1f1b", "gpipe", "gpipe8", "slow", "delay", "stall"])
def test_finding_gains_are_their_whatif_rows(runs: Runs, name: str) -> None:
    diag, _ = runs[name]
    rep = diag.result
    rows = {r.fix: r for r in rep.whatif}
    step = rep.summary.step_mean_ms  # every gain and what-if row is of the mean step
    assert step is not None
    for f in rep.findings:
        fix = f.evidence.as_dict().get("whatif_fix")
        if fix is None:
            continue
        assert isinstance(fix, str), f
        row = rows[fix]
        assert row.step_ms is not None, row
        if f.code == "PP002":  # memory fix: offered while not slower beyond the noise, gain >= 0
            noise_ms = f.evidence.as_dict()["noise_ms"]
            assert isinstance(noise_ms, (int, float)) and row.step_ms <= step + noise_ms
            assert f.gain_ms == pytest.approx(max(step - row.step_ms, 0.0), abs=2e-3)
            continue
        assert row.step_ms < step, f  # never a fix the table predicts slower
        assert f.gain_ms == pytest.approx(step - row.step_ms, abs=2e-3), f


def test_fault_free_demo_has_no_finding_above_low(runs: Runs) -> None:
    diag, truth = runs["1f1b"]
    # a healthy run may carry the schedule's own findings (PP001 bubble, PP002 GPipe, PP008 batch):
    # 1F1B at P=4, M=8 idles 3/11 = 27 % of the step by design, and on a quiet host more
    # micro-batches win 5 % of it, a medium PP001 that is true; no other finding above low but
    # late launches the recording measured on the ranks named (a loaded host's, see _host_measured)
    schedule_own = ("PP001", "PP002", "PP008")
    loud = [f for f in diag.result.findings if f.severity not in ("low", "info")]
    assert [f for f in loud if f.code not in schedule_own and not _host_measured(diag, truth, f)] == []


def test_demo_host_is_reported_oversubscribed(runs: Runs) -> None:
    # 4 ranks on one host (the demo), all launching late: the report says the host is oversubscribed.
    # On a run at the demo's own costs (never recorded again): the late launches are Python time of
    # a few ms per step whatever the costs, so a run recorded again with 3x costs (as the fault-free
    # 1F1B run is when its holds overran) shares them below the 1 % of the step that defines it
    # (5.5 ms of a 552 ms step)
    diag, _ = runs["interleaved"]
    assert diag.result.noise.shared_host and diag.result.noise.oversubscribed
    assert any("oversubscribed" in w for w in diag.result.run.warnings)


@pytest.mark.parametrize("name", list(FAULT_FINDING))
def test_injected_fault_is_the_top_finding(runs: Runs, name: str) -> None:
    diag, truth = runs[name]
    findings = diag.result.findings
    expected = FAULT_FINDING[name]
    assert findings and findings[0].code in expected, [(f.code, f.severity) for f in findings]
    if name == "gpipe8":
        assert any(f.code == "PP002" for f in findings)
    for f in findings[1:]:
        if f.cause is None or f.severity in ("low", "info") or f.code in expected:
            continue
        if name == "slow" and f.code == "PP001":
            # a slow stage lengthens the fill and drain by its extra cost on every other stage, so
            # more micro-batches win more than on a balanced run: PP001's fix gain grows with the
            # fault (a 6x re-recording measured 57.9 ms, 3.1 % of the step beyond its noise, just
            # over medium) while PP003 stays first, which the assertion above holds
            continue
        if _host_measured(diag, truth, f):
            continue  # late launches the recording measured on the ranks named (a loaded host's)
        # The demo delays a rank's sends from a helper thread while its main thread waits for them
        # in Python: the CPU trace shows that wait as the delayed rank's own late launches.
        delayed = [x["rank"] for x in truth["faults"] if x["kind"] == "comm_delay"]
        assert f.code == "PP006" and f.ranks == delayed, f
