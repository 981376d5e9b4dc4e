"""The structural facts of a rebuilt pipeline with their evidence: ``run.structure`` of the JSON
report (docs/json.md)."""

from __future__ import annotations

import msgspec

from ppdiag.compat import StrEnum


class FactSource(StrEnum):
    """Where a structural fact comes from (``run.structure.*.source``)."""

    METADATA = "metadata"  # process-group ranks, NCCL payloads, comm args, one host's clock
    PG_NAME = "pg name"  # a process group named for the pipeline
    P2P_CHAIN = "p2p chain"  # the chain of point-to-point partners
    LABELS = "labels"  # pipeline block labels (PP:<s>F<mb>, Forward <mb>, NVTX ranges)
    ORDER = "order"  # the measured order and counts of blocks and transfers
    TIMING = "timing"  # matched by time (peers, clock offsets)
    OVERRIDE = "override"  # --pp, --stage-map, --microbatches, --schedule
    DEFAULT = "default"  # no evidence: no pipeline, one clock


class Confidence(StrEnum):
    """How far a structural fact can be trusted."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Fact(msgspec.Struct, frozen=True):
    """One structural fact: its value, where it comes from and how sure it is."""

    value: object
    source: FactSource
    confidence: Confidence


class Structure(msgspec.Struct, frozen=True):
    """The pipeline's structural facts with their evidence (``run.structure``). ``established``
    False: the evidence contradicted the structure it suggested (``claimed``, in words) for the
    ``reason`` given; the run is then analysed without a pipeline."""

    established: bool
    reason: str | None
    claimed: str | None
    pp: Fact
    stage_map: Fact
    virtual_stages: Fact
    schedule: Fact
    microbatches: Fact
    peers: Fact
    clock_offsets: Fact

    def headline(self) -> str | None:
        """``pipeline structure could not be established: <why>`` when rejected, else None."""
        if self.established:
            return None
        return f"pipeline structure could not be established: {self.reason}"
