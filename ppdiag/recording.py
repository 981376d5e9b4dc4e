"""Record a training run the way ppdiag reads it best: :func:`profiler` returns a configured
``torch.profiler.profile`` that writes one ``rank{r}.pt.trace.json.gz`` per rank.

Use it in the training script of every rank, after ``torch.distributed.init_process_group`` (the
profiler then writes the process groups into the trace's ``distributedInfo``, which is how ppdiag
knows the rank, the world size and which group is the pipeline)::

    from ppdiag.recording import profiler

    with profiler("prof/run", steps=3) as prof:
        for batch in loader:
            schedule.step(batch)  # one optimizer step: every micro-batch
            prof.step()

torch is imported when :func:`profiler` is called, never by ``import ppdiag``: only the training
environment needs it. ``ppdiag demo`` records its runs with this helper. The README's "Record your
run" section says which options matter and which only cost time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.profiler

#: Steps the profiler skips before it starts, then runs without recording (CUPTI warm-up).
DEFAULT_WAIT = 1
DEFAULT_WARMUP = 1


def trace_file(out_dir: str | Path, rank: int) -> Path:
    """Where :func:`profiler` writes the trace of ``rank``."""
    return Path(out_dir) / f"rank{rank}.pt.trace.json.gz"


def current_rank() -> int:
    """This process's global rank: ``torch.distributed`` when it is initialised, else ``$RANK``
    (set by torchrun, Slurm launchers and DeepSpeed), else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


def profiler(
    out_dir: str | Path,
    *,
    steps: int = 3,
    wait: int = DEFAULT_WAIT,
    warmup: int = DEFAULT_WARMUP,
    rank: int | None = None,
    cuda: bool | None = None,
    record_shapes: bool = False,
    profile_memory: bool = False,
    **kwargs: Any,
) -> torch.profiler.profile:
    """A ``torch.profiler.profile`` that records ``steps`` training steps after skipping ``wait``
    and warming up ``warmup``, and writes them to ``out_dir/rank{r}.pt.trace.json.gz``.

    ``cuda``: record the GPU (kernels, copies, NCCL) as well as the CPU; by default when CUDA is
    available. ``record_shapes`` records op inputs (p2p peers and sizes on the host ops; ppdiag
    finds the peers without them, from NCCL metadata or labels and timing). ``profile_memory``
    records the allocator's events (the memory section, PP012). Other keyword arguments go to
    ``torch.profiler.profile`` unchanged. Call ``prof.step()`` once per optimizer step (all the
    micro-batches), so that ``ProfilerStep#N`` ranges mark the steps.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    if steps < 1 or wait < 0 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and wait, warmup >= 0 (got {steps}, {wait}, {warmup})")
    r = current_rank() if rank is None else rank
    path = trace_file(out_dir, r)
    use_cuda = torch.cuda.is_available() if cuda is None else cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])

    def write(prof: torch.profiler.profile) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name ending in .gz is gzip-compressed by torch (traces shrink about 10x)
        prof.export_chrome_trace(str(path))

    return profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=write,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        **kwargs,
    )


__all__ = ["current_rank", "profiler", "trace_file"]
