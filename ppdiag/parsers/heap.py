"""The C heap around a big parse: its free pages given back to the system afterwards, and the
buffer a trace's text is decompressed into.

A table parser's columns (pandas' CSV reader chunks, the converted columns, the per-rank cuts)
are NumPy arrays, many of them on the C heap, and all but the timelines are freed when the parse
ends. glibc keeps those pages: the later stages allocate mostly Python objects (from their own
arenas) and small arrays, which do not reuse most of them, so the parse's garbage stays in the
process's resident memory through the analysis's peak (1,024 ranks x 10 steps: about 0.3 GB kept
after the parse of a 0.15 GB table). ``malloc_trim`` hands every free page back.

A gzip trace's text is written into one buffer of its decompressed size (:func:`text_buffer`):
``bytearray(n)`` zero-fills it first, which faults in every 4 KiB page of it (~14,000 faults
for a 56 MB rank, ~25 ms, as much CPU as ISA-L's inflating of it). Left unfilled and advised as
transparent huge pages, the decompressor's writes fault it in 2 MiB at a time.
"""

from __future__ import annotations

import sys
from typing import Any

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


_HUGE = 1 << 21  # a transparent huge page (x86-64, arm64 with 4 KiB pages)
_MADV_HUGEPAGE = 14  # Linux
_raw: Any = None  # (PyByteArray_Resize, madvise, addressof a buffer), once looked up; False: none


def _raw_api() -> Any:
    global _raw
    if _raw is None:
        _raw = False
        if sys.platform.startswith("linux") and sys.implementation.name == "cpython":
            try:
                import ctypes

                resize = ctypes.pythonapi.PyByteArray_Resize
                resize.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
                resize.restype = ctypes.c_int
                madvise = ctypes.CDLL(None, use_errno=True).madvise
                madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                madvise.restype = ctypes.c_int

                def address(buf: bytearray) -> int:
                    return ctypes.addressof(ctypes.c_char.from_buffer(buf))

                _raw = (resize, madvise, address)
            except (OSError, AttributeError):
                pass
    return _raw


def text_buffer(n: int) -> bytearray:
    """A bytearray of ``n`` bytes for a decompressed text, whose content is undefined: the caller
    writes every byte it keeps (and trims the rest). Large buffers are allocated without the
    zero fill and advised as huge pages where the platform allows (Linux, CPython); anywhere
    else, or when that fails, ``bytearray(n)``."""
    api = _raw_api() if n >= 4 * _HUGE else None
    if not api:
        return bytearray(n)
    resize, madvise, address = api
    buf = bytearray()
    try:
        resize(buf, n)  # a fresh allocation this large is an untouched mapping: no page faulted yet
    except MemoryError:
        return bytearray(n)  # raises the same MemoryError where the memory is really not there
    start = address(buf)
    lo, hi = -(-start // _HUGE) * _HUGE, (start + n) // _HUGE * _HUGE
    if hi > lo:
        madvise(lo, hi - lo, _MADV_HUGEPAGE)  # advice only: where it is refused, 4 KiB pages
    return buf
