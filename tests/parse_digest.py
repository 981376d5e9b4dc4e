"""Digest of a parsed rank: every RankTimeline field but ``source`` (where the file lies), each
column as dtype + bytes. Used to prove that parser changes leave the output identical."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from ppdiag.model import Intervals, Ranges, RankTimeline


def timeline_digest(tl: RankTimeline) -> dict[str, str]:
    """One hash per field (columns one by one, so a failure names the column)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(tl):
        if f.name == "source":
            continue
        v: Any = getattr(tl, f.name)
        if isinstance(v, Intervals | Ranges):
            for c in v.COLUMNS:
                col = getattr(v, c)
                h = hashlib.sha256(col.dtype.str.encode() + col.tobytes()).hexdigest()[:16]
                out[f"{f.name}.{c}"] = h
            continue
        if f.name == "process_groups":
            v = [dataclasses.astuple(g) for g in v]
        text = json.dumps(v, sort_keys=True, default=repr, ensure_ascii=True)
        out[f.name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out
