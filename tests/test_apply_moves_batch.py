"""The waits moved out of ``exposed_comm`` for every rank-step at once split each rank-step exactly
as :func:`apply_moves` splits it alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.attribution.causes import _apply_all_moves
from ppdiag.attribution.collective_waits import apply_moves

_NAMES = ("compute", "host_stall", "comm", "slow_link")
_ns = st.integers(min_value=-5, max_value=10**12)


def test_hand_built_split() -> None:
    # 10 ms exposed; moves of 6 ms compute and 2 ms host stall: all 8 ms move (6 + 2), 2 ms stay.
    # A rank-step with no exposed comm keeps its causes; one whose moves exceed it splits 4 ms
    # as 3 : 1 (3 ms compute, 1 ms host stall).
    causes = {
        (0, 1): {"exposed_comm": 10_000_000, "bubble": 5},
        (1, 1): {"exposed_comm": 0, "bubble": 7},
        (2, 1): {"exposed_comm": 4_000_000},
    }
    moves = {
        (0, 1): {"compute": 6_000_000, "host_stall": 2_000_000},
        (1, 1): {"compute": 1_000_000, "host_stall": 1},
        (2, 1): {"compute": 9_000_000, "host_stall": 3_000_000},
    }
    _apply_all_moves(causes, moves)
    assert causes[(0, 1)] == {
        "exposed_comm": 2_000_000,
        "bubble": 5,
        "compute": 6_000_000,
        "host_stall": 2_000_000,
    }
    assert causes[(1, 1)] == {"exposed_comm": 0, "bubble": 7}
    assert causes[(2, 1)] == {"exposed_comm": 0, "compute": 3_000_000, "host_stall": 1_000_000}


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            _ns,
            st.integers(min_value=0, max_value=3),
            st.lists(_ns, min_size=4, max_size=4),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_batch_equals_one_at_a_time(rows: list[tuple[int, int, list[int]]]) -> None:
    causes: dict[tuple[int, int], dict[str, int]] = {}
    moves: dict[tuple[int, int], dict[str, int]] = {}
    for i, (have, n_names, vals) in enumerate(rows):
        k = (i, i % 3)
        causes[k] = {"exposed_comm": have, "compute": 1}
        # different sets (and orders) of move names in one run, an empty one included
        names = _NAMES[:n_names] if i % 2 else tuple(reversed(_NAMES[:n_names]))
        moves[k] = dict(zip(names, vals, strict=False))
    one = {k: apply_moves(c, moves[k]) if k in moves else c for k, c in causes.items()}
    _apply_all_moves(causes, moves)
    assert causes == one
    assert all(list(causes[k]) == list(one[k]) for k in causes)  # same key order (the report's)
