"""Batch arithmetic: ``global = micro x accumulation x dp`` and ``dp = world / (tp x pp x cp)``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BatchCheck:
    """Derived sizes and what is wrong with them."""

    world: int | None
    tp: int
    pp: int
    dp: int | None
    micro_batch: int | None
    global_batch: int | None
    accumulation: int | None  # = micro-batches per step per pipeline (M)
    microbatches_seen: int | None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (severity, text)

    def to_json(self) -> dict[str, object]:
        return {
            "world": self.world,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "micro_batch": self.micro_batch,
            "global_batch": self.global_batch,
            "accumulation": self.accumulation,
            "microbatches_seen": self.microbatches_seen,
            "problems": [{"severity": s, "text": t} for s, t in self.problems],
        }


def check_batch(
    world: int | None,
    pp: int,
    tp: int = 1,
    micro_batch: int | None = None,
    global_batch: int | None = None,
    microbatches: int | None = None,
    cp: int = 1,
    schedule: str | None = None,
    virtual: int = 1,
) -> BatchCheck:
    """Derive dp and M from the sizes and list every inconsistency.

    ``schedule`` / ``virtual`` (optional) add the schedule's own constraints: interleaved 1F1B with
    ``v > 1`` chunks needs M to be a multiple of pp (Megatron), or at least of its number of
    rounds ``max(1, M // pp)`` (``torch.distributed.pipelining``).
    """
    probs: list[tuple[str, str]] = []
    dp: int | None = None
    if world:
        denom = tp * pp * cp
        if world % denom:
            probs.append(
                (
                    "high",
                    f"world size {world} is not divisible by tp x pp{' x cp' if cp > 1 else ''} = {denom}",
                )
            )
        else:
            dp = world // denom
    acc: int | None = None
    if global_batch and micro_batch and dp:
        per = micro_batch * dp
        if global_batch % per:
            probs.append(
                (
                    "high",
                    f"global batch {global_batch} is not divisible by micro-batch x dp = "
                    f"{micro_batch} x {dp} = {per}",
                )
            )
        else:
            acc = global_batch // per
    m = acc if acc is not None else microbatches
    if acc is not None and microbatches and acc != microbatches:
        probs.append(
            (
                "medium",
                f"the trace shows M={microbatches} micro-batches per step but "
                f"global / (micro x dp) gives {acc}",
            )
        )
    probs += _m_problems(pp, m, schedule, virtual)
    return BatchCheck(world, tp, pp, dp, micro_batch, global_batch, acc, microbatches, probs)


def _m_problems(pp: int, m: int | None, schedule: str | None, virtual: int) -> list[tuple[str, str]]:
    """(severity, text) of every way M does not suit the pipeline and its schedule."""
    probs: list[tuple[str, str]] = []
    if pp > 1 and m:
        if m < pp:
            probs.append(
                (
                    "high",
                    f"M={m} is smaller than pp={pp}: 1F1B cannot fill the pipeline; the "
                    f"schedule's bubble is {(pp - 1) / (m + pp - 1):.0%}",
                )
            )
        elif m < 2 * pp:
            probs.append(
                (
                    "medium",
                    f"M={m} < 2 × pp = {2 * pp} ({pp} stages): the schedule's bubble is "
                    f"{(pp - 1) / (m + pp - 1):.0%}; aim for M >= {4 * pp}",
                )
            )
    if schedule in ("interleaved_1f1b", "interleaved") and virtual > 1 and pp > 1 and m:
        if m % max(1, m // pp):
            probs.append(
                (
                    "high",
                    f"interleaved 1F1B cannot run M={m}: it must be a multiple of its "
                    f"number of rounds max(1, M // pp) = {max(1, m // pp)}",
                )
            )
        elif m % pp:
            probs.append(
                ("medium", f"interleaved 1F1B with M={m}, not a multiple of pp={pp}: Megatron rejects it")
            )
    return probs
