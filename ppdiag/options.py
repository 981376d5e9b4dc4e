"""The options of one analysis (:class:`Options`), apart from the analysis (:mod:`ppdiag.api`
re-exports them) so that the commands build them, and the result cache (:mod:`ppdiag.result_cache`)
keys them, without loading numpy or any analysis layer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    """Analysis options; every field is optional (inferred from the traces when absent)."""

    pp: int | None = None
    stage_map: str | None = None
    microbatches: int | None = None
    schedule: str | None = None
    steps: str | None = None
    global_batch: int | None = None
    micro_batch: int | None = None
    tp: int | None = None
    jobs: int | None = None
    progress: bool = False
    nsys_cache_dir: str | None = None
    hosts: str | None = None  # --hosts: ranks per node, or HOST=RANKS,... (see pipeline/links.py)
    scheduler: str | None = None  # Dask scheduler address for the parse (else $PPDIAG_DASK_SCHEDULER)
