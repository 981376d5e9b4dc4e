"""How far the fitted offset of a second host lands from the truth, alone (docs/clocks.md).

For each one-host run folder given (a ``ppdiag demo --record-only`` output), the peers are matched
once, then the last rank alone, the first rank alone and the upper half of the ranks are named
another host (no skew: the skew moves the fitted offset by itself alone, so the true offset of
every split is 0) and only the host clocks are fitted again. Much faster than
``bench_clock_relations.py`` (no diagnosis, a fraction of a second per run), so that a placement
can be judged on many recordings.

    python benchmarks/bench_clock_offsets.py RUN [RUN ...]

Prints per run and split the fitted offset minus the truth and the host's residual (µs), then per
split the median, mean and largest |error| and how many runs are off by more than 500 µs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ppdiag.api import load  # noqa: E402
from ppdiag.pipeline import PipelineOptions, _peers_and_topology  # noqa: E402
from ppdiag.pipeline.clocks import match_pairs, p2p_ops  # noqa: E402
from ppdiag.pipeline.host_clocks import fit_host_clocks  # noqa: E402

SPLITS = ("last", "first", "half")


def offset_errors(src: Path) -> dict[str, tuple[float, float]]:
    """Per split: the moved host's fitted offset against the others' (µs; truth 0) and the largest
    residual of the fit (µs)."""
    run = load([src])
    ops = {tl.rank: p2p_ops(tl) for tl in run.ranks}
    _peers_and_topology(run, PipelineOptions(), ops, [])
    pairs = match_pairs(ops)
    n = len(run.ranks)
    named = {tl.rank: tl.meta.get("host_name") for tl in run.ranks}
    out: dict[str, tuple[float, float]] = {}
    for split, moved in zip(SPLITS, ((n - 1,), (0,), tuple(range(n // 2, n))), strict=True):
        for tl in run.ranks:
            tl.meta["host_name"] = "other-node" if tl.rank in moved else (named[tl.rank] or "node0")
        got = fit_host_clocks(run, pairs)
        if got is None:
            continue
        off, clocks, _ = got
        stay = min(r for r in off if r not in moved)
        err = max((off[r] - off[stay] for r in moved), key=abs)
        out[split] = (err / 1000.0, max((c.residual_ns or 0) for c in clocks) / 1000.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    a = ap.parse_args()
    errs: dict[str, list[float]] = {s: [] for s in SPLITS}
    for p in a.runs:
        got = offset_errors(p)
        print(f"{p.name:32s} " + "  ".join(f"{s}: {e:+7.0f} / {r:6.0f}" for s, (e, r) in got.items()))
        for s, (e, _) in got.items():
            errs[s].append(abs(e))
    for s, v in errs.items():
        if v:
            print(
                f"{s}: median {statistics.median(v):.0f} µs, mean {statistics.mean(v):.0f}, "
                f"max {max(v):.0f}, over 500 µs {sum(x > 500 for x in v)} of {len(v)}"
            )


if __name__ == "__main__":
    main()
