"""``python -m ppdiag`` and the ``ppdiag`` console script.

A signal during start-up (importing the command line, a few hundred ms on a loaded host) ends the
process as an interrupt does later on: "ppdiag: interrupted" and exit 128 + the signal, no
traceback. :func:`ppdiag.cli.main` then installs the handler that also stops parse workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType


def _interrupted_early(signum: int, _frame: FrameType | None) -> None:
    with contextlib.suppress(OSError):
        os.write(2, b"ppdiag: interrupted\n")
    os._exit(128 + signum)


def main() -> None:
    """Install the start-up signal handler, then run the command line."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: keep the defaults
            signal.signal(sig, _interrupted_early)
    from ppdiag.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
