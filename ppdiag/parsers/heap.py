"""Giving the C heap's free pages back to the system after a big parse.

A table parser's columns (pandas' CSV reader chunks, the converted columns, the per-rank cuts)
are NumPy arrays, many of them on the C heap, and all but the timelines are freed when the parse
ends. glibc keeps those pages: the later stages allocate mostly Python objects (from their own
arenas) and small arrays, which do not reuse most of them, so the parse's garbage stays in the
process's resident memory through the analysis's peak (1,024 ranks x 10 steps: about 0.3 GB kept
after the parse of a 0.15 GB table). ``malloc_trim`` hands every free page back.
"""

from __future__ import annotations

import sys

_trim: object = None  # the libc function, once looked up; False where there is none


def trim_heap() -> None:
    """Return the heap's free pages to the system (glibc only; elsewhere nothing)."""
    global _trim
    if _trim is None:
        _trim = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _trim = ctypes.CDLL(None).malloc_trim
            except (OSError, AttributeError):  # a libc without it (musl)
                pass
    if _trim is not False:
        _trim(0)  # type: ignore[operator]
