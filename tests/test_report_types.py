"""Typed report sections (ppdiag/report_types.py): the shipped schema is current (every rule's
evidence type in it), docs/json.md names every field and docs/rules.md every rule's evidence field,
and a real report decodes into the types, each finding's evidence as its rule's type."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from ppdiag.api import Options, diagnose
from ppdiag.report_schema import shipped_schema_text
from ppdiag.report_types import (
    SCHEMA_PATH,
    SECTIONS,
    Evidence,
    RankRow,
    Report,
    StageRow,
    Summary,
    decode,
    dumps,
    report_schema,
)
from ppdiag.rules import RULES, load_builtin
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

DOCS = Path(__file__).resolve().parents[1] / "docs" / "json.md"
RULES_DOC = DOCS.with_name("rules.md")


def test_shipped_schema_is_current() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == shipped_schema_text(), (
        "run: python -m ppdiag.report_schema"
    )


def test_schema_types_each_rule_evidence() -> None:
    """A finding's evidence is its rule's type in the schema: one if/then per registered code."""
    load_builtin()
    finding = report_schema()["$defs"]["FindingRow"]
    got = {
        c["if"]["properties"]["code"]["const"]: c["then"]["properties"]["evidence"]["$ref"]
        for c in finding["allOf"]
    }
    assert got == {code: f"#/$defs/{r.evidence.__name__}" for code, r in RULES.items()}
    # each type is its own (no two rules share one, none is the bare common part)
    kinds = [r.evidence for r in RULES.values()]
    assert len(set(kinds)) == len(kinds) and Evidence not in kinds
    assert all(issubclass(k, Evidence) for k in kinds)


def test_rules_doc_names_every_evidence_field() -> None:
    load_builtin()
    text = RULES_DOC.read_text(encoding="utf-8")
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    fields = {f for r in RULES.values() for f in r.evidence.__struct_fields__}
    assert sorted(fields - words) == []


def test_docs_name_every_field() -> None:
    text = DOCS.read_text(encoding="utf-8")
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    missing = [f"{name}.{f}" for name, t in SECTIONS.items() for f in t.__struct_fields__ if f not in words]
    assert missing == []
    # and the sections themselves are headings of docs/json.md's field list
    for name in SECTIONS:
        assert re.search(rf"^{name}(\[\])?\s", text, re.M), name
    # nested objects too (run.peers, peers.links[], gate.checks[], gate.coverage, Dist)
    # the report's own types (each rule's evidence fields are in docs/rules.md)
    nested = [
        f"{name}.{f}"
        for name, d in report_schema(evidence={})["$defs"].items()
        for f in d.get("properties", {})
        if f not in words
    ]
    assert nested == []


def test_every_report_field_is_in_the_schema() -> None:
    """The schema is the Report's: every section a property; the sections later versions added
    (absent from older reports), ``hang`` (only when the run stopped) and ``gate`` (only in ``check``
    reports) the optional ones."""
    sch = report_schema(evidence={})
    top = sch["$defs"]["Report"]
    assert list(top["properties"]) == list(Report.__struct_fields__)
    assert set(top["required"]) == set(Report.__struct_fields__) - {
        "critical_path",
        "hang",
        "memory",
        "links",
        "kernels",
        "gate",
    }


def test_report_decodes_into_the_types(tmp_path: Path) -> None:
    write_kineto(make_scenario(steps=2), tmp_path)
    # the JSON form (plain dicts): what the file holds and what the types decode
    rep = msgspec.to_builtins(diagnose([tmp_path], Options()).result)
    s = msgspec.convert(rep["summary"], Summary)
    assert s.step_ms is not None and s.step_ms > 0
    stages = msgspec.convert(rep["stages"], list[StageRow])
    ranks = msgspec.convert(rep["ranks"], list[RankRow])
    assert [x.stage for x in stages] == [0, 1, 2, 3] and len(ranks) == 4
    # every key the report writes is a declared field, in the declared order
    assert list(rep["summary"]) == list(Summary.__struct_fields__)
    assert list(rep["stages"][0]) == list(StageRow.__struct_fields__)
    assert list(rep["ranks"][0]) == list(RankRow.__struct_fields__)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**rep["ranks"][0], "steps": "two"}, RankRow)


def test_report_round_trips_byte_identical(tmp_path: Path) -> None:
    """The file is the typed report's encoding: decode and encode again, the same bytes."""
    write_kineto(make_scenario(steps=2, dp=2), tmp_path / "run")
    diag = diagnose([tmp_path / "run"], Options())
    text = dumps(diag.result)
    again = decode(text)
    assert again == diag.result
    # each finding's evidence decodes as its rule's type
    assert again.findings and all(type(f.evidence) is RULES[f.code].evidence for f in again.findings)
    assert dumps(again) == text
    # the plain-data form of the result is the file's content
    assert msgspec.to_builtins(diag.result) == msgspec.json.decode(text)
    with pytest.raises(msgspec.ValidationError, match=r"\$\.summary\.step_ms"):
        decode(text.replace('"step_ms": ', '"step_ms": "x", "_": ', 1))
