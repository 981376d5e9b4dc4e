"""Step windows of a GPU rank on hand-built timelines (µs), with the expected windows worked out.

A step starts at its host ``ProfilerStep`` start when the device is idle by then, so the host
time before the step's first kernel is inside the step and charged as host; device work still
running from the previous step keeps the start at that work's end.
"""

from __future__ import annotations

from ppdiag.attribution.causes import attribute, rank_step
from ppdiag.model import Intervals, Kind, RangeKind, Ranges, RankTimeline
from ppdiag.pipeline.blocks import Blocks
from ppdiag.pipeline.steps import step_windows

US = 1000


def _tl(kernels: list[tuple[int, int, int]], steps: list[tuple[int, int, int]]) -> RankTimeline:
    """kernels: (launch, start, end) µs on one compute stream; steps: (number, start, end) µs."""
    n = len(kernels)
    iv = Intervals.from_columns(
        n,
        {
            "start": [k[1] * US for k in kernels],
            "end": [k[2] * US for k in kernels],
            "stream": [7] * n,
            "kind": [int(Kind.COMPUTE)] * n,
            "name": [0] * n,
            "launch": [k[0] * US for k in kernels],
        },
    )
    m = len(steps)
    rg = Ranges.from_columns(
        m,
        {
            "start": [s[1] * US for s in steps],
            "end": [s[2] * US for s in steps],
            "kind": [int(RangeKind.STEP)] * m,
            "name": [0] * m,
            "num": [s[0] for s in steps],
        },
    )
    return RankTimeline(0, "rank0", "kineto", [""], iv, rg, world_size=None)


def _windows(tl: RankTimeline) -> list[tuple[int, int, int]]:
    steps, _ = step_windows(tl)
    return [(s.number, s.start // US, s.end // US) for s in steps]


def test_host_stall_before_the_first_kernel_is_inside_the_step() -> None:
    # Step 1 (host 0-10000): a kernel launched at 100 runs 200-5000. Step 2 (host 10000-20000):
    # the host stalls 3000 µs, launches at 13000, the kernel runs 13050-18000. The device is idle
    # from 5000 on, so step 2 starts at its host start 10000 (not at its first kernel, 13050) and
    # step 1 ends there; step 1 starts at its host start 0 (nothing ran before it).
    tl = _tl([(100, 200, 5000), (13000, 13050, 18000)], [(1, 0, 10000), (2, 10000, 20000)])
    assert _windows(tl) == [(1, 0, 10000), (2, 10000, 18000)]
    # Step 2's lost time: 10000-13050 = 3050 µs idle; the next kernel was launched at 13000, so
    # 10000-13000 = 3000 µs is host, the 50 µs launch latency is not.
    steps, _ = step_windows(tl)
    s2 = steps[1]
    rs = rank_step(tl, 1, 2, s2.start, s2.end, Blocks.empty())
    assert rs.acct.lost == 3050 * US
    att = attribute([rs], {0: tl}, {}, 0, pipelined=False)
    assert att.causes[(0, 1)]["host"] == 3000 * US


def test_device_still_busy_keeps_the_start_at_the_end_of_its_work() -> None:
    # Step 1's kernel runs 200-11000, past the host's step boundary at 10000; step 2's kernel is
    # launched at 10100 and runs 11000-15000. The device is busy until 11000, so step 2 starts
    # there (= its first kernel), as before.
    tl = _tl([(100, 200, 11000), (10100, 11000, 15000)], [(1, 0, 10000), (2, 10000, 20000)])
    assert _windows(tl) == [(1, 0, 11000), (2, 11000, 15000)]


def test_start_never_moves_past_the_first_kernel() -> None:
    # A kernel launched in a step but starting before the host's step start (clock skew between
    # the host and device timelines) keeps the start at the kernel: min(10000, 9950) = 9950.
    tl = _tl([(100, 200, 9000), (10001, 9950, 12000)], [(1, 0, 10000), (2, 10000, 20000)])
    assert _windows(tl) == [(1, 0, 9950), (2, 9950, 12000)]
