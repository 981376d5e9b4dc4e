"""Per-rank lookups that read every replica once: the pipeline neighbours of all ranks from one pass,
process-group member lists read once per distinct list (they were read once per rank: quadratic in
the ranks at a fixed pipeline depth)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppdiag.pipeline.group_members import MemberUnion, TracedMembers
from ppdiag.pipeline.topology import Topology


def _scan(topo: Topology, rank: int) -> tuple[int | None, int | None]:
    """The former per-rank scan of the pipelines: the reference."""
    for line in topo.pipelines:
        if rank in line:
            i, n = line.index(rank), len(line)
            wrap = topo.ring or (topo.virtual > 1 and topo.placement == "loop")
            prev = line[i - 1] if i > 0 else (line[-1] if wrap and n > 1 else None)
            nxt = line[i + 1] if i + 1 < n else (line[0] if wrap and n > 1 else None)
            return prev, nxt
    return None, None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=5), min_size=1, max_size=5),
    st.booleans(),
    st.integers(1, 2),
)
def test_neighbour_map_is_the_scan_of_every_rank(lines: list[list[int]], ring: bool, virtual: int) -> None:
    # repeated ranks (in a line and across lines) keep their first place, as the scan did
    topo = Topology(len(lines[0]), {}, {}, lines, virtual=virtual, ring=ring)
    by_rank = topo.neighbour_map()
    for r in range(14):
        assert topo.neighbours(r) == _scan(topo, r)
        assert by_rank.get(r, (None, None)) == _scan(topo, r)


def test_neighbours_of_two_pipelines() -> None:
    # pp 3 x dp 2: ranks 0-1-2 and 3-4-5; no wrap without a ring
    topo = Topology(3, {}, {}, [[0, 1, 2], [3, 4, 5]])
    want = {0: (None, 1), 1: (0, 2), 2: (1, None), 3: (None, 4), 4: (3, 5), 5: (4, None)}
    assert topo.neighbour_map() == want
    ring = Topology(3, {}, {}, [[0, 1, 2]], ring=True)
    assert ring.neighbours(0) == (2, 1)
    assert ring.neighbours(7) == (None, None)


def test_traced_members_reads_each_list_once_and_answers_as_before() -> None:
    traced = {0, 2, 3, 5}
    tm = TracedMembers(traced)
    shared = [5, 3, 9, 0]
    assert tm.of(shared) == ((0, 3, 5), frozenset({0, 3, 5}))
    # the same object again, an equal copy, and another list
    assert tm.of(shared) is tm.of([5, 3, 9, 0])
    assert tm.of([2, 9]) == ((2,), frozenset({2}))
    assert tm.of(()) == ((), frozenset())


def test_member_union_is_the_union_of_every_list() -> None:
    u = MemberUnion()
    world = [0, 1, 2, 3]
    for _ in range(3):
        u.add("world", world)  # one list shared by every rank
    u.add("world", [0, 1, 2, 3])  # an equal copy
    u.add("dp0", [0, 2])
    u.add("dp0", [2, 4])  # a member list that differs: its members are added
    u.add("other", world)  # the same list under another name counts for that name
    assert u.members == {"world": {0, 1, 2, 3}, "dp0": {0, 2, 4}, "other": {0, 1, 2, 3}}
