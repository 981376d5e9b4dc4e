"""Communication facts of host ops and kernels (gloo / NCCL): process groups, peers in group
and global ranks, directions and payload sizes from names and args."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from ppdiag.model import (
    Direction,
    ProcessGroup,
)
from ppdiag.parsers.kineto_meta import _ranks_from_arith, parse_rank_list
from ppdiag.parsers.kineto_names import _RE_ALLTOALL, C_COALESCED, C_COLL, C_NONE, C_P2P, N_COMM, NameInfo
from ppdiag.parsers.kineto_schema import _STRICT, _as_int, _raw_json, dtype_size


@dataclass
class _Ctx:
    path: str
    rank: int
    groups: list[ProcessGroup]
    warnings: list[str] = field(default_factory=list)
    comm_unclassified: int = 0  # comm kernels classified without launcher evidence
    # each group's ranks as a set, built once: a group may list 10^6 ranks and every comm op asks
    _members: dict[int, tuple[int, frozenset[int]]] = field(default_factory=dict)
    # comm facts by the args fields they are read from (every field but the sequence number):
    # a rank's comm ops repeat a few groups, peers and shapes thousands of times. Emptied
    # whenever the groups change, since the facts depend on them.
    _comm_memo: dict[tuple[Any, ...], _CommInfo] = field(default_factory=dict)
    _host_memo: dict[tuple[Any, ...], _CommInfo] = field(default_factory=dict)

    def groups_changed(self) -> None:
        """Forget the memoised comm facts: they were read against the groups as they were."""
        self._comm_memo.clear()
        self._host_memo.clear()

    def members(self, i: int) -> frozenset[int]:
        """The ranks of group ``i`` as a set (rebuilt when the group's rank list was filled in)."""
        ranks = self.groups[i].ranks
        got = self._members.get(i)
        if got is None or got[0] != len(ranks):
            got = (len(ranks), frozenset(ranks))
            self._members[i] = got
        return got[1]

    def group_index(self, name: str, desc: str, ranks: list[int] | None) -> int:
        """Index of a process group, adding it when the comm metadata names one not in pg_config."""
        if not name and ranks is None:
            return -1
        for i, g in enumerate(self.groups):
            if name and g.name == name:
                if not g.ranks and ranks:
                    g.ranks = ranks
                    self.groups_changed()
                if not g.desc and desc:
                    g.desc = desc
                    self.groups_changed()
                return i
        if not name:
            for i, g in enumerate(self.groups):
                if ranks and g.ranks == ranks:
                    return i
            name = f"?{len(self.groups)}"
        self.groups_changed()
        self.groups.append(ProcessGroup(name=name, desc=desc, ranks=list(ranks or [])))
        return len(self.groups) - 1

    def to_global(self, grp_rank: int, group: int = -1, my_grp: int = -1) -> int:
        """Global rank of ``grp_rank`` in ``group`` (or in the only plausible group when unknown)."""
        if grp_rank < 0:
            return -1
        if 0 <= group < len(self.groups):
            r = self.groups[group].ranks
            return r[grp_rank] if grp_rank < len(r) else -1
        if not self.groups:
            return grp_rank  # no group information: the default group, where group rank == global rank
        cands: set[int] = set()
        for i, g in enumerate(self.groups):
            if not g.ranks or grp_rank >= len(g.ranks):
                continue
            if self.rank >= 0 and self.rank not in self.members(i):
                continue
            if my_grp >= 0 and (my_grp >= len(g.ranks) or g.ranks[my_grp] != self.rank):
                continue
            cands.add(g.ranks[grp_rank])
        return cands.pop() if len(cands) == 1 else -1


@dataclass
class _CommInfo:
    """Communication facts of one host op or kernel (all -1 / NONE when unknown)."""

    comm: int = C_NONE
    direction: int = int(Direction.NONE)
    peer: int = -1
    peer_grp: int = -1
    my_grp: int = -1
    nbytes: int = -1
    seq: int = -1
    group: int = -1
    alltoall: bool = False


def _coll_class(coll: str) -> tuple[int, int, bool]:
    """(comm class, direction, alltoall) from a ``Collective name`` value."""
    c = coll.lower()
    if c in ("send", "isend"):
        return C_P2P, int(Direction.SEND), False
    if c in ("recv", "irecv", "recv_any_source"):
        return C_P2P, int(Direction.RECV), False
    if c in ("wait", "init", "", "barrier_wait", "unknown"):
        return C_NONE, int(Direction.NONE), False
    if "coalesced" in c and not any(k in c for k in ("gather", "reduce", "scatter")):
        return C_COALESCED, int(Direction.NONE), False
    return C_COLL, int(Direction.NONE), bool(_RE_ALLTOALL.search(c))


# the args fields comm facts are read from, but the sequence number
_COMM_KEY = attrgetter(
    "coll",
    "pg_name",
    "pg_id",
    "pg_ranks",
    "pg_desc",
    "rank_start",
    "rank_stride",
    "group_size",
    "src",
    "dst",
    "peer_rank",
    "dtype",
    "nelems",
)


def _args_comm(a: Any, ctx: _Ctx) -> _CommInfo:
    """Comm facts carried by an event's args (record_param_comms or an NCCL kernel)."""
    if a is None:
        return _CommInfo()
    if type(a) is _STRICT.args:  # strictly typed: equal keys are equal values (no 1 == 1.0 == True)
        key = _comm_key(a)
        got = ctx._comm_memo.get(key)
        if got is None:
            got = _args_comm_of(a, ctx)
            ctx._comm_memo[key] = got
        return _with_seq(got, _as_int(a.seq))
    return _args_comm_of(a, ctx)


def _comm_key(a: Any) -> tuple[Any, ...]:
    """The (hashable) args fields comm facts are read from, but the sequence number."""
    key: tuple[Any, ...] = _COMM_KEY(a)
    if isinstance(a.pg_ranks, list):
        key = (*key[:3], tuple(a.pg_ranks), *key[4:])
    return key


def _with_seq(c: _CommInfo, seq: int) -> _CommInfo:
    """A new copy of ``c`` with sequence number ``seq`` (callers may write the copy)."""
    return _CommInfo(c.comm, c.direction, c.peer, c.peer_grp, c.my_grp, c.nbytes, seq, c.group, c.alltoall)


def _args_comm_of(a: Any, ctx: _Ctx) -> _CommInfo:
    """:func:`_args_comm` read from the fields (no memo)."""
    info = _CommInfo()
    coll = a.coll if isinstance(a.coll, str) else ""
    if coll:
        info.comm, info.direction, info.alltoall = _coll_class(coll)
    info.group = _args_group(a, ctx)
    if info.direction == Direction.SEND:
        info.peer = _as_int(a.dst)
    elif info.direction == Direction.RECV:
        info.peer = _as_int(a.src)
    if info.peer < 0 and info.comm == C_P2P:
        info.peer_grp = _as_int(a.peer_rank)  # for send/recv "Rank" is the peer's group rank
        if info.peer_grp >= 0 and info.group >= 0:
            info.peer = ctx.to_global(info.peer_grp, info.group)
    size = dtype_size(a.dtype)
    nel = _as_int(a.nelems)
    if size > 0 and nel >= 0:
        info.nbytes = nel * size
    info.seq = _as_int(a.seq)
    return info


def _args_group(a: Any, ctx: _Ctx) -> int:
    """The process group an event's args name (by name or id, ranks listed or arithmetic): its index
    in the rank's groups, or -1 when the args name none."""
    name = a.pg_name if a.pg_name not in (None, "") else a.pg_id
    name = "" if name in (None, "", -1) else str(name)
    ranks = parse_rank_list(a.pg_ranks)
    if ranks is None or (not ranks and _as_int(a.group_size) > 1):
        ranks = _ranks_from_arith(_as_int(a.rank_start), _as_int(a.rank_stride), _as_int(a.group_size))
    if ranks is not None and not ranks:
        ranks = None
    desc = a.pg_desc if isinstance(a.pg_desc, str) else ""
    return ctx.group_index(name, desc, ranks) if (name or ranks) else -1


def _shape_bytes(dims: Any, types: Any) -> int:
    """Payload bytes of an op's first tensor argument from ``Input Dims`` / ``Input type``."""
    if not isinstance(dims, list) or not dims:
        return -1
    first = dims[0]
    tname = types[0] if isinstance(types, list) and types else ""
    size = dtype_size(tname)
    if size < 0 or not isinstance(first, list):
        return -1
    if first and isinstance(first[0], list):  # a TensorList
        total = 0
        for t in first:
            if isinstance(t, list):
                total += int(np.prod(t, dtype=np.int64)) if t else 1
        return total * size
    return (int(np.prod(first, dtype=np.int64)) if first else 1) * size


def _host_comm(info: NameInfo, a: Any, ctx: _Ctx) -> _CommInfo:
    """Comm facts of one host comm op from its name and args."""
    if type(a) is not _STRICT.args:
        return _host_comm_of(info, a, ctx)
    # the facts are read from the name's class and comm fields, the args fields but the
    # sequence number, and the raw inputs (peer and size when the args name neither)
    key = (
        info.cls, info.comm, info.direction, info.peer_grp, info.my_grp, info.alltoall,
        *_comm_key(a), bytes(a.concrete), bytes(a.dims), bytes(a.types),
    )  # fmt: skip
    got = ctx._host_memo.get(key)
    if got is None:
        got = _host_comm_of(info, a, ctx)
        ctx._host_memo[key] = got
    return _with_seq(got, _as_int(a.seq) if info.cls == N_COMM else -1)


def _host_comm_of(info: NameInfo, a: Any, ctx: _Ctx) -> _CommInfo:
    """:func:`_host_comm` read from the name and the args (no memo)."""
    out = _CommInfo(
        comm=info.comm,
        direction=info.direction,
        peer_grp=info.peer_grp,
        my_grp=info.my_grp,
        alltoall=info.alltoall,
    )
    if a is None:
        return out
    if info.cls == N_COMM:
        meta = _args_comm(a, ctx)
        if meta.comm != C_NONE or out.comm == C_NONE:
            if meta.comm != C_NONE:
                out.comm, out.alltoall = meta.comm, meta.alltoall
            if meta.direction:
                out.direction = meta.direction
        out.peer = meta.peer
        if meta.peer_grp >= 0 and out.peer_grp < 0:
            out.peer_grp = meta.peer_grp
        out.nbytes, out.seq, out.group = meta.nbytes, meta.seq, meta.group
        if out.comm == C_P2P and out.peer < 0 and out.peer_grp < 0:
            conc = _raw_json(a.concrete)
            # c10d::send / recv_ with record_shapes: [tensors, group, "peer group rank", "tag"]
            if isinstance(conc, list) and len(conc) >= 3:
                out.peer_grp = _as_int(conc[2])
        if out.nbytes < 0:
            out.nbytes = _shape_bytes(_raw_json(a.dims), _raw_json(a.types))
    if out.peer < 0 and out.peer_grp >= 0:
        out.peer = ctx.to_global(out.peer_grp, out.group, out.my_grp)
    return out
