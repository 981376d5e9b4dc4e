"""Clock relations on recorded runs: ranks moved to other hosts whose clocks are skewed must keep the
diagnosis (docs/clocks.md).

For each run folder given (a ``ppdiag demo --record-only`` output, or any multi-rank trace folder),
the last rank alone and then the upper half of the ranks are moved to another host with each skew
of +-1 ms, +-20 ms, +-2.5 s and +-60 s (16 relations), and two hosts of half the ranks each are
given two different skews (2 more). Ranks are moved by :func:`ppdiag.demo.skew.move_ranks` (host
name and every timestamp, nothing else). A relation holds when the moved run has the same pp,
stage map, schedule, M and findings (codes and ranks), every rank's causes within 1.5 % of the
step, and each moved rank's fitted offset within its host's residual of the skew applied.

    python benchmarks/bench_clock_relations.py RUN [RUN ...]
    python -m ppdiag demo --record-only -q --pp 4 -m 8 --comm-delay-ms 2 --comm-delay-rank 2 -o held2

Prints a line per failed relation and a row per run: held (of 16), the worst cause error and the
largest offset error of the 16, and the two-host cases held (of 2).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the clock tests' relations (clock_relations)

from clock_relations import cause_error, clock_structure  # noqa: E402

from ppdiag.analysis import Analyzed  # noqa: E402
from ppdiag.api import Options, diagnose  # noqa: E402
from ppdiag.demo.skew import Move, move_ranks  # noqa: E402

MS = 1_000_000
SKEWS_MS = (1.0, -1.0, 20.0, -20.0, 2500.0, -2500.0, 60_000.0, -60_000.0)
CAUSE_TOL = 0.015  # of the step


def offset_error(base: Analyzed, moved: Analyzed, moves: dict[int, Move]) -> tuple[float, bool]:
    """The largest error (µs) of a moved rank's fitted offset against the skew applied (relative to
    the reference rank), and whether every one is within its host's residual."""
    ob, om = base.result.run.clock_offsets_us, moved.result.run.clock_offsets_us
    resid = {r: c.residual_us for c in moved.result.run.clocks for r in c.ranks}
    ref = min(om, key=int)
    worst, ok = 0.0, True
    for r, mv in moves.items():
        want = -(mv.skew_ns - moves.get(int(ref), Move("", 0)).skew_ns) / 1000.0
        err = abs((om[str(r)] - om[ref]) - (ob[str(r)] - ob[ref]) - want)
        worst = max(worst, err)
        ok = ok and err <= (resid.get(r) or moved.result.run.clock_residual_us or 0.0) + 1.0
    return worst, ok


def cases(n: int) -> list[tuple[str, dict[int, Move]]]:
    """The 16 one-host-moved relations, then the 2 two-host ones."""
    out = []
    for place, ranks in (("last rank", (n - 1,)), ("half", tuple(range(n // 2, n)))):
        for s in SKEWS_MS:
            out.append((f"{place} {s:+g} ms", {r: Move("other-node", int(s * MS)) for r in ranks}))
    h = n // 2
    for sa, sb in ((1.0, 60_000.0), (-20.0, 2500.0)):
        moves = {r: Move("host-a" if r < h else "host-b", int((sa if r < h else sb) * MS)) for r in range(n)}
        out.append((f"2x2 {sa:+g} ms / {sb:+g} ms", moves))
    return out


def relations(src: Path) -> str:
    """The row of one run; failed relations are printed as they come."""
    base = diagnose([src], Options())
    want = clock_structure(base)
    held = held2 = 0
    worst_c = worst_o = 0.0
    for i, (name, moves) in enumerate(cases(len(base.result.ranks))):
        with tempfile.TemporaryDirectory() as d:
            move_ranks(src, Path(d), moves)
            moved = diagnose([Path(d)], Options())
        got = clock_structure(moved)
        ce = cause_error(base, moved)
        oe, within = offset_error(base, moved, moves)
        good = got == want and ce <= CAUSE_TOL and within
        if not good:
            diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
            print(
                f"  {src.name}: {name}: causes {100 * ce:.2f} %, offset {oe:.0f} us, within: {within}, {diff}"
            )
        if i < 16:
            held += good
            worst_c, worst_o = max(worst_c, ce), max(worst_o, oe)
        else:
            held2 += good
    return f"| {src.name} | {held}/16 | {100 * worst_c:.2f} % | {worst_o:.0f} µs | {held2}/2 |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    a = ap.parse_args()
    rows = [relations(p) for p in a.runs]
    print("| recording | held (of 16) | worst cause error | max offset error | two hosts (of 2) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
