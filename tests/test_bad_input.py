"""Bad input: one clear InputError line naming the file, never a traceback.

The CLI maps InputError to exit code 2; here the errors are checked where they are raised
(``load_run``).
"""

from __future__ import annotations

import gzip
import json
import random
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_DATA

from ppdiag.errors import InputError
from ppdiag.parsers.loader import load_run


def load_error(paths: list[Path], match: str) -> InputError:
    with pytest.raises(InputError) as ei:
        load_run(paths, progress=False)
    err = ei.value
    text = str(err)
    assert match in text, text
    assert "\n" not in text and "Traceback" not in text
    assert err.exit_code == 2
    return err


def named(err: InputError, path: Path) -> None:
    assert err.path == str(path)
    assert str(err).startswith(f"{path}: ")


def cpu_events() -> list[dict[str, Any]]:
    return [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"hello, this is not json", "not a recognised trace format"),
        (b'{"lr": 0.1, "epochs": 3}', "JSON object without traceEvents"),
        (b"[1, 2, 3]", "a JSON array"),
        (b"", "empty file"),
        (b"  \n\t ", "empty file"),
        (b"\x00\x01\x02binary", "not a recognised trace format"),
    ],
)
def test_not_a_trace(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "trace.json"
    p.write_bytes(content)
    named(load_error([p], match), p)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ('{"schemaVersion": 1, "deviceProperties": []}', "no traceEvents"),
        ('{"schemaVersion": 1, "traceEvents": []}', "empty trace"),
        ('{"schemaVersion": 1, "traceEvents": "oops"}', "not a PyTorch Profiler trace"),
        ('{"schemaVersion": 1, "traceEvents": [1, 2]}', "not a PyTorch Profiler trace"),
        ('{"schemaVersion": 1, "deviceProperties": [}, "traceEvents": []}', "invalid JSON"),
    ],
)
def test_kineto_shaped_but_unusable(tmp_path: Path, doc: str, match: str) -> None:
    p = tmp_path / "rank0.json"
    p.write_text(doc)
    named(load_error([p], match), p)


def test_no_gpu_events_with_devices_or_nccl(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json"
    p.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": "NVIDIA A100"}],
                "traceEvents": cpu_events(),
            }
        )
    )
    err = load_error([p], "no GPU events")
    assert "CUDA devices" in str(err)
    q = tmp_path / "rank1.json"
    q.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "deviceProperties": [],
                "distributedInfo": {"backend": "nccl", "rank": 1},
                "traceEvents": cpu_events(),
            }
        )
    )
    assert "backend is nccl" in str(load_error([q], "no GPU events"))


def test_no_gpu_events_and_no_cpu_ops(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json"
    p.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "deviceProperties": [],
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": "ProfilerStep#1",
                        "pid": 1,
                        "tid": 1,
                        "ts": 0,
                        "dur": 5,
                    },
                    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
                ],
            }
        )
    )
    named(load_error([p], "no GPU events and no CPU ops"), p)


def test_truncated_before_any_gpu_event(tmp_path: Path) -> None:
    doc = json.loads((TEST_DATA / "gpu_pp_rank0.json").read_text())
    evs = doc["traceEvents"]
    cpu_first = [e for e in evs if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")]
    doc["traceEvents"] = cpu_first + [e for e in evs if e not in cpu_first]
    text = json.dumps(doc, indent=1)
    cut = text.index('"cat": "kernel"') - 40
    p = tmp_path / "rank0.json"
    p.write_text(text[:cut])
    # the host ops before the cut are still the rank's work: read (CPU mode), and the loss said
    run = load_run([p], progress=False)
    (tl,) = run.ranks
    assert tl.cpu_only and len(tl.intervals) > 0
    said = " ".join(run.warnings)
    assert "truncated" in said and "cut before its GPU events" in said, said


def test_corrupt_gzip(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4)
    named(load_error([p], "corrupt gzip"), p)
    # damage in the middle of an otherwise valid stream (past the head the loader sniffs): the
    # checksum at the end catches it
    big = json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": cpu_events() * 20000})
    raw = bytearray(gzip.compress(big.encode(), compresslevel=1, mtime=0))
    raw[len(raw) // 2] ^= 0x5A
    with pytest.raises(zlib.error):  # the damage is real
        zlib.decompressobj(wbits=31).decompress(bytes(raw))
    q = tmp_path / "rank1.json.gz"
    q.write_bytes(bytes(raw))
    named(load_error([q], "corrupt gzip"), q)
    # a bad checksum alone
    raw = bytearray(gzip.compress(big.encode(), mtime=0))
    raw[-6] ^= 1
    r = tmp_path / "rank2.json.gz"
    r.write_bytes(bytes(raw))
    named(load_error([r], "corrupt gzip"), r)
    # in a directory too: the file was meant to be a trace
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0.json.gz").write_bytes(p.read_bytes())
    load_error([d], "corrupt gzip")


def test_empty_gzip(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gzip.compress(b""))
    named(load_error([p], "empty file"), p)


def test_missing_path_and_empty_dir(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    named(load_error([missing], "no such file or directory"), missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    named(load_error([empty], "no trace files found"), empty)
    (empty / "rank0.json").write_bytes(b"")
    err = load_error([empty], "no trace files found")
    assert "rank0.json (empty file)" in str(err)
    load_error([], "no input paths")


def test_random_damage_never_escapes_as_another_exception(tmp_path: Path) -> None:
    """Cut, flipped and spliced bytes give a parsed rank or an InputError, nothing else."""
    rng = random.Random(1234)
    base = (TEST_DATA / "gpu_pp_rank0.json").read_bytes()
    cpu = (TEST_DATA / "cpu_gloo_rank0.json").read_bytes()
    outcomes = {"ok": 0, "error": 0}
    for i in range(150):
        src = base if i % 2 else cpu
        data = bytearray(src)
        op = i % 3
        if op == 0:
            data = data[: rng.randrange(1, len(data))]
        elif op == 1:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.choice(b'{}[],:"0a\\ \x00\xff')
        else:
            a, b = sorted(rng.randrange(len(data)) for _ in range(2))
            data = data[:a] + data[b:]
        p = tmp_path / f"rank{i % 2}.json"
        p.write_bytes(bytes(data) if i % 5 else gzip.compress(bytes(data)))
        try:
            run = load_run([p], progress=False)
        except InputError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
        else:
            assert len(run.ranks) == 1
            outcomes["ok"] += 1
    assert outcomes["ok"] > 10 and outcomes["error"] > 10
