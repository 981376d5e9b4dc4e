"""Global ranks for a run written as one report per host (``nsys profile -o node%q{SLURM_NODEID}
torchrun ...`` on every node), where each report numbers its GPU processes from 0.

The evidence, strongest first: a report's own NCCL communicators (a communicator as large as the
world gives each process its global rank; one shared between reports orders them), then the
numbering the file names state (``node1``, ``rank_4``), then, as a last resort said in a warning,
the reports in file-name order, each offset by the ranks of the reports before it. Evidence that
disagrees is an :class:`InputError` naming the files.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np

from ppdiag.errors import InputError
from ppdiag.model import RankTimeline
from ppdiag.parsers.nsys_ranks import ORDER_MARK

_NODE = re.compile(r"(?:^|[^a-z])(?:node|host|nid)[_.-]?(\d+)(?:$|[^0-9])", re.IGNORECASE)
_NUM = re.compile(r"(\d+)(?!.*\d)")


def _stem(source: str) -> str:
    name = Path(source).name
    for suffix in (".sqlite", ".nsys-rep", ".qdrep", ".db"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def needs_renumbering(files: dict[str, list[RankTimeline]]) -> bool:
    """Several reports numbered by GPU order within themselves, whose numbers collide. A report of
    one GPU process without a rank of its own (a host with one GPU among them) joins them."""
    if len(files) < 2 or not any(ORDER_MARK in rs[0].rank_source for rs in files.values()):
        return False
    if not all(ORDER_MARK in r.rank_source or r.rank < 0 for rs in files.values() for r in rs):
        return False
    numbers = [r.rank for rs in files.values() for r in rs]
    return min(numbers) < 0 or len(set(numbers)) < len(numbers)


def renumber_reports(files: dict[str, list[RankTimeline]]) -> list[str]:
    """Give the ranks of ``files`` (source -> its ranks in local order) global numbers, in place;
    returns the warnings that say what was assumed."""
    world = sum(len(rs) for rs in files.values())
    for rs in files.values():
        rs.sort(key=lambda r: r.rank)
    exact = _world_comm_ranks(files, world)
    warnings: list[str] = []
    named = _named_order(files)
    chain = _comm_chain(files)
    if named is not None:
        order, what = named  # a chain that disagrees fails _check_comm_order below
    elif chain is not None:
        order, what = chain, "NCCL communicators shared between the reports"
    else:
        order = sorted(files, key=lambda s: _stem(s))
        what = "report order by file name"
    new, offset = {}, 0
    for src in order:
        new[src] = list(range(offset, offset + len(files[src])))
        offset += len(files[src])
    how = dict.fromkeys(files, what)
    for src, ranks in exact.items():
        if named is not None and ranks != new[src]:
            raise InputError(
                None,
                f"{', '.join(Path(s).name for s in order)}: the NCCL communicator of all {world} ranks "
                f"gives {Path(src).name} ranks {ranks}, the {what} gives {new[src]}; rename the reports "
                "or pass --stage-map",
            )
        new[src], how[src] = ranks, f"NCCL communicator of all {world} ranks"
    if named is None and chain is None and len(exact) < len(files):
        shown = ", ".join(f"{Path(s).name}: {len(files[s])} ranks" for s in order[:8] if s not in exact)
        warnings.append(
            f"{len(files)} reports each number their GPU processes from 0 and nothing in them or their "
            f"names says which node each is: ranks taken by report order by file name, each report "
            f"offset by the ranks of the reports before it ({shown}); name the reports node<N> "
            "(nsys profile -o node%q{SLURM_NODEID}) or pass --stage-map if wrong"
        )
    for src, rs in files.items():
        _renumber(rs, new[src], how[src])
    _check_comm_order(files)
    return warnings


def _renumber(rs: list[RankTimeline], ranks: list[int], how: str) -> None:
    """New numbers for one report's ranks, and for the peers and process-group members its parser
    mapped within the report (numbered like its ranks); peers in other reports are mapped later,
    run-wide (the nsys parser's resolve_run)."""
    lut = np.arange(max(r.rank for r in rs) + 1, dtype=np.int32)  # empty for an unranked process
    known = [(r.rank, g) for r, g in zip(rs, ranks, strict=True) if r.rank >= 0]
    lut[[o for o, _ in known]] = [g for _, g in known]
    for r, g in zip(rs, ranks, strict=True):
        r.rank, r.rank_source = g, how
        for table in (r.intervals, r.ranges):
            inside = (table.peer >= 0) & (table.peer < len(lut))
            table.peer[inside] = lut[table.peer[inside]]
        for pg in r.process_groups:
            pg.ranks = [int(lut[x]) if 0 <= x < len(lut) else x for x in pg.ranks]


def _world_comm_ranks(files: dict[str, list[RankTimeline]], world: int) -> dict[str, list[int]]:
    """Per report whose every process is in an NCCL communicator of the whole world: their ranks
    there (torch's default process group numbers its members by global rank)."""
    out: dict[str, list[int]] = {}
    for src, rs in files.items():
        got = []
        for r in rs:
            hits = [
                int(c["rank"]) for c in (r.meta.get("nccl_comms") or {}).values() if int(c["nranks"]) == world
            ]
            if not hits:
                break
            got.append(hits[0])
        else:
            out[src] = got
    return out


def _named_order(files: dict[str, list[RankTimeline]]) -> tuple[list[str], str] | None:
    """Report order the file names state: a node number (``node1``), or each report's first rank
    (``rank_4``) or consecutive numbers (node indices); None when they state none."""
    stems = {src: _stem(src) for src in files}
    node = {src: _NODE.search(stems[src]) for src in files}
    if all(node.values()):
        idx = {src: int(m.group(1)) for src, m in node.items() if m}
        if len(set(idx.values())) == len(idx):
            return sorted(files, key=lambda s: idx[s]), "node number in the file name"
    nums = {src: _NUM.search(stems[src]) for src in files}
    if not all(nums.values()):
        return None
    idx = {src: int(m.group(1)) for src, m in nums.items() if m}
    order = sorted(files, key=lambda s: idx[s])
    firsts, offset = [], 0
    for src in order:
        firsts.append(offset)
        offset += len(files[src])
    values = [idx[s] for s in order]
    if values == firsts:
        return order, "first rank in the file name"
    if values == list(range(len(order))):
        return order, "node number in the file name"
    return None


def _comm_chain(files: dict[str, list[RankTimeline]]) -> list[str] | None:
    """The reports' order from the communicators they share: a communicator numbers its members in
    global-rank order, so where its rank k is in one report and rank k+1 in another, the first
    report comes before the second. None unless those links put every report in one chain."""
    members: dict[str, list[tuple[int, str]]] = {}
    for src, rs in files.items():
        for r in rs:
            for comm, info in (r.meta.get("nccl_comms") or {}).items():
                members.setdefault(comm, []).append((int(info["rank"]), src))
    after: dict[str, set[str]] = {src: set() for src in files}
    for ms in members.values():
        ms.sort()
        for (_, a), (_, b) in itertools.pairwise(ms):
            if a != b:
                after[a].add(b)
    before = {src: sum(src in nxt for nxt in after.values()) for src in files}
    order: list[str] = []
    ready = [src for src, n in before.items() if n == 0]
    while len(ready) == 1:  # a unique topological order: one report is ready at every step
        src = ready.pop()
        order.append(src)
        for nxt in after[src]:
            before[nxt] -= 1
            if before[nxt] == 0:
                ready.append(nxt)
    return order if len(order) == len(files) else None


def _check_comm_order(files: dict[str, list[RankTimeline]]) -> None:
    """A communicator numbers its members in global-rank order: one whose members, now numbered,
    are out of that order means the reports were placed wrong."""
    members: dict[str, list[tuple[int, int, str]]] = {}
    for src, rs in files.items():
        for r in rs:
            for comm, info in (r.meta.get("nccl_comms") or {}).items():
                members.setdefault(comm, []).append((int(info["rank"]), r.rank, src))
    for comm, ms in sorted(members.items()):
        ms.sort()
        for (la, ga, sa), (lb, gb, sb) in itertools.pairwise(ms):
            if la < lb and ga >= gb and sa != sb:
                raise InputError(
                    None,
                    f"{Path(sa).name} and {Path(sb).name} disagree with their NCCL communicator {comm}: "
                    f"its rank {la} is global rank {ga} and its rank {lb} global rank {gb}, so the reports "
                    "are not in the order their names or their order say; name the reports by node "
                    "(node%q{SLURM_NODEID}) or pass --stage-map",
                )
