"""Matched host-op transfers (:class:`~ppdiag.pipeline.clocks.Pairs`) built from µs times, for the
hand-built clock tests (a test-support module, imported by bare name)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ppdiag.pipeline.clocks import Pairs

US = 1000


def pairs_us(
    src: Sequence[int],
    dst: Sequence[int],
    send_start: Sequence[np.ndarray],
    recv_start: Sequence[np.ndarray],
    recv_end: Sequence[np.ndarray],
    call_us: int = 50,
) -> Pairs:
    """Host-op transfers from per-link arrays of µs times (one array per link, in order), each
    send call lasting ``call_us``; ``src`` and ``dst`` give each transfer's ranks."""
    send = (np.concatenate(send_start) * US).astype(np.int64)
    return Pairs(
        np.array(src, np.int32),
        np.array(dst, np.int32),
        send,
        send + call_us * US,
        (np.concatenate(recv_start) * US).astype(np.int64),
        (np.concatenate(recv_end) * US).astype(np.int64),
        False,
    )
