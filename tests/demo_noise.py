"""How disturbed a recorded demo run was, measured from its own ground truth, and a recorder that
re-records once (bounded) when a recording cannot support a test's assertion.

A demo run's costs are sleeps inside ``ppdiag_demo::hold`` ops. On a busy host every op wakes up
late (by whole scheduler slices under load), the Python glue around the ops stretches, and the step
times spread. None of that is the fault a test injected, and a diagnosis can only be asked to find a
fault that stands out of it. So every number here is read off ``groundtruth.json``, what the ranks
measured inside that run:

* ``overrun``: per rank and step, how much more the hold ops held than the run asked of them (a
  late wake-up is given back by the next holds of the same cost, up to half of each; on a loaded
  host it is not, and a 2x slow stage may then hold no more than its neighbours);
* ``glue_ms``: per rank and step, the wall time of the compute blocks outside their hold ops;
* ``step_error_ms``: ``Z`` standard errors of the mean step over the steps the analysis used
  (infinite over one step: one step has no spread to measure, which is not a run without noise, so
  no check can be passed on it and the recording is made again with more steps).

:func:`record_supported` records a configuration, lets ``support`` say from the measured ground
truth whether the recording can carry the test's assertion, and otherwise records it once more with
every cost (and every injected fault) scaled by how far the first one fell short, and with more
steps. A second recording that still cannot carry it fails the test with the measured numbers; it is
never skipped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.demo.config import DemoConfig
from ppdiag.demo.recorder import record

#: Standard errors of the mean step a gain must exceed (as the diagnosis's own noise model).
Z = 2.0
COMPUTE = ("fwd", "bwd", "bwd_input", "wgrad")
#: Most a recording's costs are scaled by when it is recorded again.
MAX_SCALE = 6.0
#: A recording is quiet enough for a schedule-shape assertion when its holds kept their costs within
#: this share, and glue plus the step's standard error stay under this share of the step. The
#: schedule's closed forms are computed from the asked costs: a rank whose holds overran by half
#: (late wake-ups on a loaded host, not given back) stretched its blocks unevenly against the
#: others', and that is a bubble of the load's, not of the schedule's (a zero-bubble recording with
#: holds +46% on one rank measured 29 % of bubble against the schedule's 6 %).
MAX_OVERRUN = 0.25
MAX_NOISE_SHARE = 0.25
#: A fault stands out when the run measured it at this many times the run's noise (and a tenth of
#: the step): the diagnosis's own noise model asks for 2 standard errors of the step.
STANDOUT = 2.0

#: Every recording these tests made: name, attempt, seconds, the noise it measured (printed at the
#: end of the session by :func:`report`).
LOG: list[str] = []


@dataclass(frozen=True)
class RunNoise:
    """What a recording varied by, from its ground truth (ms per step, means over ranks)."""

    steps: tuple[int, ...]  # the steps it was measured over
    step_ms: float
    step_error_ms: float
    glue_ms: float
    overrun: float  # max over ranks of held / asked - 1

    @property
    def noise_ms(self) -> float:
        """The time per step a fault must stand out of: the step's error and the glue."""
        return max(self.step_error_ms, self.glue_ms)

    @property
    def share(self) -> float:
        return (self.step_error_ms + self.glue_ms) / self.step_ms if self.step_ms > 0 else math.inf

    def __str__(self) -> str:
        err = (
            f"{self.step_error_ms:.1f} ms"
            if math.isfinite(self.step_error_ms)
            else f"not measurable over {len(self.steps)} step"
        )
        return (
            f"step {self.step_ms:.1f} ms, step error {err}, glue "
            f"{self.glue_ms:.1f} ms/step, holds {100 * self.overrun:+.0f}% of the asked cost"
        )


def _asked_ns(truth: dict[str, Any], kind: str, stage: int) -> int:
    costs = truth.get("stage_costs_ms")
    if not costs or kind not in costs[stage]:
        return 0
    return int(costs[stage][kind] * 1e6)


def measure(truth: dict[str, Any], steps: list[int] | None = None) -> RunNoise:
    """The noise of a recording over ``steps`` (default: every recorded step)."""
    use = set(steps if steps is not None else truth["steps"])
    windows: list[float] = []
    glue: list[float] = []
    overrun = 0.0
    for rt in truth["ranks"]:
        iv = rt["intervals"]
        rank_windows = [(e - s) / 1e6 for k, s, e in _steps(rt) if k in use]
        windows.append(float(np.mean(rank_windows)) if rank_windows else 0.0)
        g = held = asked = 0
        for i, kind in enumerate(iv["kind"]):
            if kind not in COMPUTE or iv["step"][i] not in use:
                continue
            g += iv["end_ns"][i] - iv["start_ns"][i] - iv["held_ns"][i]
            held += iv["held_ns"][i]
            asked += _asked_ns(truth, kind, iv["stage"][i])
        glue.append(g / 1e6 / max(len(use), 1))
        if asked > 0:
            overrun = max(overrun, held / asked - 1.0)
    per_step = [
        float(np.mean([(e - s) / 1e6 for rt in truth["ranks"] for k, s, e in _steps(rt) if k == step]))
        for step in sorted(use)
    ]
    # one step gives no spread: its error is unknown, not zero (a check must not pass on it)
    err = Z * float(np.std(per_step, ddof=1)) / math.sqrt(len(per_step)) if len(per_step) > 1 else math.inf
    return RunNoise(
        steps=tuple(sorted(use)),
        step_ms=float(np.mean(windows)),
        step_error_ms=err,
        glue_ms=float(np.mean(glue)),
        overrun=overrun,
    )


def _steps(rt: dict[str, Any]) -> list[tuple[int, int, int]]:
    st = rt["steps"]
    return list(zip(st["step"], st["start_ns"], st["end_ns"], strict=True))


def quiet(truth: dict[str, Any], noise: RunNoise) -> str | None:
    """None when the recording kept its costs and its noise is a small share of the step; else why not."""
    if noise.overrun > MAX_OVERRUN or noise.share > MAX_NOISE_SHARE:
        return f"too disturbed for a schedule-shape assertion ({noise})"
    return None


def kept_costs(limit: float) -> Support:
    """A check that every rank's hold ops held what the run asked of them, late wake-ups given back
    to within ``limit`` of the cost (beyond it, a cost ratio between ranks is the load's)."""

    def check(truth: dict[str, Any], noise: RunNoise) -> str | None:
        if noise.overrun > limit:
            return f"the hold ops did not keep their costs within {100 * limit:.0f}% ({noise})"
        return None

    return check


def standing_out(fault_ms: float, noise: RunNoise, what: str) -> str | None:
    """None when a fault of ``fault_ms`` per step (as the run measured it) stands out of the run's
    noise: :data:`STANDOUT` times its noise and a tenth of its step; else why not."""
    need = max(STANDOUT * noise.noise_ms, 0.1 * noise.step_ms)
    if fault_ms >= need:
        return None
    return f"{what} measured {fault_ms:.1f} ms per step, below the {need:.1f} ms that stand out of {noise}"


def scaled(cfg: DemoConfig, factor: float, costs: bool = True) -> DemoConfig:
    """``cfg`` with every cost and fault ``factor`` times larger and four more steps (``costs``
    False: only the faults)."""
    if not costs:
        return dataclasses.replace(
            cfg, host_stall_ms=cfg.host_stall_ms * factor, comm_delay_ms=cfg.comm_delay_ms * factor
        )
    return dataclasses.replace(
        cfg,
        fwd_ms=cfg.fwd_ms * factor,
        bwd_ms=cfg.bwd_ms * factor,
        host_stall_ms=cfg.host_stall_ms * factor,
        comm_delay_ms=cfg.comm_delay_ms * factor,
        steps=cfg.steps + 4,
        timeout_s=max(cfg.timeout_s, 240.0),
    )


#: ``support(truth, noise)``: None when the recording can carry the assertion, else why not.
Support = Callable[[dict[str, Any], RunNoise], "str | None"]
#: ``scale(truth, noise)``: how many times larger the costs of a second recording should be.
Scale = Callable[[dict[str, Any], RunNoise], float]
Recorded = tuple[Analyzed, dict[str, Any]]


def _once(
    name: str, cfg: DemoConfig, out: Path, attempt: int, analyse: bool
) -> tuple[Analyzed | None, dict[str, Any], RunNoise]:
    t0 = time.monotonic()
    record(cfg, out)
    truth = json.loads((out / "groundtruth.json").read_text())
    diag = diagnose([out], Options()) if analyse else None
    noise = measure(truth, list(diag.result.run.steps) if diag is not None else None)
    LOG.append(f"{name} #{attempt}: {time.monotonic() - t0:.1f} s, {noise}")
    return diag, truth, noise


def _supported(
    name: str,
    cfg: DemoConfig,
    out: Path,
    support: Support | None,
    scale: Scale | None,
    analyse: bool,
    costs: bool = True,
) -> tuple[Analyzed | None, dict[str, Any], Path]:
    diag, truth, noise = _once(name, cfg, out, 1, analyse)
    why = support(truth, noise) if support else None
    if support is None or why is None:
        return diag, truth, out
    factor = min(max(scale(truth, noise) if scale else default_scale(noise), 2.0), MAX_SCALE)
    again = out.with_name(out.name + "-again")
    diag, truth, noise = _once(name, scaled(cfg, factor, costs), again, 2, analyse)
    why2 = support(truth, noise)
    if why2 is not None:
        pytest.fail(f"{name}: recorded twice, neither can carry the test: {why}; then x{factor:.1f}: {why2}")
    LOG[-1] += f" (recorded again x{factor:.1f}: {why})"
    return diag, truth, again


def default_scale(noise: RunNoise) -> float:
    """Costs of a second recording: 3x, or twice what the first one's holds overran (a late wake-up
    is given back by later holds up to half of each, so holds twice the lateness keep their cost)."""
    return max(3.0, 2.0 * (1.0 + noise.overrun))


def record_supported(
    name: str, cfg: DemoConfig, out: Path, support: Support | None = None, scale: Scale | None = None
) -> Recorded:
    """Record ``cfg`` into ``out`` and analyse it; when ``support(truth, noise)`` (the noise measured
    over the steps the analysis used) names a reason the recording cannot carry the assertion, record
    once more (costs times ``scale(truth, noise)``, default :func:`default_scale`, within 2 and
    :data:`MAX_SCALE`) into a sibling folder. A second reason fails the test."""
    diag, truth, _ = _supported(name, cfg, out, support, scale, analyse=True)
    assert diag is not None
    return diag, truth


def record_supported_in(
    name: str,
    cfg: DemoConfig,
    out: Path,
    support: Support | None = None,
    scale: Scale | None = None,
    costs: bool = True,
) -> tuple[Analyzed, Path]:
    """:func:`record_supported`, returning the folder of the recording that carries the test.
    ``costs`` False: a second recording scales only the injected faults (of a run without any, it
    is the same run again: a test whose prediction is of these costs)."""
    diag, _, where = _supported(name, cfg, out, support, scale, analyse=True, costs=costs)
    assert diag is not None
    return diag, where


def record_dir_supported(
    name: str,
    cfg: DemoConfig,
    out: Path,
    support: Support | None = None,
    scale: Scale | None = None,
    costs: bool = True,
) -> Path:
    """:func:`record_supported` without the analysis (the noise over every recorded step); returns
    the folder of the recording that carries the test. ``costs`` False: a second recording scales
    only the injected faults (a test that compares it with a fault-free run of the same costs)."""
    return _supported(name, cfg, out, support, scale, analyse=False, costs=costs)[2]


#: ``fault(truth, noise)``: the injected fault's size per step (ms) as the run measured it, over the
#: steps the noise was measured on.
Fault = Callable[[dict[str, Any], RunNoise], float]


def fault_support(fault: Fault, what: str, also: Support | None = None) -> tuple[Support, Scale]:
    """The support check and re-record scale of a fault: it must stand out of the run's noise (and
    pass ``also``), and a second recording scales it (with every cost) by :data:`MAX_SCALE`."""

    def support(truth: dict[str, Any], noise: RunNoise) -> str | None:
        why = also(truth, noise) if also else None
        if why:
            return why
        fault_ms = fault(truth, noise)
        return standing_out(fault_ms, noise, what) or above_load_host(fault_ms, truth, noise, what)

    def scale(truth: dict[str, Any], noise: RunNoise) -> float:
        # the load that buried the fault may be burstier still during the second recording (the
        # step error of a few steps moves by 4x between two recordings on a shared host): the
        # largest scale, whatever the first one fell short by
        return MAX_SCALE

    return support, scale


def send_delay_ms(truth: dict[str, Any], noise: RunNoise) -> float:
    """Per step and link, how long the delayed rank's sends were held before they left (the comm
    delay fault as the run measured it)."""
    (fault,) = truth["faults"]
    r = fault["rank"]
    held = total_ms(truth, r, intervals(truth, r, ("send",), noise.steps))
    return held / len(noise.steps) / max(len(fault["peers"]), 1)


def intervals(truth: dict[str, Any], rank: int, kinds: tuple[str, ...], steps: tuple[int, ...]) -> list[int]:
    """Rows of ``rank``'s ground-truth intervals of the given kinds within ``steps``."""
    rt = next(x for x in truth["ranks"] if x["rank"] == rank)
    iv = rt["intervals"]
    return [i for i, k in enumerate(iv["kind"]) if k in kinds and iv["step"][i] in steps]


def total_ms(truth: dict[str, Any], rank: int, rows: list[int], column: str = "") -> float:
    """Summed duration (or ``column``, e.g. held_ns) of ``rows`` of ``rank``, in ms."""
    iv = next(x for x in truth["ranks"] if x["rank"] == rank)["intervals"]
    if column:
        return float(sum(iv[column][i] for i in rows)) / 1e6
    return float(sum(iv["end_ns"][i] - iv["start_ns"][i] for i in rows)) / 1e6


def host_ms_by_rank(truth: dict[str, Any], steps: list[int] | tuple[int, ...]) -> dict[int, float]:
    """Per rank, the host time per step of ``steps`` that the rank measured: its wall time neither
    held in a compute block's sleep op nor blocked in a p2p wait (Python glue, injected stalls,
    send calls, and every late wake-up of a descheduled process). It is measured from the start of
    the first step to the start of the step after the last one (or the last one's end), so the
    glue between two steps, which a profiler's step span holds, is counted once."""
    use = sorted(set(steps))
    out: dict[int, float] = {}
    for rt in truth["ranks"]:
        windows = {k: (s, e) for k, s, e in _steps(rt)}
        if not use or any(k not in windows for k in use):
            continue
        start = windows[use[0]][0]
        later = [windows[k][0] for k in windows if k > use[-1]]
        end = min(later) if later else windows[use[-1]][1]
        iv = rt["intervals"]
        busy = 0
        for i, kind in enumerate(iv["kind"]):
            s, e = iv["start_ns"][i], iv["end_ns"][i]
            if e <= start or s >= end:
                continue
            if kind in COMPUTE:
                busy += iv["held_ns"][i]
            elif kind == "wait":
                busy += min(e, end) - max(s, start)
        out[rt["rank"]] = (end - start - busy) / 1e6 / len(use)
    return out


def load_host_ms(truth: dict[str, Any], steps: list[int] | tuple[int, ...]) -> float:
    """The most host time per step (:func:`host_ms_by_rank`) that the machine, not an injected
    fault, gave one rank: each rank's injected stalls are taken out, and a rank whose sends are
    delayed is left out (its main thread waits in Python for them: the fault's own host time)."""
    delayed = {f["rank"] for f in truth["faults"] if f["kind"] == "comm_delay"}
    use = tuple(sorted(set(steps)))
    most = 0.0
    for r, host in host_ms_by_rank(truth, use).items():
        if r in delayed:
            continue
        stalls = total_ms(truth, r, intervals(truth, r, ("stall",), use)) / len(use)
        most = max(most, host - stalls)
    return most


def above_load_host(fault_ms: float, truth: dict[str, Any], noise: RunNoise, what: str) -> str | None:
    """None when a fault of ``fault_ms`` per step stands :data:`STANDOUT` times above the late
    launches the host's load gave any rank (:func:`load_host_ms`); else why not. A loaded host
    starves a rank between its ops, and the diagnosis rightly reports that as host time (PP006):
    a fault that does not stand above it cannot be asked to be the top finding."""
    host = load_host_ms(truth, noise.steps)
    if fault_ms >= STANDOUT * host:
        return None
    return (
        f"{what} measured {fault_ms:.1f} ms per step, below {STANDOUT:g}x the {host:.1f} ms per step "
        f"of late launches the host's load gave one rank ({noise})"
    )


def report() -> str:
    return "recordings: " + "; ".join(LOG) if LOG else ""


def waits_after_posts(truth: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    """Every receive wait of the recording whose send was logged: (step, wait start, wait end,
    when the matching send was posted), all on the recording host's one clock."""
    posted: dict[tuple[int, int, int, str, int], int] = {}
    for rt in truth["ranks"]:
        iv = rt["intervals"]
        for i, kind in enumerate(iv["kind"]):
            if kind == "send":
                key = (rt["rank"], iv["peer"][i], iv["step"][i], iv["payload"][i], iv["mb"][i])
                posted[key] = iv["end_ns"][i]
    out: list[tuple[int, int, int, int]] = []
    for rt in truth["ranks"]:
        iv = rt["intervals"]
        for i, kind in enumerate(iv["kind"]):
            if kind != "wait" or iv["direction"][i] != "recv":
                continue
            post = posted.get((iv["peer"][i], rt["rank"], iv["step"][i], iv["payload"][i], iv["mb"][i]))
            if post is not None:
                out.append((iv["step"][i], iv["start_ns"][i], iv["end_ns"][i], post))
    return out
