"""Runs of a few tiny ops between transfers are not blocks, and real blocks stay blocks when a busy
host stretched some others many times over (late wake-ups lift the upper part of the distribution)."""

from __future__ import annotations

import numpy as np

from ppdiag.model import Phase
from ppdiag.pipeline.blocks import Blocks, _drop_small


def _blocks(busy_ms: list[float]) -> Blocks:
    n = len(busy_ms)
    busy = (np.asarray(busy_ms) * 1e6).astype(np.int64)
    start = np.cumsum(np.r_[0, busy[:-1] + 1_000_000]).astype(np.int64)
    return Blocks(
        np.zeros(n, np.int32),
        start,
        start + busy,
        busy,
        np.full(n, -1, np.int64),
        np.full(n, int(Phase.FWD), np.int8),
        np.full(n, -1, np.int32),
        np.zeros(n, np.int32),
    )


def test_stretched_blocks_do_not_make_real_blocks_tiny() -> None:
    # the forward blocks of one rank of a GPipe demo recorded under load (ms of compute): two real
    # blocks of 2.6 and 3.3 ms beside ones held 30 ms, and two runs of tiny ops
    real = [2.6, 3.3, 3.9, 5.0, 5.9, 7.6, 8.9, 9.4, 10.1, 10.8, 13.2, 14.3, 19.5, 20.4, 30.4, 35.5]
    kept = _drop_small(_blocks([0.03, 0.03, *real]))
    assert sorted((kept.busy / 1e6).round(1).tolist()) == real


def test_tiny_runs_are_dropped_even_when_they_outnumber_the_blocks() -> None:
    tiny = [0.01] * 30 + [0.1] * 3
    real = [2.7, 2.7, 4.7, 5.0, 5.4, 5.5, 6.4, 8.2, 14.0, 36.2]
    kept = _drop_small(_blocks(tiny + real))
    assert sorted((kept.busy / 1e6).round(1).tolist()) == real
