"""A finding's evidence (``findings[].evidence``): one typed Struct per rule, as each rule module
defines it (the way a linter's rule carries its own violation type).

:class:`Evidence` holds what every finding's evidence ends with, the fields
:func:`ppdiag.rules.base.finding` stamps on it: the noise the finding is judged against, the steps
the noise model used, a flag for an oversubscribed host and the what-if fix its gain comes from.
A rule's evidence subclasses it with its own fields; as the common fields are keyword-only, the
rule's own come first in the JSON object. A field left :data:`msgspec.UNSET` is not written.

Rules register their evidence type by code (:func:`register_evidence`, called by
:func:`ppdiag.rules.register`); :func:`ppdiag.report_types.decode` reads each finding's evidence
back as the type its code registered, and ``python -m ppdiag.report_schema`` writes every
registered type into the report's JSON schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import msgspec
from msgspec import UNSET, UnsetType


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """The numbers behind a finding (``findings[].evidence``): a rule's own fields, then these."""

    noise_ms: float | UnsetType = UNSET
    """the noise the gain is judged against (ms per step)"""
    steps_used: int | UnsetType = UNSET
    """the steps the noise model used"""
    oversubscribed_host: bool | UnsetType = UNSET
    """present (true) when ranks share oversubscribed host cores"""
    whatif_fix: str | UnsetType = UNSET
    """the what-if scenario the gain comes from (``whatif[].fix``)"""
    whatif_step_ms: float | UnsetType | None = UNSET
    """that scenario's predicted step (ms)"""

    def as_dict(self) -> dict[str, object]:
        """The evidence as the JSON object holds it (unset fields left out), for readers that show
        every field alike (the reports' evidence tables, the report's own checks)."""
        out: dict[str, object] = msgspec.to_builtins(self, enc_hook=_number)
        return out


def _number(o: object) -> object:
    """numpy scalars and arrays (a rule's arithmetic) as Python numbers and lists."""
    item = getattr(o, "item", None)
    if callable(item):
        tolist = getattr(o, "tolist", None)
        return tolist() if callable(tolist) and bool(getattr(o, "ndim", None)) else item()
    raise NotImplementedError(f"cannot encode {type(o).__name__}")


_EVIDENCE: dict[str, type[Evidence]] = {}

#: Finding code -> the evidence type its rule registered (read-only view).
EVIDENCE: Mapping[str, type[Evidence]] = MappingProxyType(_EVIDENCE)


def register_evidence(code: str, kind: type[Evidence]) -> None:
    """Record the evidence type of the rule ``code`` (once; the same type again is a no-op)."""
    if _EVIDENCE.setdefault(code, kind) is not kind:
        raise ValueError(f"evidence of {code} registered twice")


def evidence_type(code: str) -> type[Evidence]:
    """The evidence type of ``code``: its rule's, or :class:`Evidence` (the common fields only) for
    a code no loaded rule registered (a report of a newer version)."""
    return _EVIDENCE.get(code, Evidence)
