"""What Python 3.10 lacks of the 3.11 standard library that ppdiag uses (``requires-python >= 3.10``)."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised by the Python 3.10 install test (tests/test_action.py)

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of Python 3.11: members are strings, and ``str()`` is the value."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = ["StrEnum"]
