"""The map step on a Dask distributed cluster, for runs of thousands of ranks.

``--scheduler ADDRESS`` (or ``$PPDIAG_DASK_SCHEDULER``) sends the parse of every file to the
cluster's workers: each runs :func:`ppdiag.parsers.digest.map_file` on one file, where the file
lies (a shared filesystem path, or an fsspec URL), and sends back its compact digest. This process
then runs the reduce step (matching, clocks, replay, rules) on the digests alone, exactly as after
a local parse: the result is the same. Dask is the optional extra ``ppdiag[dask]``
(``dask[distributed]``); without it ``--scheduler`` is one clear error.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ppdiag.errors import InputError
from ppdiag.model import RankTimeline
from ppdiag.parsers import ParseOptions

if TYPE_CHECKING:
    from ppdiag.parsers.loader import TraceFile

ENV = "PPDIAG_DASK_SCHEDULER"
_NEED = "needs Dask: pip install 'dask[distributed]' fsspec (the ppdiag[dask] extra)"
CONNECT_TIMEOUT_S = 30.0


def scheduler_address(explicit: str | None = None) -> str | None:
    """The scheduler to use: ``explicit``, else ``$PPDIAG_DASK_SCHEDULER``; None for the local pool."""
    addr = explicit if explicit is not None else os.environ.get(ENV, "")
    addr = addr.strip()
    return addr or None


def _client(address: str) -> Any:
    try:
        from distributed import Client
    except ImportError:
        raise InputError(None, f"--scheduler {address} ({ENV}) {_NEED}") from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(None, f"cannot reach the Dask scheduler at {address} ({msg})") from None


def _n_workers(client: Any) -> int:
    try:
        return max(1, len(client.scheduler_info().get("workers", {})))
    except (OSError, TimeoutError, AttributeError):
        return 1


def _batches(n: int, workers: int) -> list[tuple[int, int]]:
    """``[a, b)`` file ranges: about 8 batches per worker (balance against per-task cost), at
    most 64 files each (a lost worker loses little), at least one file."""
    size = max(1, min(64, -(-n // (8 * workers))))
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def parse_on_dask(
    files: Sequence[TraceFile], options: ParseOptions, address: str
) -> list[tuple[TraceFile, list[RankTimeline]]]:
    """Map every file on the cluster at ``address``; the files' ranks in input order."""
    from ppdiag.parsers import cache
    from ppdiag.parsers.digest import FileDigest, map_files
    from ppdiag.parsers.urls import url_of

    client = _client(address)
    try:
        from distributed import as_completed

        use_cache = cache.enabled()
        # the workers read the files themselves: send names, never bytes
        names = [url_of(f.path) or str(f.path) for f in files]
        batches = _batches(len(files), _n_workers(client))
        futs = [
            client.submit(
                map_files,
                names[a:b],
                [f.format for f in files[a:b]],
                options,
                use_cache,
                pure=False,
            )
            for a, b in batches
        ]
        where = {fut.key: ab for fut, ab in zip(futs, batches, strict=True)}
        results: list[list[RankTimeline] | None] = [None] * len(files)
        for fut in as_completed(futs, loop=client.loop):
            a, b = where[fut.key]
            try:
                digests: list[FileDigest] = fut.result()
            except Exception as exc:  # a worker lost, or a failure inside the parse
                client.cancel(futs)
                raise InputError(
                    names[a] if b - a == 1 else f"{names[a]} (and {b - a - 1} more)",
                    f"the parse on the Dask cluster failed ({type(exc).__name__}: {str(exc)[:200]})",
                ) from None
            fut.release()  # the cluster need not keep what arrived here
            for i, d in zip(range(a, b), digests, strict=True):
                if d.error_message:
                    client.cancel(futs)
                results[i] = d.ranks()  # raises the file's own error, as the local parse does
    finally:
        client.close()
    return [(f, r or []) for f, r in zip(files, results, strict=True)]


__all__ = ["ENV", "parse_on_dask", "scheduler_address"]
