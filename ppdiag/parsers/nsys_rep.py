"""``.nsys-rep`` reports: exported to SQLite with the ``nsys`` CLI and cached.

The report format is proprietary with no public reader, so ppdiag asks ``nsys export`` for the
SQLite form. The export is cached (``ParseOptions.nsys_cache_dir``, else next to the report when
that directory is writable, else the user cache directory) and reused while it is newer than the
report.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

# where an export lies is shared with the result cache, which keys the export a report is read through
from ppdiag.cachedir import nsys_export_path as cache_path
from ppdiag.cachedir import nsys_report_stem as _stem
from ppdiag.errors import InputError
from ppdiag.parsers.nsys_db import SQLITE_MAGIC

EXPORT_TIMEOUT_S = 3600


def export_command(report: Path, output: Path) -> str:
    """The command a user runs by hand (shell-quoted)."""
    return f"nsys export --type sqlite --output {shlex.quote(str(output))} {shlex.quote(str(report))}"


def _fresh(export: Path, report: Path) -> bool:
    try:
        if export.stat().st_mtime < report.stat().st_mtime or export.stat().st_size == 0:
            return False
        with export.open("rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def ensure_sqlite(report: Path, cache_dir: str | None) -> Path:
    """Path of an up-to-date SQLite export of ``report``, running ``nsys export`` when needed."""
    if not report.is_file():
        raise InputError(str(report), "no such file")
    target = cache_path(report, cache_dir)
    if _fresh(target, report):
        return target
    nsys = shutil.which("nsys")
    if nsys is None:
        suggested = report.with_name(f"{_stem(report)}.sqlite")
        raise InputError(
            str(report), f"cannot read .nsys-rep without nsys; run: {export_command(report, suggested)}"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            str(report), f"cannot create the export cache directory {target.parent}: {exc.strerror or exc}"
        ) from None
    # Export to a private name and rename, so a killed export never looks like a valid cache entry.
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp.sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(tmp), str(report)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(
            str(report), f"nsys export failed ({exc}); run by hand: {export_command(report, target)}"
        ) from None
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise InputError(str(report), f"nsys export failed: {why}")
    os.replace(tmp, target)
    return target
