"""The HTML report at any width, in real headless Chromium (slow): at 800 and 1400 px no element
spills out of its card (tables scroll inside a box of their own), the page never scrolls sideways,
the plots take their card's width, and no two titles of a figure overlap. On the report of a
recorded demo run and on the report of a 64-rank (8 stages x 8 replicas) synthetic op table."""

from __future__ import annotations

import html as html_lib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from test_html import CHROMIUM, _chromium

from ppsynth.optable import OpTableParams, simulate_optable, write_table

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]

WIDTHS = (800, 1400)

# Every element of every card whose box leaves the card, unless an ancestor inside the card clips
# or scrolls it (then that ancestor is the one checked); the page's own sideways overflow; each
# plot's width against its card; overlapping titles (subplot titles, axis titles) inside a figure.
PROBE = """<script>
window.addEventListener('load',function(){setTimeout(function(){
  var out={spill:[],page:[document.documentElement.scrollWidth,window.innerWidth],plots:{},overlaps:[]};
  function clipped(el,card){for(var p=el.parentElement;p&&p!==card;p=p.parentElement){
    var o=getComputedStyle(p).overflowX;if(o!=='visible')return true;}return false;}
  function name(el){return el.tagName.toLowerCase()+(el.id?'#'+el.id:'')+
    (el.getAttribute('class')?'.'+String(el.getAttribute('class')).split(' ')[0]:'');}
  document.querySelectorAll('section').forEach(function(card){
    var c=card.getBoundingClientRect();
    card.querySelectorAll('*').forEach(function(el){
      var r=el.getBoundingClientRect();if(r.width===0||r.height===0)return;
      if(r.right>c.right+1||r.left<c.left-1){if(clipped(el,card))return;
        out.spill.push([card.id||'',name(el),Math.round(r.left-c.left),Math.round(r.right-c.right),
          (el.textContent||'').trim().slice(0,40)]);}});});
  document.querySelectorAll('.plot').forEach(function(p){
    var r=p.getBoundingClientRect(),box=p.parentElement,cs=getComputedStyle(box);
    var inner=box.clientWidth-parseFloat(cs.paddingLeft)-parseFloat(cs.paddingRight);
    var svg=p.querySelector('svg.main-svg'),sw=svg?svg.getBoundingClientRect().width:-1;
    out.plots[p.id]=[Math.round(r.width),Math.round(inner),Math.round(sw)];
    var boxes=[],sel='g.annotation-text-g, g.xtitle, g.ytitle, g.gtitle, g.updatemenu-button';
    p.querySelectorAll(sel).forEach(function(g){
      var b=g.getBoundingClientRect();
      if(b.width>0&&b.height>0)boxes.push([b,(g.textContent||'').slice(0,30)]);});
    for(var i=0;i<boxes.length;i++)for(var j=i+1;j<boxes.length;j++){var a=boxes[i][0],b=boxes[j][0];
      var w=Math.min(a.right,b.right)-Math.max(a.left,b.left);
      var h=Math.min(a.bottom,b.bottom)-Math.max(a.top,b.top);
      if(w>1&&h>1)out.overlaps.push([p.id,boxes[i][1],boxes[j][1]]);}});
  var pre=document.createElement('pre');pre.id='probe-result';pre.textContent=JSON.stringify(out);
  document.body.appendChild(pre);},1500);});
</script>"""


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(REPO)}


def _analyze(src: Path, html: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ppdiag", "analyze", str(src), "--html", str(html), "-q"],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.fixture(scope="module", params=["demo", "optable64"])
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "demo":
        if importlib.util.find_spec("torch") is None:
            pytest.skip("torch is not installed")
        run = tmp / "run"
        cmd = [sys.executable, "-m", "ppdiag", "demo", "--record-only", "-q", "--out", str(run)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
        assert res.returncode == 0, res.stderr[-2000:]
        src = run
    else:
        df, _ = simulate_optable(
            OpTableParams(pp=8, dp=8, microbatches=8, steps=(3, 5, 9), slow_worker=(2, 3, 1.4))
        )
        src = write_table(df, tmp / "ops.csv")
    html = tmp / "report.html"
    _analyze(src, html)
    return html


def _probe(report: Path, width: int) -> dict[str, Any]:
    text = report.read_text(encoding="utf-8")
    cut = text.index(">", text.index('http-equiv="Content-Security-Policy"')) + 1
    page = report.with_name(f"probe-{width}.html")
    page.write_text(text[:cut] + PROBE + text[cut:], encoding="utf-8")
    res = _chromium(
        page.parent / f"chrome-{width}", page.as_uri(), "--dump-dom", f"--window-size={width},3000"
    )
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r'<pre id="probe-result">(.*?)</pre>', res.stdout, re.S)
    assert m, "the page did not finish loading"
    out: dict[str, Any] = json.loads(html_lib.unescape(m.group(1)))
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_nothing_spills_out_of_its_card(report: Path, width: int) -> None:
    out = _probe(report, width)
    assert out["spill"] == [], out["spill"][:10]
    scroll_w, inner_w = out["page"]
    assert scroll_w <= inner_w, f"the page scrolls sideways: {scroll_w} > {inner_w}"
    assert "fig-timeline" in out["plots"]
    for pid, (plot_w, box_w, svg_w) in out["plots"].items():
        # the figure takes its box's content width (the card's, or its column's), drawn at that width
        assert box_w - 2 <= plot_w <= box_w, (pid, plot_w, box_w)
        assert abs(svg_w - plot_w) <= 2, (pid, svg_w, plot_w)
    assert out["overlaps"] == [], out["overlaps"][:10]
