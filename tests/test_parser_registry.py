"""Parsers register themselves, as rules do: every parser module of ppdiag/parsers (a name without
``_``) registers one parser, and what the rest of ppdiag knows of formats (the names a directory
scan picks up, the "expected ..." message, the run format of the report) is read off the registry."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import ppdiag.parsers as pkg
from ppdiag.parsers import PARSERS, load_builtin
from ppdiag.parsers.detect import formats_read, is_table_name, is_trace_name, trace_suffixes
from ppdiag.report_types import TraceFormat


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
        assert p.format in set(TraceFormat), f"{name}: run format {p.format!r} is not a TraceFormat"
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
