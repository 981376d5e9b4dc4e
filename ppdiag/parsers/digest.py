"""The map step of a scaled-out analysis: one trace file in, its ranks' compact digest out.

A digest is what the reduce step (matching, clocks, replay, rules: everything after parsing)
needs of a file and nothing else: each rank's columnar timeline (device intervals, host ranges,
interned names, metadata), never the raw events, encoded by :func:`ppdiag.parsers.cache.encode_ranks`
(the parse cache's columns back to back after a JSON header: no pickle, nothing executed when
read). That is KBs to a few MB per rank where the
trace held tens to hundreds of MB, so thousands of digests fit in the reducer's memory.

:func:`map_file` is the function the workers run: on a Dask cluster (:mod:`ppdiag.parsers.scaleout`)
and, through the same :func:`ppdiag.parsers.loader.parse_one`, in the local process pool. It reads
the file where it lies (a local or shared path, or an fsspec URL streamed on the worker), through
the worker's parse cache when ``use_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppdiag.model import RankTimeline
from ppdiag.parsers import ParseOptions


@dataclass(frozen=True)
class FileDigest:
    """One file's ranks, encoded; or the input error that file gave (as plain data)."""

    path: str
    payload: bytes | None = None  # cache.encode_ranks of the file's ranks
    ranks_plain: list[RankTimeline] | None = None  # the rare ranks an entry cannot carry exactly
    error_path: str | None = None
    error_message: str = ""

    @property
    def nbytes(self) -> int:
        """Size of the encoded ranks (0 for an error or the plain fallback)."""
        return len(self.payload) if self.payload is not None else 0

    def ranks(self) -> list[RankTimeline]:
        """The decoded ranks (raises the file's :class:`InputError` when it had one)."""
        from ppdiag.errors import InputError
        from ppdiag.parsers import cache

        if self.error_message:
            raise InputError(self.error_path, self.error_message)
        if self.payload is not None:
            out = cache.decode_ranks(self.payload)
            for tl in out:
                tl.source = self.path
            return out
        return list(self.ranks_plain or [])


def map_file(path: str, fmt: str, options: ParseOptions, use_cache: bool = True) -> FileDigest:
    """Parse one file (through the parse cache when ``use_cache``) and digest its ranks."""
    from ppdiag.parsers import cache
    from ppdiag.parsers.loader import parse_one

    # looked up with no key: the cache is neither read nor written
    out = parse_one(path, fmt, options) if use_cache else parse_one(path, fmt, options, True, None)
    if out.ranks is None:
        return FileDigest(path, error_path=out.error_path, error_message=out.error_message)
    data = cache.encode_ranks(out.ranks)
    if data is None:
        return FileDigest(path, ranks_plain=out.ranks)
    return FileDigest(path, payload=data)


def map_files(
    paths: list[str], fmts: list[str], options: ParseOptions, use_cache: bool = True
) -> list[FileDigest]:
    """:func:`map_file` over a batch of files (one task for many small files: a cluster's
    per-task cost is then paid once per batch, not once per rank)."""
    return [map_file(p, f, options, use_cache) for p, f in zip(paths, fmts, strict=True)]


__all__ = ["FileDigest", "map_file", "map_files"]
