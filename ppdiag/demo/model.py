"""The demo model: a stack of identical blocks split contiguously into pipeline stages.

Two compute modes:

``sleep``
    Each block is ``hold(x) * hold(w)`` built from one custom operator, ``ppdiag_demo::hold``, whose
    forward holds the host for a fixed time and whose backward (``ppdiag_demo::hold_backward``)
    holds for the backward time. Holding is a sleep, so four ranks on two cores keep their costs
    while the real pipelining library, gloo and autograd run around them: a rank's total hold time
    is what the config asks (late wake-ups are given back by the next holds), single holds are off
    by the host's wake-up latency (~0.1 ms idle, more on a busy machine). The backward is split
    across two autograd paths on purpose: the input path (``hold(x)``) carries the input-gradient
    cost and the weight path (``hold(w)``) the weight-gradient cost. Zero-bubble schedules compute
    input gradients (I) and weight gradients (W) as separate autograd passes, so I and W blocks get
    exactly their share; other schedules pay both in one backward.
``real``
    Each block is ``LayerNorm(GELU(Linear(x)))``; a slow stage repeats the Linear+GELU ``factor``
    times per block.

This module imports torch; only rank processes import it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from ppdiag.demo.config import DemoConfig

_HELD_NS = [0]  # total host time held by the hold ops in this process (probes read differences)
#: Per kind of hold (lane, ms): held beyond what was asked and not yet given back.
_OVERRUN_NS: dict[tuple[int, float], int] = {}
#: Lanes: which cost a hold stands for, so late wake-ups are given back within the same cost.
LANE_FWD, LANE_INPUT_GRAD, LANE_WEIGHT_GRAD = 0, 1, 2


def held_ns() -> int:
    """Nanoseconds spent inside hold ops in this process so far."""
    return _HELD_NS[0]


def start_step() -> None:
    """Forget overruns of earlier steps: a step's holds give back only that step's late wake-ups."""
    _OVERRUN_NS.clear()


def _hold_for(ms: float, lane: int) -> None:
    if ms <= 0:
        return
    want = int(ms * 1e6)
    # A sleep ends late: by ~50-100 µs of timer slack on an idle host, by whole scheduler slices on
    # a busy one. The next holds of the same lane and cost give that overrun back (up to half of
    # each), so per step each cost (a stage's F, I or W) adds up to what the config asks and no
    # block shrinks below half its cost. Spinning instead would be worse: the ranks share few
    # cores, and a spinning process loses the quick wake-up the scheduler grants to sleepers.
    key = (lane, ms)
    give_back = min(_OVERRUN_NS.get(key, 0), want // 2)
    t0 = time.perf_counter_ns()
    deadline = t0 + want - give_back
    while (left := deadline - time.perf_counter_ns()) > 0:
        time.sleep(left / 1e9)
    got = time.perf_counter_ns() - t0
    _HELD_NS[0] += got
    _OVERRUN_NS[key] = _OVERRUN_NS.get(key, 0) + got - want


@torch.library.custom_op("ppdiag_demo::hold_backward", mutates_args=())
def hold_backward(grad: torch.Tensor, ms: float, lane: int) -> torch.Tensor:
    """Backward of :func:`hold`: holds ``ms`` and passes the gradient through."""
    _hold_for(ms, lane)
    return grad.clone()


@hold_backward.register_fake
def _(grad: torch.Tensor, ms: float, lane: int) -> torch.Tensor:
    return torch.empty_like(grad)


@torch.library.custom_op("ppdiag_demo::hold", mutates_args=())
def hold(x: torch.Tensor, fwd_ms: float, bwd_ms: float, bwd_lane: int) -> torch.Tensor:
    """Identity that holds ``fwd_ms`` in forward and ``bwd_ms`` in backward.

    ``bwd_lane`` says which backward cost the backward hold stands for (input or weight gradient).
    """
    _hold_for(fwd_ms, LANE_FWD)
    return x.clone()


@hold.register_fake
def _(x: torch.Tensor, fwd_ms: float, bwd_ms: float, bwd_lane: int) -> torch.Tensor:
    return torch.empty_like(x)


def _hold_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.bwd_ms = inputs[2]
    ctx.bwd_lane = inputs[3]


def _hold_bwd(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
    return hold_backward(grad, ctx.bwd_ms, ctx.bwd_lane), None, None, None


hold.register_autograd(_hold_bwd, setup_context=_hold_setup)


class HoldBlock(nn.Module):
    """Sleep-mode block: ``hold(x) * hold(w)`` with fixed forward, input-grad and weight-grad costs."""

    def __init__(self, hidden: int, fwd_ms: float, bwd_input_ms: float, wgrad_ms: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.fwd_ms = fwd_ms
        self.bwd_input_ms = bwd_input_ms
        self.wgrad_ms = wgrad_ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = hold(x, self.fwd_ms, self.bwd_input_ms, LANE_INPUT_GRAD) * hold(
            self.weight, 0.0, self.wgrad_ms, LANE_WEIGHT_GRAD
        )
        return out


class RealBlock(nn.Module):
    """Real-compute block: ``LayerNorm(GELU(Linear(x)))``, the matmul repeated ``repeats`` times."""

    def __init__(self, hidden: int, repeats: int = 1) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.repeats = repeats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeats):
            x = functional.gelu(self.linear(x))
        out: torch.Tensor = self.norm(x)
        return out


class InputBias(nn.Module):
    """Adds a learned bias to the model input.

    In sleep mode it makes the first block's input require grad, so stage 0 pays the same
    input-gradient cost as every other stage (a balanced config stays balanced).
    """

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def build_stage_module(cfg: DemoConfig, stage: int) -> nn.Sequential:
    """The blocks of one pipeline stage, initialised as if cut from one seeded full model."""
    layers = cfg.layers()
    first_block = sum(layers[:stage])
    mods: list[nn.Module] = []
    if cfg.compute == "sleep":
        if stage == 0:
            mods.append(InputBias(cfg.hidden))
        factor = cfg.stage_factor(stage)
        per_fwd = cfg.fwd_ms / cfg.layers_per_stage * factor
        per_bwd = cfg.bwd_ms / cfg.layers_per_stage * factor
        for i in range(layers[stage]):
            k = cfg.layer_factor(stage, i)
            mods.append(
                HoldBlock(
                    cfg.hidden,
                    per_fwd * k,
                    per_bwd * k * (1.0 - cfg.wgrad_fraction),
                    per_bwd * k * cfg.wgrad_fraction,
                )
            )
    else:
        reps = cfg.real_repeats(stage)
        for i in range(layers[stage]):
            # Seed per block so a block's weights do not depend on how the model is split.
            torch.manual_seed(cfg.seed * 100_003 + first_block + i)
            mods.append(RealBlock(cfg.hidden, max(1, round(reps * cfg.layer_factor(stage, i)))))
    return nn.Sequential(*mods)


def make_batch(cfg: DemoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The (input, target) batch every step trains on."""
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.rows, cfg.hidden, generator=g)
    y = torch.randn(cfg.rows, cfg.hidden, generator=g)
    return x, y


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error, the last stage's loss."""
    return functional.mse_loss(output, target)
