"""The ground-truth measures the recorded-run tests judge findings by, on hand-worked truths."""

from __future__ import annotations

from typing import Any

import pytest
from demo_noise import host_ms_by_rank, load_host_ms

MS = 1_000_000


def _rank(
    rank: int, steps: list[tuple[int, int, int]], rows: list[tuple[str, int, int, int, int]]
) -> dict[str, Any]:
    """A rank of a ground truth: step windows (step, start ms, end ms) and intervals
    (kind, step, start ms, end ms, held ms)."""
    return {
        "rank": rank,
        "steps": {
            "step": [s for s, _, _ in steps],
            "start_ns": [a * MS for _, a, _ in steps],
            "end_ns": [b * MS for _, _, b in steps],
        },
        "intervals": {
            "kind": [k for k, *_ in rows],
            "step": [s for _, s, *_ in rows],
            "start_ns": [a * MS for _, _, a, _, _ in rows],
            "end_ns": [b * MS for _, _, _, b, _ in rows],
            "held_ns": [h * MS for *_, h in rows],
        },
    }


def test_host_time_is_what_is_neither_held_nor_waited() -> None:
    # rank 0, steps 1 [0, 100) and 2 [110, 200):
    #   step 1: fwd 0-30 holding 25, wait 30-60, bwd 60-95 holding 30   -> held 55 + waited 30
    #   (10 ms between the steps: glue the profiler's step span holds)
    #   step 2: stall 110-120 (host), fwd 120-150 holding 30, wait 150-190 -> held 30 + waited 40
    # over [0, 200): 200 - 55 - 30 - 30 - 40 = 45 ms of host time, 22.5 ms per step;
    # the send marker (issued to posted) is no hold and no wait: host time too
    r0 = _rank(
        0,
        [(1, 0, 100), (2, 110, 200)],
        [
            ("fwd", 1, 0, 30, 25),
            ("wait", 1, 30, 60, 0),
            ("send", 1, 60, 61, 0),
            ("bwd", 1, 60, 95, 30),
            ("stall", 2, 110, 120, 0),
            ("fwd", 2, 120, 150, 30),
            ("wait", 2, 150, 190, 0),
        ],
    )
    truth = {"ranks": [r0]}
    assert host_ms_by_rank(truth, [1, 2]) == {0: pytest.approx(22.5)}
    # step 1 alone runs to the start of step 2 (the glue between them counted once):
    # [0, 110) - held 55 - waited 30 = 25 ms
    assert host_ms_by_rank(truth, [1]) == {0: pytest.approx(25.0)}
    # step 2 alone, the last: [110, 200) - held 30 - waited 40 = 20 ms
    assert host_ms_by_rank(truth, (2,)) == {0: pytest.approx(20.0)}


def test_a_wait_across_the_measured_span_counts_only_inside_it() -> None:
    # step 2 [100, 200) measured alone; a wait 90-130 began in step 1's glue: 30 ms of it inside
    # [100, 200) - held 50 - waited 30 = 20 ms
    r1 = _rank(
        1,
        [(1, 0, 90), (2, 100, 200)],
        [("wait", 1, 90, 130, 0), ("fwd", 2, 130, 190, 50)],
    )
    assert host_ms_by_rank({"ranks": [r1]}, [2]) == {1: pytest.approx(20.0)}


def test_a_rank_without_every_step_is_left_out() -> None:
    r2 = _rank(2, [(1, 0, 100)], [("fwd", 1, 0, 100, 100)])
    assert host_ms_by_rank({"ranks": [r2]}, [1, 2]) == {}


def test_load_host_leaves_out_what_the_faults_made() -> None:
    # one step [0, 100) on three ranks:
    #   rank 0: fwd 0-40 holding 40, wait 40-90             -> 10 ms host, all of it the load's
    #   rank 1: stall 0-30 (injected), fwd 30-70 holding 40 -> 60 ms host, 30 of them injected: 30
    #   rank 2: sends delayed (comm_delay): fwd 0-10 holding 10 -> 90 ms host, the fault's own
    # the most the load gave one rank: rank 1's 30 ms
    steps = [(1, 0, 100)]
    truth = {
        "faults": [{"kind": "host_stall", "rank": 1}, {"kind": "comm_delay", "rank": 2}],
        "ranks": [
            _rank(0, steps, [("fwd", 1, 0, 40, 40), ("wait", 1, 40, 90, 0)]),
            _rank(1, steps, [("stall", 1, 0, 30, 0), ("fwd", 1, 30, 70, 40)]),
            _rank(2, steps, [("fwd", 1, 0, 10, 10)]),
        ],
    }
    assert host_ms_by_rank(truth, [1]) == {
        0: pytest.approx(10.0),
        1: pytest.approx(60.0),
        2: pytest.approx(90.0),
    }
    assert load_host_ms(truth, [1]) == pytest.approx(30.0)
