"""What a change would buy: predicted step time, bubble, lost time by cause and memory of a scenario.

A scenario changes some of: the number of micro-batches ``M``, the schedule, the virtual stages per
rank ``v``, the pipeline size ``P``, the split of the model into stages (``rebalance``), and removes
measured delays (``no_comm_wait``, ``no_host``). Predictions come from the schedule simulator
(:mod:`ppdiag.simulate`) driven by what the run measured:

* per-stage forward / backward / weight-gradient costs of one micro-batch (:class:`MeasuredRun`);
* the normal p2p latency between stages (the median transfer the analysis saw);
* what every rank does before its first block and after its last one (optimizer, step-end
  collectives);
* everything else the run lost (host and launch overhead, slow transfers, unexplained waits) through
  a **calibration**: the simulator's prediction of the *measured* configuration is compared with the
  measured step time and the difference is carried over to every scenario, by default as an
  overhead added to every block (``per-block``: host/launch work and late transfers happen per
  micro-batch and travel along the pipeline's critical path, so they grow with M and with the
  number of chunks); ``per-step`` (one constant per step), ``ratio`` (a factor) and ``none`` (the
  simulator alone) are the alternatives. Removing a cause lowers the calibration target by the step
  time the analysis' replay says that cause costs.

Changing M at a fixed global batch changes the micro-batch size: per-micro-batch compute scales by
``M_old / M_new`` (compute assumed linear in the micro-batch size — optimistic for small
micro-batches on GPUs), while the per-block overhead and the p2p latency stay. With
``fixed_microbatch_size`` costs stay and a step processes more samples: the speed-up is then the
throughput ratio (time per sample), not the step-time ratio.

Memory: the peak number of micro-batches a rank holds activations for, from the simulated block
order (forward done minus backward done, max over time, summed over its chunks), weighted by each
chunk's share of the model and by the micro-batch size, relative to the measured configuration.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ppdiag.diagnosis import CAUSE_KEYS
from ppdiag.errors import InputError
from ppdiag.model.schedule import SIMULATED_AS, SIMULATED_NOTE, parse_schedule
from ppdiag.report_types import Report, WhatifRow
from ppdiag.simulate import SimConfig, closed_form_bubble, rank_orders, simulate, splits_backward
from ppdiag.simulate.schedules import B, F, I, canonical_schedule, default_virtual
from ppdiag.whatif.costs import (
    MS,
    LayerProfile,
    MeasuredRun,
    measure,
    profile_from_stages,
    profile_from_trace,
    scale_profile_to,
)
from ppdiag.whatif.rebalance import continuous_balance, even_split, min_max_split

F64 = npt.NDArray[np.float64]

CALIBRATIONS = ("per-block", "per-step", "ratio", "none")
_SOURCES = {
    "trace": "the per-layer costs of the trace's module ranges",
    "file": "the --layer-costs file",
    "layers-per-stage": "per-layer costs estimated from the stage totals",
}
_INTERLEAVED = ("interleaved_1f1b",)
_SINGLE = ("gpipe", "1f1b")


@dataclass
class Scenario:
    """One change to predict; ``None`` keeps the measured value."""

    microbatches: int | None = None
    schedule: str | None = None
    virtual: int | None = None
    pp: int | None = None
    rebalance: bool = False
    fixed_microbatch_size: bool = False
    no_comm_wait: bool = False
    no_host: bool = False
    no_exposed_comm: bool = False  # communication overlapped with compute (asynchronous p2p, reduce)
    label: str | None = None


@dataclass
class WhatifOptions:
    """How predictions are made."""

    calibration: str = "per-block"
    wgrad_fraction: float = 0.5  # weight-gradient share of a backward when the trace does not split it
    micro_batch: int | None = None  # samples per micro-batch in the measured run (time per sample)
    max_activation_mb: float | None = None  # memory limit per rank for the rebalanced split


@dataclass
class Calibration:
    """How the measured step is reproduced: the simulator alone gives ``sim_ns``; ``target_ns`` is the
    measured step minus removed causes; ``delta_ns`` / ``offset_ns`` / ``ratio`` close the gap."""

    mode: str
    target_ns: float
    sim_ns: float
    delta_ns: float = 0.0
    offset_ns: float = 0.0
    ratio: float = 1.0
    removed_ns: dict[str, float] = field(default_factory=dict)
    note: str = ""

    def describe(self) -> str:
        gap = self.target_ns - self.sim_ns
        base = f"simulator alone {self.sim_ns / MS:.2f} ms vs {self.target_ns / MS:.2f} ms measured"
        if self.removed_ns:
            base += " minus " + ", ".join(
                f"{k.replace('_', ' ')} {v / MS:.2f} ms" for k, v in sorted(self.removed_ns.items())
            )
        if self.mode == "per-block":
            how = f"calibration: per-block overhead {self.delta_ns / MS:+.3f} ms on every F/B/W block"
        elif self.mode == "per-step":
            how = f"calibration: {gap / MS:+.2f} ms per step"
        elif self.mode == "ratio":
            how = f"calibration: step times x{self.ratio:.3f}"
        else:
            how = "no calibration (the simulator alone)"
        out = f"{how} ({base})"
        if self.note:
            out += f"; {self.note}"
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "target_ms": round(self.target_ns / MS, 4),
            "sim_ms": round(self.sim_ns / MS, 4),
            "delta_ms": round(self.delta_ns / MS, 5),
            "offset_ms": round(self.offset_ns / MS, 4),
            "ratio": round(self.ratio, 5),
            "removed_ms": {k: round(v / MS, 4) for k, v in self.removed_ns.items()},
            "text": self.describe(),
        }


@dataclass
class Prediction:
    """The predicted step of one scenario (``error`` set when it cannot be simulated)."""

    scenario: str
    schedule: str
    pp: int
    virtual: int
    microbatches: int
    step_ns: float | None = None
    speedup: float | None = None
    step_speedup: float | None = None
    bubble_ratio: float | None = None
    schedule_bubble_ratio: float | None = None
    closed_form_bubble: float | None = None
    lost_ns: dict[str, float] = field(default_factory=dict)
    samples_vs_measured: float = 1.0
    ms_per_sample: float | None = None
    peak_inflight: int | None = None
    activation_vs_measured: float | None = None
    peak_activation_mb: float | None = None
    stage_ns: list[float] = field(default_factory=list)
    split: dict[str, Any] | None = None
    calibration: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    measured: bool = False

    @property
    def note(self) -> str:
        return "; ".join(self.notes)

    def to_json(self) -> dict[str, Any]:
        def r(v: float | None, nd: int = 4) -> float | None:
            return None if v is None else round(float(v), nd)

        return {
            "scenario": self.scenario,
            "measured": self.measured,
            "schedule": self.schedule,
            "pp": self.pp,
            "virtual": self.virtual,
            "microbatches": self.microbatches,
            "step_ms": r(self.step_ns / MS if self.step_ns is not None else None),
            "speedup": r(self.speedup, 3),
            "step_speedup": r(self.step_speedup, 3),
            "bubble_ratio": r(self.bubble_ratio),
            "schedule_bubble_ratio": r(self.schedule_bubble_ratio),
            "closed_form_bubble": r(self.closed_form_bubble),
            "lost_ms": {k: round(v / MS, 4) for k, v in self.lost_ns.items()},
            "samples_vs_measured": r(self.samples_vs_measured, 4),
            "ms_per_sample": r(self.ms_per_sample, 5),
            "peak_inflight": self.peak_inflight,
            "activation_vs_measured": r(self.activation_vs_measured, 3),
            "peak_activation_mb": r(self.peak_activation_mb, 2),
            "stage_ms": [round(x / MS, 4) for x in self.stage_ns],
            "split": self.split,
            "calibration": self.calibration,
            "note": self.note,
            "error": self.error,
        }


@dataclass
class _Layout:
    """A scenario's shape and per-chunk costs (ns per micro-batch, before the micro-batch scaling)."""

    schedule: str
    pp: int
    virtual: int
    fwd: F64
    bwd: F64  # input-gradient part for split schedules, whole backward otherwise
    wgrad: F64
    act: F64  # activation weight of one micro-batch per chunk (MB, or measured-stage units)
    act_in_mb: bool
    split: dict[str, Any] | None
    notes: list[str]


def rank_peaks(sched: str, pp: int, m: int, v: int, act: F64) -> tuple[int, float]:
    """(max chunk-micro-batches held by any rank, max weighted activations of any rank) over time.

    Activations of a micro-batch live from its forward until its (input-gradient) backward.
    """
    orders = rank_orders(sched, pp, m, v)
    peak_n, peak_w = 0, 0.0
    for order in orders:
        n, w = 0, 0.0
        for a in order:
            if a.op == F:
                n += 1
                w += float(act[a.stage])
                peak_n = max(peak_n, n)
                peak_w = max(peak_w, w)
            elif a.op in (B, I):
                n -= 1
                w -= float(act[a.stage])
    return peak_n, peak_w


def _sim_cfg(
    sched: str,
    pp: int,
    m: int,
    v: int,
    fwd: F64,
    bwd: F64,
    wgrad: F64,
    delta: float,
    p2p: float = 0.0,
    head: float = 0.0,
    end: float = 0.0,
    tail_busy: F64 | float = 0.0,
) -> SimConfig:
    """The simulator config of one shape: ``delta`` added to every block; after its last block every
    rank computes ``tail_busy`` (optimizer) and the step ends ``end`` after the last rank is done."""
    split = splits_backward(sched)
    f = np.maximum(fwd + delta, 0.0)
    if split:
        b = np.maximum(bwd + delta, 0.0)
        w = np.maximum(wgrad + delta, 0.0)
    else:
        b = np.maximum(bwd + wgrad + delta, 0.0)
        w = np.zeros_like(wgrad)
    return SimConfig(
        sched,
        pp,
        m,
        v,
        fwd_ns=f.tolist(),
        bwd_ns=b.tolist(),
        wgrad_ns=w.tolist(),
        p2p_ns=p2p,
        start_delay_ns=head,
        optim_ns=tail_busy.tolist() if isinstance(tail_busy, np.ndarray) else tail_busy,
        end_latency_ns=end,
    )


def _resample(vals: F64, n: int) -> F64:
    """Per-rank values of a pipeline of ``len(vals)`` ranks mapped onto ``n`` ranks by position."""
    if vals.size == n:
        return vals.copy()
    if vals.size == 0:
        return np.zeros(n)
    idx = np.round(np.linspace(0, vals.size - 1, n)).astype(int) if n > 1 else np.array([0])
    return vals[idx]


class WhatifModel:
    """The measured run plus per-block costs, calibrated; :meth:`predict` answers one scenario."""

    def __init__(
        self, meas: MeasuredRun, profile: LayerProfile, options: WhatifOptions | None = None
    ) -> None:
        self.meas = meas
        self.profile = profile
        self.opts = options or WhatifOptions()
        if self.opts.calibration not in CALIBRATIONS:
            raise ValueError(
                f"unknown calibration {self.opts.calibration!r}; choose one of {', '.join(CALIBRATIONS)}"
            )
        self._cal: dict[tuple[str, ...], Calibration] = {}
        self._base_layout = self._measured_layout()
        self._base_peaks = rank_peaks(
            meas.schedule, meas.pp, meas.microbatches, meas.virtual, self._base_layout.act
        )

    # ---- layouts ---------------------------------------------------------------------------

    def _measured_layout(self) -> _Layout:
        m = self.meas
        n_st = m.stages
        act, in_mb = self._act_of_bounds(self.profile.bounds, n_st)
        return _Layout(
            m.schedule,
            m.pp,
            m.virtual,
            m.fwd_ns.copy(),
            m.bwd_ns.copy(),
            m.wgrad_ns.copy(),
            act,
            in_mb,
            None,
            [],
        )

    def _act_of_bounds(self, bounds: Sequence[float] | None, n_st: int) -> tuple[F64, bool]:
        """Activation weight per chunk: MB when the profile knows it, else the chunk's model share
        in units of one measured stage."""
        prof = self.profile
        if bounds is not None and len(bounds) == n_st + 1:
            sums = prof.chunk_sums(bounds)
            if prof.has_activations:
                return sums["act"], True
            return sums["layers"] / max(prof.n, 1) * self.meas.stages, False
        return np.full(n_st, self.meas.stages / n_st), False

    def _layout(self, sched: str, pp: int, v: int, mm: int, scale: float, rebalance: bool) -> _Layout:
        """Per-chunk costs of a shape: the measured stages when the shape is the measured one, else the
        profile re-cut (evenly by layer count, or rebalanced)."""
        m = self.meas
        n_st = pp * v
        prof = self.profile
        notes: list[str] = []
        split_info: dict[str, Any] | None = None
        if not rebalance and (pp, v) == (m.pp, m.virtual):
            lay = self._measured_layout()
            fwd, bwd_full = lay.fwd, lay.bwd + lay.wgrad
            wg = lay.wgrad if m.split_backward else np.full(n_st, np.nan)
            act, in_mb = lay.act, lay.act_in_mb
        else:
            if rebalance:
                bounds_f, split_info = self._rebalanced_bounds(sched, pp, v, mm, scale, notes)
            elif prof.discrete:
                if prof.n < n_st:
                    raise ValueError(f"{prof.n} layers cannot fill {n_st} stages")
                b = even_split(prof.n, n_st)
                bounds_f = [float(x) for x in b]
                split_info = self._split_json(b)
                notes.append(f"layers split evenly over {n_st} {'chunks' if v > 1 else 'stages'}")
            else:
                bounds_f = [float(x) for x in np.linspace(0.0, prof.n, n_st + 1)]
                notes.append(
                    f"the model re-cut into {n_st} equal parts (the measured stages taken to hold equal "
                    "layer counts)"
                )
            sums = prof.chunk_sums(bounds_f)
            fwd, bwd_full = sums["fwd"], sums["bwd"]
            wg = sums["wgrad"] if np.isfinite(prof.wgrad_ns).all() else np.full(n_st, np.nan)
            act, in_mb = self._act_of_bounds(bounds_f, n_st)
        if splits_backward(sched):
            if not np.isfinite(wg).all():
                wg = bwd_full * self.opts.wgrad_fraction
                if not m.split_backward:
                    notes.append(
                        f"backward split as {1 - self.opts.wgrad_fraction:.0%} input gradient + "
                        f"{self.opts.wgrad_fraction:.0%} weight gradient (not measured)"
                    )
            bwd = bwd_full - wg
        else:
            wg = np.zeros(n_st)
            bwd = bwd_full
        return _Layout(
            sched,
            pp,
            v,
            np.asarray(fwd, dtype=np.float64),
            np.asarray(bwd, dtype=np.float64),
            np.asarray(wg, dtype=np.float64),
            act,
            in_mb,
            split_info,
            notes,
        )

    def _split_json(self, bounds: Sequence[int]) -> dict[str, Any]:
        prof = self.profile
        ranges = [(int(a), int(b) - 1) for a, b in itertools.pairwise(bounds)]
        out: dict[str, Any] = {
            "layers_per_stage": [b - a + 1 for a, b in ranges],
            "ranges": [[a, b] for a, b in ranges],
            "names": [[prof.names[a], prof.names[b]] for a, b in ranges],
            "source": prof.source,
        }
        if prof.bounds is not None:
            out["current_layers_per_stage"] = [
                int(b - a) for a, b in zip(prof.bounds[:-1], prof.bounds[1:], strict=True)
            ]
        return out

    def _rebalanced_bounds(
        self, sched: str, pp: int, v: int, mm: int, scale: float, notes: list[str]
    ) -> tuple[list[float], dict[str, Any] | None]:
        """The split with the cheapest slowest chunk (F + B + W per micro-batch), within the memory
        limit when one is set: a chunk holding ``h`` micro-batches in flight may keep at most
        ``limit / v / h`` MB of activations per micro-batch (v chunks share a rank)."""
        prof = self.profile
        n_st = pp * v
        total = prof.total_ns
        if not prof.discrete:
            notes.append(
                "ideal balance, every stage at the mean cost (no per-block costs: pass "
                "--layers-per-stage or --layer-costs for a concrete layer split)"
            )
            return continuous_balance(total, n_st), None
        weights = limits = None
        if self.opts.max_activation_mb is not None:
            if not prof.has_activations:
                raise ValueError("--max-activation-mb needs activation_mb per block (--layer-costs)")
            # micro-batches each chunk keeps in flight, from the schedule's block order
            held = _chunk_inflight(sched, pp, mm, v)
            limits = np.array([self.opts.max_activation_mb / v / max(h, 1) / scale for h in held])
            weights = prof.act_mb
        sp = min_max_split(total, n_st, weights, limits)
        info = self._split_json(sp.bounds)
        source = _SOURCES.get(prof.source, prof.source)
        notes.append(f"layers {'/'.join(map(str, sp.layers_per_stage))} per stage, split by {source}")
        return [float(x) for x in sp.bounds], info

    # ---- calibration -----------------------------------------------------------------------

    def calibration(self, removed: Sequence[str] = ()) -> Calibration:
        """The calibration against the measured step, with some causes removed from the target."""
        key = tuple(sorted(removed))
        if key in self._cal:
            return self._cal[key]
        m = self.meas
        rem = {c: float(m.removable_ns.get(c, 0.0)) for c in key}
        target = max(m.step_ns - sum(rem.values()), 1.0)
        lay = self._base_layout

        def step_at(delta: float) -> float:
            cfg = _sim_cfg(
                m.schedule,
                m.pp,
                m.microbatches,
                m.virtual,
                lay.fwd,
                lay.bwd,
                lay.wgrad,
                delta,
                m.p2p_ns,
                m.head_ns,
                m.end_ns,
                m.tail_busy_ns,
            )
            return simulate(cfg).step_ns

        sim0 = step_at(0.0)
        mode = self.opts.calibration if m.from_trace else "none"
        cal = Calibration(mode, target, sim0, removed_ns=rem)
        if mode == "per-block":
            delta, ok = _solve_delta(step_at, target, sim0, lay)
            if ok:
                cal.delta_ns = delta
            else:
                cal.mode = "ratio"
                cal.ratio = target / sim0 if sim0 > 0 else 1.0
                cal.note = "a per-block overhead cannot reproduce the measured step; a ratio is used"
        elif mode == "per-step":
            cal.offset_ns = target - sim0
        elif mode == "ratio":
            cal.ratio = target / sim0 if sim0 > 0 else 1.0
        self._cal[key] = cal
        return cal

    # ---- prediction ------------------------------------------------------------------------

    def measured_row(self) -> Prediction:
        """The measured run as the first row of a table."""
        m = self.meas
        p = Prediction(
            "measured",
            m.schedule,
            m.pp,
            m.virtual,
            m.microbatches,
            step_ns=m.step_ns,
            speedup=1.0,
            step_speedup=1.0,
            bubble_ratio=m.bubble_ratio,
            measured=True,
        )
        p.lost_ns = {k: float(v) * MS for k, v in m.lost_ms.items()}
        p.closed_form_bubble = _closed(m.schedule, m.pp, m.microbatches, m.virtual)
        p.peak_inflight = self._base_peaks[0]
        p.activation_vs_measured = 1.0
        if self._base_layout.act_in_mb:
            p.peak_activation_mb = self._base_peaks[1]
        p.stage_ns = [float(x) for x in self.meas.stage_total_ns()]
        if self.opts.micro_batch:
            p.ms_per_sample = m.step_ns / MS / (m.microbatches * self.opts.micro_batch)
        if not m.from_trace:
            p.scenario = "current split"
            p.notes.append("no trace: predicted from the block costs alone")
        return p

    def predict(self, scn: Scenario) -> Prediction:
        """Predict one scenario; a scenario that cannot run returns a Prediction with ``error``."""
        m = self.meas
        label = scn.label or describe(scn, m)
        notes: list[str] = []
        pred = Prediction(
            label,
            scn.schedule or m.schedule,
            scn.pp or m.pp,
            scn.virtual or m.virtual,
            scn.microbatches or m.microbatches,
        )
        try:
            sched, v, pp, mm = self._shape(scn, notes)
            pred.schedule, pred.virtual, pred.pp, pred.microbatches = sched, v, pp, mm
            if pp < 1 or mm < 1 or v < 1:
                raise ValueError("pp, microbatches and virtual must be >= 1")
            scale = 1.0 if scn.fixed_microbatch_size else m.microbatches / mm
            rank_orders(sched, pp, mm, v)  # raises for impossible combinations
            lay = self._layout(sched, pp, v, mm, scale, scn.rebalance)
        except ValueError as exc:
            pred.error = str(exc)
            pred.notes = notes
            return pred
        removed = {
            c
            for c, on in (
                ("comm_wait", scn.no_comm_wait),
                ("host", scn.no_host),
                ("exposed_comm", scn.no_exposed_comm),
            )
            if on
        }
        # Calibrations with fewer and fewer causes removed: the first leaves only what no cause
        # explains, each next one adds one cause back; the step growth at each level is that cause.
        # Overlapped communication only lowers the target (its exposure is modelled by the links).
        gone = {"comm_wait", "host"} | (removed & {"exposed_comm"})
        chain = [("unexplained", self.calibration(tuple(gone)))]
        for c in ("comm_wait", "host"):
            if c not in removed:
                gone.discard(c)
                chain.append((c, self.calibration(tuple(gone))))
        cal = chain[-1][1]
        notes.extend(lay.notes)
        if scale != 1.0:
            notes.append(f"fixed global batch: micro-batch {scale:.3g}x the size, costs scaled alike")
        elif mm != m.microbatches:
            notes.append(f"same micro-batch size: {mm / m.microbatches:.3g}x the samples per step")
        fwd, bwd, wg = lay.fwd * scale, lay.bwd * scale, lay.wgrad * scale
        tail_b = _resample(m.tail_busy_ns, pp)
        n_st = pp * v

        def mean_costs(x: F64) -> F64:
            return np.full(n_st, float(x.mean()))

        s_bal = simulate(_sim_cfg(sched, pp, mm, v, mean_costs(fwd), mean_costs(bwd), mean_costs(wg), 0.0))
        s_cost = simulate(_sim_cfg(sched, pp, mm, v, fwd, bwd, wg, 0.0))
        s_comm = simulate(
            _sim_cfg(sched, pp, mm, v, fwd, bwd, wg, 0.0, m.p2p_ns, m.head_ns, m.end_ns, tail_b)
        )
        busy = s_comm.per_rank_busy_ns  # blocks + tail compute: the overhead is not compute
        floor = float(busy.max())

        def step_with(c: Calibration) -> float:
            if c.mode == "per-block":
                st = simulate(
                    _sim_cfg(
                        sched, pp, mm, v, fwd, bwd, wg, c.delta_ns, m.p2p_ns, m.head_ns, m.end_ns, tail_b
                    )
                ).step_ns
            elif c.mode == "per-step":
                st = s_comm.step_ns + c.offset_ns
            elif c.mode == "ratio":
                st = s_comm.step_ns * c.ratio
            else:
                st = s_comm.step_ns
            return max(float(st), floor)

        steps = np.maximum.accumulate(np.array([step_with(c) for _, c in chain]))
        step = float(steps[-1])
        bubble_r = np.minimum(s_bal.per_rank_idle_ns, s_cost.per_rank_idle_ns)
        imb_r = np.maximum(s_cost.per_rank_idle_ns - bubble_r, 0.0)
        exp_r = np.maximum(s_comm.per_rank_idle_ns - s_cost.per_rank_idle_ns, 0.0)
        base_lost = steps[0] - busy
        sched_lost = bubble_r + imb_r + exp_r
        if steps[0] < s_comm.step_ns:
            # the measured step is shorter than the schedule model: shrink its causes to fit
            k = np.clip(base_lost / np.maximum(sched_lost, 1.0), 0.0, 1.0)
            bubble_r, imb_r, exp_r = bubble_r * k, imb_r * k, exp_r * k
        lost = {k: 0.0 for k in CAUSE_KEYS}
        lost["bubble"] = float(bubble_r.mean())
        lost["imbalance"] = float(imb_r.mean())
        lost["exposed_comm"] = float(exp_r.mean())
        lost["unexplained"] = float(np.maximum(base_lost - bubble_r - imb_r - exp_r, 0.0).mean())
        for i in range(1, len(chain)):
            lost[chain[i][0]] = float(steps[i] - steps[i - 1])
        pred.step_ns = step
        pred.lost_ns = lost
        pred.bubble_ratio = float((bubble_r + imb_r).mean() / step) if step > 0 else None
        pred.schedule_bubble_ratio = float(bubble_r.mean() / step) if step > 0 else None
        pred.closed_form_bubble = _closed(sched, pp, mm, v)
        samples = mm * scale / m.microbatches
        pred.samples_vs_measured = samples
        pred.step_speedup = m.step_ns / step if step > 0 else None
        pred.speedup = (samples * m.step_ns / step) if step > 0 else None
        if self.opts.micro_batch:
            pred.ms_per_sample = step / MS / (mm * scale * self.opts.micro_batch)
        peaks = rank_peaks(sched, pp, mm, v, lay.act * scale)
        pred.peak_inflight = peaks[0]
        base_w = self._base_peaks[1]
        pred.activation_vs_measured = peaks[1] / base_w if base_w > 0 else None
        if lay.act_in_mb:
            pred.peak_activation_mb = peaks[1]
        ratio = pred.activation_vs_measured
        if ratio is not None and abs(ratio - 1.0) > 0.05:
            unit = "micro-batch chunks" if v > 1 or m.virtual > 1 else "micro-batches"
            mb = f", {peaks[1]:.0f} MB" if lay.act_in_mb else ""
            notes.append(
                f"peak activations {ratio:.2f}x the measured ({peaks[0]} {unit} in flight on the busiest "
                f"rank vs {self._base_peaks[0]}{mb})"
            )
        pred.stage_ns = [float(x) for x in fwd + bwd + wg]
        pred.split = lay.split
        if scn.rebalance:
            before = m.stage_total_ns()
            info = dict(lay.split) if lay.split else {"source": self.profile.source, "ideal": True}
            slow = int(np.argmax(before))
            info.update(
                {
                    "slowest_stage_before": slow,
                    "slowest_before_ms": round(float(before[slow]) / MS, 4),
                    "mean_before_ms": round(float(before.mean()) / MS, 4),
                    "stage_ms_before": [round(float(x) / MS, 4) for x in before],
                    "slowest_after_ms": round(float((lay.fwd + lay.bwd + lay.wgrad).max()) / MS, 4),
                    "stage_ms_after": [round(float(x) / MS, 4) for x in lay.fwd + lay.bwd + lay.wgrad],
                }
            )
            pred.split = info
        pred.calibration = cal.mode
        pred.notes = notes
        return pred

    def _shape(self, scn: Scenario, notes: list[str]) -> tuple[str, int, int, int]:
        """Schedule, chunks per rank, pipeline size and M of a scenario (ValueError if impossible)."""
        m = self.meas
        pp = scn.pp or m.pp
        mm = scn.microbatches or m.microbatches
        if scn.schedule:
            named = parse_schedule(scn.schedule)
            if named in SIMULATED_AS:
                notes.append(SIMULATED_NOTE[named])
            sched = canonical_schedule(SIMULATED_AS.get(named, named))
            if scn.virtual:
                v = scn.virtual
            elif sched in _INTERLEAVED:
                v = m.virtual if m.virtual > 1 else 2
            elif sched == "zero_bubble":
                v = 1
            else:
                v = default_virtual(sched, 1)
        else:
            sched = m.schedule
            v = scn.virtual or m.virtual
            if v > 1 and sched in _SINGLE:
                notes.append(f"{sched} with v={v} chunks per rank is interleaved 1F1B")
                sched = "interleaved_1f1b"
            elif v == 1 and sched in _INTERLEAVED:
                sched = "1f1b"
        return sched, default_virtual(sched, v), pp, mm


def _solve_delta(step_at: Any, target: float, sim0: float, lay: _Layout) -> tuple[float, bool]:
    """The per-block overhead that makes the simulated step equal ``target``.

    The step never decreases when blocks get longer and is piecewise linear in the overhead, so a
    bracketing secant (Illinois) search converges in a few simulations.
    """
    tol = max(1000.0, target * 1e-6)  # 1 µs, or a millionth of the step
    if abs(target - sim0) <= tol:
        return 0.0, True
    costs = np.concatenate([lay.fwd, lay.bwd + (lay.wgrad if splits_backward(lay.schedule) else 0.0)])
    pos = costs[costs > 0]
    if target > sim0:
        lo, f_lo = 0.0, sim0 - target
        hi = max(target - sim0, 1.0) / max(len(costs), 1)
        f_hi = step_at(hi) - target
        while f_hi < 0:
            lo, f_lo = hi, f_hi
            hi *= 4
            if hi > 1e15:
                return 0.0, False
            f_hi = step_at(hi) - target
    else:
        hi, f_hi = 0.0, sim0 - target
        lo = -float(pos.min()) if pos.size else 0.0
        f_lo = step_at(lo) - target
        if f_lo > 0:
            return 0.0, False
    side = 0
    x = hi
    for _ in range(60):
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (lo + hi)
        if not lo < x < hi:
            x = 0.5 * (lo + hi)
        fx = step_at(x) - target
        if abs(fx) <= tol or hi - lo <= 0.5:
            return x, True
        if fx < 0:
            lo, f_lo = x, fx
            if side == -1:
                f_hi *= 0.5
            side = -1
        else:
            hi, f_hi = x, fx
            if side == 1:
                f_lo *= 0.5
            side = 1
    return x, True


def _chunk_inflight(sched: str, pp: int, m: int, v: int) -> list[int]:
    """Peak micro-batches each chunk (virtual stage) holds activations for, from the block order."""
    orders = rank_orders(sched, pp, m, v)
    n_st = pp * v
    peak = [0] * n_st
    for order in orders:
        cnt = [0] * n_st
        for a in order:
            if a.op == F:
                cnt[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], cnt[a.stage])
            elif a.op in (B, I):
                cnt[a.stage] -= 1
    return peak


def _closed(sched: str, pp: int, m: int, v: int) -> float | None:
    try:
        return float(closed_form_bubble(sched, pp, m, v))
    except (ValueError, ZeroDivisionError):
        return None


def describe(scn: Scenario, m: MeasuredRun) -> str:
    """A short label for a scenario, naming only what it changes."""
    parts: list[str] = []
    if scn.microbatches and scn.microbatches != m.microbatches:
        parts.append(f"M={scn.microbatches}")
    if scn.schedule and parse_schedule(scn.schedule).value != m.schedule:
        name = parse_schedule(scn.schedule).value
        parts.append("interleaved" if name == "interleaved_1f1b" else name)
    if scn.virtual and scn.virtual != m.virtual:
        parts.append(f"v={scn.virtual}")
    if scn.pp and scn.pp != m.pp:
        parts.append(f"pp={scn.pp}")
    if scn.rebalance:
        parts.append("rebalanced")
    if scn.no_comm_wait:
        parts.append("no comm wait")
    if scn.no_host:
        parts.append("no host stalls")
    if scn.no_exposed_comm:
        parts.append("overlapped comm")
    if scn.fixed_microbatch_size and scn.microbatches and scn.microbatches != m.microbatches:
        parts.append("same micro-batch size")
    return ", ".join(parts) or "as measured (model)"


def build_model(
    diag: Any,
    options: WhatifOptions | None = None,
    layer_costs: LayerProfile | None = None,
    layers_per_stage: Sequence[int] | None = None,
) -> WhatifModel:
    """The what-if model of an analyzed run (:class:`ppdiag.diagnosis.Diagnosis`); see :func:`model_of`."""
    ctx = diag.context
    if "pipeline" not in ctx:
        raise InputError(None, "the analysis kept no pipeline model")
    return model_of(
        diag.run,
        diag.result,
        ctx["pipeline"],
        ctx.get("attribution"),
        ctx.get("rank_steps") or [],
        options,
        layer_costs,
        layers_per_stage,
    )


def model_of(
    run: Any,
    report: Report,
    pipe: Any,
    attr: Any,
    rank_steps: Sequence[Any],
    options: WhatifOptions | None = None,
    layer_costs: LayerProfile | None = None,
    layers_per_stage: Sequence[int] | None = None,
) -> WhatifModel:
    """The what-if model of an analyzed run. Per-block costs, in order of preference: ``layer_costs``
    (a file, scaled to the trace's totals), module ranges in the trace, ``layers_per_stage`` (stage
    totals spread evenly), or the stage totals alone (ideal splits only)."""
    meas = measure(report, pipe, attr, rank_steps)
    prof: LayerProfile | None = None
    if layer_costs is not None:
        prof = scale_profile_to(layer_costs, meas)
        if prof.bounds is not None and len(prof.bounds) != meas.stages + 1:
            prof.notes.append(
                f"the file's stage column has {len(prof.bounds) - 1} stages but the run has "
                f"{meas.stages}; it is not used"
            )
            prof.bounds = None
    if prof is None:
        prof = profile_from_trace(run.by_rank(), pipe.blocks, meas)
        if prof is not None and layers_per_stage is not None:
            prof.notes.append("--layers-per-stage ignored: the trace shows the layers")
    if prof is None:
        prof = profile_from_stages(meas, layers_per_stage)
    return WhatifModel(meas, prof, options)


# Keys of the fixes the findings offer, each one what-if scenario (see :func:`fix_scenarios`).
FIX_LABELS = {
    "microbatches_x2": "M x 2",
    "1f1b": "1F1B",
    "1f1b_microbatches_x2": "1F1B, M x 2",
    "interleaved_v2": "interleaved, v=2",
    "zero_bubble": "zero bubble (ZB-H1)",
    "rebalanced": "rebalanced stages",
    "no_comm_wait": "no comm wait",
    "no_host": "no host stalls",
    "no_exposed_comm": "overlapped comm",
}
# The causes whose removal is a scenario, with the fix key that removes each.
_REMOVALS = (("comm_wait", "no_comm_wait"), ("host", "no_host"), ("exposed_comm", "no_exposed_comm"))


def fix_scenarios(meas: MeasuredRun) -> dict[str, Scenario]:
    """Every fix a finding may offer, keyed as in :data:`FIX_LABELS`, for the measured run: more
    micro-batches at the same global batch, 1F1B for GPipe runs, interleaving (v = 2) and a
    zero-bubble schedule for GPipe/1F1B runs, rebalanced stages, and each measured delay removed."""
    m2 = 2 * meas.microbatches
    out: dict[str, Scenario] = {"microbatches_x2": Scenario(microbatches=m2, label=f"M={m2} (M x 2)")}
    if meas.schedule == "gpipe":
        out["1f1b"] = Scenario(schedule="1f1b", label=FIX_LABELS["1f1b"])
        # 1F1B's freed activation memory spent on more micro-batches
        out["1f1b_microbatches_x2"] = Scenario(
            schedule="1f1b", microbatches=m2, label=f"1F1B, M={m2} (M x 2)"
        )
    if meas.schedule in _SINGLE and meas.virtual == 1:
        out["interleaved_v2"] = Scenario(
            schedule="interleaved_1f1b", virtual=2, label=FIX_LABELS["interleaved_v2"]
        )
        out["zero_bubble"] = Scenario(schedule="zero_bubble", label=FIX_LABELS["zero_bubble"])
    out["rebalanced"] = Scenario(rebalance=True, label=FIX_LABELS["rebalanced"])
    for _, key in _REMOVALS:
        out[key] = Scenario(
            no_comm_wait=key == "no_comm_wait",
            no_host=key == "no_host",
            no_exposed_comm=key == "no_exposed_comm",
            label=FIX_LABELS[key],
        )
    return out


def default_scenarios(meas: MeasuredRun, min_gain: float = 0.03) -> list[Scenario]:
    """The table every report shows: M x 2, interleaving (v = 2) or 1F1B for GPipe runs, rebalanced
    stages, and each removable delay worth at least ``min_gain`` of the step."""
    return [fix_scenarios(meas)[k] for k in default_keys(meas, min_gain)]


def default_keys(meas: MeasuredRun, min_gain: float = 0.03) -> list[str]:
    """The fix keys of :func:`default_scenarios`, in table order."""
    keys = ["microbatches_x2"]
    if meas.schedule == "gpipe":
        keys.append("1f1b")
    if meas.schedule in _SINGLE and meas.virtual == 1:
        keys.append("interleaved_v2")
    keys.append("rebalanced")
    for cause, key in _REMOVALS:
        if meas.removable_ns.get(cause, 0.0) >= min_gain * meas.step_ns:
            keys.append(key)
    return keys


@dataclass
class FixPredictions:
    """The what-if answer for every fix of an analyzed run, computed once (one code path for the
    what-if table and the findings' gains). ``rows`` maps a fix key to its prediction's JSON row
    (with ``fix`` set to the key); ``table`` lists the keys the report's table shows by default."""

    measured_step_ms: float
    rows: dict[str, WhatifRow] = field(default_factory=dict)
    table: list[str] = field(default_factory=list)
    calibration: str = ""

    def gain_ms(self, key: str) -> float | None:
        """Step time the fix saves per step (ms; negative: the fix is slower), None when the
        what-if could not predict it."""
        row = self.rows.get(key)
        if row is None or row.step_ms is None:
            return None
        return self.measured_step_ms - row.step_ms

    def report_rows(self, used: Sequence[str] = ()) -> list[WhatifRow]:
        """The report's ``whatif`` list: the default table plus the fixes the findings used."""
        keys = list(self.table) + [k for k in used if k not in self.table]
        return [self.rows[k] for k in keys if k in self.rows]


def predict_fixes(
    run: Any,
    report: Report,
    pipe: Any,
    attr: Any,
    rank_steps: Sequence[Any],
    warnings: list[str] | None = None,
) -> FixPredictions | None:
    """Predict every fix of :func:`fix_scenarios` for an analyzed run; None without a usable
    pipeline. A run the model cannot describe (it raises :class:`InputError` or ValueError: M
    unknown, no blocks, an impossible layout) gets no predictions and a warning appended to
    ``warnings``; any other exception is a bug and propagates."""
    if pipe is None or pipe.topology.pp <= 1:
        return None
    try:
        model = model_of(run, report, pipe, attr, rank_steps)
        preds = {k: model.predict(scn) for k, scn in fix_scenarios(model.meas).items()}
        keys = default_keys(model.meas)
    except (InputError, ValueError) as exc:
        if warnings is not None:
            warnings.append(f"what-if: no predictions for this run ({exc})")
        return None
    out = FixPredictions(model.meas.step_ns / MS, calibration=model.calibration().describe())
    for k, p in preds.items():
        if p.error is None and p.step_ns is not None:
            out.rows[k] = msgspec.convert({**p.to_json(), "fix": k}, WhatifRow)
    out.table = [k for k in keys if k in out.rows]
    return out


def report_rows(run: Any, report: Report, pipe: Any, attr: Any, rank_steps: Sequence[Any]) -> list[WhatifRow]:
    """The report's default ``whatif`` list for an analyzed run (empty without a usable pipeline)."""
    fp = predict_fixes(run, report, pipe, attr, rank_steps)
    return fp.report_rows() if fp is not None else []


__all__ = [
    "CALIBRATIONS",
    "FIX_LABELS",
    "Calibration",
    "FixPredictions",
    "Prediction",
    "Scenario",
    "WhatifModel",
    "WhatifOptions",
    "build_model",
    "default_keys",
    "default_scenarios",
    "describe",
    "fix_scenarios",
    "model_of",
    "predict_fixes",
    "rank_peaks",
    "report_rows",
]
