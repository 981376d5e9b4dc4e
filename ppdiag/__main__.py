"""``python -m ppdiag`` and the ``ppdiag`` console script.

A signal during start-up (importing the command line, a few hundred ms on a loaded host) ends the
process as an interrupt does later on: "ppdiag: interrupted" and exit 128 + the signal, no
traceback. :func:`ppdiag.cli.main` then installs the handler that also stops parse workers.

The process ends with the cyclic garbage collector's objects frozen (:func:`main`): the
interpreter's exit would otherwise traverse every object of the analysis and its modules once
more (about 20 ms of a 0.3 s command) to find cycles that nothing here needs collected.
"""

from __future__ import annotations

import contextlib
import gc
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

    try:
        cli_main()
    finally:
        # The process ends here (this is the console script, never called in-process): the exit's
        # collections would only search the modules and the analysis for cycles to free. Frozen
        # objects are still freed by reference counting, the standard streams are still flushed,
        # and every report file is written and closed inside the command (ppdiag.io.write_output).
        gc.freeze()


if __name__ == "__main__":
    main()
