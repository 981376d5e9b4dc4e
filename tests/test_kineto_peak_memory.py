"""A Kineto parse's peak memory is bounded by the decompressed size of its trace.

The trace is a real one replicated to ~60 MiB of JSON (gzip), parsed in a fresh subprocess whose
peak RSS (``VmHWM``) is compared with that of a subprocess that only imports the parser: the
difference is what the parse itself held at its peak. The bound is a memory bound, not a timing
assert: issue 15 asks for under 2x the decompressed size; a GPU trace measures ~1.21x here (the
decompressed text itself, 1x, plus one slice and the columns; 1.43x while a skeleton of views of
every event was decoded first), so 1.75x leaves room for allocator noise without letting a second
copy of the text (2x and more) pass. A CPU-only (gloo) trace keeps every event as a row and
measures ~1.44x (1.49x with the skeleton; 1.82x while each slice was copied out of the text, the
slices' columns were joined at the end and its four args columns of -1 were stored; 3.35x when
CPU traces were decoded as a whole document): it is held to 1.75x too.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import shared_trace

REPO = Path(__file__).resolve().parents[1]
SOURCE = "kineto/hta_2022_format_rank3.json.gz"
COPIES = 2  # ~27 MiB of JSON each

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forked parent across exec, so a
# child of a big test process would report the parent's size
_PEAK = """
from ppdiag.parsers.kineto import parse_file
{body}
print([ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0])
"""


def _peak_kib(body: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PEAK.format(body=body)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "PPDIAG_NO_CACHE": "1"},
    )
    return int(out.stdout.split()[-1])


def _replicate(src: Path, dst: Path, copies: int = COPIES) -> int:
    """Write ``copies`` time-shifted copies of ``src``'s events to ``dst`` (gzip, or plain JSON
    when ``src`` is); returns the decompressed size in bytes."""
    text = src.read_bytes()
    doc: dict[str, Any] = msgspec.json.decode(gzip.decompress(text) if src.suffix == ".gz" else text)
    events: list[dict[str, Any]] = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), int | float)]
    span = max(ts) - min(ts) + 1000.0
    enc = msgspec.json.Encoder()
    head = enc.encode(doc)[:-1] + b',"traceEvents":['
    with gzip.open(dst, "wb", compresslevel=1) as fh:
        fh.write(head)
        size = len(head)
        for c in range(copies):
            shifted = [
                {**e, "ts": e["ts"] + c * span} if isinstance(e.get("ts"), int | float) else e for e in events
            ]
            body = enc.encode(shifted)[1:-1] + (b"," if c < copies - 1 else b"]}")
            fh.write(body)
            size += len(body)
    return size


# (real trace, copies, bound): a GPU trace (its unread host ops dropped per slice) and a CPU-only
# gloo trace (every row kept, so its columns weigh more: ~1.49x measured)
CASES = [
    pytest.param(SOURCE, COPIES, 1.75, id="gpu"),
    pytest.param("kineto/gloo_cpu_2rank/rank0.10013.pt.trace.json", 1900, 1.75, id="cpu-gloo"),
]


@pytest.mark.parametrize(("source", "copies", "bound"), CASES)
def test_parse_peak_is_bounded_by_the_decompressed_trace(
    tmp_path: Path, source: str, copies: int, bound: float
) -> None:
    src = shared_trace(source)
    trace = tmp_path / "rank0.json.gz"
    raw = _replicate(src, trace, copies)
    assert raw > 40 << 20  # big enough that the fixed costs do not decide
    base = _peak_kib("")
    peak = _peak_kib(f"parse_file({str(trace)!r})")
    held = (peak - base) * 1024
    assert held < bound * raw, f"parse held {held / raw:.2f}x the decompressed trace ({raw >> 20} MiB)"


INFLATERS = ["zlib", "isal"]


def _use(monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    """Make gunzip use zlib or the optional isal (skipped when isal is not installed)."""
    from ppdiag.parsers import kineto_bytes

    monkeypatch.setattr(kineto_bytes, "_INFLATER", None)
    if which == "isal":
        pytest.importorskip("isal")
        monkeypatch.delenv("PPDIAG_NO_ISAL", raising=False)
    else:
        monkeypatch.setenv("PPDIAG_NO_ISAL", "1")


@pytest.mark.parametrize("which", INFLATERS)
@pytest.mark.parametrize("members", [1, 3])
def test_gunzip_fills_one_buffer_of_the_exact_size(
    monkeypatch: pytest.MonkeyPatch, members: int, which: str
) -> None:
    """The gzip trailer sizes the buffer (one member) or it grows (several): same bytes; a cut
    stream keeps a prefix of the data. Either inflater."""
    from ppdiag.parsers.kineto_bytes import gunzip

    _use(monkeypatch, which)
    parts = [bytes(range(256)) * (4096 + 17 * k) for k in range(members)]
    data = b"".join(gzip.compress(p) for p in parts)
    out, cut = gunzip(data, "x.json.gz")
    assert (bytes(out), cut) == (b"".join(parts), False)
    out, cut = gunzip(data[: len(data) // 2], "x.json.gz")
    assert cut and b"".join(parts).startswith(bytes(out))


@pytest.mark.parametrize("which", INFLATERS)
def test_corrupt_gzip_is_named_with_either_inflater(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    from ppdiag.errors import InputError
    from ppdiag.parsers.kineto import parse_file

    _use(monkeypatch, which)
    data = bytearray(gzip.compress(b'{"traceEvents": []}' * 1000))
    data[20:40] = b"\xff" * 20
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match="corrupt gzip"):
        parse_file(p)


def test_isal_and_zlib_give_the_same_timeline_of_a_cut_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real trace whose gzip stream is cut: both inflaters keep the same events."""
    from ppdiag.parsers.kineto import parse_file

    pytest.importorskip("isal")
    raw = shared_trace("kineto/hta_ddp_nccl_rank0.json.gz").read_bytes()
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(raw[: len(raw) * 2 // 3])
    got = []
    for which in INFLATERS:
        _use(monkeypatch, which)
        tl = parse_file(p)
        got.append((tl.events_total, tl.events_lost, tl.warnings, tl.intervals.start.tolist()))
    assert got[0] == got[1]
