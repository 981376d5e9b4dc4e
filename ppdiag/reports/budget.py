"""The gate's budget: the limits of ``ppdiag check``, read from a TOML file (docs/budget.md).

``load_budget(path)`` reads ``[budget]`` / ``[regression]`` from a budget file, or
``[tool.ppdiag.budget]`` / ``[tool.ppdiag.regression]`` from ``pyproject.toml``, and refuses an
unknown table or key, a non-number, a negative value or a ratio given as a percentage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppdiag.errors import InputError

try:  # Python >= 3.11
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python 3.10 with the tomli backport installed
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ModuleNotFoundError:
        _toml = None  # type: ignore[assignment]


BUDGET_KEYS: dict[str, str] = {
    "max_lost_ratio": "lost time / step time, mean over ranks",
    "max_bubble_excess": "measured bubble ratio minus the theoretical one",
    "max_stage_ratio": "slowest stage compute / mean stage compute",
    "max_comm_wait_ratio": "recv / NCCL wait time / step time, mean over ranks",
    "max_step_p95_ratio": "step time p95 / median",
}
REGRESSION_KEYS: dict[str, str] = {
    "step_pct": "allowed step-time growth vs the baseline, %",
    "lost_pct": "allowed growth of each cause vs the baseline, points of step time",
}
DEFAULT_STEP_PCT = 5.0

# Keys whose value is a fraction of step time: a value above 1 is almost surely a percentage.
_RATIO_KEYS = ("max_lost_ratio", "max_bubble_excess", "max_comm_wait_ratio")
# Keys whose measured value can never be below 1.
_AT_LEAST_ONE = ("max_stage_ratio", "max_step_p95_ratio")


@dataclass
class Budget:
    """Limits of the gate; ``None`` = not checked."""

    max_lost_ratio: float | None = None
    max_bubble_excess: float | None = None
    max_stage_ratio: float | None = None
    max_comm_wait_ratio: float | None = None
    max_step_p95_ratio: float | None = None
    step_pct: float | None = None  # None = DEFAULT_STEP_PCT when a baseline is given
    lost_pct: float | None = None
    source: str | None = None

    def is_empty(self) -> bool:
        """True when the budget sets no limit at all."""
        return all(getattr(self, k) is None for k in (*BUDGET_KEYS, *REGRESSION_KEYS))


# ----------------------------------------------------------------------------------------------
# loading


def _read_toml(path: Path) -> dict[str, Any]:
    if _toml is None:  # pragma: no cover - only on Python 3.10 without tomli
        raise InputError(str(path), "reading TOML needs Python >= 3.11 or the 'tomli' package")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(str(path), "no such budget file") from None
    except IsADirectoryError:
        raise InputError(str(path), "is a directory, expected a TOML budget file") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(str(path), "not a TOML file (not UTF-8 text)") from None
    try:
        data: dict[str, Any] = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise InputError(str(path), f"not valid TOML: {exc}") from None
    except RecursionError:  # the TOML reader recurses per level of nesting: bounded by Python's stack
        raise InputError(str(path), "not a budget: arrays or tables nested too deeply to read") from None
    return data


def _number(path: str, where: str, key: str, value: Any) -> float:
    # TOML booleans are Python bools, which are ints: refuse them explicitly
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(path, f"{where}.{key} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise InputError(path, f"{where}.{key} must be a finite number, got {value!r}")
    if v < 0:
        raise InputError(path, f"{where}.{key} must not be negative, got {value!r}")
    if key in _RATIO_KEYS and v > 1:
        raise InputError(
            path,
            f"{where}.{key} is a ratio of step time between 0 and 1, got {value!r}"
            f" (for {value!r} % write {v / 100:g})",
        )
    if key in _AT_LEAST_ONE and v < 1:
        raise InputError(
            path, f"{where}.{key} must be >= 1 (the measured ratio is never below 1), got {value!r}"
        )
    return v


def _table(path: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(path, f"[{where}] must be a table, got {type(value).__name__} {value!r}")
    return value


def _unknown(path: str, where: str, keys: list[str], known: list[str]) -> InputError:
    return InputError(
        path, f"unknown key(s) in [{where}]: {', '.join(sorted(keys))} (known: {', '.join(known)})"
    )


def budget_from_dict(data: dict[str, Any], path: str, prefix: str = "") -> Budget:
    """Validate a parsed ``{budget: {...}, regression: {...}}`` mapping into a :class:`Budget`.

    ``prefix`` (``"tool.ppdiag."`` for pyproject.toml) only changes how errors name the tables.
    """
    known_tables = ["budget", "regression"]
    extra = [k for k in data if k not in known_tables]
    if extra:
        where = prefix.rstrip(".") or "top level"
        raise InputError(
            path,
            f"unknown key(s) in [{where}]: {', '.join(sorted(extra))} "
            f"(known: {', '.join(f'[{prefix}{t}]' for t in known_tables)})",
        )
    b = Budget(source=path)
    for tname, keys in (("budget", BUDGET_KEYS), ("regression", REGRESSION_KEYS)):
        if tname not in data:
            continue
        where = f"{prefix}{tname}"
        tab = _table(path, where, data[tname])
        bad = [k for k in tab if k not in keys]
        if bad:
            raise _unknown(path, where, bad, list(keys))
        for k, v in tab.items():
            setattr(b, k, _number(path, where, k, v))
    return b


def load_budget(path: str | Path) -> Budget:
    """Read a budget file (``[budget]``/``[regression]``) or a pyproject.toml (``[tool.ppdiag.*]``).

    Raises :class:`InputError` naming the file for a missing file, invalid TOML, an unknown table
    or key, a non-number, a negative value or a ratio given as a percentage.
    """
    p = Path(path)
    data = _read_toml(p)
    if p.name == "pyproject.toml" or ("tool" in data and "budget" not in data and "regression" not in data):
        # pyproject.toml: other tools' tables and [project] are none of our business
        tool = data.get("tool")
        if not isinstance(tool, dict) or "ppdiag" not in tool:
            raise InputError(str(p), "no [tool.ppdiag.budget] or [tool.ppdiag.regression] table")
        sub = _table(str(p), "tool.ppdiag", tool["ppdiag"])
        return budget_from_dict(sub, str(p), prefix="tool.ppdiag.")
    return budget_from_dict(data, str(p))


def budget_help() -> list[str]:
    """One line per budget key with its meaning (for ``--help`` texts and docs)."""
    out = [f"[budget] {k}: {v}" for k, v in BUDGET_KEYS.items()]
    out += [f"[regression] {k}: {v}" for k, v in REGRESSION_KEYS.items()]
    return out
