"""One rank's device memory row of the report (``memory[]``), apart from the code that measures it
(:mod:`ppdiag.model.memory`, numpy) so that the report's types load without numpy: a re-run served
from the result cache (:mod:`ppdiag.result_cache`) renders the report without the analysis."""

from __future__ import annotations

import msgspec


class MemoryRow(msgspec.Struct, frozen=True):
    """One rank's device memory (``memory[]``): the peak allocated and reserved (MiB), when the
    peak happened (``peak_t_ms`` on the run's clock as the hang section; ``peak_ts_us`` as the
    trace writes it), the device capacity, the micro-batches in flight at the peak and the
    activation memory per micro-batch."""

    rank: int
    device: int
    # "totals" (Total Allocated) | "bytes" (running sum, relative to the window) | "cuda" (nsys
    # CUDA-level allocations, running sum since the capture began)
    source: str
    events: int
    peak_allocated_mb: float
    peak_reserved_mb: float | None
    peak_ts_us: float
    peak_t_ms: float
    capacity_mb: float | None
    peak_of_capacity: float | None
    steady_allocated_mb: float  # the median level over the window
    inflight_at_peak: int | None
    inflight_microbatches: list[int]
    activation_per_mb_mb: float | None
    # the peak with the micro-batches another schedule holds on this stage (weights and the rest
    # of the level stay): gpipe holds M, 1f1b min(P - s, M)
    predicted_peak_mb: dict[str, float]
    note: str
