"""One offset per host for device runs, where the host's name is evidence of one clock
(docs/clocks.md).

The GPUs of one host are stamped on that host's clock (Kineto and Nsight Systems convert device
times to host time), so the ranks of a named host share one unknown in the device fit: the offset
rests on every transfer between that host and the others, and a rank's own jitter stays in the
residual instead of becoming a clock of its own. A host's name is not always evidence, though:
no name, a generic one (``localhost``), or one name written for processes whose clocks differ
(a merged or rewritten trace). So the ranks are fitted one by one as well, and a host whose ranks'
own fits disagree by more than :data:`_SAME_CLOCK_NS` (or four times their residual) keeps one
offset per rank, with a warning: a wrong clock is never forced.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ppdiag.model import Run
from ppdiag.pipeline.clocks import ClockFit, Pairs, align_clocks
from ppdiag.pipeline.host_clocks import clock_domains

# Names that say nothing about the machine: every host calls itself that.
GENERIC_HOSTS = frozenset(
    {"localhost", "localhost.localdomain", "127.0.0.1", "::1", "0.0.0.0", "(none)", "unknown"}
)
# The Nsight Systems parser keeps a host name hashed (parsers/nsys_export.py): the same names, hashed.
_GENERIC_HASHED = frozenset(hashlib.sha1(h.encode()).hexdigest()[:12] for h in GENERIC_HOSTS)
# Ranks of one host read one clock; their per-rank device fits still differ by the GPU-to-host
# conversion and transfer jitter (tens of µs). Clocks of different hosts differ by NTP's
# milliseconds: a spread beyond this is two clocks, whatever the name says.
_SAME_CLOCK_NS = 200_000


def shared_clocks(run: Run) -> dict[int, int]:
    """Each rank's clock as the lowest rank of its host: ranks on one named host read one clock.
    A rank whose host is not known, or named generically (``localhost``), keeps a clock of its
    own."""
    dom = clock_domains(run)
    first: dict[str, int] = {}
    for r in sorted(dom):
        first.setdefault(dom[r], r)
    return {r: first[h] if _evidence(h) else r for r, h in dom.items()}


def _evidence(host: str) -> bool:
    """Whether a host name identifies a machine (and so a clock)."""
    name = host.strip().lower()
    return (
        bool(name)
        and not host.startswith("rank ")
        and name not in GENERIC_HOSTS
        and host not in _GENERIC_HASHED
    )


def fit_device_clocks(run: Run, pairs: Pairs) -> tuple[ClockFit, list[str]]:
    """The device fit with one offset per named host, where the ranks' own fits agree with it;
    warnings for the hosts whose ranks read different clocks (kept per rank)."""
    per_rank = align_clocks(run, pairs)
    rep = shared_clocks(run)
    if per_rank.residual_us is None or all(rep[r] == r for r in rep):
        return per_rank, []
    members: dict[int, list[int]] = {}
    for r, c in rep.items():
        members.setdefault(c, []).append(r)
    dom = clock_domains(run)
    warnings: list[str] = []
    for c, ranks in members.items():
        if len(ranks) < 2:
            continue
        vals = np.array([per_rank.offsets.get(r, 0) for r in ranks], dtype=np.float64)
        spread = float(vals.max() - vals.min())
        noise = max((per_rank.residual_by_rank_us.get(r, 0.0) for r in ranks), default=0.0) * 1000.0
        if spread > max(_SAME_CLOCK_NS, 4.0 * noise):
            for r in ranks:
                rep[r] = r
            warnings.append(
                f"host {dom[c]!r}: its ranks {sorted(ranks)} read clocks {spread / 1000:.0f} µs apart "
                f"(fitted one by one; their transfers agree within {max(noise, 1000.0) / 1000:.0f} µs): "
                "the name is not one clock (a merged or rewritten trace?), so each rank keeps its own offset"
            )
    if all(rep[r] == r for r in rep):
        return per_rank, warnings
    return align_clocks(run, pairs, rep), warnings
