"""Trace strings are data: no terminal escapes on the terminal or in Markdown, no live mentions or
autolinks in PR comments, file names quoted in one-line errors; and an HTML report for any width."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from diag_fixture import base_report
from report_fill import typed
from rich.console import Console

from ppdiag.errors import InputError
from ppdiag.reports.md import md_escape, render_markdown
from ppdiag.reports.sanitize import clean, clean_report, clean_tree, md_neutral
from ppdiag.reports.terminal import render

ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m\x07\x08\r"


def test_clean_strips_escape_sequences_and_controls() -> None:
    assert clean(ESC + "kernel") == "redkernel"
    assert clean("a\tb\nc") == "a\tb\nc"  # layout whitespace stays
    assert clean("x\u202eevil") == "xevil"  # bidi override
    assert clean("rep\udcffort") == "rep\ufffdort"  # undecodable file-name byte
    assert clean_tree({"k\x1b[1m": [ESC, 1, None]}) == {"k": ["red", 1, None]}


def _report_with(name: str) -> dict[str, Any]:
    rep = base_report()
    rep["run"]["warnings"] = [f"{name}: skipped", f"kernel {name} @alice see www.evil.example"]
    rep["run"]["sources"] = {"0": name}
    return rep


def test_terminal_report_has_no_escape_sequences() -> None:
    buf = io.StringIO()
    render(typed(_report_with(ESC + "rank0.json")), Console(file=buf, width=140, force_terminal=False))
    out = buf.getvalue()
    assert "\x1b" not in out and "\x07" not in out and "\x08" not in out
    assert "redrank0.json" in out


@pytest.mark.parametrize(
    "name",
    ["rank0.json", ESC + "rank0.json", "x\u202eevil", "a\x85b", "del\x7f", "tab\tnl\n"],
)
def test_clean_report_equals_the_cleaned_tree(name: str) -> None:
    """A report without anything to clean is decoded as it is (no walk over its values); with
    anything to clean every string is cleaned, as the walk does."""
    from ppdiag.report_types import Report, to_builtins

    rep = typed(_report_with(name))
    want = msgspec.convert(clean_tree(to_builtins(rep)), Report)
    assert clean_report(rep) == want


def test_markdown_neutralises_escapes_mentions_and_links() -> None:
    md = render_markdown(typed(_report_with(ESC + "rank0.json")))
    assert "\x1b" not in md and "\x07" not in md
    assert "@alice" not in md and "@\u200balice" in md
    assert "www.evil" not in md and "www\u200b.evil" in md
    assert md_neutral("mail me@example.com") == "mail me@example.com"  # not a mention
    assert "http://" not in md_escape("see http://x.example")


def test_errors_quote_file_names(tmp_path: Path) -> None:
    from ppdiag.parsers.loader import load_run

    p = tmp_path / "a\nb\x1b[31m.json"
    p.write_text("not json")
    with pytest.raises(InputError) as ei:
        load_run([p], progress=False)
    text = str(ei.value)
    assert "\n" not in text and "\x1b" not in text
    assert text.startswith(repr(str(p)))


@pytest.mark.parametrize("pp", [33])  # the first width plotly refused
def test_html_for_many_stages(tmp_path: Path, pp: int) -> None:
    from ppdiag.api import analyze_run, load
    from ppdiag.reports import write_report
    from ppsynth.kineto import write_kineto
    from ppsynth.scenario import make_scenario

    write_kineto(make_scenario(pp=pp, microbatches=pp, steps=1, fwd_ms=0.2, bwd_ms=0.4), tmp_path)
    diag = analyze_run(load([tmp_path]))
    out = write_report("html", diag, tmp_path / "r.html")
    assert out.stat().st_size > 0 and json.dumps(diag.result.run.pp) == str(pp)
