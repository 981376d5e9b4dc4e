"""Name rules of the nsys reader: comm kernels, NCCL API ranges, steps and pipeline labels.

All rules run once per *distinct* name; callers broadcast the answers to events through the
name codes, so the cost does not grow with the number of events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ppdiag.model.timeline import Direction, Kind, Phase, RangeKind

# --- GPU kernels -------------------------------------------------------------------------------

_COMM_KERNEL = re.compile(r"(^|[^a-z])(nccl|rccl|hccl)", re.IGNORECASE)
_P2P_KERNEL = re.compile(r"sendrecv|(^|_)send(_|\(|$)|(^|_)recv(_|\(|$)", re.IGNORECASE)
_SEND_ONLY = re.compile(r"(^|_)send(_|\(|$)", re.IGNORECASE)
_RECV_ONLY = re.compile(r"(^|_)recv(_|\(|$)", re.IGNORECASE)


@dataclass(frozen=True)
class KernelClass:
    """What a kernel name alone says."""

    kind: Kind
    direction: Direction = Direction.NONE
    sendrecv: bool = False  # a SendRecv kernel: P2P unless the launch says otherwise


def classify_kernel(name: str) -> KernelClass:
    """Compute vs NCCL/RCCL comm kernel, from the (short or demangled) name.

    NCCL names (KINETO.md §7.3): ``ncclKernel_<Coll>_...`` (<= 2.18), ``ncclDevKernel_<Coll>...``;
    ``SendRecv`` carries p2p but also all-to-all, so it is only a default.
    """
    base = name.split("(", 1)[0]
    if base.startswith("void "):
        base = base[5:]
    if not _COMM_KERNEL.search(base):
        return KernelClass(Kind.COMPUTE)
    if "sendrecv" in base.lower():
        return KernelClass(Kind.P2P, Direction.NONE, sendrecv=True)
    if _P2P_KERNEL.search(base):
        if _SEND_ONLY.search(base) and not _RECV_ONLY.search(base):
            return KernelClass(Kind.P2P, Direction.SEND)
        if _RECV_ONLY.search(base) and not _SEND_ONLY.search(base):
            return KernelClass(Kind.P2P, Direction.RECV)
        return KernelClass(Kind.P2P, Direction.NONE)
    return KernelClass(Kind.COLLECTIVE)


# --- NCCL API ranges (NVTX domain "NCCL") -------------------------------------------------------

NCCL_P2P_APIS = {"ncclsend": Direction.SEND, "ncclrecv": Direction.RECV}
NCCL_COLLECTIVE_APIS = {
    "ncclallreduce",
    "ncclallgather",
    "ncclreducescatter",
    "ncclbroadcast",
    "ncclbcast",
    "ncclreduce",
    "ncclalltoall",
    "ncclalltoallv",
    "ncclallgatherv",
    "ncclgather",
    "ncclscatter",
}
NCCL_GROUP_START = "ncclgroupstart"
NCCL_GROUP_END = "ncclgroupend"
NCCL_INIT_APIS = {
    "ncclcomminitrank",
    "ncclcomminitrankconfig",
    "ncclcomminitrankscalable",
    "ncclcomminitall",
    "ncclcommsplit",
    "ncclcommshrink",
}


NCCL_API_NAMES = frozenset(
    {*NCCL_P2P_APIS, *NCCL_COLLECTIVE_APIS, NCCL_GROUP_START, NCCL_GROUP_END, *NCCL_INIT_APIS}
    | {"ncclcommdestroy", "ncclcommabort", "ncclcommfinalize", "ncclmemalloc", "ncclmemfree"}
)


def nccl_api(name: str) -> str:
    """Normalised NCCL API name (``ncclSend`` → ``ncclsend``); newer nsys drops the prefix."""
    n = name.strip().lower()
    if not n.startswith("nccl"):
        n = "nccl" + n
    return n


# --- host ranges -------------------------------------------------------------------------------

# torch.autograd.profiler.emit_nvtx names every range "<name>, seq = N, op_id = M, sizes = ..."
# (the SQL strips that tail); operator ranges (aten::mm, autograd nodes) are not annotations.
_TORCH_OP = re.compile(
    r"(aten|prim|quantized|cudnn|mkldnn|torch|autograd|profiler|_c10d_functional|c10d|fbgemm|torchvision|"
    r"cuda|xformers|flash_attn|triton|inductor)::|\w+Backward\d*$|^autograd::engine::"
)
OP_NAMESPACES_SQL = (
    "aten::*",
    "prim::*",
    "autograd::*",
    "torch::*",
    "profiler::*",
    "quantized::*",
    "cudnn::*",
    "mkldnn::*",
)

_STEP = re.compile(
    r"(?:ProfilerStep#(?P<n1>\d+))"
    r"|(?:(?:train(?:ing)?[ _-]?|global[ _-]?)?(?:step|iteration|iter)(?:[\s_#:=-]*(?P<n2>\d+))?)",
    re.IGNORECASE,
)

# PiPPy / torch.distributed.pipelining action labels (the same spellings the Kineto reader knows).
_PP_LABEL = re.compile(r"PP:(?P<stage>\d+)(?P<ph>[FBIW])(?P<mb>\d+)")
_PP_COMM = re.compile(r"PP:(?P<stage>\d+)(?P<dir>RECV|SEND)_(?P<ph>[FBIW])(?P<mb>\d+)")
_PP_OVERLAP = re.compile(r"PP:\((?P<stage>\d+)(?P<ph>[FBIW])(?P<mb>\d+)[;,]")
_PP_ANY = re.compile(r"PP:(?P<stage>\d+)")
_PHASE_LABEL = re.compile(
    r"(?:(?:megatron|schedule|pipeline|pp)[\s:._/-]+)?"
    r"(?P<ph>forward|backward|fwd|bwd|wgrad|weight[ _-]?grad(?:ient)?s?|optimi[sz]er|optim)"
    r"(?:[ _-]?(?:step|pass|compute|func))?"
    r"(?:[\s_:,(=-]*(?:stage|pp)[\s_#:=-]*(?P<stage>\d+))?"
    r"(?:[\s_:,(=-]*(?:chunk|vp|model[ _]chunk)[\s_#:=-]*(?P<chunk>\d+))?"
    r"(?:[\s_:,(#=-]*(?:mb|microbatch|micro[ _-]?batch)?[\s_#:=-]*(?P<mb>\d+)\)?)?",
    re.IGNORECASE,
)
_PHASE_WORDS = {
    "f": Phase.FWD,
    "forward": Phase.FWD,
    "fwd": Phase.FWD,
    "b": Phase.BWD,
    "backward": Phase.BWD,
    "bwd": Phase.BWD,
    "i": Phase.BWD,
    "w": Phase.WGRAD,
    "wgrad": Phase.WGRAD,
    "optimizer": Phase.OPTIM,
    "optimiser": Phase.OPTIM,
    "optim": Phase.OPTIM,
}

_MPI_DIRECTION = {
    "mpi_send": Direction.SEND,
    "mpi_isend": Direction.SEND,
    "mpi_ssend": Direction.SEND,
    "mpi_bsend": Direction.SEND,
    "mpi_rsend": Direction.SEND,
    "mpi_recv": Direction.RECV,
    "mpi_irecv": Direction.RECV,
    "mpi_sendrecv": Direction.BOTH,
}
# ProcessGroupNCCL's profiling titles, which emit_nvtx turns into NVTX ranges on the calling thread:
# "nccl:send <group rank>-><group dst>", "nccl:recv <group rank><-<group src>" (the same shape for
# the xccl/ucc/gloo backends; older releases and gloo write "gloo:send" without ranks). Both numbers
# are ranks in the op's process group; an emit_nvtx tail (", seq = ..., sizes = ...") may follow.
_TORCH_P2P = re.compile(
    r"(?:nccl|xccl|ucc|gloo|mpi|hccl|rccl):(?P<op>send|recv|recvanysource|recv_anysource)"
    r"(?:\s+(?P<me>\d+)\s*(?:->|<-)\s*(?P<peer>\d+))?(?:\s*,.*)?",
    re.IGNORECASE | re.DOTALL,
)
_ALL_TO_ALL = re.compile(r"all[_ ]?to[_ ]?all|alltoall", re.IGNORECASE)
# PyTorch's collective titles and c10d ops (emit_nvtx / record_function ranges): NCCL kernels
# launched inside belong to that collective, even when NCCL ran it as grouped sends and receives
_TORCH_COLL = re.compile(
    r"(?:nccl|xccl|ucc|gloo|mpi|hccl|rccl|c10d|_c10d_functional|c10d_functional):{1,2}_?"
    r"(?:all_?to_?all|alltoall|all_?gather|allgather|reduce_?scatter|all_?reduce|allreduce|broadcast|"
    r"scatter|gather|reduce|barrier)",
    re.IGNORECASE,
)


_OP_TAIL = re.compile(r", (?:seq = \d+|op_id = \d+|sizes = \[|input_op_ids = \[).*$", re.DOTALL)


def strip_op_tail(name: str) -> str:
    """``"ProfilerStep#3, op_id = 17"`` → ``"ProfilerStep#3"`` (emit_nvtx naming)."""
    return _OP_TAIL.sub("", name)


def _phase_of(word: str) -> Phase:
    w = word.lower().replace(" ", "").replace("_", "").replace("-", "")
    if w.startswith("weightgrad"):
        return Phase.WGRAD
    return _PHASE_WORDS.get(w, Phase.UNKNOWN)


@dataclass(frozen=True)
class RangeClass:
    """What a host range name says (one per distinct name)."""

    keep: bool
    kind: RangeKind = RangeKind.OTHER
    num: int = -1
    stage: int = -1
    mb: int = -1
    phase: Phase = Phase.UNKNOWN
    direction: Direction = Direction.NONE
    numbered: bool = True  # STEP only: False when the name carries no step number
    collective: bool = False  # NCCL kernels launched inside belong to a collective (all-to-all...)
    torch_p2p: bool = False  # a PyTorch "nccl:send a->b" / "nccl:recv a<-b" range
    group_rank: int = -1  # torch_p2p: this process's rank in the op's process group (-1 unknown)
    group_peer: int = -1  # torch_p2p: the peer's rank in that group (-1 unknown)


def _pp_range(text: str) -> RangeClass:
    """A ``PP:`` range: a pipeline block label, a pipeline comm op, an overlap range, or another
    range of a stage."""
    m = _PP_LABEL.fullmatch(text)
    if m:
        return RangeClass(
            keep=True,
            kind=RangeKind.LABEL,
            stage=int(m.group("stage")),
            mb=int(m.group("mb")),
            phase=_phase_of(m.group("ph")),
        )
    m = _PP_COMM.fullmatch(text)
    if m:
        d = Direction.RECV if m.group("dir") == "RECV" else Direction.SEND
        return RangeClass(
            keep=True,
            kind=RangeKind.COMM_OP,
            stage=int(m.group("stage")),
            mb=int(m.group("mb")),
            phase=_phase_of(m.group("ph")),
            direction=d,
        )
    m = _PP_OVERLAP.match(text)
    if m:
        return RangeClass(
            keep=True,
            kind=RangeKind.OTHER,
            stage=int(m.group("stage")),
            mb=int(m.group("mb")),
            phase=_phase_of(m.group("ph")),
        )
    m = _PP_ANY.match(text)
    return RangeClass(keep=True, kind=RangeKind.OTHER, stage=int(m.group("stage")) if m else -1)


def classify_range(name: str, domain: str) -> RangeClass:
    """Steps, pipeline labels, comm ops, other user ranges; emit_nvtx op ranges are dropped."""
    a2a = bool(_ALL_TO_ALL.search(name) or _TORCH_COLL.match(name))
    if _TORCH_OP.match(name):
        return RangeClass(keep=False, collective=a2a)
    text = name.strip()
    m = _STEP.fullmatch(text)
    if m:
        n = m.group("n1") or m.group("n2")
        return RangeClass(keep=True, kind=RangeKind.STEP, num=int(n) if n else -1, numbered=n is not None)
    if text.startswith("PP:"):
        return _pp_range(text)
    if text.startswith("Optimizer."):
        return RangeClass(keep=True, kind=RangeKind.OTHER, phase=Phase.OPTIM)
    if text.startswith("enumerate(DataLoader)"):
        return RangeClass(keep=True, kind=RangeKind.OTHER, phase=Phase.OTHER)
    if text.startswith("nn.Module: "):
        return RangeClass(keep=True, kind=RangeKind.MODULE)
    m = _PHASE_LABEL.fullmatch(text)
    if m:
        return RangeClass(
            keep=True,
            kind=RangeKind.LABEL,
            phase=_phase_of(m.group("ph")),
            stage=int(m.group("stage")) if m.group("stage") else -1,
            mb=int(m.group("mb")) if m.group("mb") else -1,
        )
    if domain.upper() == "MPI":
        mpi_dir = _MPI_DIRECTION.get(text.lower())
        if mpi_dir is not None:
            return RangeClass(keep=True, kind=RangeKind.COMM_OP, direction=mpi_dir)
    m = _TORCH_P2P.fullmatch(text)
    if m:
        d = Direction.SEND if m.group("op").lower() == "send" else Direction.RECV
        return RangeClass(
            keep=True,
            kind=RangeKind.COMM_OP,
            direction=d,
            torch_p2p=True,
            group_rank=int(m.group("me")) if m.group("me") else -1,
            group_peer=int(m.group("peer")) if m.group("peer") else -1,
        )
    return RangeClass(keep=True, kind=RangeKind.OTHER, collective=a2a)


# --- memcpy / memset names (the Kineto spelling, so both formats name copies alike) -------------

COPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "HtoD",
    12: "DtoH",
    13: "DtoD",
}
MEM_KINDS = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}
SYNC_TYPES = {0: "Unknown", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}


def memcpy_name(copy_kind: int, src_kind: int, dst_kind: int) -> str:
    ck = COPY_KINDS.get(copy_kind, "Unknown")
    if src_kind < 0 or dst_kind < 0:
        return f"Memcpy {ck}"
    return f"Memcpy {ck} ({MEM_KINDS.get(src_kind, 'Unknown')} -> {MEM_KINDS.get(dst_kind, 'Unknown')})"


def memset_name(mem_kind: int) -> str:
    return f"Memset ({MEM_KINDS.get(mem_kind, 'Unknown')})" if mem_kind >= 0 else "Memset"


def sync_name(sync_type: int) -> str:
    return f"cuda_sync {SYNC_TYPES.get(sync_type, 'Unknown')}"
