"""The process guards of the entry point: signals end the command as an interrupt, a closed
stdout or stderr does not change its exit code, and an input error is one line on stderr.

Kept apart from :mod:`ppdiag.cli.support` (which loads typer and rich) so that the entry point can
install them before it knows whether the command needs typer at all (``ppdiag rules`` does not).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from ppdiag.errors import PpdiagError


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. Not a KeyboardInterrupt: click would turn that into "Aborted!"
    and exit 1, the gate-failed code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def on_signal(signum: int, _frame: Any) -> None:
    # ignore repeats while the cleanup (terminating parse workers) runs
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


class SafeStream:
    """stdout/stderr that survive a closed pipe (``ppdiag check ... | head -1``): the first EPIPE
    points the descriptor at /dev/null and later writes are dropped, so the command still ends with
    its own exit code (click would exit 1, the gate-failed code). Text the stream's encoding cannot
    hold (an ASCII-only locale) is replaced, not raised."""

    def __init__(self, stream: Any) -> None:
        self._s = stream
        self._broken = False

    def _drop(self) -> None:
        self._broken = True
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, self._s.fileno())
            os.close(fd)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if self._broken:
            return len(text)
        try:
            return int(self._s.write(text))
        except UnicodeEncodeError:
            enc = getattr(self._s, "encoding", None) or "ascii"
            try:
                return int(self._s.write(text.encode(enc, "replace").decode(enc, "replace")))
            except BrokenPipeError:
                self._drop()
                return len(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        if self._broken:
            return
        try:
            self._s.flush()
        except BrokenPipeError:
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def guard_streams() -> None:
    """A closed stdout/stderr (``>&-``) becomes /dev/null; open ones get :class:`SafeStream`."""
    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if s is None or getattr(s, "closed", False):
            s = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        if not isinstance(s, SafeStream):
            setattr(sys, name, SafeStream(s))


def error_line(exc: PpdiagError) -> str:
    """The one line an input error prints on stderr (``ppdiag: error: ...``), control characters
    of the message made visible."""
    from ppdiag.reports.sanitize import clean

    return f"ppdiag: error: {clean(str(exc))}"
