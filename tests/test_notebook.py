"""The notebook API (``ppdiag.analyze``, ppdiag/notebook.py): the same report as ``ppdiag analyze
--json``, and tables that add up to it: lost intervals to the summary's lost time by cause, blocks
to the schedule's micro-batches, transfers to the matched sends and receives."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

import ppdiag
from ppdiag.cli import app
from ppdiag.errors import InputError
from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

M, PP, STEPS = 4, 4, 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("nb") / "run"
    write_kineto(make_scenario("1f1b", pp=PP, microbatches=M, steps=STEPS, seed=5), d)
    return d


@pytest.fixture(scope="module")
def analysis(run_dir: Path) -> ppdiag.notebook.Analysis:
    return ppdiag.analyze(run_dir, jobs=1)


def test_report_is_the_one_the_cli_writes(
    run_dir: Path, analysis: ppdiag.notebook.Analysis, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["analyze", str(run_dir), "--json", str(out), "-q", "--jobs", "1"])
    assert res.exit_code == 0, res.output
    cli = json.loads(out.read_text())
    mine = msgspec.to_builtins(analysis.report)
    for key in ("run", "summary", "stages", "ranks", "findings", "whatif", "critical_path"):
        assert mine[key] == cli[key], key


def test_lost_intervals_add_up_to_the_summary(analysis: ppdiag.notebook.Analysis) -> None:
    lost = analysis.lost
    assert list(lost.columns) == ["rank", "step", "start_ms", "end_ms", "duration_ms", "cause", "blamed_rank"]
    assert (lost.end_ms >= lost.start_ms).all() and set(lost["rank"]) == set(range(PP))
    # the summary's lost time is the mean over the ranks and the analysed steps
    n = len(analysis.report.ranks) * len(analysis.report.summary.steps_ms)
    per_cause = lost.groupby("cause").duration_ms.sum() / n
    for cause, ms in analysis.report.summary.lost_ms.items():
        assert per_cause.get(cause, 0.0) == pytest.approx(ms, abs=2e-3), cause


def test_blocks_are_every_micro_batch_of_every_stage(analysis: ppdiag.notebook.Analysis) -> None:
    b = analysis.blocks
    steps = len(analysis.report.summary.steps_ms)
    assert len(b) == PP * steps * M * 2  # 1F1B: one forward and one backward per micro-batch
    per = b.groupby(["rank", "step", "phase"]).microbatch.apply(lambda s: sorted(s))
    assert all(v == list(range(M)) for v in per)
    assert dict(zip(b["rank"], b["stage"], strict=True)) == {r: r for r in range(PP)}
    assert (b.busy_ms <= b.end_ms - b.start_ms + 1e-6).all()


def test_transfers_go_between_neighbour_stages(analysis: ppdiag.notebook.Analysis) -> None:
    t = analysis.transfers
    assert len(t) > 0 and set(zip(t.src, t.dst, strict=True)) <= {(r, r + 1) for r in range(PP - 1)} | {
        (r + 1, r) for r in range(PP - 1)
    }
    # on the common clock a receive does not end before its send started
    assert (t.recv_end_ms >= t.send_start_ms - 1e-3).all()


def test_frames_of_the_report_sections(analysis: ppdiag.notebook.Analysis) -> None:
    assert list(analysis.ranks["rank"]) == list(range(PP))
    assert "lost_ms.bubble" in analysis.ranks.columns
    assert list(analysis.stages["stage"]) == list(range(PP))
    assert list(analysis.findings["code"]) == [f.code for f in analysis.report.findings]


def test_figures_and_html(analysis: ppdiag.notebook.Analysis, tmp_path: Path) -> None:
    import plotly.graph_objects as go

    tl = analysis.timeline()
    assert isinstance(tl, go.Figure) and len(tl.data) > 0
    hist = analysis.histograms()
    assert isinstance(hist, go.Figure) and any(d.type == "histogram" for d in hist.data)
    page = analysis.to_html(tmp_path / "r.html")
    assert page.read_text().startswith("<!DOCTYPE html>")
    foreign = tmp_path / "notes.html"
    foreign.write_text("mine")
    with pytest.raises(InputError):
        analysis.to_html(foreign)  # never over a file ppdiag did not write
    assert "ranks, pp=4, schedule=1f1b" in repr(analysis)


def test_options_are_checked_like_the_cli(run_dir: Path) -> None:
    with pytest.raises(InputError, match="unknown option"):
        ppdiag.analyze(run_dir, micro_batches=8)
    with pytest.raises(InputError, match="--steps"):
        ppdiag.analyze(run_dir, steps="x:y")
    a = ppdiag.analyze([str(run_dir)], schedule="gpipe", jobs=1)
    assert a.report.run.schedule == "gpipe"
