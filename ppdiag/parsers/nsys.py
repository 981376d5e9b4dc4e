"""Nsight Systems input: SQLite exports (``nsys export --type sqlite``) and ``.nsys-rep`` reports.

One export becomes one :class:`RankTimeline` per process with GPU activity (one report per rank, or
one report holding every process of a torchrun job). Kernels, copies, memsets and sync rows become
device intervals with the host call that enqueued them (``launch``); NVTX ranges become host ranges
(steps, pipeline labels, NCCL API calls); NCCL kernels get p2p/collective semantics, direction,
bytes and peer from the NCCL API calls that launched them (NSYS.md §6), else from their names.

Timestamps: exports made with ``--ts-normalize`` are already on the UTC epoch clock; others are
shifted by the capture's session start time (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``) so that
the files of different ranks share one clock, to the precision of the hosts' clocks.

Communicator-local NCCL peers are mapped to global ranks inside one export (from the
``ncclCommInitRank`` payloads of its processes) and, across one-file-per-rank runs, by
:func:`resolve_nccl_peers`, which the run loader calls once every file is parsed and ranked.
Without payloads, peers come from PyTorch's ``nccl:send a->b`` / ``nccl:recv a<-b`` ranges
(``emit_nvtx``), whose process-group ranks :func:`resolve_nccl_peers` maps to global ranks; where
nothing names a peer it stays -1 (the pipeline layer may infer it from timing) and the direction is
kept. How each p2p kernel's peer was decided is in ``meta["p2p_peer_source"]`` (counts of
``metadata`` / ``nvtx name`` / ``none``) and per interval, in parse order, in
``meta["p2p_peer_how"]`` (0 none, 1 metadata, 2 nvtx name).

Rows with unusable ``start``/``end`` (NULL, TEXT, REAL, BLOB, or ``end < start``) are dropped in
SQL and counted per file in one warning (and in ``events_lost``); how the file is opened so that
only committed rows are read is :func:`ppdiag.parsers.nsys_db.open_export`'s business.

The reading of an open export is :mod:`ppdiag.parsers.nsys_export`, imported on the first parse
(:meth:`NsysParser.preload` imports it before a pool forks its workers): sniffing a run's files
imports this module only, and a run of other traces never loads the export reader.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ppdiag.cachedir import is_nsys_report as is_report
from ppdiag.errors import InputError
from ppdiag.model.timeline import RankTimeline
from ppdiag.parsers import ParseOptions, register
from ppdiag.parsers.nsys_db import SQL_BUDGET_ENV, SQL_STOPPED, open_export, sniff_sqlite
from ppdiag.parsers.nsys_peers import (
    PEER_HOW_NAMES,
    PEER_METADATA,
    PEER_NONE,
    PEER_NVTX_NAME,
    peer_source_counts,
    resolve_nccl_peers,
)
from ppdiag.parsers.nsys_rep import ensure_sqlite

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


class NsysParser:
    """Nsight Systems SQLite exports and ``.nsys-rep`` reports."""

    name = "nsys"
    format = "nsys"
    suffixes: tuple[str, ...] = (".sqlite", ".nsys-rep")
    describe = "Nsight Systems (*.sqlite, *.nsys-rep)"
    holds_every_rank = False

    def sniff(self, path: Path, head: bytes) -> bool:
        """``.nsys-rep``/``.qdrep`` by suffix; SQLite files by magic plus nsys tables."""
        if is_report(path):
            return True
        return sniff_sqlite(path, head)

    def parse(self, path: Path, options: ParseOptions) -> list[RankTimeline]:
        """One timeline per rank found in the file; :class:`InputError` on unusable input."""
        from ppdiag.parsers.nsys_export import parse_export

        path = Path(path)
        source = str(path)
        sqlite_path = ensure_sqlite(path, options.nsys_cache_dir) if is_report(path) else path
        db = open_export(sqlite_path)
        try:
            return parse_export(db, source)
        except sqlite3.Error as exc:
            if str(exc) == SQL_STOPPED:
                raise InputError(
                    source,
                    "its SQLite queries ran past their budget and were stopped (a view or trigger that "
                    f"does not end?); {SQL_BUDGET_ENV} sets a time limit",
                ) from None
            raise InputError(source, f"corrupt or truncated SQLite export ({exc})") from None
        except MemoryError:
            raise InputError(source, "export too large for the available memory") from None
        finally:
            db.close()

    def preload(self) -> None:
        """Import what :meth:`parse` reads an export with: once in a parent, not in each worker."""
        import ppdiag.parsers.nsys_export  # noqa: F401

    def resolve_run(self, ranks: list[RankTimeline]) -> list[str]:
        """NCCL p2p communicators name peers by their own ranks: global ranks are known only once
        every rank's file has been read (:func:`resolve_nccl_peers`)."""
        return resolve_nccl_peers(ranks)


PARSER = register(NsysParser())


__all__ = [
    "PARSER",
    "PEER_HOW_NAMES",
    "PEER_METADATA",
    "PEER_NONE",
    "PEER_NVTX_NAME",
    "NsysParser",
    "peer_source_counts",
    "resolve_nccl_peers",
]
