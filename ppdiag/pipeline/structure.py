"""Where each structural fact of the rebuilt pipeline comes from, and the contradictions that reject
the structure (``run.structure``, docs/json.md).

A pipeline read from weak evidence (peers matched by timing, a chain of transfers, counted blocks)
must agree with the measurement it was read from, or ppdiag says it cannot tell instead of
inventing one. Rejected are:

* block labels against the measured order: most micro-batch dependencies they imply (a forward
  after the previous stage's forward of the same micro-batch, a backward after the next stage's
  backward) start before their producer ended;
* more virtual stages than the forward blocks a rank shows in any step;
* most of the claimed pipeline stages (stages x virtual stages) without a traced block;
* two stages of one micro-batch whose transfers state no direction (SendRecv kernels known by name
  only): one exchange each way per step, made by timing, is any two-rank exchange's pattern.

A structure the user gave (``--pp``, ``--stage-map``) is never rejected. Grouped send/recv of a
collective and p2p made only of two-way exchanges never form a pipeline in the first place
(ppdiag/pipeline/topology.py).
"""

from __future__ import annotations

import numpy as np

from ppdiag.model import Phase
from ppdiag.model.structure import Confidence, Fact, FactSource, Structure
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.steps import LocalStep
from ppdiag.pipeline.topology import Topology

# a consumer block may start this much before its producer ended (clock residual, timer rounding)
ORDER_TOL_NS = 50_000


def contradiction(
    topo: Topology,
    blocks: dict[int, Blocks],
    windows: dict[int, list[LocalStep]],
    overridden: bool,
    microbatches: int | None = None,
    directions_stated: bool = True,
) -> str | None:
    """Why the pipeline ``topo`` with these blocks cannot be established, or None when it holds
    (always None for pp 1 and for a structure the user gave). ``directions_stated``: whether any
    p2p op of the trace states its direction (else timing decided every one)."""
    if topo.pp <= 1 or overridden:
        return None
    return (
        _one_exchange(topo, microbatches, directions_stated)
        or _untraced(topo, blocks)
        or _virtual_beyond_blocks(topo, blocks)
        or _labels_against_order(topo, blocks, windows)
    )


def _one_exchange(topo: Topology, microbatches: int | None, directions_stated: bool) -> str | None:
    """Two stages and one micro-batch read from a chain of transfers that state neither their
    direction nor their peer: one transfer each way per step, both made by timing, is what any
    exchange of two ranks shows (an all-to-all or a send/recv pair built from SendRecv kernels), so
    it is no evidence of a pipeline."""
    if directions_stated or topo.pp != 2 or microbatches != 1 or not topo.source.startswith("p2p chain"):
        return None
    return (
        "2 stages of 1 micro-batch from transfers that state no direction: one transfer each way per "
        "step, directions and peers decided by timing, cannot tell a pipeline from an exchange "
        "between two ranks (pass --pp or --stage-map if it is a pipeline)"
    )


def _untraced(topo: Topology, blocks: dict[int, Blocks]) -> str | None:
    """Most claimed stages (pp x v) with no traced block, for structures not read from a process
    group (a group lists its untraced ranks: those stages exist, only their traces are missing)."""
    if topo.source.startswith("pipeline process group"):
        return None
    claimed = topo.pp * max(topo.virtual, 1)
    traced: set[tuple[int, int]] = set()
    for r, b in blocks.items():
        if not len(b):
            continue
        chunks = np.unique(b.stage[b.stage >= 0]).tolist()
        traced.update((r, int(c)) for c in chunks) if chunks else traced.add((r, -1))
    if claimed >= 4 and 2 * len(traced) < claimed:
        return f"only {len(traced)} of the {claimed} claimed pipeline stages have traced blocks"
    return None


def _virtual_beyond_blocks(topo: Topology, blocks: dict[int, Blocks]) -> str | None:
    """More virtual stages per rank than forward blocks in any of its steps."""
    v = topo.virtual
    if v <= 1:
        return None
    most = 0
    for b in blocks.values():
        if not len(b):
            continue
        fwd = b.phase == int(Phase.FWD)
        sel = b.step[fwd] if fwd.any() else b.step
        most = max(most, int(np.bincount(sel.astype(np.int64)).max()) if len(sel) else 0)
    if most < v:
        return f"{v} virtual stages per rank, but no rank shows more than {most} forward blocks in a step"
    return None


def _labels_against_order(
    topo: Topology, blocks: dict[int, Blocks], windows: dict[int, list[LocalStep]]
) -> str | None:
    """Most micro-batch dependencies of the labelled blocks contradict the measured order. A block's
    producer is looked up in its own pipeline replica: replicas run the same labels at their own
    pace, so another replica's producer says nothing about this block's order."""
    line_of = {r: i for i, line in enumerate(topo.pipelines) for r in line}
    rows: list[np.ndarray] = []
    for r, b in blocks.items():
        ok = (b.stage >= 0) & (b.mb >= 0) & ((b.phase == int(Phase.FWD)) | (b.phase == int(Phase.BWD)))
        if not len(b) or not ok.any():
            continue
        nums = np.array([w.number for w in windows.get(r, [])], np.int64)
        st = b.step[ok].astype(np.int64)
        if not len(nums) or st.max() >= len(nums):
            continue
        line = np.full(int(ok.sum()), line_of.get(r, len(topo.pipelines)), np.int64)
        rows.append(
            np.stack([line, nums[st], b.stage[ok], b.phase[ok], b.mb[ok], b.start[ok], b.end[ok]]).astype(
                np.int64
            )
        )
    if not rows:
        return None
    line, step, stage, phase, mb, start, end = np.concatenate(rows, axis=1)
    last = topo.pp * max(topo.virtual, 1) - 1
    is_f = phase == int(Phase.FWD)
    # the producer of each block: the previous stage's forward, the next stage's backward
    p_stage = np.where(is_f, stage - 1, stage + 1)
    wants = (p_stage >= 0) & (p_stage <= last)
    key = ((step * (last + 2) + stage) * 4 + phase) * (int(mb.max()) + 1) + mb
    want = ((step * (last + 2) + p_stage) * 4 + phase) * (int(mb.max()) + 1) + mb
    # the replica in the key's top digits (step numbers may be negative: shift to 0 first)
    low = int(min(key.min(), want.min()))
    span = int(max(key.max(), want.max())) - low + 1
    key, want = line * span + (key - low), line * span + (want - low)
    o = np.argsort(key, kind="stable")
    ks = key[o]
    pos = np.minimum(np.searchsorted(ks, want), len(ks) - 1)
    found = wants & (ks[pos] == want)
    prod = o[pos[found]]
    total = int(found.sum())
    bad = int((start[found] < end[prod] - ORDER_TOL_NS).sum())
    if bad >= 2 and 2 * bad > total:
        return (
            f"{bad} of {total} micro-batch dependencies from the block labels contradict the measured order"
        )
    return None


_TOPO_SOURCE = (
    ("--", FactSource.OVERRIDE, Confidence.HIGH),
    ("pipeline process group", FactSource.PG_NAME, Confidence.HIGH),
    ("pipeline labels", FactSource.LABELS, Confidence.HIGH),
    ("p2p chain (peers from timing", FactSource.P2P_CHAIN, Confidence.MEDIUM),
    ("p2p chain", FactSource.P2P_CHAIN, Confidence.HIGH),
)


def _topology_fact(topo: Topology) -> tuple[FactSource, Confidence]:
    for prefix, src, conf in _TOPO_SOURCE:
        if topo.source.startswith(prefix):
            return src, conf
    return FactSource.DEFAULT, Confidence.HIGH


def describe(
    topo: Topology,
    schedule: str,
    microbatches: int | None,
    labelled: bool,
    peer_source: str,
    clock_method: str,
    user: dict[str, bool],
    rejected: tuple[str, str] | None = None,
) -> Structure:
    """Each structural fact with its source and confidence; ``rejected`` = (reason, the refused
    structure in words) when the pipeline could not be established. ``user`` says which facts
    the user gave (``pp``, ``stage_map``, ``microbatches``, ``schedule``)."""
    t_src, t_conf = _topology_fact(topo)
    if rejected is not None:
        t_src, t_conf = FactSource.DEFAULT, Confidence.LOW
    pp = topo.pp
    if pp > 1 and topo.virtual > 1:
        v_src = FactSource.LABELS if topo.source == "pipeline labels" or labelled else FactSource.ORDER
        v_fact = Fact(topo.virtual, t_src if t_src == FactSource.OVERRIDE else v_src, t_conf)
    else:
        v_fact = Fact(topo.virtual, t_src if pp > 1 else FactSource.DEFAULT, t_conf)

    def read_off_blocks(value: object, option: str) -> Fact:
        # the schedule and M are read off the blocks (their labels, else their order), so they are
        # no surer than the stages they were read on, and at most medium without an override
        if user.get(option):
            return Fact(value, FactSource.OVERRIDE, Confidence.HIGH)
        if pp <= 1:
            return Fact(value, FactSource.DEFAULT, t_conf)
        src = FactSource.LABELS if labelled else FactSource.ORDER
        return Fact(value, src, _min(t_conf, Confidence.MEDIUM))

    s_fact = read_off_blocks(schedule, "schedule")
    m_fact = read_off_blocks(microbatches, "microbatches")
    return Structure(
        established=rejected is None,
        reason=rejected[0] if rejected else None,
        claimed=rejected[1] if rejected else None,
        pp=Fact(pp, t_src, t_conf),
        stage_map=Fact(topo.stage_map() if pp > 1 else {}, *_order_fact(topo, t_src, t_conf, peer_source)),
        virtual_stages=v_fact,
        schedule=s_fact,
        microbatches=m_fact,
        peers=Fact(peer_source, *_peer_fact(peer_source)),
        clock_offsets=Fact(clock_method, *_clock_fact(clock_method)),
    )


_ORDER = (Confidence.LOW, Confidence.MEDIUM, Confidence.HIGH)


def _order_fact(
    topo: Topology, src: FactSource, conf: Confidence, peer_source: str
) -> tuple[FactSource, Confidence]:
    """Where the stage order comes from: a process group says only which ranks form a pipeline
    (torch lists its ranks sorted), so its order is the labels', the p2p chain's or, last, the
    listed one (low confidence)."""
    if src != FactSource.PG_NAME:
        return src, conf
    if topo.source.endswith("from labels)"):
        return FactSource.LABELS, Confidence.HIGH
    if topo.source.endswith("from p2p chain)"):
        return FactSource.P2P_CHAIN, Confidence.MEDIUM if "timing" in peer_source else Confidence.HIGH
    return FactSource.PG_NAME, Confidence.LOW


def _min(a: Confidence, b: Confidence) -> Confidence:
    return a if _ORDER.index(a) < _ORDER.index(b) else b


def _peer_fact(source: str) -> tuple[FactSource, Confidence]:
    if source in ("none", ""):
        return FactSource.DEFAULT, Confidence.HIGH
    if "timing" in source:
        return FactSource.TIMING, Confidence.MEDIUM if source != "timing" else Confidence.LOW
    if "label" in source:
        return FactSource.LABELS, Confidence.HIGH
    return FactSource.METADATA, Confidence.HIGH


def _clock_fact(method: str) -> tuple[FactSource, Confidence]:
    if method.startswith("same host"):
        return FactSource.METADATA, Confidence.HIGH
    if method.startswith("none"):
        return FactSource.DEFAULT, Confidence.LOW
    return FactSource.TIMING, Confidence.MEDIUM if "unlinked" in method else Confidence.HIGH


def claimed_words(topo: Topology, schedule: str, microbatches: int | None) -> str:
    """The refused structure in words, as the header would have said it."""
    m = "?" if microbatches is None else str(microbatches)
    v = f", v={topo.virtual}" if topo.virtual > 1 else ""
    return f"{topo.pp} stages, schedule {schedule}, M={m}{v} (from {topo.source})"
