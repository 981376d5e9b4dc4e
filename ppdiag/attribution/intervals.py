"""Former home of the interval algebra, now :mod:`ppdiag.model.intervals`.

The algebra sits below the pipeline layer (``pipeline/blocks.py`` needs it), so it moved into the
model. This module *is* that module (``sys.modules`` alias), so code written against the old path
keeps working, monkeypatching included.
"""

from __future__ import annotations

import sys

from ppdiag.model import intervals as _intervals

sys.modules[__name__] = _intervals
