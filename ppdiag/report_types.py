"""The JSON report (``docs/json.md``) as one typed value: :class:`Report` and its sections.

Every section is a frozen :class:`msgspec.Struct` (field order = the JSON key order); the report is
built as a :class:`Report` by :mod:`ppdiag.api`, written by :func:`dumps` (encoded by msgspec) and
read back by :func:`decode` (``msgspec.json.decode(..., type=Report)``, each finding's evidence as
the type its rule registered, :mod:`ppdiag.report_evidence`), so ``check``, ``diff`` and the
reporters take the same typed value the analysis produced. ``report.schema.json`` next to this
module is :func:`report_schema` written out with every rule's evidence (``python -m
ppdiag.report_schema`` regenerates it; a test keeps it current and checks that ``docs/json.md``
names every field and ``docs/rules.md`` every rule's evidence field).

A section added later is one more Struct and one optional :class:`Report` field defaulting to
None: ``Report`` omits default-valued fields, so reports without it keep their bytes.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from ppdiag.compat import StrEnum
from ppdiag.model.memory_row import MemoryRow
from ppdiag.model.schedule import Schedule as Schedule

# run.structure's types, re-exported: every section type of the report is importable from here
from ppdiag.model.structure import Confidence as Confidence
from ppdiag.model.structure import Fact as Fact
from ppdiag.model.structure import FactSource as FactSource
from ppdiag.model.structure import Structure as Structure
from ppdiag.report_evidence import EVIDENCE, evidence_type
from ppdiag.report_evidence import Evidence as Evidence
from ppdiag.report_sections import PATH_CATEGORIES as PATH_CATEGORIES
from ppdiag.report_sections import Cause as Cause
from ppdiag.report_sections import CriticalStep as CriticalStep
from ppdiag.report_sections import Hang as Hang
from ppdiag.report_sections import Kernel as Kernel
from ppdiag.report_sections import LastOp as LastOp
from ppdiag.report_sections import LayerSplit as LayerSplit
from ppdiag.report_sections import LinkRow as LinkRow
from ppdiag.report_sections import PathPiece as PathPiece
from ppdiag.report_sections import RankKernels as RankKernels
from ppdiag.report_sections import StageShare as StageShare
from ppdiag.report_sections import Wait as Wait
from ppdiag.report_sections import path_by_stage as path_by_stage

#: The shipped schema of the report.
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


class Severity(StrEnum):
    """How much a finding stands out of the run's noise."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"


#: The trace format of a run (``run.format``): the ``format`` a registered parser names
#: (:mod:`ppdiag.parsers`), checked against the registry when the report is built. A string, not an
#: enum here: a new format is a parser module (and its test), nothing in the report's types.
TraceFormat = Annotated[
    str, msgspec.Meta(description="the run's trace format: the format a registered parser names")
]


class GateStatus(StrEnum):
    """The gate's verdict (exit 0, 1, 3)."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class CheckState(StrEnum):
    """One gate check's outcome: ``skip`` (a budget check not computable here) or
    ``inconclusive`` (a regression check with nothing comparable)."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"
    INCONCLUSIVE = "inconclusive"


class MemoryBasis(StrEnum):
    """What a what-if row's memory figures rest on (``whatif[].memory_basis``)."""

    MEASURED = "measured"  # the measured row of a run with allocator events
    CALIBRATED = "calibrated"  # predicted, on the activation memory per micro-batch the run measured
    PREDICTED = "predicted"  # no allocator events: the schedule's micro-batches in flight only


class CheckKind(StrEnum):
    """A budget limit on the run, or a regression against the baseline."""

    BUDGET = "budget"
    REGRESSION = "regression"


class Tool(msgspec.Struct, frozen=True):
    """The program that wrote the report (``tool``)."""

    name: str
    version: str


class PeerLink(msgspec.Struct, frozen=True):
    """The timing fit of one directed p2p link (``run.peers.links[]``)."""

    src: int
    dst: int
    ops: int
    shift_us: float
    tol_us: float


class Peers(msgspec.Struct, frozen=True):
    """How the p2p partners were decided (``run.peers``)."""

    source: str
    decided_by_timing: int
    decided_by_labels: int
    undecided: int
    confidence: float | None
    coarse_clock: str
    links: list[PeerLink]


class HostClockInfo(msgspec.Struct, frozen=True):
    """One clock domain (a host) and its fitted offset (``run.clocks[]``, docs/clocks.md)."""

    host: str
    ranks: list[int]
    offset_us: float
    residual_us: float | None
    method: str


class RunInfo(msgspec.Struct, frozen=True):
    """What was analyzed and how the pipeline was rebuilt (``run``)."""

    world_size: int
    ranks: list[int]
    pp: int
    stage_map: dict[str, int]
    stage_source: str
    virtual_stages: int
    schedule: Schedule
    microbatches: int | None
    steps: list[int]
    clock_residual_us: float | None
    clock_method: str
    clock_residual_by_rank_us: dict[str, float]
    peer_source: str
    peers: Peers | None
    clock_offsets_us: dict[str, float]
    format: TraceFormat
    cpu_only: bool
    sources: dict[str, str]
    rank_sources: dict[str, str]
    warnings: list[str]
    structure: Structure | None = None
    clocks: list[HostClockInfo] = msgspec.field(default_factory=list)


class Dist(msgspec.Struct, frozen=True):
    """Distribution of per-micro-batch block compute (ms)."""

    mean: float
    p50: float
    p95: float
    n: int


class Summary(msgspec.Struct, frozen=True):
    """Run-level step time and lost time (``summary``)."""

    step_ms: float | None
    step_p95_ms: float | None
    step_mean_ms: float | None
    compute_ms: float | None
    lost_ratio: float | None
    lost_ms: dict[str, float]
    shares: dict[str, float] | None
    steps_ms: list[float]
    slowest_stage: int | None
    stage_ratio: float | None


class Bubble(msgspec.Struct, frozen=True):
    """Measured pipeline waits vs the schedule's theoretical bubble (``bubble``)."""

    measured_ratio: float | None
    theoretical_ratio: float | None


class RankRow(msgspec.Struct, frozen=True):
    """One rank's time accounting, mean per step (``ranks[]``)."""

    rank: int
    stage: int | None
    pipeline: int | None  # DP replica index of the rank's pipeline (null without PP)
    steps: int
    step_ms: float
    compute_ms: float
    exposed_p2p_ms: float
    exposed_collective_ms: float
    exposed_copy_ms: float
    idle_ms: float
    lost_ms: dict[str, float]
    shares: dict[str, float]


class StageRow(msgspec.Struct, frozen=True):
    """One pipeline stage (``stages[]``)."""

    stage: int
    ranks: list[int]
    chunks: list[int]
    fwd_ms: Dist | None
    bwd_ms: Dist | None
    wgrad_ms: Dist | None
    compute_ms: float | None
    block_ms: float | None
    lost_ms: dict[str, float]
    fwd_samples_ms: list[float]
    bwd_samples_ms: list[float]
    wgrad_samples_ms: list[float]


class NoiseInfo(msgspec.Struct, frozen=True):
    """What the run varies by without a fault (``noise``); severity is judged against it."""

    steps_used: int
    first_step_excluded: bool
    step_spread_ms: float | None
    step_error_ms: float | None
    latency_jitter_ms: float | None
    critical_transfers: int
    comm_jitter_ms: float | None
    base_noise_ms: float | None
    shared_host: bool
    oversubscribed: bool
    contention_ms: float | None


class FindingRow(msgspec.Struct, frozen=True):
    """One diagnosed problem (``findings[]``); ``gain_ms`` None: not computed."""

    code: str
    cause: Cause | None
    title: str
    severity: Severity
    stages: list[int]
    ranks: list[int]
    gain_ms: float | None
    gain_pct: float | None
    evidence: Evidence  # the rule's own type (ppdiag.report_evidence), registered by its code
    fixes: list[str]


class WhatifRow(msgspec.Struct, frozen=True):
    """One predicted scenario (``whatif[]``); ``fix`` is its key (what a finding's gain names)."""

    scenario: str
    measured: bool
    schedule: str
    pp: int
    virtual: int
    microbatches: int
    step_ms: float | None
    speedup: float | None
    step_speedup: float | None
    bubble_ratio: float | None
    schedule_bubble_ratio: float | None
    closed_form_bubble: float | None
    lost_ms: dict[str, float]
    samples_vs_measured: float | None
    ms_per_sample: float | None
    peak_inflight: int | None
    activation_vs_measured: float | None
    peak_activation_mb: float | None
    stage_ms: list[float]
    split: LayerSplit | None
    calibration: str
    note: str
    error: str | None
    fix: str
    # added after the first reports: older JSON has no memory_basis and decodes as predicted
    memory_basis: MemoryBasis = MemoryBasis.PREDICTED


class GateCheck(msgspec.Struct, frozen=True):
    """One check of the gate (``gate.checks[]``)."""

    name: str
    kind: CheckKind
    measured: float | None
    limit: float | None
    state: CheckState
    text: str
    note: str


class GateCoverage(msgspec.Struct, frozen=True):
    """Which ranks and steps the gate's figures come from (``gate.coverage``)."""

    world_size: int
    traced: list[int]
    analyzed: list[int]
    steps: list[int]
    missing: list[int]
    no_steps: list[int]
    skipped_files: list[str]
    doubts: list[str]


class Gate(msgspec.Struct, frozen=True):
    """The verdict of ``ppdiag check`` (``gate``)."""

    status: GateStatus
    exit_code: int
    reasons: list[str]
    budget: str | None
    baseline: str | None
    checks: list[GateCheck]
    coverage: GateCoverage | None
    partial: list[str]
    allow_partial: bool
    warnings: list[str]


class Report(msgspec.Struct, frozen=True, omit_defaults=True):
    """The whole JSON report. Optional sections default to None and are left out when absent
    (``gate`` is only in reports ``ppdiag check`` writes)."""

    schema_version: int
    tool: Tool
    run: RunInfo
    summary: Summary
    bubble: Bubble
    stages: list[StageRow]
    ranks: list[RankRow]
    findings: list[FindingRow]
    whatif: list[WhatifRow]
    noise: NoiseInfo
    critical_path: list[CriticalStep] | None = None
    hang: Hang | None = None  # only when the run stopped or its traces were cut mid-step
    memory: list[MemoryRow] | None = None
    links: list[LinkRow] | None = None
    kernels: list[RankKernels] | None = None  # each rank's top compute kernels (ppdiag.facts)
    gate: Gate | None = None

    def check(self) -> list[str]:
        """Every claim of this report that another part of it contradicts, one line each (empty:
        it agrees with itself); the checks are :func:`ppdiag.report_check.violations`."""
        from ppdiag.report_check import violations

        return violations(self)


#: JSON section name -> its type (a list section holds rows of that type).
SECTIONS: dict[str, type[msgspec.Struct]] = {
    "tool": Tool,
    "run": RunInfo,
    "summary": Summary,
    "bubble": Bubble,
    "stages": StageRow,
    "ranks": RankRow,
    "findings": FindingRow,
    "whatif": WhatifRow,
    "noise": NoiseInfo,
    "critical_path": CriticalStep,
    "hang": Hang,
    "memory": MemoryRow,
    "links": LinkRow,
    "kernels": RankKernels,
    "gate": Gate,
}


def _enc_hook(o: object) -> object:
    """numpy scalars and arrays (in free-form evidence) as Python numbers and lists."""
    item = getattr(o, "item", None)
    if callable(item):
        tolist = getattr(o, "tolist", None)
        array = bool(getattr(o, "ndim", None))
        return tolist() if callable(tolist) and array else item()
    raise NotImplementedError(f"cannot encode {type(o).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode(value: msgspec.Struct | list[Any]) -> bytes:
    """Compact JSON of a report or a section (NaN and infinities become null; a lone surrogate,
    what an undecodable byte of a file name decodes to, becomes its JSON escape)."""
    try:
        return _ENCODER.encode(value)
    except UnicodeEncodeError:  # msgspec refuses lone surrogates: the standard library writes them
        doc = msgspec.to_builtins(value, enc_hook=_enc_hook)
        text = json.dumps(_finite(doc), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return _escape_surrogates(text).encode("utf-8")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogates(text: str) -> str:
    """JSON text with each lone surrogate (only ever inside a string: an undecodable byte of a file
    name) written as the backslash escape Python's ``backslashreplace`` gives (``\\xff``), so the
    text is valid UTF-8 and every JSON reader takes it."""
    return _SURROGATE.sub(_backslashed, text)


def _backslashed(m: re.Match[str]) -> str:
    c = ord(m.group())
    b = "\\"  # one backslash; written twice below, as JSON text escapes it
    return b + b + (f"x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"u{c:04x}")


def _finite(o: Any) -> Any:
    """``o`` with NaN and infinities as None, as msgspec's encoder writes them."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


def dumps(report: Report, marker: dict[str, object] | None = None) -> str:
    """The report file's text: ``marker`` first (``{"ppdiag": {...}}``), then the report, indented
    by 2 with non-ASCII kept: the text of ``json.dumps({**marker, **doc}, indent=2,
    ensure_ascii=False)``. msgspec encodes and indents; its few floats that the standard library
    writes otherwise are rewritten in the text (:func:`ppdiag.report_text.stdlib_floats`), not by
    decoding and encoding the report again (:func:`_dumps_stdlib`, which a marker key that is also
    a report field still takes)."""
    from ppdiag.report_text import stdlib_floats

    m = marker or {}
    body = encode(report)
    if set(m) & set(Report.__struct_encode_fields__) or not body.startswith(b"{"):
        return _dumps_stdlib(report, marker)
    if m:
        head = msgspec.json.encode(m)
        body = b"{" + head[1:-1] + (b"," if body != b"{}" else b"") + body[1:]
    text: bytes = msgspec.json.format(stdlib_floats(body), indent=2)
    return text.decode("utf-8")


def _dumps_stdlib(report: Report, marker: dict[str, object] | None = None) -> str:
    """:func:`dumps` through the standard library's compact text (its float reprs)."""
    doc = json.loads(encode(report))
    if marker:
        doc = {**marker, **doc}
    # the same text as ``json.dumps(doc, indent=2, ensure_ascii=False)``: the standard library's C
    # encoder writes the compact text (its float reprs), msgspec only indents it (it copies every
    # token as it is); the indenting encoder of the standard library is pure Python, seconds on a
    # report of tens of MB. Lone surrogates (undecodable file names) are written as JSON escapes.
    compact = _escape_surrogates(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
    text: bytes = msgspec.json.format(compact.encode("utf-8"), indent=2)
    return text.decode("utf-8")


def to_builtins(report: Report) -> dict[str, Any]:
    """The report as the JSON file holds it, as plain dicts and lists (for readers of the file's
    shape; typed code reads the :class:`Report`)."""
    doc: dict[str, Any] = msgspec.json.decode(encode(report))
    return doc


class _RawFinding(msgspec.Struct):
    code: str
    evidence: msgspec.Raw


class _RawFindings(msgspec.Struct):
    findings: list[_RawFinding] = msgspec.field(default_factory=list)


def decode(data: bytes | str) -> Report:
    """A report file's bytes as a :class:`Report` (:class:`msgspec.ValidationError` or
    :class:`msgspec.DecodeError` when it is not one; the marker and unknown keys are ignored).
    Each finding's evidence is the type its code registered (the rules loaded: ``ppdiag.rules.
    load_builtin``), else the common :class:`Evidence` fields only."""
    report = msgspec.json.decode(data, type=Report)
    if not report.findings:
        return report
    raw = msgspec.json.decode(data, type=_RawFindings).findings
    return _with_evidence(report, [_evidence(msgspec.json.decode(r.evidence), r.code) for r in raw])


def from_builtins(doc: Mapping[str, Any]) -> Report:
    """The report of a plain-data document (what :func:`to_builtins` gives), each finding's evidence
    typed as :func:`decode` types it (:class:`msgspec.ValidationError` when it is not a report)."""
    report = msgspec.convert(doc, Report)
    raw = doc.get("findings") or []
    return _with_evidence(report, [_evidence(f["evidence"], f["code"]) for f in raw])


def _evidence(doc: object, code: str) -> Evidence:
    """A finding's evidence object as the type its code registered; an object that is not one (a
    report written before one of its fields existed, a hand-written one) keeps the common fields
    (:class:`Evidence`) rather than refusing the whole report."""
    try:
        typed: Evidence = msgspec.convert(doc, evidence_type(code))
    except msgspec.ValidationError:
        typed = msgspec.convert(doc, Evidence)
    return typed


def _with_evidence(report: Report, evidence: list[Evidence]) -> Report:
    """``report`` with each finding's evidence replaced by the typed one (same order)."""
    typed = [msgspec.structs.replace(f, evidence=e) for f, e in zip(report.findings, evidence, strict=True)]
    return msgspec.structs.replace(report, findings=typed)


def _schema_hook(t: object) -> dict[str, Any]:
    """Any JSON value for an ``object`` field (``run.structure``'s fact values: a count, a list, a
    map, as the fact is)."""
    if t is object:
        return {"description": "any JSON value"}
    raise NotImplementedError(f"no JSON Schema for {t!r}")


def report_schema(evidence: Mapping[str, type[Evidence]] | None = None) -> dict[str, Any]:
    """JSON Schema of the whole report, as the report writes it: a finding's ``evidence`` is the
    type its ``code`` registered (``evidence``, default: the rules loaded now), the common fields
    for any other code."""
    kinds = dict(sorted((EVIDENCE if evidence is None else evidence).items()))
    (part, *_), defs = msgspec.json.schema_components(
        (Report, *kinds.values()), schema_hook=_schema_hook, ref_template="#/$defs/{name}"
    )
    if kinds:
        defs["FindingRow"]["allOf"] = [
            {
                "if": {"properties": {"code": {"const": code}}},
                "then": {"properties": {"evidence": {"$ref": f"#/$defs/{kind.__name__}"}}},
            }
            for code, kind in kinds.items()
        ]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ppdiag report",
        **part,
        "$defs": defs,
    }


def schema_text(evidence: Mapping[str, type[Evidence]] | None = None) -> str:
    """:func:`report_schema` as the shipped file holds it."""
    return json.dumps(report_schema(evidence), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    # the schema holds every rule's evidence type: the rules are above this module, so the file is
    # written from there
    sys.stderr.write("the schema is written by: python -m ppdiag.report_schema\n")
    sys.exit(2)
