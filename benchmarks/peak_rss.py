"""A process's own peak memory, for the benchmarks that measure a child process.

``getrusage(...).ru_maxrss`` is the wrong figure in a child started with ``exec`` (a subprocess, a
``spawn`` pool, a Dask worker): Linux carries the peak over from the process that forked it, so a
child of a parent holding 0.8 GB reports at least 0.8 GB whatever it does itself. ``VmHWM`` in
``/proc/self/status`` is the high-water mark of the current process image alone. A ``fork`` child
that does not ``exec`` shares its parent's pages, and both measures count them as its own.
"""

from __future__ import annotations

import resource


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB: ``VmHWM``, or ``ru_maxrss`` where there is no /proc."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def peak_rss_mb() -> float:
    """This process's peak RSS in MiB (KiB / 1024, as the benchmarks have always printed it)."""
    return peak_rss_kib() / 1024
