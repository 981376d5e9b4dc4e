"""The clock relations' finding comparison (``tests/clock_relations.finding_changes``): a finding
that stands out of its noise in either run must keep its code and ranks; one within its noise
wherever it appears may come, go or name other ranks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from clock_relations import finding_changes, within_noise

from ppdiag.report_evidence import Evidence
from ppdiag.report_types import FindingRow, Severity


def _f(code: str, ranks: list[int], gain: float | None, noise: float | None) -> FindingRow:
    ev = Evidence() if noise is None else Evidence(noise_ms=noise)
    return FindingRow(code, None, code, Severity.LOW, [], ranks, gain, None, ev, [])


def _run(*fs: FindingRow) -> Any:
    return SimpleNamespace(result=SimpleNamespace(findings=list(fs)))


def test_within_noise_reads_the_evidence() -> None:
    assert within_noise(_f("PP004", [1], 6.4, 14.6))
    assert within_noise(_f("PP004", [1], 14.6, 14.6))  # at the noise: not out of it
    assert not within_noise(_f("PP004", [1], 14.7, 14.6))
    assert not within_noise(_f("PP004", [1], None, 14.6))  # no gain: never excused
    assert not within_noise(_f("PP004", [1], 6.4, None))  # no noise given: never excused


def test_a_finding_out_of_its_noise_must_keep_its_ranks() -> None:
    base = _run(_f("PP004", [2], 22.3, 10.0))
    assert finding_changes(base, _run(_f("PP004", [2], 21.0, 12.0))) == []
    assert finding_changes(base, _run(_f("PP004", [1], 21.0, 12.0))) == ["PP004: ((2,),) -> ((1,),)"]
    assert finding_changes(base, _run()) == ["PP004: ((2,),) -> None"]
    # out of its noise in the moved run only: still a change (the moved run claims it)
    assert finding_changes(_run(), _run(_f("PP004", [1], 3.7, 3.2))) == ["PP004: None -> ((1,),)"]
    # within its noise in the base, out of it moved, other ranks: a change
    assert finding_changes(_run(_f("PP004", [0, 1], 20.6, 27.9)), _run(_f("PP004", [1], 24.9, 17.6))) == [
        "PP004: ((0, 1),) -> ((1,),)"
    ]


def test_findings_within_their_noise_may_move() -> None:
    # gain 6.4 ms within 14.6 and 10.8 ms of noise: rank 1 or rank 2 is the run's noise deciding
    base = _run(_f("PP004", [1], 6.4, 14.6), _f("PP010", [], 22.1, 19.7))
    moved = _run(_f("PP004", [2], 6.4, 10.8), _f("PP010", [], 22.1, 19.7))
    assert finding_changes(base, moved) == []
    assert finding_changes(base, _run(_f("PP010", [], 22.1, 19.7))) == []
    # PP010 stands out of its noise in both runs and is kept: no change
    assert finding_changes(_run(_f("PP010", [], 30.0, 19.7)), _run(_f("PP010", [], 30.0, 19.7))) == []
    # ...and lost, it is a change
    assert finding_changes(_run(_f("PP010", [], 30.0, 19.7)), _run()) == ["PP010: ((),) -> None"]
