"""Trace metadata: the rank (``distributedInfo`` or the file name), process groups and their
rank lists, and the range checks on top-level numbers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError
from ppdiag.model import (
    ProcessGroup,
)
from ppdiag.parsers.kineto_schema import _MAX_NS, _MAX_RANK


def parse_rank_list(v: Any) -> list[int] | None:
    """Ranks given as a JSON list or as a string "[0, 1, 2]"; None when truncated ("..."), absent."""
    if isinstance(v, list):
        try:
            return [int(x) for x in v]
        except (TypeError, ValueError):
            return None
    if isinstance(v, str):
        if "..." in v:
            return None
        nums = re.findall(r"-?\d{1,12}", v)
        return [int(x) for x in nums] if nums or v.strip() == "[]" else None
    return None


_RE_FILE_RANK = re.compile(r"(?:^|[^a-z0-9])(rank|worker)[-_ ]?(\d{1,9})(?![0-9])", re.IGNORECASE)


def rank_from_filename(path: Path) -> int | None:
    """Rank from names like ``rank3``, ``rank-3``, ``rank_3``, ``worker3``, ``worker-3`` (file name
    first, then its directory). ``rank`` wins over ``worker``."""
    for part in (path.name, path.parent.name):
        found = {m.group(1).lower(): int(m.group(2)) for m in reversed(list(_RE_FILE_RANK.finditer(part)))}
        if "rank" in found:
            return found["rank"]
        if "worker" in found:
            return found["worker"]
    return None


def _ranks_from_arith(start: int, stride: int, size: int) -> list[int] | None:
    if start >= 0 and stride > 0 and size > 0:
        return [start + stride * i for i in range(size)]
    return None


def _check_fields(dist: dict[str, Any], base: Any, path: str) -> None:
    """Refuse top-level numbers no profiler writes, naming the field (not a crash later)."""
    for key in ("rank", "world_size"):
        v = dist.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (-1 <= v < _MAX_RANK):
            raise InputError(path, f"distributedInfo.{key} = {v!r} is out of range (0..{_MAX_RANK - 1})")
    b = base
    if isinstance(b, str):
        try:
            b = float(b)
        except ValueError:
            return  # not a number at all: warned about, and the timestamps read as absolute
    if isinstance(b, (int, float)) and not isinstance(b, bool) and not (abs(b) < _MAX_NS):
        raise InputError(path, f"baseTimeNanoseconds = {base!r} is out of range (more than 2^62 ns)")


def _process_groups(dist: dict[str, Any]) -> list[ProcessGroup]:
    out: list[ProcessGroup] = []
    cfg = dist.get("pg_config")
    if not isinstance(cfg, list):
        return out
    for g in cfg:
        if not isinstance(g, dict):
            continue
        name = g.get("pg_name", g.get("uid", ""))
        desc = g.get("pg_desc", "")
        ranks = parse_rank_list(g.get("ranks"))
        out.append(
            ProcessGroup(
                name="" if name is None else str(name),
                desc=desc if isinstance(desc, str) else str(desc),
                ranks=ranks or [],
                backend=str(g.get("backend_config", "") or ""),
            )
        )
    return out
