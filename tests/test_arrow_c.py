"""The ctypes reader of Arrow C streams gives the values pyarrow holds: int64 and binary columns
in several batches, sliced batches, NULLs; an erring stream gives None."""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.parsers.arrow_c import _Stream, read_stream
from ppdiag.parsers.nsys_arrow import Blobs, _int64_values

pa = pytest.importorskip("pyarrow")


def _read(reader: Any) -> Any:
    """read_stream of ``reader`` exported through the C stream interface."""
    stream = _Stream()
    addr = ctypes.addressof(stream)
    reader._export_to_c(addr)
    try:
        return read_stream(addr)
    finally:
        if stream.release:
            ctypes.CFUNCTYPE(None, ctypes.c_void_p)(stream.release)(addr)


@settings(max_examples=80, deadline=None)
@given(
    ints=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=40),
    blobs=st.lists(st.one_of(st.none(), st.binary(max_size=7)), min_size=40, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    large=st.booleans(),
    sliced=st.booleans(),
)
def test_columns_are_the_arrow_values(
    ints: list[int | None], blobs: list[bytes | None], cuts: list[int], large: bool, sliced: bool
) -> None:
    n = len(ints)
    blobs = blobs[:n]
    btype = pa.large_binary() if large else pa.binary()
    table = pa.table({"i": pa.array(ints, pa.int64()), "b": pa.array(blobs, btype)})
    bounds = sorted({0, n, *(min(c, n) for c in cuts)})
    if sliced:  # batches that are slices of one batch (offsets into shared buffers)
        whole = table.combine_chunks().to_batches()[0]
        batches = [whole.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)]
    else:
        batches = [
            table.slice(lo, hi - lo).combine_chunks().to_batches()[0] for lo, hi in itertools.pairwise(bounds)
        ]
    cols = _read(pa.RecordBatchReader.from_batches(table.schema, batches))
    assert cols is not None
    assert [c.format for c in cols] == ["l", "Z" if large else "z"]
    assert sum(len(c) for c in cols[0].chunks) == n
    nulls = sum(c.null_count for c in cols[0].chunks)
    assert nulls == sum(v is None for v in ints)
    if not nulls:
        assert _int64_values(cols[0].chunks).tolist() == ints
    objs = np.empty(n, dtype=object)
    objs[:] = blobs
    got, want = Blobs.from_arrow(cols[1].chunks, large=large), Blobs.from_objects(objs)
    assert got.lengths.tolist() == want.lengths.tolist()
    assert got.data.tobytes() == want.data.tobytes()


def test_other_types_are_named_by_their_format() -> None:
    table = pa.table({"n": pa.nulls(3), "d": pa.array([1.5, 2.0, None]), "s": pa.array(["a", "b", "c"])})
    cols = _read(pa.RecordBatchReader.from_batches(table.schema, table.to_batches()))
    assert cols is not None
    assert [c.format for c in cols] == ["n", "g", "u"]
    assert cols[0].chunks[0].null_count == 3


def test_an_erring_stream_gives_none() -> None:
    schema = pa.schema([("i", pa.int64())])

    def batches() -> Iterator[Any]:
        yield pa.record_batch([pa.array([1, 2])], schema=schema)
        raise ValueError("a later batch fails, as the driver does on a changed type")

    assert _read(pa.RecordBatchReader.from_batches(schema, batches())) is None
