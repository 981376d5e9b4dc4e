"""Compressed traces under any name: read by magic bytes, capped in size, clear when unreadable."""

from __future__ import annotations

import bz2
import gzip
import lzma
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TEST_DATA

from ppdiag.errors import InputError
from ppdiag.parsers.kineto import gunzip, parse_file, unpack_other
from ppdiag.parsers.loader import detect_format, load_run

RAW = (TEST_DATA / "gpu_pp_rank0.json").read_bytes()


def _zstd(data: bytes) -> bytes:
    zstandard = pytest.importorskip("zstandard")
    out: bytes = zstandard.ZstdCompressor().compress(data)
    return out


PACKERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "zstd": _zstd,
}


@pytest.mark.parametrize("codec", sorted(PACKERS))
@pytest.mark.parametrize("name", ["rank0.pt.trace.json.gz", "rank0.json", "rank0.trace.bin.json"])
def test_read_under_any_name(tmp_path: Path, codec: str, name: str) -> None:
    """Same intervals as the plain file, whatever the name says."""
    (tmp_path / "ref.json").write_bytes(RAW)
    ref = parse_file(tmp_path / "ref.json")
    p = tmp_path / name
    p.write_bytes(PACKERS[codec](RAW))
    assert detect_format(p) == ("kineto", "")
    run = load_run([p], progress=False)
    (tl,) = run.ranks
    assert len(tl.intervals) == len(ref.intervals) > 0
    assert (tl.intervals.start == ref.intervals.start).all()


@pytest.mark.parametrize("codec", ["bzip2", "xz", "zstd"])
def test_decompression_cap_for_every_codec(codec: str) -> None:
    """A payload past the cap is refused naming the codec and the cap; just under it is read."""
    data = b'{"traceEvents":[' + b" " * (3 << 20) + b"]}"  # 3 MiB that compress to a few KiB
    packed = PACKERS[codec](data)
    with pytest.raises(InputError, match=rf"{codec} data expands past 2\.0 MiB"):
        unpack_other(packed, "x.json", limit=2 << 20)
    out, what = unpack_other(packed, "x.json", limit=4 << 20)
    assert what == codec and out == data


def test_gzip_cap() -> None:
    data = b'{"traceEvents":[' + b" " * (3 << 20) + b"]}"
    with pytest.raises(InputError, match=r"gzip data expands past 2\.0 MiB"):
        gunzip(gzip.compress(data), "x.json.gz", limit=2 << 20)
    assert gunzip(gzip.compress(data), "x.json.gz", limit=4 << 20) == (bytearray(data), False)


def test_cap_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PPDIAG_MAX_TRACE_GB`` caps every codec read through the parser."""
    monkeypatch.setenv("PPDIAG_MAX_TRACE_GB", str(1 / 1024))  # 1 MiB
    p = tmp_path / "rank0.json"
    p.write_bytes(bz2.compress(b'{"traceEvents":[' + b" " * (2 << 20) + b"]}"))
    with pytest.raises(InputError, match=r"bzip2 data expands past 1\.0 MiB"):
        parse_file(p)


def test_zstd_without_the_package_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails as if not installed
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 32)
    assert "needs the optional 'zstandard' package" in detect_format(p)[1]
    with pytest.raises(InputError, match="zstd-compressed data: reading it needs the optional 'zstandard'"):
        parse_file(p)


def test_corrupt_zstd_is_named(tmp_path: Path) -> None:
    pytest.importorskip("zstandard")
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 32)
    with pytest.raises(InputError, match="zstd-compressed data"):
        load_run([p], progress=False)
    p.write_bytes(_zstd(RAW)[:100])  # cut short
    with pytest.raises(InputError):
        parse_file(p)


def test_lz4_says_what_it_is(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(b"\x04\x22\x4d\x18" + b"\x00" * 32)
    assert "lz4-compressed data" in detect_format(p)[1] and "lz4 -d" in detect_format(p)[1]
    with pytest.raises(InputError, match="lz4-compressed data"):
        parse_file(p)


def _big_text(n: int) -> bytes:
    # varied enough that a stale or zero byte anywhere would show (not one repeated block)
    line = b"".join(b'{"ph":"X","ts":%d,"dur":%d},' % (i, i % 97) for i in range(4096))
    return (line * (n // len(line) + 1))[:n]


@pytest.mark.parametrize("cut", [False, True])
def test_gunzip_into_the_unfilled_buffer_is_the_text(cut: bool) -> None:
    # 24 MB: past the size where the buffer is left unfilled and advised as huge pages; a cut
    # stream fills less than its trailer promised (here: no trailer, the size is re-grown)
    text = _big_text(24 << 20)
    raw = gzip.compress(text, compresslevel=1)
    if cut:
        raw = raw[: len(raw) * 2 // 3]
    data, was_cut = gunzip(raw, "t.json.gz")
    assert was_cut is cut and isinstance(data, bytearray)
    if cut:
        assert 0 < len(data) < len(text) and text.startswith(data)
    else:
        assert data == text


def test_text_buffer_sizes() -> None:
    from ppdiag.parsers.heap import text_buffer

    for n in (0, 100, 8 << 20, (8 << 20) + 12345):
        buf = text_buffer(n)
        assert isinstance(buf, bytearray) and len(buf) == n
        buf[-1:] = b"x" if n else b""
        assert bytes(buf[-1:]) == (b"x" if n else b"")
    assert text_buffer(100) == bytearray(100)  # small buffers are plain zero-filled ones
