"""The columns of an Arrow C stream (an ADBC query's result) read with :mod:`ctypes`, without pyarrow.

ADBC hands its results over as an ``ArrowArrayStream``, the Arrow C data interface: plain C
structs whose layout is fixed by the specification
(https://arrow.apache.org/docs/format/CDataInterface.html). Reading them here keeps pyarrow out
of the parse worker: importing it cost ~0.03-0.08 s CPU per worker process and started two
threads (jemalloc's among them), which is also why it cannot be imported once in the parent
before the workers are forked.

Only what the nsys reader needs is read: a stream of struct batches whose children are flat
columns. Each batch's buffers are copied out before the batch is released, so the result does
not depend on the producer's memory.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

_P = ctypes.c_void_p


class _Schema(ctypes.Structure):
    pass


_Schema._fields_ = [
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", _P),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(_Schema))),
    ("dictionary", _P),
    ("release", _P),
    ("private_data", _P),
]


class _Array(ctypes.Structure):
    pass


_Array._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(_P)),
    ("children", ctypes.POINTER(ctypes.POINTER(_Array))),
    ("dictionary", _P),
    ("release", _P),
    ("private_data", _P),
]

_GET_SCHEMA = ctypes.CFUNCTYPE(ctypes.c_int, _P, ctypes.POINTER(_Schema))
_GET_NEXT = ctypes.CFUNCTYPE(ctypes.c_int, _P, ctypes.POINTER(_Array))
_RELEASE_SCHEMA = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Schema))
_RELEASE_ARRAY = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Array))


class _Stream(ctypes.Structure):
    _fields_ = [
        ("get_schema", _P),
        ("get_next", _P),
        ("get_last_error", _P),
        ("release", _P),
        ("private_data", _P),
    ]


@dataclass
class Chunk:
    """One batch of a column with its buffers copied out (validity bitmap or None, then the data
    or offsets and data buffers). It answers what :func:`ppdiag.parsers.nsys_arrow._int64_values`
    and :meth:`ppdiag.parsers.nsys_arrow.Blobs.from_arrow` ask of a pyarrow array."""

    length: int
    offset: int
    null_count: int
    bufs: list[bytes | None]

    def __len__(self) -> int:
        return self.length

    def buffers(self) -> list[bytes | None]:
        return self.bufs


@dataclass
class Column:
    """A column of the stream: its Arrow format string (``"l"`` int64, ``"z"`` binary, ``"Z"``
    large binary, ``"n"`` null...) and its chunks (buffers only for those three)."""

    format: str
    chunks: list[Chunk]


def _copy(ptr: int | None, size: int) -> bytes | None:
    return ctypes.string_at(ptr, size) if ptr and size > 0 else (b"" if ptr else None)


def _nulls(validity: bytes | None, offset: int, length: int) -> int:
    """NULLs among ``length`` values from ``offset`` of a validity bitmap (None: no NULL)."""
    if validity is None or not length:
        return 0
    bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
    return int(length - np.count_nonzero(bits[offset : offset + length]))


def _chunk(arr: _Array, fmt: str) -> Chunk | None:
    """The buffers of one column batch copied out; None where its form is not a flat column."""
    if arr.dictionary or arr.n_children:
        return None
    n, off = int(arr.length), int(arr.offset)
    ptrs = [arr.buffers[i] for i in range(int(arr.n_buffers))]
    if fmt == "n":
        return Chunk(n, off, n, [])
    if fmt not in ("l", "z", "Z"):
        return Chunk(n, off, 0, [])  # another type: the caller does not take it
    if len(ptrs) < (2 if fmt == "l" else 3) or (n and not ptrs[1]):
        return None  # not the buffers its type has
    validity = _copy(ptrs[0], (off + n + 7) // 8)
    if fmt == "l":
        bufs = [validity, _copy(ptrs[1], (off + n) * 8)]
    else:
        width = 4 if fmt == "z" else 8
        offsets = _copy(ptrs[1], (off + n + 1) * width) or b""
        end = int(np.frombuffer(offsets, dtype=f"<i{width}")[-1]) if offsets else 0
        if end and not ptrs[2]:
            return None
        bufs = [validity, offsets, _copy(ptrs[2], end)]
    nulls = int(arr.null_count)
    if nulls < 0:  # not computed by the producer
        nulls = _nulls(validity, off, n)
    return Chunk(n, off, nulls, bufs)


def _formats(stream: _Stream, address: int) -> list[str] | None:
    """The column formats of a stream of struct batches, or None."""
    schema = _Schema()
    if _GET_SCHEMA(stream.get_schema)(address, ctypes.byref(schema)) != 0:
        return None
    try:
        if schema.format != b"+s":
            return None
        return [schema.children[i].contents.format.decode() for i in range(int(schema.n_children))]
    finally:
        if schema.release:
            _RELEASE_SCHEMA(schema.release)(ctypes.byref(schema))


def read_stream(address: int) -> list[Column] | None:
    """The columns of the ``ArrowArrayStream`` at ``address``, read to its end; None where the
    stream reports an error (e.g. a value that does not fit the type it inferred) or is not a
    stream of struct batches without NULL rows. The caller still owns (and releases) the stream."""
    stream = _Stream.from_address(address)
    if not (stream.get_schema and stream.get_next):
        return None
    formats = _formats(stream, address)
    if formats is None:
        return None
    cols = [Column(f, []) for f in formats]
    get_next = _GET_NEXT(stream.get_next)
    while True:
        arr = _Array()
        if get_next(address, ctypes.byref(arr)) != 0:
            return None
        if not arr.release:  # the end of the stream
            return cols
        try:
            # the rows of the struct itself must all be there, unsliced
            has_nulls = arr.null_count and arr.n_buffers and arr.buffers[0]
            if arr.offset or arr.n_children != len(cols) or has_nulls:
                return None
            for i, col in enumerate(cols):
                got = _chunk(arr.children[i].contents, col.format)
                if got is None:
                    return None
                col.chunks.append(got)
        finally:
            _RELEASE_ARRAY(arr.release)(ctypes.byref(arr))
