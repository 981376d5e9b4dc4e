"""Calibration of the what-if model: how the simulator's step is made to reproduce the measured one
(a per-block overhead found by a bracketing search, a per-step offset, or a ratio)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppdiag.simulate import SimConfig, SimResult, simulate, splits_backward
from ppdiag.whatif.costs import (
    MS,
)
from ppdiag.whatif.types import _Layout


def _dur(ns: float) -> str:
    """A duration for the text: ms, or seconds from 10 s (a 46.67 s step, not 46666.27 ms)."""
    ms = ns / MS
    return f"{ms / 1e3:.2f} s" if abs(ms) >= 10_000 else f"{ms:.2f} ms"


class SimCache:
    """The simulated steps of one what-if model, by config. Its predictions simulate the same
    configs again and again (the balanced, measured-cost and with-links steps of every scenario of
    the measured shape, each calibration's step): each is simulated once. Callers only read the
    results."""

    def __init__(self) -> None:
        self._res: dict[str, SimResult] = {}

    def __call__(self, cfg: SimConfig) -> SimResult:
        # repr tells every float apart (round-trip exact, -0.0 from 0.0): a hit is the same config
        vals = [getattr(cfg, k) for k in cfg.__dataclass_fields__]
        key = repr([v.tolist() if isinstance(v, np.ndarray) else v for v in vals])
        res = self._res.get(key)
        if res is None:
            res = self._res[key] = simulate(cfg)
        return res


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
        base = f"simulator alone {_dur(self.sim_ns)} vs {_dur(self.target_ns)} measured"
        if self.removed_ns:
            base += " minus " + ", ".join(
                f"{k.replace('_', ' ')} {_dur(v)}" for k, v in sorted(self.removed_ns.items())
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
