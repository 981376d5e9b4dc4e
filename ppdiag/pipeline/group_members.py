"""Process-group member lists read once per distinct list, not once per rank.

Every rank of a job lists its groups' members: a data-parallel group of ``dp`` ranks on each of
its ``dp`` members, a world group of every rank on every rank. Reading each rank's lists member
by member costs the ranks times the group size, which grows as the square of the ranks at a fixed
pipeline depth (10,240 ranks of 640 replicas: 6.5 M members read for the DP groups alone). Ranks
that share a group mostly share the list object (the op-table reducer hands them the same one) or
hold equal copies (a parse cache decodes one per rank): this reads each distinct list once.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


class TracedMembers:
    """Per member list: its members among ``traced``, sorted, and as a set."""

    def __init__(self, traced: Collection[int]) -> None:
        self._traced = traced
        # id(list) -> (the list, kept alive so that its id is not reused, and its entry)
        self._by_id: dict[int, tuple[Sequence[int], tuple[tuple[int, ...], frozenset[int]]]] = {}
        self._by_value: dict[tuple[int, ...], tuple[tuple[int, ...], frozenset[int]]] = {}

    def of(self, ranks: Sequence[int]) -> tuple[tuple[int, ...], frozenset[int]]:
        """The traced members of ``ranks`` (sorted) and the same as a set."""
        got = self._by_id.get(id(ranks))
        if got is not None and got[0] is ranks:
            return got[1]
        key = tuple(ranks)  # an equal copy (one per rank) hashes in C, not member by member
        entry = self._by_value.get(key)
        if entry is None:
            members = tuple(sorted(r for r in key if r in self._traced))
            entry = self._by_value[key] = (members, frozenset(members))
        self._by_id[id(ranks)] = (ranks, entry)
        return entry


class MemberUnion:
    """Per group name, the union of the member lists its ranks give (each distinct list read once)."""

    def __init__(self) -> None:
        self.members: dict[str, set[int]] = {}
        # (name, id(list)) -> the list, kept alive so that its id is not reused
        self._by_id: dict[tuple[str, int], Sequence[int]] = {}
        self._by_value: set[tuple[str, tuple[int, ...]]] = set()

    def add(self, name: str, ranks: Sequence[int]) -> None:
        """Add ``ranks`` to the members of group ``name``."""
        if self._by_id.get((name, id(ranks))) is ranks:
            return
        self._by_id[(name, id(ranks))] = ranks
        key = (name, tuple(ranks))
        if key not in self._by_value:
            self._by_value.add(key)
            self.members.setdefault(name, set()).update(key[1])


__all__ = ["MemberUnion", "TracedMembers"]
