"""Fault injection inside a rank process: a slow link and a host stall.

(The third fault, a slow stage, is built into the model's costs: see :mod:`ppdiag.demo.model`.)

Slow link
    Every send of the delayed rank is handed to one background thread that posts it to gloo
    ``delay`` later, so the data reaches the peer late. One FIFO thread keeps sends to a peer in
    issue order, which gloo needs to match them with receives. The work object the schedule gets
    back waits for the deferred post, then for the transfer.

    The trace records the send as torch records a gloo send whose transfer is slow, on the main
    thread: a ``c10d::send`` CPU op at the issue (with its inputs, tensor list, group, peer and
    tag, under ``record_shapes``), and a ``gloo:send`` annotation opened at the end of that op and
    closed when the wait on the send returns (torch's gloo work opens its ``gloo:send`` range
    after posting and ends it in ``wait()``). A main thread blocked on its slow send is thus
    covered by the tail of a ``gloo:send`` span, as in a real run. The background thread is not
    profiled (the profiler's default: its thread only), so its real post leaves no event that no
    real run has. The synthesized ``gloo:send`` carries no input shapes, which torch's records
    under ``record_shapes``; the ``c10d::send`` that opens it has them.

    *Asynchronous* hold (the default): the issue returns at once and the rank computes on; its
    sends leave ``delay`` after issue. *Synchronous* hold (``comm_delay_sync``): the send call
    itself blocks the main thread until the data leaves, as a post the transport does not accept
    at once would: the ``c10d::send`` op lasts the hold and its ``gloo:send`` opens after it.
Host stall
    Before each micro-batch forward the stalled rank sleeps ``stall`` with no operator running,
    like a slow data loader or a host synchronisation would.

This module imports torch; only rank processes import it.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ppdiag.demo.config import DemoConfig

#: A CPU op recorded from Python (torch records it as ``cpu_op``, with its inputs under record_shapes).
_CpuOp = torch._C._profiler._RecordFunctionFast


def _open_span(name: str) -> Any:
    """Open a user annotation that a later :func:`_close_span` ends, not nested in a ``with``."""
    return torch.ops.profiler._record_function_enter_new(name, None)


def _close_span(handle: Any) -> None:
    torch.ops.profiler._record_function_exit._RecordFunction(handle)


class DeferredSend:
    """A send posted later by :class:`DelayedSender`; ``wait()`` waits for the post, then the transfer."""

    __slots__ = ("_error", "_event", "due_ns", "op", "posted_ns", "span", "work")

    def __init__(self, op: Any, due_ns: int) -> None:
        self.op = op
        self.due_ns = due_ns
        self.work: Any = None
        self.posted_ns = -1
        self.span: Any = None
        self._error: BaseException | None = None
        self._event = threading.Event()

    def wait_posted(self) -> None:
        """Block until the sender thread has posted this send (or failed to)."""
        # The sender thread posts after a bounded delay; a missing post means it died.
        if not self._event.wait(timeout=600.0):
            raise RuntimeError("delayed send was never posted (sender thread stopped)")
        if self._error is not None:
            raise RuntimeError(f"delayed send failed: {self._error}") from self._error

    def wait(self, timeout: Any = None) -> bool:
        try:
            self.wait_posted()
            return bool(self.work.wait())
        finally:
            # torch's gloo work ends its gloo:send range when its wait returns
            if self.span is not None:
                span, self.span = self.span, None
                _close_span(span)

    def is_completed(self) -> bool:
        return self._event.is_set() and self.work is not None and bool(self.work.is_completed())


class DelayedSender:
    """Posts sends ``delay_ns`` after they were issued, in issue order, from one background thread.

    ``sync``: the issue itself blocks until the send is posted (see the module docstring).
    """

    def __init__(self, delay_ns: int, post: Callable[[Any], Any], sync: bool = False) -> None:
        self.delay_ns = delay_ns
        self.sync = sync
        self._post = post
        self._queue: collections.deque[DeferredSend] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ppdiag-delayed-send", daemon=True)
        self._thread.start()

    def issue(self, op: Any) -> DeferredSend:
        """Issue one send on the calling (main) thread, recorded as torch records a gloo send."""
        # c10d::send(Tensor[] tensors, ProcessGroup pg, int dstRank, int tag): the group is
        # recorded as an empty input, the peer as its rank in the group
        with _CpuOp("c10d::send", [[op.tensor], None, int(op.group_peer), int(op.tag)]):
            d = self.submit(op)
            if self.sync:
                d.wait_posted()
            d.span = _open_span("gloo:send")
        return d

    def submit(self, op: Any) -> DeferredSend:
        d = DeferredSend(op, time.monotonic_ns() + self.delay_ns)
        with self._cv:
            if self._closed:
                raise RuntimeError("delayed sender is closed")
            self._queue.append(d)
            self._cv.notify()
        return d

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                head = self._queue[0]
            # All sends carry the same delay, so the queue is ordered by due time.
            left = head.due_ns - time.monotonic_ns()
            if left > 0:
                time.sleep(left / 1e9)
                continue
            with self._cv:
                self._queue.popleft()
            try:
                # Stamp before the call: the data cannot leave earlier, and a thread switch after
                # the call returns must not count as delay.
                head.posted_ns = time.time_ns()
                head.work = self._post(head.op)
            except BaseException as exc:  # handed to the waiting main thread
                head._error = exc
            finally:
                head._event.set()

    def close(self, timeout: float = 10.0) -> None:
        """Post what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)


def post_send(op: Any) -> Any:
    """Post one ``P2POp`` send to gloo, as the pipelining library would."""
    return dist.isend(op.tensor, group=op.group, tag=op.tag, group_dst=op.group_peer)


class RankFaults:
    """The faults that act on one rank, switched on per step by the rank loop."""

    def __init__(self, cfg: DemoConfig, rank: int) -> None:
        self.active = False
        self.stall_s = cfg.host_stall_ms / 1e3 if cfg.host_stall_rank == rank else 0.0
        delay_ns = int(cfg.comm_delay_ms * 1e6) if cfg.comm_delay_rank == rank else 0
        self.sender: DelayedSender | None = None
        if delay_ns > 0:
            # The sender thread needs the GIL to post; the default 5 ms switch interval would let
            # the main thread's Python work add up to 5 ms to each injected delay.
            sys.setswitchinterval(0.0005)
            self.sender = DelayedSender(delay_ns, post_send, sync=cfg.comm_delay_sync)

    @property
    def delays_sends(self) -> bool:
        return self.active and self.sender is not None

    def host_stall(self) -> tuple[int, int] | None:
        """Stall the host when this rank is the stalled one; returns the stall's (start, end) ns."""
        if not (self.active and self.stall_s > 0):
            return None
        t0 = time.time_ns()
        deadline = time.perf_counter() + self.stall_s
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(left)
        return t0, time.time_ns()

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
