"""The shell of the HTML report page: its stylesheet, the Content-Security-Policy that forbids every
request, the vendored plotly.js inlined once, the script that draws the figures, and the
autoescaped Jinja2 templates (``templates/*.html.j2``) the sections and the page are rendered with.
"""

from __future__ import annotations

import functools
import json
import re
from importlib.resources import files

import jinja2
from markupsafe import Markup

from ppdiag.io import html_marker
from ppdiag.reports.html_figures import PlotlyFigure, fig_json

#: The plotly.js partial bundle inlined into the page (vendor/README.md: version, source, licence).
PLOTLY_JS = "plotly-cartesian.min.js"
PLOTLY_VERSION = "4.1.1"

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'"
)


@functools.cache
def plotly_js() -> str:
    """The vendored plotly.js bundle (cartesian trace types only: bar, scatter, histogram, heatmap)."""
    return (files("ppdiag.reports") / "vendor" / PLOTLY_JS).read_text(encoding="utf-8")


_CSS = """
:root{--fg:#1d232b;--muted:#5b6672;--line:#e3e7ec;--bg:#f6f8fa;--card:#fff}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--fg);
background:var(--bg)}
main{max-width:1360px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:17px;margin:0 0 10px}h3{font-size:15px;margin:0}
.sub{color:var(--muted)}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:16px 18px;margin:14px 0}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:10px;margin:12px 0}
.tile{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.tile .v{font-size:22px;font-weight:650}.tile .k{color:var(--muted);font-size:12px;text-transform:uppercase;
letter-spacing:.04em}
.bar{display:flex;height:22px;border-radius:4px;overflow:hidden;border:1px solid var(--line);margin:8px 0 6px}
.bar span{display:block;height:100%}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;color:var(--muted);font-size:13px}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;vertical-align:-1px}
table{border-collapse:collapse;width:100%;font-size:13px}
.tw{overflow-x:auto;max-width:100%;margin:0 0 4px}.tw td:not(.l){white-space:nowrap}
section{overflow-wrap:break-word}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:right;vertical-align:top}
th{background:#fafbfc;font-weight:600}
td.l,th.l{text-align:left}
.finding{border:1px solid var(--line);border-left:6px solid #999;border-radius:6px;padding:10px 14px;
margin:10px 0}
.finding .head{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.badge{font-size:11px;font-weight:700;color:#fff;border-radius:3px;padding:1px 6px;text-transform:uppercase}
.code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-weight:700}
.gain{margin-left:auto;font-weight:650}
.meta{color:var(--muted);font-size:13px;margin:3px 0 6px}
.evidence{width:auto;min-width:40%;margin:4px 0 6px}.evidence td{text-align:left}
.evidence td:first-child{color:var(--muted);white-space:nowrap}
ol.fixes{margin:4px 0 0 18px;padding:0}
.note{background:#fff8e1;border:1px solid #f3e3a1;border-radius:6px;padding:7px 10px;margin:8px 0;
font-size:13px}
.warn li{margin:2px 0}
.grid2{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:14px}
@media (max-width:900px){.grid2{grid-template-columns:1fr}}
.plot{width:100%}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
details>summary{cursor:pointer;color:var(--muted);margin:6px 0}
#ppdiag-errors{background:#fdecea;border:1px solid #f5c2c0;color:#8a1c14;border-radius:6px;padding:8px 12px}
.howto{background:#f4f7fb;border:1px solid #d6e0ec;border-radius:6px;padding:4px 12px;margin:8px 0;
font-size:13px}.howto ul{margin:2px 0 6px 18px;padding:0}.howto summary{font-weight:600;color:var(--fg)}
tr.slow td{font-weight:650;background:#fff6e5}
.pass{color:#1e7d32;font-weight:700}.fail{color:#b71c1c;font-weight:700}.inconclusive{color:#8a6d00;font-weight:700}
"""

_ERROR_HOOK = """
(function(){
  function show(msg){var d=document.getElementById('ppdiag-errors');if(!d)return;d.hidden=false;
    var li=document.createElement('li');li.textContent=String(msg);d.querySelector('ul').appendChild(li);}
  window.addEventListener('error',function(e){show(e.message||e);});
  window.addEventListener('unhandledrejection',function(e){show(e.reason||e);});
})();
"""


@functools.cache
def env() -> jinja2.Environment:
    """The page templates (``templates/*.html.j2``), autoescaped: a trace string can only reach the
    page as text."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("ppdiag.reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
    )


#: plotly options of every figure (no logo, no cloud, no links out of the page).
_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "showLink": False,
    "showSendToCloud": False,
    "typesetMath": False,
    "modeBarButtonsToRemove": ["select2d", "lasso2d"],
    "toImageButtonOptions": {"format": "png", "scale": 2},
}


_TABLE_OPEN = re.compile(r"<table\b")


def _scrolling_tables(part: str) -> str:
    """Every table of a section in a box of its own that scrolls sideways (``.tw``), so that a table
    wider than its card (a narrow window, many cause columns) scrolls inside the card instead of
    spilling out of it. Trace strings reach the parts escaped, so a ``<table`` here is markup."""
    return _TABLE_OPEN.sub('<div class="tw"><table', part).replace("</table>", "</table></div>")


def page(title: str, parts: list[str], figs: dict[str, PlotlyFigure]) -> str:
    """The whole page: ``parts`` (HTML built with every trace string escaped) in the page template,
    and a script that draws ``figs`` (element id -> figure dict), reporting a figure that fails."""
    script = (
        "(function(){var F=" + fig_json(figs) + ";var C=" + json.dumps(_CONFIG) + ";"
        "for(var id in F){var el=document.getElementById(id);if(!el)continue;"
        # the toolbar only where zooming helps (the timeline): elsewhere it covered the data
        "var c=Object.assign({},C,{displayModeBar:id==='fig-timeline'?'hover':false});"
        "try{Plotly.newPlot(el,F[id].data,F[id].layout,c);}catch(e){"
        "var d=document.getElementById('ppdiag-errors');"
        "if(d){d.hidden=false;var li=document.createElement('li');"
        "li.textContent=id+': '+e;d.querySelector('ul').appendChild(li);}}}})();"
    )
    text = (
        env()
        .get_template("page.html.j2")
        .render(
            marker=Markup(html_marker()),
            csp=Markup(CSP),
            title=title,
            css=Markup(_CSS),
            error_hook=Markup(_ERROR_HOOK),
            # built by the sections, every trace string escaped
            parts=[Markup(_scrolling_tables(p)) for p in parts],
            plotly=Markup(plotly_js()),
            script=Markup(script),
        )
    )
    return text + "\n"


__all__ = ["CSP", "PLOTLY_JS", "PLOTLY_VERSION", "env", "page", "plotly_js"]
