"""The grammar of host range names: steps, pipeline labels, comm ops, optimizer and data ranges.

:func:`classify_name` is a pure function of the name; :class:`_NameMemo` computes it once per
distinct name (names repeat a lot in traces)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.model import (
    Direction,
    NameTable,
    Phase,
    RangeKind,
)

# host-name classes
N_NONE, N_STEP, N_LABEL, N_PP_COMM, N_PP_OTHER, N_COMM, N_OPTIM, N_DATA, N_BWD_OP, N_MODULE = range(10)
# comm classes (host ops and kernels)
C_NONE, C_P2P, C_COLL, C_COALESCED = range(4)

_RE_STEP = re.compile(r"^ProfilerStep#(\d{1,9})$")
_RE_PP_ACT = re.compile(r"^PP:(\d{1,9})([FBIW])(\d{1,9})$")
_RE_PP_COMM = re.compile(r"^PP:(\d{1,9})(RECV|SEND)_([FBIW])(\d{1,9})$")
_RE_PP_OVERLAP = re.compile(r"^PP:\((\d{1,9})([FBIW])(\d{1,9})[;,]")
_RE_FWDBWD = re.compile(
    r"^(forward|fwd|backward|bwd|wgrad|weight[ _-]?grad)[\s_\-#:.=]*"
    r"(?:mb|micro[ _-]?batch|microbatch|mbatch)?[\s_\-#:.=]*(\d{1,9})$",
    re.IGNORECASE,
)
_RE_BACKEND_TITLE = re.compile(r"^(nccl|gloo|mpi|ucc|xccl|hccl|rccl):")
_RE_TITLE_P2P = re.compile(r"^[a-z]+:(send|recv)\s+(\d{1,9})\s*(->|<-)\s*(\d{1,9})")
_RE_COMM_KERNEL = re.compile(r"nccl|rccl|hccl|msccl", re.IGNORECASE)
_RE_KERNEL_COLL = re.compile(
    r"all_?reduce|all_?gather|reduce_?scatter|broadcast|reduce|all_?to_?all", re.IGNORECASE
)
_RE_KERNEL_SENDRECV = re.compile(r"sendrecv|_send|_recv", re.IGNORECASE)
_RE_ALLTOALL = re.compile(r"all_?to_?all", re.IGNORECASE)

_ACTION_PHASE = {"F": Phase.FWD, "B": Phase.BWD, "I": Phase.BWD, "W": Phase.WGRAD}
_WORD_PHASE = {"forward": Phase.FWD, "fwd": Phase.FWD, "backward": Phase.BWD, "bwd": Phase.BWD}


def _label_phase(word: str) -> Phase:
    w = word.lower()
    if w in _WORD_PHASE:
        return _WORD_PHASE[w]
    return Phase.WGRAD


@dataclass(frozen=True)
class NameInfo:
    """What a host range name means; computed once per distinct name."""

    cls: int
    range_kind: int = -1  # RangeKind or -1 when not kept as a range
    num: int = -1
    stage: int = -1
    mb: int = -1
    phase: int = int(Phase.UNKNOWN)
    direction: int = int(Direction.NONE)
    comm: int = C_NONE
    alltoall: bool = False
    peer_grp: int = -1  # peer's rank in the op's process group (nccl:send a->b)
    my_grp: int = -1  # this rank's rank in that group


def _classify_pp(name: str) -> NameInfo:
    """A ``PP:`` annotation: an action, a comm action, an overlapped pair, else its stage."""
    m = _RE_PP_ACT.match(name)
    if m:
        return NameInfo(
            N_LABEL,
            int(RangeKind.LABEL),
            stage=int(m.group(1)),
            mb=int(m.group(3)),
            phase=int(_ACTION_PHASE[m.group(2)]),
        )
    m = _RE_PP_COMM.match(name)
    if m:
        d = Direction.RECV if m.group(2) == "RECV" else Direction.SEND
        return NameInfo(
            N_PP_COMM,
            int(RangeKind.COMM_OP),
            stage=int(m.group(1)),
            mb=int(m.group(4)),
            phase=int(_ACTION_PHASE[m.group(3)]),
            direction=int(d),
            comm=C_P2P,
        )
    m = _RE_PP_OVERLAP.match(name)
    if m:
        return NameInfo(
            N_PP_OTHER,
            int(RangeKind.OTHER),
            stage=int(m.group(1)),
            mb=int(m.group(3)),
            phase=int(_ACTION_PHASE[m.group(2)]),
        )
    tail = re.match(r"^PP:(\d{1,9})", name)
    return NameInfo(N_PP_OTHER, int(RangeKind.OTHER), stage=int(tail.group(1)) if tail else -1)


def _classify_backend(name: str, m: re.Match[str]) -> NameInfo:
    """A backend span title (``nccl:send 0->1``, ``gloo:all_reduce``) whose prefix ``m`` matched."""
    rest = name[m.end() :]
    mp = _RE_TITLE_P2P.match(name)
    if mp:
        d = Direction.SEND if mp.group(1) == "send" else Direction.RECV
        return NameInfo(
            N_COMM,
            int(RangeKind.COMM_OP),
            direction=int(d),
            comm=C_P2P,
            my_grp=int(mp.group(2)),
            peer_grp=int(mp.group(4)),
        )
    if rest.startswith("send"):
        return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.SEND), comm=C_P2P)
    if rest.startswith("recv"):
        return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.RECV), comm=C_P2P)
    if rest.startswith("coalesced"):
        return NameInfo(N_COMM, int(RangeKind.COMM_OP), comm=C_COALESCED)
    return NameInfo(N_COMM, int(RangeKind.COMM_OP), comm=C_COLL, alltoall=bool(_RE_ALLTOALL.search(rest)))


def classify_name(name: str) -> NameInfo:
    """Classify a host (CPU op / annotation) name. Pure function of the name."""
    if not name:
        return NameInfo(N_NONE)
    c0 = name[0]
    if c0 == "P":
        m = _RE_STEP.match(name)
        if m:
            return NameInfo(N_STEP, int(RangeKind.STEP), num=int(m.group(1)))
        if name.startswith("PP:"):
            return _classify_pp(name)
    if name.startswith("c10d::"):
        op = name[6:]
        if op == "send" or op.startswith("send"):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.SEND), comm=C_P2P)
        if op.startswith("recv"):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP), direction=int(Direction.RECV), comm=C_P2P)
        if op.startswith(("wait", "monitored_barrier", "_coalesc")):
            return NameInfo(N_COMM, int(RangeKind.COMM_OP))
        return NameInfo(N_COMM, int(RangeKind.COMM_OP), comm=C_COLL, alltoall=bool(_RE_ALLTOALL.search(op)))
    if name == "record_param_comms":
        # what it is depends on its args (Collective name)
        return NameInfo(N_COMM, int(RangeKind.COMM_OP))
    m = _RE_BACKEND_TITLE.match(name)
    if m:
        return _classify_backend(name, m)
    if name.startswith("Optimizer."):
        return NameInfo(N_OPTIM, int(RangeKind.OTHER), phase=int(Phase.OPTIM))
    if name.startswith("enumerate(DataLoader)"):
        return NameInfo(N_DATA, int(RangeKind.OTHER), phase=int(Phase.OTHER))
    if name.startswith("autograd::engine::evaluate_function:"):
        return NameInfo(N_BWD_OP)
    if name.startswith("nn.Module: "):
        return NameInfo(N_MODULE, int(RangeKind.MODULE))
    if c0 in "FfBbWw":
        m = _RE_FWDBWD.match(name)
        if m:
            return NameInfo(
                N_LABEL, int(RangeKind.LABEL), mb=int(m.group(2)), phase=int(_label_phase(m.group(1)))
            )
    return NameInfo(N_NONE)


class _NameMemo(dict[Any, NameInfo]):
    """name -> NameInfo, computed on first sight (names repeat a lot in traces)."""

    def __missing__(self, key: Any) -> NameInfo:
        v = classify_name(key if isinstance(key, str) else str(key))
        self[key] = v
        return v


def interned_ids(table: NameTable, names: list[str], idx: npt.NDArray[Any]) -> npt.NDArray[np.int32]:
    """``table.id(names[i])`` for every ``i`` of ``idx`` (a trace's name ids), with one lookup
    per distinct name instead of one per row: the names are interned in the order of their
    first row, so the table assigns the very ids a lookup per row would."""
    if not len(idx):
        return np.zeros(0, dtype=np.int32)
    uniq, first, inv = np.unique(idx, return_index=True, return_inverse=True)
    lut = np.empty(len(uniq), dtype=np.int32)
    for k in np.argsort(first, kind="stable").tolist():
        lut[k] = table.id(names[int(uniq[k])])
    return lut[inv.reshape(-1)]
