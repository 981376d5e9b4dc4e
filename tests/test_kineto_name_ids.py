"""Name ids of the Kineto parse: the per-slice ids of typed events and the timeline's interned
names are the ids a lookup per row gives, in the same order, whatever repeats."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.model import NameTable
from ppdiag.parsers.kineto import _SLICE_DECODERS
from ppdiag.parsers.kineto_names import _NameMemo, interned_ids
from ppdiag.parsers.kineto_table import Decoded, EventsBuilder


def _events(names: list[str]) -> bytes:
    return json.dumps(
        [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0} for n in names]
    ).encode()


def _builder_ids(slices: list[list[str]], how: Decoded) -> tuple[list[int], list[str]]:
    b = EventsBuilder(_NameMemo(), "x")
    for names in slices:
        dec = _SLICE_DECODERS.strict if how == Decoded.STRICT else _SLICE_DECODERS.lenient
        evs = dec.decode(_events(names))
        b.add(evs, None, how)
    ev = b.finish()
    return ev.name.tolist(), ev.names


_NAMES = st.sampled_from(["a", "b", "c", "ProfilerStep#1", "nccl:send", "z"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_NAMES, min_size=1, max_size=8), min_size=1, max_size=5))
def test_typed_name_ids_equal_the_set_path(slices: list[list[str]]) -> None:
    """Typed slices take ids straight from the Structs when every name is known, else register
    the slice's new names: the same ids and name list as the lenient path (a set per slice)."""
    assert _builder_ids(slices, Decoded.STRICT) == _builder_ids(slices, Decoded.LENIENT)


def test_typed_name_ids_of_a_slice_with_a_new_name_after_known_ones() -> None:
    # slice 1 registers a, b (ids 0, 1); slice 2 starts with known names, then c: ids in sorted
    # order of the new names (c=2), whatever the row the lookup failed on
    ids, names = _builder_ids([["b", "a"], ["a", "b", "c", "a"]], Decoded.STRICT)
    assert names == ["a", "b", "c"]
    assert ids == [1, 0, 0, 1, 2, 0]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=40),
    st.lists(st.sampled_from(["", "x", "y", "k1"]), max_size=3),
)
def test_interned_ids_equal_one_lookup_per_row(idx: list[int], seen: list[str]) -> None:
    """One lookup per distinct name, in the order of first rows: the ids and the table's names
    are those of a lookup per row, also when the table already holds some of the names."""
    pool = ["k0", "k1", "k2", "x", "k4", ""]
    one, per_row = NameTable(), NameTable()
    for s in seen:
        one.id(s), per_row.id(s)
    got = interned_ids(one, pool, np.array(idx, dtype=np.int32))
    want: list[Any] = [per_row.id(pool[i]) for i in idx]
    assert got.dtype == np.int32 and got.tolist() == want
    assert one.names == per_row.names


def test_interned_ids_hand_case() -> None:
    # rows k2, k0, k2, k1 on a fresh table ("" is id 0): k2 -> 1, k0 -> 2, k1 -> 3
    t = NameTable()
    got = interned_ids(t, ["k0", "k1", "k2"], np.array([2, 0, 2, 1]))
    assert got.tolist() == [1, 2, 1, 3] and t.names == ["", "k2", "k0", "k1"]
