"""The order of findings within the run's noise (``rules._order``): a cause at a place to look at
(some ranks or stages, not all of them) comes before a remark that names none or every one, as a
user reads the first findings first (a recorded GPipe run, P = 4, rank 1's sends held 2 ms: PP004
[1] at gain / noise 0.999 fell behind PP010's variance on every stage, and the held rank was the
third finding)."""

from __future__ import annotations

from ppdiag.report_evidence import Evidence
from ppdiag.report_sections import Cause
from ppdiag.report_types import FindingRow, Severity
from ppdiag.rules import _order, _points_somewhere

WHERE = (4, 4)  # four ranks, four stages


def _low(
    code: str, cause: Cause | None, ranks: list[int], stages: list[int], gain: float, noise: float
) -> FindingRow:
    return FindingRow(
        code, cause, code, Severity.LOW, stages, ranks, gain, None, Evidence(noise_ms=noise), []
    )  # fmt: skip


def test_a_finding_at_one_rank_reads_before_one_everywhere() -> None:
    # PP004 at rank 1: 8.196 / 8.203 = 0.999; PP010 on all four stages: 5.644 / 5.0 = 1.13;
    # PP006 on all four ranks: 19.095 / 25.0 = 0.76. Gain / noise alone: PP010, PP004, PP006.
    p4 = _low("PP004", Cause.COMM_WAIT, [1], [], 8.196, 8.203)
    p10 = _low("PP010", Cause.IMBALANCE, [], [0, 1, 2, 3], 5.644, 5.0)
    p6 = _low("PP006", Cause.HOST, [0, 1, 2, 3], [], 19.095, 25.0)
    got = sorted([p10, p6, p4], key=lambda f: _order(f, WHERE))
    assert [f.code for f in got] == ["PP004", "PP010", "PP006"]


def test_points_somewhere() -> None:
    assert _points_somewhere(_low("A", None, [1], [], 1, 1), WHERE)
    assert _points_somewhere(_low("A", None, [], [2, 3], 1, 1), WHERE)
    assert not _points_somewhere(_low("A", None, [0, 1, 2, 3], [], 1, 1), WHERE)
    assert not _points_somewhere(_low("A", None, [], [], 1, 1), WHERE)
    assert not _points_somewhere(_low("A", None, [3, 2, 1, 0, 0], [0, 1, 2, 3], 1, 1), WHERE)


def test_a_cause_everywhere_still_reads_before_a_general_remark() -> None:
    # no cause: a general remark whatever it names, after every cause (a one-rank trace names its
    # one rank everywhere: PP005 at rank 0 of 1 stays before PP007's remark of a higher ratio)
    remark = _low("PP007", None, [1], [], 5.0, 1.0)
    everywhere = _low("PP005", Cause.EXPOSED_COMM, [0], [], 1.0, 1.0)
    got = sorted([remark, everywhere], key=lambda f: _order(f, (1, 1)))
    assert [f.code for f in got] == ["PP005", "PP007"]
