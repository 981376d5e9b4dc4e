"""The parse cache: a hit gives back exactly what the parser gives, and no stale or foreign entry
is ever served (changed content at the same size and mtime, another parser version, damage)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_TRACES, TEST_DATA
from typer.testing import CliRunner

from ppdiag.cli import app
from ppdiag.model import Intervals, ProcessGroup, Ranges, RankTimeline
from ppdiag.parsers import ParseOptions, cache
from ppdiag.parsers.loader import detect_format, parse_one


def _state(tl: RankTimeline) -> dict[str, Any]:
    """Every field of a timeline, column tables as (dtype, bytes) per column."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(tl):
        v = getattr(tl, f.name)
        if isinstance(v, Intervals | Ranges):
            v = {c: (getattr(v, c).dtype.str, getattr(v, c).tobytes()) for c in v.COLUMNS}
        elif f.name == "process_groups":
            v = [dataclasses.astuple(g) for g in v]
        out[f.name] = v
    return out


def _parse(path: Path) -> list[RankTimeline]:
    fmt, why = detect_format(path)
    assert fmt is not None, why
    out = parse_one(str(path), fmt, ParseOptions())
    assert out.ranks is not None, out.error_message
    return out.ranks


def _entries(d: Path) -> list[Path]:
    return sorted(d.glob("*.cols")) if d.is_dir() else []


def _traces() -> list[Path]:
    found = sorted(TEST_DATA.glob("*.json"))
    if SHARED_TRACES.is_dir():
        found += sorted((SHARED_TRACES / "kineto").glob("*.json.gz"))[:3]
        found += sorted((SHARED_TRACES / "kineto" / "gloo_cpu_2rank").glob("*"))[:1]
    return found


@pytest.mark.parametrize("trace", _traces(), ids=lambda p: p.name)
def test_hit_equals_fresh_parse(trace: Path, cache_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _parse(trace)  # miss: parses and stores
    assert len(_entries(cache_on)) == 1
    monkeypatch.setattr(cache, "put", lambda *a: pytest.fail("a hit must not store again"))
    hit = _parse(trace)
    monkeypatch.setenv("PPDIAG_NO_CACHE", "1")
    fresh = _parse(trace)
    assert [_state(t) for t in hit] == [_state(t) for t in fresh] == [_state(t) for t in first]


def test_same_size_same_mtime_changed_middle_is_a_miss(tmp_path: Path, cache_on: Path) -> None:
    src = tmp_path / "rank0.json"
    shutil.copy(TEST_DATA / "gpu_pp_rank0.json", src)
    before = _parse(src)
    st = src.stat()
    data = bytearray(src.read_bytes())
    # change the first digit of a kernel's duration past the middle: same size, other content
    kern = data.find(b'"cat": "kernel"', len(data) // 2)
    p = data.find(b'"dur": ', kern) + len(b'"dur": ')
    assert kern > 0 and chr(data[p]).isdigit()
    data[p] = ord("9") if data[p] != ord("9") else ord("8")
    src.write_bytes(bytes(data))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (src.stat().st_size, src.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    after = _parse(src)
    assert len(_entries(cache_on)) == 2  # a miss: a second entry
    os.environ["PPDIAG_NO_CACHE"] = "1"
    try:
        truth = _parse(src)
    finally:
        del os.environ["PPDIAG_NO_CACHE"]
    assert [_state(t) for t in after] == [_state(t) for t in truth]
    assert [_state(t) for t in after] != [_state(t) for t in before]


def test_other_parser_version_is_a_miss(cache_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = TEST_DATA / "gpu_pp_rank0.json"
    k1 = cache.entry_key(trace, "kineto")
    monkeypatch.setattr(cache, "_VERSION", "another-parser")
    k2 = cache.entry_key(trace, "kineto")
    assert k1 and k2 and k1 != k2
    assert cache.entry_key(trace, "nsys") != k2  # the format is in the key too


def test_damaged_entry_is_a_miss_and_removed(cache_on: Path) -> None:
    trace = TEST_DATA / "gpu_pp_rank0.json"
    good = _parse(trace)
    (entry,) = _entries(cache_on)
    entry.write_bytes(entry.read_bytes()[:100])
    key = cache.entry_key(trace, "kineto")
    assert key is not None and cache.get(key) is None
    assert not entry.exists()
    again = _parse(trace)
    assert [_state(t) for t in again] == [_state(t) for t in good]


@pytest.mark.parametrize("where", ["header", "column"])
def test_flipped_byte_is_a_miss_with_a_note(cache_on: Path, where: str) -> None:
    # the entry's checksum covers the header and every column: one changed byte anywhere is damage
    trace = TEST_DATA / "gpu_pp_rank0.json"
    good = _parse(trace)
    (entry,) = _entries(cache_on)
    data = bytearray(entry.read_bytes())
    at = 40 if where == "header" else len(data) - 9
    data[at] ^= 0x01
    entry.write_bytes(bytes(data))
    key = cache.entry_key(trace, "kineto")
    damaged: list[str] = []
    assert key is not None and cache.get(key, damaged) is None
    assert not entry.exists() and "checksum" in damaged[0]
    again = _parse(trace)
    assert [_state(t) for t in again] == [_state(t) for t in good]


def test_old_npz_entry_is_never_read_and_is_cleared(cache_on: Path) -> None:
    # an entry of the earlier .npz form under today's key: a plain miss (no damage note), a new
    # entry written beside it, and `cache clear` removes both
    trace = TEST_DATA / "gpu_pp_rank0.json"
    key = cache.entry_key(trace, "kineto")
    assert key is not None
    cache_on.mkdir(parents=True)
    old = cache_on / f"{key}.npz"
    np.savez(old, meta=np.zeros(3, np.uint8))
    damaged: list[str] = []
    assert cache.get(key, damaged) is None and damaged == [] and old.exists()
    ranks = _parse(trace)
    assert not any("cache" in w for t in ranks for w in t.warnings)
    assert len(_entries(cache_on)) == 1 and cache.info().entries == 2
    assert cache.clear() == 2 and not old.exists() and _entries(cache_on) == []


@pytest.mark.parametrize(
    "head",
    [
        b'{"not": "a list"}',
        b'[["x", "|O", [1], 0]]',  # an object array
        b'[["x", "<i8", [-1], 0]]',  # a negative shape
        b'[["x", "<i8", [1000], 0]]',  # beyond the end
        b'[["x", "<i8", [1], -8]]',  # a negative offset
    ],
)
def test_foreign_packed_bytes_are_refused(head: bytes) -> None:
    head += b" " * (-(len(cache._PACK_MAGIC) + 8 + len(head)) % 8)
    data = cache._PACK_MAGIC + len(head).to_bytes(8, "little") + head + bytes(64)
    with pytest.raises((ValueError, TypeError)):
        cache.decode_ranks(data)


def test_odd_names_and_metadata_round_trip(cache_on: Path) -> None:
    names = ["", "gemm\n(x)", "nul\x00end\x00", "lone \udcff surrogate", "ünïcode · µs"]
    n = 3
    iv = Intervals.from_columns(
        n,
        {"start": np.array([0, 5, 9]), "end": np.array([4, 8, 12]), "name": np.array([1, 2, 4])},
    )
    tl = RankTimeline(
        rank=3,
        source="x.json",
        format="kineto",
        names=names,
        intervals=iv,
        ranges=Ranges.empty(),
        world_size=8,
        process_groups=[ProcessGroup("0", "default_pg", [0, 1, 2, 3], "nccl")],
        warnings=["2 events dropped"],
        meta={"time_base_ns": 17, "ts_format": "absolute µs", "nested": {"a": [1, 2.5, None]}},
    )
    assert cache.put("a" * 40, [tl])
    got = cache.get("a" * 40)
    assert got is not None
    (back,) = got
    assert _state(back) == _state(tl)


def test_unencodable_metadata_is_not_cached(cache_on: Path) -> None:
    tl = RankTimeline(0, "x", "kineto", [""], Intervals.empty(), Ranges.empty(), meta={"t": (1, 2)})
    assert not cache.put("b" * 40, [tl])  # a tuple would come back a list: not stored
    assert cache.get("b" * 40) is None


def test_unwritable_cache_dir_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PPDIAG_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("PPDIAG_NO_CACHE", raising=False)
    assert _parse(TEST_DATA / "gpu_pp_rank0.json")  # parses; storing fails without a word


def test_cli_no_cache_info_and_clear(tmp_path: Path, cache_on: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(TEST_DATA / "gpu_pp_rank0.json", run / "rank0.json")
    (cache_on).mkdir(parents=True, exist_ok=True)
    (cache_on / "keep-me.txt").write_text("not ours")
    runner = CliRunner()
    r = runner.invoke(app, ["analyze", str(run), "-q", "--no-cache"])
    os.environ.pop("PPDIAG_NO_CACHE", None)  # --no-cache sets it for the process
    assert r.exit_code == 0, r.output
    assert _entries(cache_on) == []
    r = runner.invoke(app, ["analyze", str(run), "-q"])
    assert r.exit_code == 0, r.output
    assert len(_entries(cache_on)) == 1
    r = runner.invoke(app, ["cache", "info"])
    assert r.exit_code == 0 and "entries: 1" in r.output and str(cache_on) in r.output
    r = runner.invoke(app, ["cache", "clear"])
    assert r.exit_code == 0 and "removed 1 cached parse " in r.output
    assert _entries(cache_on) == [] and (cache_on / "keep-me.txt").exists()


def test_default_dir_without_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PPDIAG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    d = cache.cache_dir()
    assert d.name == "ppdiag"
    try:
        import platformdirs  # noqa: F401
    except ImportError:
        assert d == tmp_path / "xdg" / "ppdiag"


def test_warm_rerun_starts_no_worker(tmp_path: Path, cache_on: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdiag.parsers import loader, pool

    src = SHARED_TRACES / "kineto" / "gloo_cpu_2rank"
    if not src.is_dir():
        pytest.skip("shared traces not available")
    run = tmp_path / "run"
    shutil.copytree(src, run)
    cold = loader.load_run([run], jobs=2, progress=False)
    assert len(_entries(cache_on)) == 2

    def no_pool(*a: Any, **k: Any) -> Any:
        raise AssertionError("a warm re-run must not start parse workers")

    monkeypatch.setattr(pool, "ProcessPoolExecutor", no_pool)
    warm = loader.load_run([run], jobs=2, progress=False)
    assert [_state(t) for t in warm.ranks] == [_state(t) for t in cold.ranks]
    assert warm.warnings == cold.warnings


def test_parser_version_follows_the_parser_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ppdiag.version

    # a copy of the package sources with one parser line changed gets another version
    fake = tmp_path / "ppdiag"
    root = Path(ppdiag.version.__file__).resolve().parent
    for sub in ("parsers", "model"):
        (fake / sub).mkdir(parents=True)
        for f in (root / sub).glob("*.py"):
            (fake / sub / f.name).write_bytes(f.read_bytes())
    for n in ("errors.py", "io.py", "limits.py", "version.py"):
        (fake / n).write_bytes((root / n).read_bytes())
    monkeypatch.setattr(ppdiag.version, "__file__", str(fake / "version.py"))
    monkeypatch.setattr(cache, "_VERSION", None)
    v1 = cache.parser_version()
    k = fake / "parsers" / "kineto.py"
    k.write_text(k.read_text() + "\n# changed\n")
    monkeypatch.setattr(cache, "_VERSION", None)
    assert cache.parser_version() != v1


UNRANKED = SHARED_TRACES / "kineto" / "tracelens_h100_single.json.gz"  # no distributedInfo


@pytest.mark.skipif(not UNRANKED.is_file(), reason="no shared traces")
@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks")
def test_a_link_under_another_rank_name_is_another_entry(tmp_path: Path, cache_on: Path) -> None:
    # the trace has no rank of its own: the parse reads it from the name (rank3 -> 3). A link
    # rank5.json.gz to the same bytes is rank 5; keyed by the bytes alone, the hit said 3
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    real = tmp_path / "a" / "rank3.json.gz"
    shutil.copyfile(UNRANKED, real)
    link = tmp_path / "b" / "rank5.json.gz"
    link.symlink_to(real)
    assert [t.rank for t in _parse(real)] == [3]
    assert [(t.rank, t.rank_source) for t in _parse(link)] == [(5, "file name")]
    assert [t.rank for t in _parse(real)] == [3]  # the first entry is still served
    assert len(_entries(cache_on)) == 2
