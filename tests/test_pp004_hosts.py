"""PP004 on links between hosts: a slow link is judged as on one host when the hosts' clock offset
is known far better than the link's transfers vary (docs/rules.md, PP004).

The inputs are committed recordings (``tests/data/cpu/gloo_1f1b_p4_m8_held{2,5}ms``: the demo's
1F1B, P=4, M=8, sleep compute, profiler defaults, rank 2's sends held 2 or 5 ms, recorded on 2 CPU
cores shared by several processes), so the relation is tested on the same bytes every time. Ranks
are moved to another host by :mod:`ppdiag.demo.skew` (host name and every timestamp, nothing
else). The fitted offset of the moved host is within about a hundred µs of the skew, while its
residual (the half-width of the causal interval: never below the spans' jitter on this loaded
host, and widened by the held link itself) is 3 to 9 ms. A margin of the whole residual hid the
held rank's links to the moved host and named rank 1 or rank 3 beside rank 2; the residual over
the root of the transfers still did on the 5 ms run (the residual is no spread: the held link
widens it); the spread of the transfers between the hosts over the root of their count does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TEST_DATA

from ppdiag.analysis import Analyzed
from ppdiag.api import Options, diagnose
from ppdiag.demo.skew import Move, move_ranks

HELD = {ms: TEST_DATA / "cpu" / f"gloo_1f1b_p4_m8_held{ms}ms" for ms in (2, 5)}
MS = 1_000_000


def _pp004_ranks(a: Analyzed) -> list[int] | None:
    got = [sorted(f.ranks) for f in a.result.findings if f.code == "PP004"]
    return got[0] if got else None


@pytest.fixture(scope="module", params=sorted(HELD), ids=lambda ms: f"held{ms}ms")
def held(request: pytest.FixtureRequest) -> tuple[Path, Analyzed]:
    src = HELD[request.param]
    return src, diagnose([src], Options())


def test_the_held_rank_is_named_on_one_host(held: tuple[Path, Analyzed]) -> None:
    _, base = held
    assert base.result.run.pp == 4
    assert _pp004_ranks(base) == [2]


@pytest.mark.parametrize("moved", [(3,), (2, 3)], ids=["one_rank", "half"])
@pytest.mark.parametrize("skew_ms", (1.0, -60_000.0))
def test_a_slow_link_across_hosts_names_the_same_rank(
    held: tuple[Path, Analyzed], tmp_path: Path, moved: tuple[int, ...], skew_ms: float
) -> None:
    src, base = held
    moves = {r: Move("other-node", int(skew_ms * MS)) for r in moved}
    move_ranks(src, tmp_path, moves)
    got = diagnose([tmp_path], Options())
    clocks = {c.host: c for c in got.result.run.clocks}
    other = clocks["other-node"]
    assert other.ranks == list(moved)
    # the offset is recovered far better than its residual: the premise of the relation
    assert other.residual_us is not None
    assert abs(other.offset_us + skew_ms * 1000.0) < 0.25 * other.residual_us
    assert _pp004_ranks(got) == _pp004_ranks(base) == [2]
