"""Clock relations on recorded runs: ranks moved to other hosts whose clocks are skewed must keep the
diagnosis (docs/clocks.md).

For each run folder given (a ``ppdiag demo --record-only`` output, or any multi-rank trace folder),
the last rank alone, the first rank alone and the upper half of the ranks are moved to another
host with each skew of +-1 ms, +-20 ms, +-2.5 s and +-60 s (24 relations), and two hosts of half
the ranks each are given two different skews (2 more; ``tests/clock_relations.py``). Ranks are
moved by :func:`ppdiag.demo.skew.move_ranks` (host name and every timestamp, nothing else). A
relation holds when the moved run has the same pp, stage map, schedule, M and findings (codes and
ranks; a finding within its noise wherever it appears may differ, as it does between two
recordings of one run), every rank's causes within 1.5 % of the step, and every rank's fitted
offset within its host's residual of the skew applied.

    python benchmarks/bench_clock_relations.py RUN [RUN ...]
    python -m ppdiag demo --record-only -q --pp 4 -m 8 --comm-delay-ms 2 --comm-delay-rank 2 -o held2

Prints a line per failed relation and a row per run: held (of 24), the worst cause error and the
largest offset error of the 24, the two-host cases held (of 2), and the relations (of 26) held
with every finding alike, those within their noise too.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the clock tests' relations (clock_relations)

from clock_relations import broken, cause_error, clock_cases, clock_structure, offset_error  # noqa: E402

from ppdiag.api import Options, diagnose  # noqa: E402
from ppdiag.demo.skew import move_ranks  # noqa: E402


def relations(src: Path) -> str:
    """The row of one run; failed relations are printed as they come."""
    base = diagnose([src], Options())
    held = {"one": 0, "two": 0}
    total = {"one": 0, "two": 0}
    strict = 0  # relations held with every finding alike, those within their noise too
    worst_c = worst_o = 0.0
    for name, moves in clock_cases(len(base.result.ranks)).items():
        with tempfile.TemporaryDirectory() as d:
            move_ranks(src, Path(d), moves)
            moved = diagnose([Path(d)], Options())
        why = broken(base, moved, moves)
        if why:
            print(f"  {src.name}: {name}: {'; '.join(why)}")
        kind = "two" if name.startswith("2x2") else "one"
        held[kind] += not why
        strict += not why and clock_structure(base)["findings"] == clock_structure(moved)["findings"]
        total[kind] += 1
        if kind == "one":
            worst_c = max(worst_c, cause_error(base, moved))
            worst_o = max(worst_o, offset_error(base, moved, moves)[0])
    return (
        f"| {src.name} | {held['one']}/{total['one']} | {100 * worst_c:.2f} % | {worst_o:.0f} µs "
        f"| {held['two']}/{total['two']} | {strict}/{total['one'] + total['two']} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    a = ap.parse_args()
    rows = [relations(p) for p in a.runs]
    print(
        "| recording | held (of 24) | worst cause error | max offset error | two hosts (of 2) "
        "| held with every finding alike |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
