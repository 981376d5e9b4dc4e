"""Ground-truth probes inside a rank: time every F/B/I/W block and every p2p wait as it happens.

The probes wrap, per rank process:

* each pipeline stage's ``forward_one_chunk``, ``backward_one_chunk`` and
  ``backward_weight_one_chunk`` (instance attributes, so only this rank's stages change);
* each stage's ``get_{fwd,bwd}_{send,recv}_ops`` to tag every ``P2POp`` with its stage, micro-batch
  and payload;
* the schedules module's ``_batch_p2p`` (posts the tagged ops; routes sends through the slow-link
  fault) and ``_wait_batch_p2p`` (times each ``Work.wait()``). Every schedule class issues and waits
  its transfers through these two functions.

Rows go to an :class:`~ppdiag.demo.groundtruth.IntervalLog` only while a profiled step runs.
This module imports torch; only rank processes import it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ppdiag.demo.faults import DeferredSend, RankFaults
from ppdiag.demo.groundtruth import IntervalLog

_TAG = "_ppdiag_tag"


class TaggedWork:
    """A p2p ``Work`` that knows its transfer and records its wait in the ground truth."""

    __slots__ = (
        "direction",
        "mb",
        "payload",
        "peer",
        "posted_ns",
        "probe",
        "recorded",
        "recording",
        "request_ns",
        "stage",
        "step",
        "work",
    )

    def __init__(self, probe: Probe, work: Any, op: Any, request_ns: int, posted_ns: int) -> None:
        payload, stage, mb = getattr(op, _TAG, ("", -1, -1))
        self.probe = probe
        self.work = work
        self.payload = payload
        self.stage = stage
        self.mb = mb
        self.peer = int(op.peer)
        self.direction = "send" if op.op is dist.isend else "recv"
        self.request_ns = request_ns
        self.posted_ns = posted_ns
        self.step = probe.step
        self.recording = probe.recording
        self.recorded = False

    def wait(self, timeout: Any = None) -> bool:
        t0 = time.time_ns()
        ok = self.work.wait()
        t1 = time.time_ns()
        if self.recording and not self.recorded:
            self.recorded = True
            posted = self.posted_ns
            if isinstance(self.work, DeferredSend):
                posted = self.work.posted_ns
            log = self.probe.log
            log.add(
                self.direction,
                self.step,
                self.stage,
                self.mb,
                self.request_ns,
                posted,
                peer=self.peer,
                direction=self.direction,
                payload=self.payload,
            )
            log.add(
                "wait",
                self.step,
                self.stage,
                self.mb,
                t0,
                t1,
                peer=self.peer,
                direction=self.direction,
                payload=self.payload,
            )
        return bool(ok)

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


class Probe:
    """Per-rank instrumentation; ``begin_step`` tells it which iteration runs and whether to record."""

    def __init__(self, log: IntervalLog, faults: RankFaults, held_ns: Callable[[], int]) -> None:
        self.log = log
        self.faults = faults
        self.held_ns = held_ns
        self.step = -1
        self.recording = False
        self._restore: list[tuple[Any, str, Any]] = []

    def begin_step(self, step: int, recording: bool) -> None:
        self.step = step
        self.recording = recording

    # ---- stage compute ---------------------------------------------------------------------

    def instrument_stage(self, stage: Any) -> None:
        """Wrap one pipeline stage's per-micro-batch functions and its p2p op builders."""
        s = int(stage.stage_index)
        fwd, bwd, wgt = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

        @functools.wraps(fwd)
        def forward_one_chunk(fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            stall = self.faults.host_stall()
            if stall is not None and self.recording:
                self.log.add("stall", self.step, s, fwd_chunk_id, *stall)
            return self._timed("fwd", s, fwd_chunk_id, fwd, (fwd_chunk_id, *args), kwargs)

        @functools.wraps(bwd)
        def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            kind = "bwd" if full else "bwd_input"
            return self._timed(kind, s, bwd_chunk_id, bwd, (bwd_chunk_id, *args), kwargs)

        @functools.wraps(wgt)
        def backward_weight_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            return self._timed("wgrad", s, bwd_chunk_id, wgt, (bwd_chunk_id, *args), kwargs)

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
        for name, payload in (
            ("get_fwd_recv_ops", "act"),
            ("get_fwd_send_ops", "act"),
            ("get_bwd_recv_ops", "grad"),
            ("get_bwd_send_ops", "grad"),
        ):
            setattr(stage, name, self._tagger(getattr(stage, name), payload, s))

    def _timed(
        self,
        kind: str,
        stage: int,
        mb: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        h0 = self.held_ns()
        t0 = time.time_ns()
        out = fn(*args, **kwargs)
        t1 = time.time_ns()
        if self.recording:
            self.log.add(kind, self.step, stage, int(mb), t0, t1, held_ns=self.held_ns() - h0)
        return out

    @staticmethod
    def _tagger(fn: Callable[..., Any], payload: str, stage: int) -> Callable[..., Any]:
        @functools.wraps(fn)
        def tagged(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            ops = fn(chunk_id, *args, **kwargs)
            for op in ops:
                setattr(op, _TAG, (payload, stage, int(chunk_id)))
            return ops

        return tagged

    # ---- p2p -------------------------------------------------------------------------------

    def install_p2p(self, schedules: Any) -> None:
        """Route the schedules module's p2p batching and waiting through the probe."""
        orig_batch, orig_wait = schedules._batch_p2p, schedules._wait_batch_p2p

        def _batch_p2p(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
            if not p2p_ops:
                return []
            now = time.time_ns()
            sender = self.faults.sender if self.faults.delays_sends else None
            if sender is None:
                works = orig_batch(p2p_ops, desc)
                if len(works) != len(p2p_ops):  # a backend that coalesces: leave untagged
                    return list(works)
                posted = time.time_ns()
                return [TaggedWork(self, w, op, now, posted) for w, op in zip(works, p2p_ops, strict=True)]
            # gloo does not coalesce, so posting one op at a time is what batch_isend_irecv does.
            out = []
            for op in p2p_ops:
                if op.op is dist.isend:
                    out.append(TaggedWork(self, sender.issue(op), op, now, -1))
                else:
                    w = orig_batch([op], desc)[0]
                    out.append(TaggedWork(self, w, op, now, time.time_ns()))
            return out

        def _wait_batch_p2p(work: list[Any]) -> None:
            for w in work:
                w.wait()

        self._restore += [(schedules, "_batch_p2p", orig_batch), (schedules, "_wait_batch_p2p", orig_wait)]
        schedules._batch_p2p = _batch_p2p
        schedules._wait_batch_p2p = _wait_batch_p2p

    def uninstall(self) -> None:
        for obj, name, value in reversed(self._restore):
            setattr(obj, name, value)
        self._restore.clear()
