"""NCCL payload BLOBs read through the optional ADBC reader give exactly what sqlite3 gives."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_nsys_arrow import _assert_same, _parse_both

from ppdiag.parsers import nsys_arrow, nsys_nvtx
from ppdiag.parsers.nsys_arrow import Blobs
from ppdiag.parsers.nsys_db import open_export
from ppdiag.parsers.nsys_nccl_plain import plain_nccl_rows
from ppdiag.parsers.nsys_nvtx import _domains, _nccl_rows
from ppdiag.parsers.nsys_payloads import _matrix
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

pytest.importorskip("adbc_driver_manager")
pytest.importorskip("adbc_driver_sqlite")
pa = pytest.importorskip("pyarrow")


@pytest.fixture(autouse=True)
def _any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # the files here are small: read them through ADBC all the same
    monkeypatch.setattr(nsys_arrow, "MIN_FILE_BYTES", 0)


def _same_blobs(a: Blobs, b: Blobs) -> None:
    assert a.lengths.tolist() == b.lengths.tolist()
    assert a.data.tobytes() == b.data.tobytes()
    assert a.offsets.dtype == b.offsets.dtype == np.int64


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.binary(max_size=9)), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    large=st.booleans(),
)
def test_arrow_chunks_give_the_buffer_of_the_objects(
    values: list[bytes | None], cuts: list[int], large: bool
) -> None:
    # sliced chunks (a non-zero offset into shared buffers), NULLs, empty values
    arr = pa.array(values, type=pa.large_binary() if large else pa.binary())
    bounds = sorted({0, len(values), *(min(c, len(values)) for c in cuts)})
    chunks = [arr.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)]
    objs = np.empty(len(values), dtype=object)
    objs[:] = values
    _same_blobs(Blobs.from_arrow(chunks, large=large), Blobs.from_objects(objs))


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.binary(min_size=0, max_size=3)), min_size=1, max_size=30))
def test_payloads_of_one_length_stack_into_their_rows(values: list[bytes | None]) -> None:
    # runs of one length back to back (viewed) or interleaved with others (gathered)
    objs = np.empty(len(values), dtype=object)
    objs[:] = values
    blobs = Blobs.from_objects(objs)
    for length in {len(v) for v in values if v}:
        idx = np.array([i for i, v in enumerate(values) if v and len(v) == length], dtype=np.int64)
        want = [list(values[i] or b"") for i in idx.tolist()]
        assert _matrix(blobs, idx, length).tolist() == want


def _export(tmp_path: Path) -> Path:
    run = make_scenario("1f1b", pp=2, microbatches=4, dp=1, steps=2, seed=5)
    return write_nsys(run, tmp_path)[0]


def _nccl_where(conn: sqlite3.Connection) -> str:
    dom = conn.execute("SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'NCCL'").fetchone()
    return f"domainId = {dom[0]} AND eventType = 59"


def _rows_both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(_nccl_rows through ADBC where it takes them, _nccl_rows with sqlite3 alone)."""
    out = []
    for off in ("0", "1"):
        monkeypatch.setenv(nsys_arrow.ARROW_ENV, off)
        db = open_export(path)
        try:
            keys = [k for k, name in _domains(db).items() if name == "NCCL"]
            assert keys
            out.append(_nccl_rows(db, keys))
        finally:
            db.close()
    return out[0], out[1]


def _same_rows(fast: Any, slow: Any) -> None:
    for c in ("start", "end", "gtid", "tid_"):
        assert fast.ints[c].tolist() == slow.ints[c].tolist()
    # the jsonTextId column is read for whether it holds a string id (>= 0) alone: ADBC's reads,
    # where none does, give -1 for any negative id
    assert (fast.ints["needs_text"] >= 0).tolist() == (slow.ints["needs_text"] >= 0).tolist()
    _same_blobs(fast.blobs, slow.blobs)


def test_nccl_payloads_come_through_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _export(tmp_path)
    fast, slow = _rows_both(p, monkeypatch)
    assert fast.text is None and fast.json is None, "the Arrow reader was not used"
    assert slow.text is not None
    assert int((fast.blobs.lengths > 0).sum()) > 10
    _same_rows(fast, slow)


# Each edit of the export's NCCL rows (at the first row, inside the first batch of the driver,
# or at the last row) must parse the same with and without ADBC, taken by ADBC or not.
_EDITS = {
    "null payloads first": "UPDATE NVTX_EVENTS SET binaryData = NULL WHERE rowid IN ({first})",
    "all payloads null": "UPDATE NVTX_EVENTS SET binaryData = NULL WHERE {where}",
    "a text payload": "UPDATE NVTX_EVENTS SET binaryData = 'abc' WHERE rowid = {last}",
    "an empty blob": "UPDATE NVTX_EVENTS SET binaryData = x'' WHERE rowid IN ({first})",
    "a short payload": "UPDATE NVTX_EVENTS SET binaryData = substr(binaryData, 1, 20) WHERE rowid = {last}",
    # the payloads of one length then lie in two runs: gathered, not viewed
    "a short one inside": "UPDATE NVTX_EVENTS SET binaryData = substr(binaryData, 1, 9) WHERE rowid = {mid}",
    "a json payload": "UPDATE NVTX_EVENTS SET jsonText = '{{\"bytes\": 7}}' WHERE rowid = {last}",
    "a plain-text name": "UPDATE NVTX_EVENTS SET textId = NULL, text = 'ncclSend' WHERE rowid = {last}",
    # rows the plain-column read (nsys_nccl_plain) must drop, or leave to the guarded query
    "a reversed range": 'UPDATE NVTX_EVENTS SET "end" = start - 1 WHERE rowid = {mid}',
    "an open range": 'UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid = {mid}',
    "a real start": "UPDATE NVTX_EVENTS SET start = start + 0.5 WHERE rowid = {last}",
    "another process": "UPDATE NVTX_EVENTS SET globalTid = globalTid + (1 << 24) WHERE rowid IN ({first})",
    "a null thread": "UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid = {mid}",
    "a negative json id": "UPDATE NVTX_EVENTS SET jsonTextId = -5 WHERE rowid = {mid}",
    "a name and a string id": "UPDATE NVTX_EVENTS SET text = 'x' WHERE rowid = {mid}",
    "a text domain": "UPDATE NVTX_EVENTS SET domainId = 'a' WHERE rowid = {mid}",
    "a marker": "UPDATE NVTX_EVENTS SET eventType = 34 WHERE rowid IN ({first})",
}


def _apply_edit(p: Path, edit: str) -> list[int]:
    """Apply ``_EDITS[edit]`` to the NCCL rows of the export ``p``; their row ids, in order."""
    conn = sqlite3.connect(p)
    where = _nccl_where(conn)
    ids = [r[0] for r in conn.execute(f"SELECT rowid FROM NVTX_EVENTS WHERE {where} ORDER BY rowid")]
    first = ", ".join(str(i) for i in ids[:3])
    conn.execute(_EDITS[edit].format(first=first, last=ids[-1], mid=ids[len(ids) // 2], where=where))
    conn.commit()
    conn.close()
    return ids


@pytest.mark.parametrize("edit", list(_EDITS))
def test_odd_nccl_rows_parse_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    p = _export(tmp_path)
    _apply_edit(p, edit)
    fast, slow = _rows_both(p, monkeypatch)
    if fast.text is None:  # taken by ADBC: the same rows and bytes
        _same_rows(fast, slow)
    _assert_same(*_parse_both(p, monkeypatch))


@pytest.mark.parametrize("chain", [0, 8])
def test_key_test_forms_match_the_row_value_in(chain: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the chain of comparisons (few keys) and the row-value IN (many) select the same rows, on
    # NULL, TEXT and REAL process and domain values too
    from ppdiag.parsers import nsys_nvtx

    monkeypatch.setattr(nsys_nvtx, "_KEY_CHAIN", chain)
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE NVTX_EVENTS (globalTid, domainId)")
    odd: list[Any] = [None, "1", 1.0, 2.5, b"\x01"]
    tids: list[Any] = [(p << 24) | 7 for p in range(4)] + odd
    doms: list[Any] = [0, 1, 2, *odd]
    conn.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?)", [(t, d) for t in tids for d in doms])
    keys = [(0, 0), (1, 1), (3, 2), (2, 0)]
    got = conn.execute(f"SELECT rowid FROM NVTX_EVENTS WHERE {nsys_nvtx._key_test(keys)}").fetchall()
    want = conn.execute(
        "SELECT rowid FROM NVTX_EVENTS WHERE ((coalesce(globalTid, 0) >> 24) & 16777215, "
        "(CASE WHEN typeof(domainId) = 'integer' THEN domainId ELSE 0 END)) "
        "IN (VALUES (0, 0), (1, 1), (3, 2), (2, 0))"
    ).fetchall()
    assert got == want and len(got) > 4
    not_got = conn.execute(
        f"SELECT count(*) FROM NVTX_EVENTS WHERE 1{nsys_nvtx._exclude_clause(keys)}"
    ).fetchone()
    assert not_got[0] == len(tids) * len(doms) - len(got)


def _plain_and_guarded(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """(plain_nccl_rows, _nccl_rows without it, _nccl_rows with sqlite3 alone) of one export."""
    monkeypatch.setenv(nsys_arrow.ARROW_ENV, "0")
    with contextlib.closing(open_export(path)) as db:
        keys = [k for k, name in _domains(db).items() if name == "NCCL"]
        plain = plain_nccl_rows(db, keys, "59, 60, 70, 71")
        with monkeypatch.context() as m:
            m.setattr(nsys_nvtx, "plain_nccl_rows", lambda *a: None)
            guarded = _nccl_rows(db, keys)
    monkeypatch.setenv(nsys_arrow.ARROW_ENV, "1")
    with contextlib.closing(open_export(path)) as db:
        slow = _nccl_rows(db, keys)
    return plain, guarded, slow


@pytest.mark.parametrize(
    "edit, taken",
    [
        (None, True),
        ("a reversed range", True),
        ("another process", True),
        ("a marker", True),
        ("an open range", False),
        ("a real start", False),
        ("a null thread", False),
        ("a negative json id", False),
        ("a name and a string id", False),
        ("a text domain", True),  # not an integer: not the domain (the SQL leaves it out)
    ],
)
def test_plain_nccl_rows_are_the_guarded_querys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str | None, taken: bool
) -> None:
    # the plain columns filtered in numpy give the guarded query's rows and payloads exactly, or
    # leave the read to it (an odd value anywhere in the selected rows)
    p = _export(tmp_path)
    ids = _apply_edit(p, edit) if edit is not None else []
    plain, guarded, slow = _plain_and_guarded(p, monkeypatch)
    assert (plain is not None) == taken
    assert guarded.text is None  # the guarded ADBC query answered
    if plain is not None:
        rows, blobs = plain
        for c in ("start", "end", "gtid", "tid_"):
            assert rows[c].tolist() == slow.ints[c].tolist() == guarded.ints[c].tolist()
        _same_blobs(blobs, slow.blobs)
        _same_blobs(blobs, guarded.blobs)
        if edit in ("a reversed range", "another process", "a marker", "a text domain"):
            assert 0 < len(rows) < len(ids)  # the edited rows were left out
    _assert_same(*_parse_both(p, monkeypatch))


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=5)), max_size=30), seed=st.integers(0, 2**16))
def test_taken_blobs_are_the_kept_values(values: list[bytes | None], seed: int) -> None:
    keep = np.random.default_rng(seed).random(len(values)) < 0.5
    objs = np.empty(len(values), dtype=object)
    objs[:] = values
    kept = np.empty(int(keep.sum()), dtype=object)
    kept[:] = [v for v, k in zip(values, keep.tolist(), strict=True) if k]
    _same_blobs(Blobs.from_objects(objs).take(keep), Blobs.from_objects(kept))
