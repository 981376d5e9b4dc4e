"""Blocks for hand-built timelines: rows of (start µs, end µs, phase, micro-batch, stage)."""

from __future__ import annotations

import numpy as np

from ppdiag.pipeline.blocks import Blocks

US = 1000


def blocks_us(rows: list[tuple[int, int, int, int, int]]) -> Blocks:
    """(start µs, end µs, phase, micro-batch, stage) per block; busy = the whole span."""
    a = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return Blocks(
        np.zeros(len(a), np.int32),
        a[:, 0] * US,
        a[:, 1] * US,
        (a[:, 1] - a[:, 0]) * US,
        np.full(len(a), -1, np.int64),
        a[:, 2].astype(np.int8),
        a[:, 3].astype(np.int32),
        a[:, 4].astype(np.int32),
        True,
    )
