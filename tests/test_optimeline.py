"""The Chrome op-timeline parser (ppdiag/parsers/optimeline.py) on its own: it registers itself,
takes JSON arrays of op events and nothing the op-table parser takes, and parses a timeline into
the same ranks as the table it was drawn from, under the op table's run format."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppdiag.parsers import PARSERS, ParseOptions, load_builtin
from ppdiag.parsers.detect import read_head
from ppdiag.parsers.optimeline import PARSER
from ppsynth.optable import OpTableParams, simulate_optable, write_chrome, write_table

SMALL = OpTableParams(pp=2, dp=2, microbatches=2, steps=(3, 4))


def test_registered_as_a_format_of_its_own() -> None:
    load_builtin()
    assert PARSERS["optimeline"] is PARSER
    assert PARSER.format == "optable" and PARSER.holds_every_rank
    assert list(PARSERS).index("optimeline") > list(PARSERS).index("kineto")  # sniffed after Kineto


def test_sniffs_timelines_not_tables(tmp_path: Path) -> None:
    df, _ = simulate_optable(SMALL)
    timeline = write_chrome(df, tmp_path / "t.json")
    gz = write_chrome(df, tmp_path / "t.json.gz", gz=True)
    table = write_table(df, tmp_path / "ops.csv")
    lines = write_table(df, tmp_path / "ops.jsonl")
    for p in (timeline, gz):
        assert PARSER.sniff(p, read_head(p)) and not PARSERS["optable"].sniff(p, read_head(p))
    for p in (table, lines):
        assert not PARSER.sniff(p, read_head(p)) and PARSERS["optable"].sniff(p, read_head(p))
    assert not PARSER.sniff(tmp_path / "x.json", b'{"traceEvents": []}')


def test_parses_the_ranks_of_its_table(tmp_path: Path) -> None:
    df, _ = simulate_optable(SMALL)
    from_timeline = PARSER.parse(write_chrome(df, tmp_path / "t.json"), ParseOptions())
    from_table = PARSERS["optable"].parse(write_table(df, tmp_path / "ops.csv"), ParseOptions())
    assert [r.rank for r in from_timeline] == [r.rank for r in from_table] == [0, 1, 2, 3]
    for a, b in zip(from_timeline, from_table, strict=True):
        assert a.format == b.format == "optable"
        assert a.meta["pipeline"] == b.meta["pipeline"] and a.meta["pp_rank"] == b.meta["pp_rank"]
        # the same ops at the same times (the timeline's µs against the table's seconds)
        assert len(a.intervals) == len(b.intervals)
        assert np.abs(np.sort(a.intervals.start) - np.sort(b.intervals.start)).max() <= 1_000
