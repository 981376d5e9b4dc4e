"""Hand-written test reports as typed :class:`~ppdiag.report_types.Report` values.

A test writes only the figures it is about; :func:`complete` fills every other field of the
report's types with a neutral value (0, "", [], {}, None, false, the first enum member), so the
same hand-checkable dicts serve the typed gate, diff and Markdown code.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi

from ppdiag.report_types import Evidence, Report


def _neutral(t: mi.Type) -> Any:
    if isinstance(t, mi.Metadata):  # an annotated type: its value's
        return _neutral(t.type)
    if isinstance(t, mi.UnionType):
        if any(isinstance(x, mi.NoneType) for x in t.types):
            return None
        return _neutral(t.types[0])
    if isinstance(t, (mi.IntType, mi.FloatType)):
        return 0
    if isinstance(t, mi.StrType):
        return ""
    if isinstance(t, mi.BoolType):
        return False
    if isinstance(t, (mi.ListType, mi.TupleType, mi.VarTupleType)):
        return []
    if isinstance(t, mi.DictType):
        return {}
    if isinstance(t, mi.EnumType):
        return next(iter(t.cls)).value
    if isinstance(t, mi.StructType):
        return _fill({}, t)
    return None


def _fill_value(v: Any, t: mi.Type) -> Any:
    if isinstance(t, mi.UnionType):
        for x in t.types:
            if isinstance(x, mi.StructType) and isinstance(v, dict):
                return _fill(v, x)
            if isinstance(x, mi.ListType) and isinstance(v, list):
                return _fill_value(v, x)
        return v
    if isinstance(t, mi.StructType) and isinstance(v, dict):
        return _fill(v, t)
    if isinstance(t, mi.ListType) and isinstance(v, list):
        return [_fill_value(x, t.item_type) for x in v]
    return v


# a run without its shape is a run without pipeline parallelism
NEUTRAL: dict[tuple[str, str], Any] = {
    ("RunInfo", "pp"): 1,
    ("RunInfo", "virtual_stages"): 1,
    ("RunInfo", "schedule"): "none",
    ("RunInfo", "format"): "kineto",  # a format a registered parser names
}


def _fill(d: dict[str, Any], t: mi.StructType) -> dict[str, Any]:
    out = dict(d)
    for f in t.fields:
        if f.name in out:
            out[f.name] = _fill_value(out[f.name], f.type)
        elif f.required:
            key = (t.cls.__name__, f.name)
            out[f.name] = NEUTRAL[key] if key in NEUTRAL else _neutral(f.type)
    return out


def complete(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with every required report field it lacks filled in (nested sections too)."""
    info = mi.type_info(Report)
    assert isinstance(info, mi.StructType)
    return _fill(d, info)


def typed(d: dict[str, Any] | Report) -> Report:
    """A hand-written report dict (completed) as a :class:`Report`; a Report as it is. Each
    finding's evidence is :func:`hand_evidence` of what the test wrote."""
    if isinstance(d, Report):
        return d
    doc = complete(d)
    rep = msgspec.convert(doc, Report)
    evidence = [hand_evidence(f.get("evidence") or {}) for f in doc.get("findings") or []]
    findings = [msgspec.structs.replace(f, evidence=e) for f, e in zip(rep.findings, evidence, strict=True)]
    return msgspec.structs.replace(rep, findings=findings)


def hand_evidence(ev: dict[str, Any]) -> Evidence:
    """A hand-written evidence object as a typed :class:`Evidence` of its own keys (a test's
    finding needs only the fields it is about, not every field of its rule's evidence type)."""
    own = [(k, Any) for k in ev if k not in Evidence.__struct_fields__]
    kind = msgspec.defstruct("HandEvidence", own, bases=(Evidence,), frozen=True)
    out = msgspec.convert(ev, kind)
    assert isinstance(out, Evidence)
    return out
