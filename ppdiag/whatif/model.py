"""The what-if model: the measured run's per-block costs, calibrated, simulated under a scenario
(:class:`WhatifModel`, :func:`model_of`); see :mod:`ppdiag.whatif.scenarios` for the method."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from ppdiag.errors import InputError
from ppdiag.limits import MAX_SIM_CELLS
from ppdiag.model.schedule import SIMULATED_AS, SIMULATED_NOTE, parse_schedule
from ppdiag.report_types import Cause, LayerSplit, Report
from ppdiag.simulate import SimConfig, closed_form_bubble, rank_orders, splits_backward
from ppdiag.simulate.schedules import canonical_schedule, default_virtual
from ppdiag.whatif.calibration import Calibration, SimCache, _solve_delta
from ppdiag.whatif.costs import MS, MeasuredRun, measure
from ppdiag.whatif.layers import LayerProfile, profile_from_stages, profile_from_trace, scale_profile_to
from ppdiag.whatif.memory import _chunk_inflight, rank_peaks
from ppdiag.whatif.rebalance import continuous_balance, even_split, min_max_split
from ppdiag.whatif.replicas import cap_rebalanced
from ppdiag.whatif.types import (
    _INTERLEAVED,
    _SINGLE,
    _SOURCES,
    CALIBRATIONS,
    F64,
    Prediction,
    Scenario,
    WhatifOptions,
    _Layout,
    describe,
)


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
    out: F64 = vals[idx]
    return out


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
        self._sim = SimCache()
        self._base_layout = self._measured_layout()
        self._base_peaks = rank_peaks(
            meas.schedule, meas.pp, meas.microbatches, meas.virtual, self._base_layout.act
        )

    # ---- layouts ---------------------------------------------------------------------------

    def _measured_layout(self) -> _Layout:
        m = self.meas
        n_st = m.stages
        act, in_mb = self._act_of_bounds(self.profile.bounds, n_st)
        if m.act_mb is not None and len(m.act_mb) == n_st:
            act, in_mb = m.act_mb.copy(), True  # measured per stage: nothing to re-cut
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
        """Activation weight per chunk: MB when the profile knows it or the trace measured it, else
        the chunk's model share in units of one measured stage.

        With allocator events the measured activation memory per micro-batch calibrates the
        shares: a chunk holds its share of what the measured stages hold together (the profile's
        activation_mb per block when it has them, else its layer count)."""
        prof = self.profile
        measured = self.meas.act_mb
        if bounds is not None and len(bounds) == n_st + 1:
            sums = prof.chunk_sums(bounds)
            if prof.has_activations:
                act = sums["act"]
                total = float(np.nansum(prof.act_mb))
                if measured is not None and total > 0:
                    act = act * (float(measured.sum()) / total)
                return act, True
            units = sums["layers"] / max(prof.n, 1) * self.meas.stages
        else:
            units = np.full(n_st, self.meas.stages / n_st)
        if measured is not None:
            return units * float(measured.mean()), True
        return units, False

    def _memory_basis(self, measured_row: bool) -> str:
        """``MemoryBasis`` of a row: allocator events make the measured row measured and the
        predictions calibrated; without them every memory figure is predicted."""
        if self.meas.act_mb is None:
            return "predicted"
        return "measured" if measured_row else "calibrated"

    def _layout(self, sched: str, pp: int, v: int, mm: int, scale: float, rebalance: bool) -> _Layout:
        """Per-chunk costs of a shape: the measured stages when the shape is the measured one, else the
        profile re-cut (evenly by layer count, or rebalanced)."""
        m = self.meas
        n_st = pp * v
        prof = self.profile
        notes: list[str] = []
        split_info: LayerSplit | None = None
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

    def _split_json(self, bounds: Sequence[int]) -> LayerSplit:
        prof = self.profile
        ranges = [(int(a), int(b) - 1) for a, b in itertools.pairwise(bounds)]
        current = prof.bounds
        return LayerSplit(
            layers_per_stage=[b - a + 1 for a, b in ranges],
            ranges=ranges,
            names=[(prof.names[a], prof.names[b]) for a, b in ranges],
            source=prof.source,
            current_layers_per_stage=UNSET
            if current is None
            else [int(b - a) for a, b in itertools.pairwise(current)],
        )

    def _rebalanced_bounds(
        self, sched: str, pp: int, v: int, mm: int, scale: float, notes: list[str]
    ) -> tuple[list[float], LayerSplit | None]:
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
            return self._sim(cfg).step_ns

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
        p.memory_basis = self._memory_basis(measured_row=True)
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
        notes: list[str] = []
        pred = Prediction(
            scn.label or describe(scn, m),
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
            if pp * mm * v > MAX_SIM_CELLS:
                # the simulator's work grows with P x M x v: a fix of a large run may pass the bound
                raise ValueError(f"P x M x v = {pp * mm * v} is above the simulated maximum {MAX_SIM_CELLS}")
            scale = 1.0 if scn.fixed_microbatch_size else m.microbatches / mm
            rank_orders(sched, pp, mm, v)  # raises for impossible combinations
            lay = self._layout(sched, pp, v, mm, scale, scn.rebalance)
        except ValueError as exc:
            pred.error = str(exc)
            pred.notes = notes
            return pred
        chain = self._chain(scn)
        notes.extend(lay.notes)
        if scale != 1.0:
            notes.append(f"fixed global batch: micro-batch {scale:.3g}x the size, costs scaled alike")
        elif mm != m.microbatches:
            notes.append(f"same micro-batch size: {mm / m.microbatches:.3g}x the samples per step")
        self._timing(pred, lay, scale, chain)
        if scn.rebalance and (pp, v, mm) == (m.pp, m.virtual, m.microbatches):
            cap_rebalanced(pred, m.step_ns, m.rebalance_gain_ns, ideal=not self.profile.discrete)
        self._memory(pred, lay, scale, notes)
        pred.stage_ns = [float(x) for x in lay.fwd * scale + lay.bwd * scale + lay.wgrad * scale]
        pred.split = self._rebalance_info(lay) if scn.rebalance else lay.split
        pred.calibration = chain[-1][1].mode
        pred.memory_basis = self._memory_basis(measured_row=False)
        pred.notes = notes
        return pred

    def _chain(self, scn: Scenario) -> list[tuple[str, Calibration]]:
        """Calibrations with fewer and fewer causes removed: the first leaves only what no cause
        explains, each next one adds one cause back; the step growth at each level is that cause.
        Overlapped communication only lowers the target (its exposure is modelled by the links)."""
        removed = {
            c
            for c, on in (
                ("comm_wait", scn.no_comm_wait),
                ("host", scn.no_host),
                ("exposed_comm", scn.no_exposed_comm),
            )
            if on
        }
        gone = {"comm_wait", "host"} | (removed & {"exposed_comm"})
        chain = [("unexplained", self.calibration(tuple(gone)))]
        for c in ("comm_wait", "host"):
            if c not in removed:
                gone.discard(c)
                chain.append((c, self.calibration(tuple(gone))))
        return chain

    def _timing(
        self, pred: Prediction, lay: _Layout, scale: float, chain: list[tuple[str, Calibration]]
    ) -> None:
        """The predicted step and its lost time per cause: the schedule's bubble and imbalance from
        simulations with balanced and measured costs, exposed communication from the links, each
        calibration level's growth for the causes the calibrations carry."""
        m = self.meas
        sched, pp, v, mm = lay.schedule, lay.pp, lay.virtual, pred.microbatches
        fwd, bwd, wg = lay.fwd * scale, lay.bwd * scale, lay.wgrad * scale
        tail_b = _resample(m.tail_busy_ns, pp)
        n_st = pp * v

        def mean_costs(x: F64) -> F64:
            return np.full(n_st, float(x.mean()))

        s_bal = self._sim(_sim_cfg(sched, pp, mm, v, mean_costs(fwd), mean_costs(bwd), mean_costs(wg), 0.0))
        s_cost = self._sim(_sim_cfg(sched, pp, mm, v, fwd, bwd, wg, 0.0))
        s_comm = self._sim(
            _sim_cfg(sched, pp, mm, v, fwd, bwd, wg, 0.0, m.p2p_ns, m.head_ns, m.end_ns, tail_b)
        )
        busy = s_comm.per_rank_busy_ns  # blocks + tail compute: the overhead is not compute
        floor = float(busy.max())

        def step_with(c: Calibration) -> float:
            if c.mode == "per-block":
                cfg = _sim_cfg(
                    sched, pp, mm, v, fwd, bwd, wg, c.delta_ns, m.p2p_ns, m.head_ns, m.end_ns, tail_b
                )
                st = self._sim(cfg).step_ns
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
        lost: dict[str, float] = {k: 0.0 for k in Cause}
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

    def _memory(self, pred: Prediction, lay: _Layout, scale: float, notes: list[str]) -> None:
        """Peak activations of the scenario's schedule against the measured one's."""
        m = self.meas
        v = lay.virtual
        peaks = rank_peaks(lay.schedule, lay.pp, pred.microbatches, v, lay.act * scale)
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

    def _rebalance_info(self, lay: _Layout) -> LayerSplit:
        """The rebalanced split with the slowest stage before and after."""
        before = self.meas.stage_total_ns()
        info = lay.split or LayerSplit(source=self.profile.source, ideal=True)
        slow = int(np.argmax(before))
        after = lay.fwd + lay.bwd + lay.wgrad
        return msgspec.structs.replace(
            info,
            slowest_stage_before=slow,
            slowest_before_ms=round(float(before[slow]) / MS, 4),
            mean_before_ms=round(float(before.mean()) / MS, 4),
            stage_ms_before=[round(float(x) / MS, 4) for x in before],
            slowest_after_ms=round(float(after.max()) / MS, 4),
            stage_ms_after=[round(float(x) / MS, 4) for x in after],
        )

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


def _closed(sched: str, pp: int, m: int, v: int) -> float | None:
    try:
        return float(closed_form_bubble(sched, pp, m, v))
    except (ValueError, ZeroDivisionError):
        return None


def build_model(
    diag: Any,
    options: WhatifOptions | None = None,
    layer_costs: LayerProfile | None = None,
    layers_per_stage: Sequence[int] | None = None,
) -> WhatifModel:
    """The what-if model of an analyzed run (:class:`ppdiag.diagnosis.Diagnosis`); see :func:`model_of`."""
    ctx = diag.context  # an AnalysisContext (reports layer, above this one: not named here)
    if ctx is None or ctx.pipeline is None:
        raise InputError(None, "the analysis kept no pipeline model")
    return model_of(
        diag.run,
        diag.result,
        ctx.pipeline,
        ctx.attribution,
        ctx.rank_steps,
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
