"""Column tables keep numpy's canonical dtype objects, also after a trip through pickle (a parse
worker's result): ufunc.at (np.add.at, np.minimum.at) takes its fast loop only for those."""

from __future__ import annotations

import pickle

import numpy as np

from ppdiag.model import Intervals
from ppdiag.model.timeline import Ranges


def _canonical(t: Intervals | Ranges) -> list[str]:
    """The columns whose dtype is not numpy's own object for it."""
    return [c for c in t.COLUMNS if getattr(t, c).dtype is not np.dtype(getattr(t, c).dtype.str)]


def test_unpickled_columns_have_canonical_dtypes() -> None:
    iv = Intervals.from_columns(3, {"start": [1, 2, 3], "end": [2, 3, 4], "peer": [0, 1, -1]})
    rg = Ranges.from_columns(2, {"start": [1, 5], "end": [2, 6]})
    for t in (iv, rg):
        back = pickle.loads(pickle.dumps(t))
        assert _canonical(back) == []
        for c in t.COLUMNS:
            assert np.array_equal(getattr(back, c), getattr(t, c))


def test_columns_built_from_unpickled_arrays_are_canonical() -> None:
    cols = pickle.loads(pickle.dumps({c: np.zeros(4, dt) for c, dt in Intervals.DTYPES.items()}))
    assert any(a.dtype is not np.dtype(a.dtype.str) for a in cols.values())  # what pickle gives
    assert _canonical(Intervals(**cols)) == []
