"""How far the fitted offset of a second host lands from the truth, alone (docs/clocks.md).

For each one-host run folder given (a ``ppdiag demo --record-only`` output), the peers are matched
once, then the last rank alone, the first rank alone and the upper half of the ranks are named
another host (no skew: the skew moves the fitted offset by itself alone, so the true offset of
every split is 0) and only the host clocks are fitted again. Much faster than
``bench_clock_relations.py`` (no diagnosis, a fraction of a second per run), so that a placement
can be judged on many recordings.

    python benchmarks/bench_clock_offsets.py RUN [RUN ...]

Prints per run and split the fitted offset minus the truth, the host's residual and its standard
error (µs), then per split the median, mean and largest |error| and how many runs are off by more
than 500 µs, and the standard error's calibration: the share of hosts off by at most one and two
standard errors (a calibrated error covers about 68 % and 95 %) and the median |error| / se.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ppdiag.api import load  # noqa: E402
from ppdiag.pipeline import PipelineOptions, _peers_and_topology  # noqa: E402
from ppdiag.pipeline.clocks import match_pairs, p2p_ops  # noqa: E402
from ppdiag.pipeline.host_clocks import _place_link, clock_domains, fit_host_clocks  # noqa: E402
from ppdiag.pipeline.placement_error import known_clock_error  # noqa: E402
from ppdiag.pipeline.send_holds import sender_holds  # noqa: E402

SPLITS = ("last", "first", "half")


def offset_errors(src: Path) -> dict[str, tuple[float, float, float, bool]]:
    """Per split: the moved host's fitted offset against the others' (µs; truth 0), the largest
    residual of the fit and the largest standard error (µs; two hosts: the one not the reference),
    and whether the placement's error was measured (a link within a host timed both ways; else the
    standard error is the placed interval's half-width)."""
    run = load([src])
    ops = {tl.rank: p2p_ops(tl) for tl in run.ranks}
    _peers_and_topology(run, PipelineOptions(), ops, [])
    pairs = match_pairs(ops)
    n = len(run.ranks)
    named = {tl.rank: tl.meta.get("host_name") for tl in run.ranks}
    out: dict[str, tuple[float, float, float, bool]] = {}
    for split, moved in zip(SPLITS, ((n - 1,), (0,), tuple(range(n // 2, n))), strict=True):
        for tl in run.ranks:
            tl.meta["host_name"] = "other-node" if tl.rank in moved else (named[tl.rank] or "node0")
        got = fit_host_clocks(run, pairs)
        if got is None:
            continue
        off, clocks, _ = got
        stay = min(r for r in off if r not in moved)
        err = max((off[r] - off[stay] for r in moved), key=abs)
        resid = max((c.residual_ns or 0) for c in clocks) / 1000.0
        dom = clock_domains(run)
        measured = known_clock_error(pairs, dom, sender_holds(pairs, dom), _place_link) is not None
        out[split] = (err / 1000.0, resid, max((c.se_ns or 0) for c in clocks) / 1000.0, measured)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    a = ap.parse_args()
    errs: dict[str, list[float]] = {s: [] for s in SPLITS}
    ses: dict[str, list[tuple[float, float, bool]]] = {s: [] for s in SPLITS}
    for p in a.runs:
        got = offset_errors(p)
        print(
            f"{p.name:32s} "
            + "  ".join(
                f"{s}: {e:+7.0f} / {r:6.0f} ± {se:5.0f}{' ' if m else '*'}"
                for s, (e, r, se, m) in got.items()
            )
        )
        for s, (e, _, se, m) in got.items():
            errs[s].append(abs(e))
            ses[s].append((abs(e), se, m))
    for s, v in errs.items():
        if v:
            print(
                f"{s}: median {statistics.median(v):.0f} µs, mean {statistics.mean(v):.0f}, "
                f"max {max(v):.0f}, over 500 µs {sum(x > 500 for x in v)} of {len(v)}"
            )
    print("standard errors (* above: no link within a host timed both ways, the se is the interval's):")
    for split in (*SPLITS, "all"):
        hosts = [x for k in SPLITS for x in ses[k]] if split == "all" else ses[split]
        for label, sel in (("measured", [x for x in hosts if x[2]]), ("every host", hosts)):
            if sel:
                print(f"{split}, {label}: " + calibration([x[0] for x in sel], [x[1] for x in sel]))


def calibration(err: list[float], se: list[float]) -> str:
    """How well standard errors ``se`` cover errors ``err`` (µs, |error| per host): the share
    within one and two standard errors and the median ratio (a normal error: 68 %, 95 %, 0.67)."""
    n = len(err)
    ratio = [e / s if s > 0 else math.inf for e, s in zip(err, se, strict=True)]
    one = sum(r <= 1.0 for r in ratio)
    two = sum(r <= 2.0 for r in ratio)
    return (
        f"within 1 se {one} of {n} ({100 * one / n:.0f} %), within 2 se {two} ({100 * two / n:.0f} %), "
        f"median |error| / se {statistics.median(ratio):.2f}, median se {statistics.median(se):.0f} µs"
    )


if __name__ == "__main__":
    main()
