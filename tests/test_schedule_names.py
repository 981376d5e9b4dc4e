"""One list of schedule names (ppdiag/model/schedule.py) that every command accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_fill import typed
from typer.testing import CliRunner

from ppdiag.cli import app
from ppdiag.demo.config import canonical_schedule as demo_schedule
from ppdiag.errors import InputError
from ppdiag.model.schedule import SCHEDULE_NAMES, Schedule, parse_schedule, schedule_option
from ppdiag.reports.style import CAUSE_LABELS
from ppdiag.reports.terminal import rank_table
from ppdiag.simulate import SCHEDULES as SIMULATED
from ppdiag.simulate import canonical_schedule
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("interleaved", Schedule.INTERLEAVED_1F1B),
        ("Interleaved-1F1B", Schedule.INTERLEAVED_1F1B),
        ("ScheduleLoopedBFS", Schedule.LOOPED_BFS),
        ("looped", Schedule.LOOPED_BFS),
        ("zb", Schedule.ZERO_BUBBLE),
        ("ZB-V", Schedule.ZBV),
        ("dualpipe_v", Schedule.DUALPIPEV),
        (" 1F1B ", Schedule.ONE_F_ONE_B),
    ],
)
def test_aliases(name: str, want: Schedule) -> None:
    assert parse_schedule(name) is want


def test_unknown_names_the_list() -> None:
    with pytest.raises(ValueError, match="known: gpipe, 1f1b"):
        parse_schedule("pipedream")
    with pytest.raises(InputError, match="--schedule: unknown schedule 'x'"):
        schedule_option("x")
    assert schedule_option(None) is None


def test_every_list_derives_from_the_one() -> None:
    assert set(SIMULATED) <= set(SCHEDULE_NAMES)
    assert set(SCHEDULE_NAMES) - set(SIMULATED) == {"looped_bfs"}
    for name in SCHEDULE_NAMES:
        assert demo_schedule(name) == name
    # the simulator resolves the same aliases, and refuses what it has no model of
    assert canonical_schedule("interleaved") == "interleaved_1f1b"
    with pytest.raises(ValueError, match="no simulator model"):
        canonical_schedule("looped_bfs")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("inter")
    write_kineto(make_scenario(schedule="interleaved_1f1b", virtual=2, steps=2), d)
    return d


def test_analyze_takes_an_alias(run_dir: Path, tmp_path: Path) -> None:
    """`analyze --schedule interleaved` was refused while whatif took it."""
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        app, ["analyze", str(run_dir), "-q", "-j", "1", "--schedule", "interleaved", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["run"]["schedule"] == "interleaved_1f1b"
    bad = CliRunner().invoke(app, ["analyze", str(run_dir), "-q", "--schedule", "nope"])
    assert bad.exit_code == 2 and "unknown schedule 'nope'" in bad.output


def test_whatif_takes_looped_bfs(run_dir: Path) -> None:
    """`whatif --schedule looped_bfs` failed while analyze took it: now it is predicted as
    interleaved 1F1B and says so."""
    res = CliRunner().invoke(app, ["whatif", str(run_dir), "-j", "1", "--schedule", "looped_bfs", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("{") :])["scenarios"]
    looped = [r for r in rows if "looped BFS is simulated as interleaved 1F1B" in (r.get("note") or "")]
    assert looped and all(not r.get("error") for r in looped)


def test_bubble_command_takes_looped_bfs() -> None:
    res = CliRunner().invoke(app, ["bubble", "--pp", "4", "-m", "8", "--schedule", "looped_bfs", "--json"])
    assert res.exit_code == 0, res.output
    # (P-1)/(vM+P-1) with v = 2: 3/19
    out = json.loads(res.stdout)
    assert out["closed_form"] == pytest.approx(3 / 19, abs=1e-6)
    assert out["schedule"] == "interleaved_1f1b"  # what was simulated, not a silent rename


def test_terminal_uses_the_report_cause_labels() -> None:
    headers = [str(c.header) for c in rank_table(typed({"ranks": []})).columns]
    assert [h for h in headers if h in CAUSE_LABELS.values()] == list(CAUSE_LABELS.values())


def test_report_schedule_enum_holds_every_schedule() -> None:
    # run.schedule in the typed report is the one Schedule: every accepted name plus "unknown" and
    # "none", which no command accepts
    from ppdiag.report_types import RunInfo

    assert RunInfo.__annotations__["schedule"] == "Schedule"
    assert {s.value for s in Schedule} == set(SCHEDULE_NAMES) | {"unknown", "none"}
    for name in ("unknown", "none"):
        with pytest.raises(ValueError, match="unknown schedule"):
            parse_schedule(name)
