"""Parsers register themselves, as rules do: every parser module of ppdiag/parsers (a name without
``_``) registers one parser, and what the rest of ppdiag knows of formats (the names a directory
scan picks up, the "expected ..." message, the run format of the report) is read off the registry.
A new format is a parser module and its test: nothing else lists formats (a throwaway parser
registered here gets a report naming its format)."""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ppdiag.parsers as pkg
from ppdiag.api import Options, diagnose
from ppdiag.model import Intervals, Kind, NameTable, RangeKind, Ranges, RankTimeline
from ppdiag.parsers import PARSERS, ParseOptions, load_builtin, register
from ppdiag.parsers.detect import formats_read, is_table_name, is_trace_name, trace_suffixes
from ppdiag.report_types import decode, dumps
from ppdiag.summary import run_format


def test_every_parser_module_registers_one_parser() -> None:
    load_builtin()
    modules = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if "_" not in m.name)
    by_module = {type(p).__module__.rsplit(".", 1)[-1]: name for name, p in PARSERS.items()}
    assert set(by_module) <= set(modules)
    assert list(PARSERS) == [by_module[m] for m in modules if m in by_module]  # sniffed in name order
    assert {"kineto", "nsys", "optable", "optimeline"} <= set(PARSERS)


def test_what_a_parser_declares() -> None:
    load_builtin()
    for name, p in PARSERS.items():
        assert p.name == name
        assert run_format(p.format) == p.format, name
        assert p.suffixes and all(s == s.lower() and s.startswith(".") for s in p.suffixes), name
        assert p.describe in formats_read(), name
        assert set(p.suffixes) <= set(trace_suffixes()), name


def test_names_read_off_the_registry() -> None:
    for n in ("rank0.pt.trace.json", "r.json.gz", "report_1.sqlite", "a.nsys-rep", "ops.csv", "o.parquet"):
        assert is_trace_name(Path(n)), n
    assert not is_trace_name(Path("notes.txt"))
    # table names: only a format that holds every rank gives them; a .json is a rank's trace too
    assert is_table_name(Path("ops.csv")) and is_table_name(Path("ops.jsonl.gz"))
    assert not is_table_name(Path("timeline.json")) and not is_table_name(Path("rank0.sqlite"))
    assert formats_read().endswith(" or a Chrome op timeline (*.json)")


MS = 1_000_000


class _TinyParser:
    """A format of its own: ``TINY`` then one ``start end`` line (ms) per compute kernel of rank 0,
    all in one step."""

    name = "tiny"
    format = "tiny"
    suffixes: tuple[str, ...] = (".tiny",)
    describe = "a tiny test trace (*.tiny)"
    holds_every_rank = False

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.startswith(b"TINY")

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        rows = [tuple(float(x) * MS for x in ln.split()) for ln in path.read_text().splitlines()[1:]]
        names = NameTable()
        gemm = names.id("gemm_kernel")
        n = len(rows)
        iv = Intervals.from_columns(
            n,
            {
                "start": [round(a) for a, _ in rows],
                "end": [round(b) for _, b in rows],
                "launch": [round(a) for a, _ in rows],
                "kind": [int(Kind.COMPUTE)] * n,
                "name": [gemm] * n,
                "stream": [7] * n,
                "group": [-1] * n,
                "seq": np.full(n, -1, np.int64),
            },
        ).sorted()
        step = Ranges.from_columns(
            1,
            {
                "start": [0],
                "end": [round(max(b for _, b in rows))],
                "kind": [int(RangeKind.STEP)],
                "name": [names.id("ProfilerStep#1")],
                "num": [1],
            },
        )
        return [RankTimeline(0, path.name, self.format, names.names, iv, step, device="cuda:0")]


@pytest.fixture
def tiny() -> Iterator[None]:
    load_builtin()
    register(_TinyParser())
    try:
        yield
    finally:
        del PARSERS["tiny"]


@pytest.mark.usefixtures("tiny")
def test_a_new_format_is_its_parser_alone(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.tiny"
    trace.write_text("TINY\n0 4\n5 9\n")
    rep = diagnose([trace], Options()).result
    assert rep.run.format == "tiny"
    assert rep.summary.compute_ms == pytest.approx(8.0)
    assert decode(dumps(rep)) == rep  # the report's types take it as they are


def test_a_format_no_parser_names_is_refused() -> None:
    with pytest.raises(ValueError, match="'tiny' is not one a registered parser names"):
        run_format("tiny")
