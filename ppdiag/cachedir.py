"""Where ppdiag's caches live, whether they are on, and how a file is keyed: shared by the parse
cache (:mod:`ppdiag.parsers.cache`) and the result cache (:mod:`ppdiag.result_cache`), and free of
numpy, so that a re-run served by the result cache never loads the analysis.

Where: ``$PPDIAG_CACHE_DIR``, else the user cache dir (``platformdirs``, else
``$XDG_CACHE_HOME/ppdiag`` or ``~/.cache/ppdiag``). ``PPDIAG_NO_CACHE=1`` (the CLI's ``--no-cache``)
turns both caches off.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_HASH_CHUNK = 1 << 22


def cache_dir() -> Path:
    """The folder entries live in (not created here)."""
    env = os.environ.get("PPDIAG_CACHE_DIR")
    if env:
        return Path(env)
    try:
        import platformdirs
    except ImportError:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "ppdiag"
    return Path(platformdirs.user_cache_dir("ppdiag", appauthor=False))


def enabled() -> bool:
    """False when ``PPDIAG_NO_CACHE`` is set to anything but empty or ``0``."""
    return os.environ.get("PPDIAG_NO_CACHE", "") in ("", "0")


def file_identity(path: Path) -> tuple[Path, int, int, str] | None:
    """(resolved path, size, ``mtime_ns``, BLAKE2b of every byte) of ``path`` as it is now, or None
    when it cannot be read or changed while it was hashed (then it must not be keyed at all). The
    hash makes a file rewritten in place with the same size and mtime a different file."""
    try:
        real = path.resolve()
        st = real.stat()
        h = hashlib.blake2b(digest_size=20)
        with open(real, "rb") as fh:
            while chunk := fh.read(_HASH_CHUNK):
                h.update(chunk)
        st2 = real.stat()
    except OSError:
        return None
    if (st2.st_size, st2.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        return None
    return real, st.st_size, st.st_mtime_ns, h.hexdigest()
