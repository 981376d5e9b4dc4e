"""HTML report: timeline model against the simulation, size limits, offline/escaping guarantees,
and (slow) a real headless-Chromium render: screenshot pixels, DOM, console, network."""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from diag_fixture import EVIL, Spec, build_nopp_diagnosis, build_pipeline_diagnosis
from report_fill import typed

from ppdiag.analysis import AnalysisContext, Analyzed
from ppdiag.diagnosis import Diagnosis
from ppdiag.model import Phase, Run
from ppdiag.report_types import Cause
from ppdiag.reports import write_report
from ppdiag.reports.html import build_timeline, plotly_js, render_html, timeline_figure
from ppdiag.reports.style import CAUSE_COLORS, WORK_COLORS

# ------------------------------------------------------------------ the timeline model


def _drawn_steps(td: Any) -> set[int]:
    return {s.index for s in td.spans if s.drawn}


def test_timeline_blocks_are_the_simulated_blocks() -> None:
    diag, truth = build_pipeline_diagnosis()
    td = build_timeline(diag)
    steps = _drawn_steps(td)
    assert steps == {0, 1, 2}
    row_rank = {r.y: r.rank for r in td.rows}
    for cat, ph in (("fwd", "F"), ("bwd", "B")):
        bs = td.sets[cat]
        got = sorted(
            zip(
                (row_rank[int(y)] for y in bs.cat("row")),
                bs.cat("mb_lo").tolist(),
                bs.cat("start").tolist(),
                bs.cat("end").tolist(),
                strict=True,
            )
        )
        # four kernels per block, on clocks offset per rank: merged back into exactly the simulated blocks
        want = sorted((r, mb, a, b) for (r, k, p, mb, a, b) in truth.blocks if p == ph and k in steps)
        assert got == want
    # rows in stage order with their labels
    assert [r.label for r in td.rows] == [f"stage {s} · rank {s}" for s in range(4)]


def test_gaps_drawn_add_up_to_the_gap_tables() -> None:
    diag, _ = build_pipeline_diagnosis()
    td = build_timeline(diag)
    hidden = sum(int(td.sets[c].cat("hidden").sum()) for c in ("fwd", "bwd") if c in td.sets)
    got_all = 0
    for i, c in enumerate(Cause):
        want = sum(int((g.end - g.start)[g.cause == i].sum()) for g in diag.gaps.values())
        bs = td.sets.get("cause:" + c)
        got = int((bs.cat("end") - bs.cat("start")).sum()) if bs else 0
        assert got <= want, c
        got_all += got
    # short gaps inside a micro-batch block are not drawn, their time is on the block (hover)
    assert got_all + hidden == sum(int((g.end - g.start).sum()) for g in diag.gaps.values())


def test_one_bar_per_micro_batch_block_short_gaps_inside_hidden() -> None:
    """Every forward block cut in two parts with a 1 µs host gap between them (a per-layer cut):
    one bar per micro-batch, the gap not drawn but counted on the bar."""
    from ppdiag.diagnosis import GapTable
    from ppdiag.report_types import Cause

    diag, truth = build_pipeline_diagnosis()
    want = sorted((r, mb) for (r, k, p, mb, _a, _b) in truth.blocks if p == "F" and k == 0)
    for rt in diag.run.ranks:
        g = diag.gaps[rt.rank]
        iv = rt.intervals
        fwd = np.flatnonzero((iv.phase == int(Phase.FWD)) & (iv.mb >= 0))
        # a 1 µs gap inside each forward interval (aligned clock), as a host gap
        mid = (iv.start[fwd] + iv.end[fwd]) // 2 + rt.clock_offset_ns
        diag.gaps[rt.rank] = GapTable(
            np.r_[g.start, mid],
            np.r_[g.end, mid + 1000],
            np.r_[g.cause, np.full(mid.shape, Cause.HOST.code, np.int8)],
            np.r_[g.blame, np.full(mid.shape, -1, np.int32)],
            np.r_[g.step, np.zeros(mid.shape, np.int32)],
        )
    td = build_timeline(diag)
    row_rank = {r.y: r.rank for r in td.rows}
    f = td.sets["fwd"]
    got = sorted(
        (row_rank[int(y)], int(m))
        for y, m, s in zip(f.cat("row"), f.cat("mb_lo"), f.cat("start"), strict=True)
        if td.spans[0].start <= s < td.spans[0].end
    )
    assert got == want
    assert int(f.cat("hidden").sum()) >= 1000 * len(want)


def test_median_step_is_shown_by_default() -> None:
    diag, truth = build_pipeline_diagnosis(Spec(steps=5, host_stall=(2, 3, 9000)))
    durs = [b - a for a, b in truth.step_windows]
    order = sorted(range(5), key=lambda i: (durs[i], i))
    med = order[2]
    td = build_timeline(diag)
    assert td.shown is not None and td.shown.index == med
    fig = timeline_figure(td)
    lo, hi = fig["layout"]["xaxis"]["range"]
    a, b = truth.step_windows[med]
    assert lo < (a - td.t0) / 1e6 < (b - td.t0) / 1e6 < hi
    assert hi - lo < 1.05 * (b - a) / 1e6  # one step, not the whole window
    labels = [btn["label"] for btn in fig["layout"]["updatemenus"][0]["buttons"]]
    assert labels == [f"step {5 + i}" + (" (median)" if i == med else "") for i in range(5)] + [
        "all drawn steps"
    ]
    # the timeline is a handful of traces, not one per block
    assert len(fig["data"]) <= 14


def test_size_limit_merges_drops_steps_and_says_so() -> None:
    diag, _ = build_pipeline_diagnosis()
    full = build_timeline(diag)
    per_step = full.n_blocks // 3
    td = build_timeline(diag, max_blocks=per_step - 10)
    assert td.n_blocks <= per_step - 10
    assert len(_drawn_steps(td)) == 1
    assert any(n.startswith("Simplified for size") and "were merged into" in n for n in td.notes)
    assert not any("longest were kept" in n for n in td.notes)
    assert any("2 of 3 steps are not drawn" in n for n in td.notes)
    # merged, not dropped: forward time drawn only grows (blocks joined across small gaps), and the
    # warm-up forwards of stage 0 (back to back in 1F1B) became one labelled run
    step = td.shown
    assert step is not None
    f_full, f_small = full.sets["fwd"], td.sets["fwd"]
    in_step = (f_full.cat("start") >= step.start) & (f_full.cat("end") <= step.end)
    drawn = int((f_small.cat("end") - f_small.cat("start")).sum())
    assert drawn >= int((f_full.cat("end") - f_full.cat("start"))[in_step].sum())
    runs = list(
        zip(
            f_small.cat("rank").tolist(),
            f_small.cat("mb_lo").tolist(),
            f_small.cat("mb_hi").tolist(),
            strict=True,
        )
    )
    assert (0, 0, 3) in runs
    html = render_html(diag, max_blocks=per_step - 10)
    assert "Simplified for size" in html


def test_size_limit_last_resort_keeps_the_longest_blocks() -> None:
    diag, _ = build_pipeline_diagnosis()
    for budget in (60, 80, 150):
        td = build_timeline(diag, max_blocks=budget)
        assert td.n_blocks == budget
        assert any(f"only the {budget} longest were kept" in n for n in td.notes)
    td = build_timeline(diag, max_blocks=60)
    kept = np.concatenate([bs.cat("end") - bs.cat("start") for bs in td.sets.values()])
    # the longest blocks of the step (the backward blocks of the slow stage) survive
    bwd = td.sets["bwd"]
    assert 2 in set(bwd.cat("rank").tolist())
    assert kept.min() > 0


def test_unlabelled_kernels_merge_into_compute_runs() -> None:
    diag, truth = build_pipeline_diagnosis(Spec(labelled=False))
    td = build_timeline(diag)
    assert "fwd" not in td.sets and "other" in td.sets
    # back-to-back kernels of one rank merge; each run is at least one simulated block long
    n_blocks = sum(1 for b in truth.blocks if b[1] in _drawn_steps(td))
    assert 0 < len(td.sets["other"]) <= n_blocks


def test_many_ranks_keep_a_bounded_number_of_rows() -> None:
    diag = build_nopp_diagnosis(n_ranks=70, steps=2)
    td = build_timeline(diag, max_rows=16)
    assert len(td.rows) == 16
    assert any("70 ranks" in n for n in td.notes)


# ------------------------------------------------------------------ the HTML text


def test_html_is_self_contained_and_escaped(tmp_path: Path) -> None:
    diag, _ = build_pipeline_diagnosis()
    path = write_report("html", diag, tmp_path / "r.html")
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    # plotly.js is inlined once, verbatim (its code mentions URLs it never loads here: checked in the browser)
    js = plotly_js()
    assert html.count(js) == 1
    page = html.replace(js, "")
    # nothing to fetch: no remote src/href, no stylesheet links, no CSS imports or remote urls
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<link" not in page.lower() and "@import" not in page
    assert not re.search(r"url\(\s*['\"]?https?:", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert html.count("</script>") == 3  # error hook, plotly.js, the figures
    # a hostile kernel name is text, never markup; the figure JSON cannot close its script element
    assert EVIL not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html
    figs = html[html.rindex("<script>") :]
    assert "</" not in figs[len("<script>") : -len("</script></body></html>\n")]
    for id_ in ("fig-timeline", "fig-histogram", "fig-lost", "fig-bubble"):
        assert f'id="{id_}"' in html


def test_html_without_pipeline(tmp_path: Path) -> None:
    diag = build_nopp_diagnosis()
    html = render_html(diag)
    assert "no pipeline parallelism" in html
    assert 'id="fig-histogram"' not in html and 'id="fig-bubble"' not in html
    assert 'id="fig-timeline"' in html and 'id="fig-lost"' in html
    assert "Lost time per rank, by cause" in html


def test_html_of_an_empty_diagnosis() -> None:
    diag: Analyzed = Diagnosis(
        run=Run(ranks=[], format="kineto"), result=typed({"schema_version": 1, "run": {}, "summary": {}})
    )
    html = render_html(diag)
    assert "No device intervals or gaps to draw." in html


# ------------------------------------------------------------------ a real browser (slow)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

PROBE = """<script>
window.__probe={errors:[],csp:[]};
window.alert=window.confirm=window.prompt=function(){document.documentElement.setAttribute('data-alerted','1');};
window.addEventListener('error',function(e){window.__probe.errors.push(String(e.message));});
document.addEventListener('securitypolicyviolation',function(e){
  window.__probe.csp.push(e.violatedDirective+' '+e.blockedURI);});
function __report(out){var pre=document.createElement('pre');pre.id='probe-result';
  pre.textContent=JSON.stringify(out);document.body.appendChild(pre);}
window.addEventListener('load',function(){setTimeout(function(){
  var out={errors:window.__probe.errors,csp:window.__probe.csp,rects:{},hover:null};
  ['fig-timeline','fig-histogram','fig-lost','fig-bubble'].forEach(function(id){
    var el=document.getElementById(id);
    if(el){var r=el.getBoundingClientRect();out.rects[id]=[r.left,r.top+window.scrollY,r.width,r.height];}});
  // hover the first forward block whose longest kernel has a hostile name, then read the tooltip
  var gd=document.getElementById('fig-timeline');
  if(!gd||!gd.data||!window.Plotly){__report(out);return;}
  var ci=-1,pi=-1;
  gd.data.forEach(function(t,i){if(t.name==='forward'){(t.hovertext||[]).forEach(function(h,j){
    if(pi<0&&h.indexOf('script')>=0){ci=i;pi=j;}});}});
  if(ci>=0){try{Plotly.Fx.hover(gd,[{curveNumber:ci,pointNumber:pi}]);}catch(e){out.errors.push(String(e));}}
  setTimeout(function(){var hl=gd.querySelector('.hoverlayer');out.hover=hl?hl.textContent:null;
    out.hoverScripts=hl?hl.querySelectorAll('script').length:-1;out.errors=window.__probe.errors;
    out.csp=window.__probe.csp;__report(out);},500);
  },800);});
</script>"""


def _chromium(tmp: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--hide-scrollbars",
        "--mute-audio",
        f"--user-data-dir={tmp / 'profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,2400",
        "--virtual-time-budget=10000",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def _bad_log_lines(logs: str) -> list[str]:
    """Console errors, blocked requests and network failures in Chromium's log."""
    keys = ("Uncaught", "Refused to", "net::ERR", "Content Security Policy")
    return [
        ln for ln in logs.splitlines() if any(k in ln for k in keys) or (":CONSOLE" in ln and "rror" in ln)
    ]


def decode_png(data: bytes) -> np.ndarray:
    """A tiny PNG decoder (8-bit RGB/RGBA, not interlaced): returns an (h, w, channels) uint8 array.

    Filters are undone along anti-diagonals so each numpy step handles every pixel whose left, upper
    and upper-left neighbours are already known.
    """
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    w = h = ctype = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        typ = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + n]
        if typ == b"IHDR":
            w, h, depth, ctype, _c, _f, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0
        elif typ == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 4 if ctype == 6 else 3
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    ftype = raw[:, 0].astype(np.int32)
    filt = raw[:, 1:].reshape(h, w, bpp).astype(np.int32)
    out = np.zeros((h + 1, w + 1, bpp), dtype=np.int32)  # a zero row above and column left
    for d in range(h + w - 1):
        y = np.arange(max(0, d - w + 1), min(h - 1, d) + 1)
        x = d - y
        a, b, c = out[y + 1, x], out[y, x + 1], out[y, x]
        t = ftype[y][:, None]
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        pred = np.select([t == 1, t == 2, t == 3, t == 4], [a, b, (a + b) // 2, paeth], 0)
        out[y + 1, x + 1] = (filt[y, x] + pred) & 255
    return out[1:, 1:, :3].astype(np.uint8)


def _count_color(img: np.ndarray, hex_color: str) -> int:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)
    return int(np.all(img == rgb, axis=2).sum())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not CHROMIUM:
        pytest.skip("chromium is not installed")
    tmp = tmp_path_factory.mktemp("browser")
    diag, truth = build_pipeline_diagnosis()
    html = render_html(diag)
    # the probe goes right after the CSP meta, so the policy covers it and everything after
    cut = html.index(">", html.index('http-equiv="Content-Security-Policy"')) + 1
    page = tmp / "report.html"
    page.write_text(html[:cut] + PROBE + html[cut:], encoding="utf-8")
    url = page.as_uri()
    dom = _chromium(tmp, url, "--dump-dom")
    shot = tmp / "shot.png"
    scr = _chromium(tmp, url, f"--screenshot={shot}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert scr.returncode == 0 and shot.exists(), scr.stderr[-2000:]
    m = re.search(r'<pre id="probe-result">(.*?)</pre>', dom.stdout, re.S)
    assert m, "the page did not finish loading"
    probe = json.loads(html_lib.unescape(m.group(1)))
    return {
        "dom": dom.stdout,
        "logs": dom.stderr + scr.stderr,
        "probe": probe,
        "img": decode_png(shot.read_bytes()),
        "shot": shot,
        "diag": diag,
        "truth": truth,
    }


@pytest.mark.slow
def test_browser_renders_the_timeline_and_histogram(rendered: dict[str, Any]) -> None:
    img: np.ndarray = rendered["img"]
    probe = rendered["probe"]
    assert img.shape[:2] == (2400, 1400)

    def region(id_: str) -> np.ndarray:
        x, y, w, h = (round(v) for v in probe["rects"][id_])
        assert w > 300 and h > 150 and y + h <= img.shape[0], (id_, probe["rects"][id_])
        return img[y : y + h, x : x + w]

    tl = region("fig-timeline")
    # forward, backward and the causes present in the shown step are painted in their colours
    for color, min_px in (
        (WORK_COLORS["fwd"], 2000),
        (WORK_COLORS["bwd"], 2000),
        (CAUSE_COLORS["imbalance"], 1000),
        (CAUSE_COLORS["bubble"], 1000),
    ):
        assert _count_color(tl, color) >= min_px, color
    hist = region("fig-histogram")
    flat = hist.reshape(-1, 3)
    assert len(np.unique(flat, axis=0)) > 50  # not a blank area
    assert (flat.min(axis=1) < 235).mean() > 0.03
    assert _count_color(hist, CAUSE_COLORS["imbalance"]) >= 200  # the slowest stage's frame
    # a blank page region for comparison: the screenshot's margin has one colour
    assert len(np.unique(img[:, :10].reshape(-1, 3), axis=0)) <= 2


@pytest.mark.slow
def test_browser_dom_has_the_traces_and_labels(rendered: dict[str, Any]) -> None:
    dom = rendered["dom"]
    legend = set(re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom))
    assert {
        "forward",
        "backward",
        "p2p send/recv",
        "collective",
        "pipeline bubble",
        "stage imbalance",
        "recv / NCCL wait",
        "missing overlap",
        "host / launch bound",
    } <= legend
    tl = dom[dom.index('id="fig-timeline"') : dom.index('<section id="histogram"')]
    td = build_timeline(rendered["diag"])
    assert tl.count('class="point"') >= td.n_blocks
    labels = set(re.findall(r'class="bartext[^"]*"[^>]*>(?:<[^>]+>)*([FB]\d+)<', tl))
    expected = {f"{p}{m}" for p in "FB" for m in range(8)}
    assert len(labels & expected) >= 12, labels
    assert "step 7 (median)" in tl  # the default step's button
    hist = dom[dom.index('id="fig-histogram"') : dom.index('<section id="lost"')]
    assert "slowest" in hist and hist.count('class="point"') > 0


@pytest.mark.slow
def test_browser_no_errors_no_requests_no_injection(rendered: dict[str, Any]) -> None:
    dom, logs, probe = rendered["dom"], rendered["logs"], rendered["probe"]
    assert probe["errors"] == [] and probe["csp"] == []
    assert _bad_log_lines(logs) == []
    assert "data-alerted" not in dom[: dom.index("<head")]
    assert 'id="ppdiag-errors" hidden' in dom
    # the hostile kernel name is shown as text in the hover label (plotly decodes the entities we wrote,
    # draws SVG text, and no element is created) and in the findings' evidence
    assert probe["hover"] is not None and f"longest: {EVIL}" in probe["hover"]
    assert probe["hoverScripts"] == 0
    # the hostile kernel name is in the page as text, not as an element
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert EVIL not in dom


@pytest.mark.slow
def test_browser_harness_sees_requests_injection_and_errors(tmp_path: Path) -> None:
    """Negative control: the probe and log scan do catch a request, an injected script and an error."""
    if not CHROMIUM:
        pytest.skip("chromium is not installed")
    from ppdiag.reports.html import CSP

    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><head>"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">{PROBE}</head>'
        '<body><img src="http://example.invalid/x.png"><script>alert(1)</script>'
        "<script>undefinedFunction();</script></body></html>",
        encoding="utf-8",
    )
    res = _chromium(tmp_path, page.as_uri(), "--dump-dom")
    m = re.search(r'<pre id="probe-result">(.*?)</pre>', res.stdout, re.S)
    assert m
    probe = json.loads(html_lib.unescape(m.group(1)))
    assert any("img-src" in v and "example.invalid" in v for v in probe["csp"])
    assert any("undefinedFunction" in e for e in probe["errors"])
    assert 'data-alerted="1"' in res.stdout[: res.stdout.index("<head")]
    bad = _bad_log_lines(res.stderr)
    assert any("Uncaught ReferenceError" in ln for ln in bad)
    assert any("example.invalid" in ln for ln in bad)


def test_weight_grad_blocks_and_virtual_stages() -> None:
    diag, truth = build_pipeline_diagnosis()
    # zero-bubble style: the last kernel of every backward block is its weight-gradient (W) part,
    # and the run is interleaved with two virtual stages per rank (chunk 1 = virtual stage r + 4)
    for rt in diag.run.ranks:
        iv = rt.intervals
        ln = rt.names.index("layer_norm_grad_kernel")
        iv.phase[iv.name == ln] = int(Phase.WGRAD)
        iv.chunk[:] = np.where(iv.mb % 2 == 1, rt.rank + 4, rt.rank)  # virtual stages r and r + P
    diag = dataclasses.replace(
        diag,
        result=msgspec.structs.replace(
            diag.result, run=msgspec.structs.replace(diag.result.run, virtual_stages=2)
        ),
        context=AnalysisContext(stage_of_rank={r: [r, r + 4] for r in range(4)}),
    )
    td = build_timeline(diag)
    assert [r.label for r in td.rows] == [f"stages {r},{r + 4} · rank {r}" for r in range(4)]
    n_b = sum(1 for b in truth.blocks if b[2] == "B")
    assert len(td.sets["wgrad"]) == n_b and len(td.sets["bwd"]) == n_b
    fig = timeline_figure(td)
    w = next(t for t in fig["data"] if t["name"] == "weight grad (W)")
    assert "W3·v1" in w["text"] and "W2·v0" in w["text"]
    b = next(t for t in fig["data"] if t["name"] == "backward")
    assert "B3·v1" in b["text"]
