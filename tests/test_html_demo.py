"""The HTML report of real recorded demo runs in real headless Chromium (slow): one labelled bar per
micro-batch block of the schedule, the critical path drawn, no console error, no request, and the
default demo's page at most 2 MB."""

from __future__ import annotations

import html as html_lib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_parts import pipeline
from test_html import CHROMIUM, _bad_log_lines, _chromium, _count_color, decode_png

from ppdiag.reports.html_timeline import PATH_COLOR

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
]

# reads the drawn figure back: every forward/backward bar inside the shown x range, by row
PROBE = """<script>
window.__errs=[];window.addEventListener('error',function(e){window.__errs.push(String(e.message));});
window.addEventListener('load',function(){setTimeout(function(){
  var gd=document.getElementById('fig-timeline'),out={errors:window.__errs,bars:[],path:0,arrows:0};
  if(gd&&gd.data&&gd.layout){
    (gd._fullData||gd.data).forEach(function(t){
      if(t.name==='forward'||t.name==='backward'){for(var i=0;i<t.base.length;i++){
        out.bars.push([t.name,Math.round(t.y[i]),(t.text||[])[i]||'']);}}
      if(t.name==='critical path')out.path=t.base.length;
      if(t.name==='transfer on the critical path')out.arrows=Array.prototype.filter.call(t.x,
        function(v){return v!==null&&v!==undefined&&!isNaN(v);}).length/2;});}
  var pre=document.createElement('pre');pre.id='probe-result';pre.textContent=JSON.stringify(out);
  document.body.appendChild(pre);},1500);});
</script>"""


def _record(out: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "ppdiag", "demo", "--record-only", "-q", "--out", str(out), *args]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(ROOT), **_env()}
    )
    assert res.returncode == 0, res.stderr[-2000:]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module", params=[("1f1b", 1), ("interleaved_1f1b", 2)], ids=["default", "interleaved"])
def page(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    schedule, v = request.param
    tmp = tmp_path_factory.mktemp(schedule)
    run = tmp / "run"
    _record(run, *([] if schedule == "1f1b" else ["--schedule", schedule]))
    report = tmp / "r.html"
    js = tmp / "r.json"
    res = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(run), "--html", str(report), "--json", str(js), "-q"],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), **_env()},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    text = report.read_text(encoding="utf-8")
    cut = text.index(">", text.index('http-equiv="Content-Security-Policy"')) + 1
    probe_page = tmp / "probe.html"
    probe_page.write_text(text[:cut] + PROBE + text[cut:], encoding="utf-8")
    dom = _chromium(tmp, probe_page.as_uri(), "--dump-dom")
    shot = tmp / "shot.png"
    scr = _chromium(tmp, report.as_uri(), f"--screenshot={shot}")
    assert dom.returncode == 0 and scr.returncode == 0, dom.stderr[-2000:]
    m = re.search(r'<pre id="probe-result">(.*?)</pre>', dom.stdout, re.S)
    assert m, "the page did not finish loading"
    return {
        "schedule": schedule,
        "v": v,
        "size": report.stat().st_size,
        "probe": json.loads(html_lib.unescape(m.group(1))),
        "logs": dom.stderr + scr.stderr,
        "report": json.loads(js.read_text()),
        "img": decode_png(shot.read_bytes()),
        "run": run,
    }


def test_one_labelled_bar_per_micro_batch_block(page: dict[str, Any]) -> None:
    """Every micro-batch block the analysis found is one labelled bar (per rank, step, phase,
    micro-batch and chunk), and on every rank at least one step holds exactly the schedule's
    blocks: each micro-batch once per chunk, forward and backward."""
    from collections import Counter

    from ppdiag.api import diagnose

    rep = page["report"]
    p, m, v = rep["run"]["pp"], rep["run"]["microbatches"], page["v"]
    diag = diagnose([page["run"]])
    pipe = pipeline(diag)
    bars = page["probe"]["bars"]
    rank_of_row = {i: r for i, r in enumerate(sorted(pipe.blocks, key=lambda r: pipe.topology.stage_of[r]))}
    for row, rank in rank_of_row.items():
        b = pipe.blocks[rank]
        # the page draws the analysed steps: a warm-up first step that a busy host made an outlier
        # is left out of the analysis (and of the page), while the pipeline keeps its blocks
        numbers = [w.number for w in pipe.windows[rank]]
        shown = [k for k, n in enumerate(numbers) if n in set(rep["run"]["steps"])]
        for name, letter, ph in (("forward", "F", 1), ("backward", "B", 2)):
            sel = b.phase == ph
            blocks = {
                (int(k), int(mb), int(vs) // p)
                for k, mb, vs in zip(b.step[sel], b.mb[sel], b.stage[sel], strict=True)
                if int(k) in shown
            }

            def label(mb: int, c: int, letter: str = letter) -> str:
                return f"{letter}{mb}" if v == 1 else f"{letter}{mb}·v{c}"

            want = Counter(label(mb, c) for _k, mb, c in blocks)
            got = Counter(t for n, y, t in bars if n == name and y == row)
            assert got == want, (name, rank, got, want)
            schedule = {label(mb, c) for mb in range(m) for c in range(v)}
            per_step = [sorted(label(mb, c) for k2, mb, c in blocks if k2 == k) for k in shown]
            assert sorted(schedule) in per_step, (name, rank, per_step)


def test_critical_path_is_drawn(page: dict[str, Any]) -> None:
    probe = page["probe"]
    p = page["report"]["run"]["pp"]
    # at least one block per stage on the path, and the transfers between stages as arrows
    assert probe["path"] >= p and probe["arrows"] >= p - 1
    assert page["report"]["critical_path"]
    # the outline is painted (the screenshot's timeline holds the path colour)
    assert _count_color(page["img"][:, :, :3], PATH_COLOR) > 500


def test_no_error_no_request_and_light(page: dict[str, Any]) -> None:
    assert page["probe"]["errors"] == []
    assert _bad_log_lines(page["logs"]) == []
    if page["schedule"] == "1f1b":
        assert page["size"] <= 2 * 1024 * 1024, page["size"]
    assert np.asarray(page["img"]).shape[0] > 0


def test_own_outputs_in_the_run_dir_and_the_overlay(page: dict[str, Any], tmp_path: Path) -> None:
    """``analyze DIR --perfetto DIR/overlay.json --html DIR/r.html`` twice gives the same result;
    the overlay has one arrow per matched pair and no partially overlapping slices on a track."""
    from test_perfetto import _partial_overlaps

    from ppdiag.api import diagnose

    run = page["run"]
    outs = []
    for i in range(2):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "ppdiag",
                "analyze",
                str(run),
                "--perfetto",
                str(run / "overlay.json"),
                "--html",
                str(run / "r.html"),
                "--json",
                str(tmp_path / f"{i}.json"),
                "-q",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={"PYTHONPATH": str(ROOT), **_env()},
        )
        assert res.returncode == 0, res.stderr[-2000:]
        rep = json.loads((tmp_path / f"{i}.json").read_text())
        rep["run"]["warnings"] = [w for w in rep["run"]["warnings"] if "ppdiag wrote" not in w]
        outs.append(rep)
    assert outs[0] == outs[1]
    doc = json.loads((run / "overlay.json").read_text())
    assert _partial_overlaps(doc) == {}
    pairs = pipeline(diagnose([run])).pairs
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "s" and e["name"] == "p2p") == len(pairs) > 0
