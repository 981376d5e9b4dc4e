"""One denominator: every report's shares add up to 100 % (±0.5) on every real trace.

Shares are per-step means over the same (rank, step) windows divided by the mean step
(``summary.step_mean_ms``): the JSON ``shares``, the Markdown "where the step goes" table and the
HTML step bar all use it, so compute plus the causes make the whole step. The real 2-GPU nsys
export, whose window is mostly pageable host-to-device copies, reports them as the dominant loss
with PP011.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SHARED_TRACES

from ppdiag.api import Options, diagnose
from ppdiag.report_types import Cause
from ppdiag.reports.html import render_html
from ppdiag.reports.md import render_markdown

TRACES = [
    "kineto/hta_2022_format_rank3.json.gz",
    "kineto/hta_alltoall_rank0.json.gz",
    "kineto/hta_ddp_nccl_rank0.json.gz",
    "kineto/hta_ns_resolution_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "kineto/kineto_2021_resnet50_worker0.pt.trace.json.gz",
    "kineto/tracelens_b200_rank0.json.gz",
    "kineto/tracelens_h100_single.json.gz",
    "kineto/tracelens_mi300_ddp_rank0.json.gz",
    "kineto/gloo_cpu_2rank",
    "kineto/hta_sampled_2rank",
    "nsys/nsysai_h100_fsdp_2gpu.sqlite",
    "nsys/pipit_cloverleaf_nsys2024.sqlite",
    "nsys/pipit_saxpy_mpi_nsys2022.sqlite",
]


def _path(rel: str) -> Path:
    p = SHARED_TRACES / rel
    if not p.exists():
        pytest.skip(f"{p} not available")
    return p


def _md_pcts(md: str) -> list[float]:
    """The % column of the Markdown "where the step goes" table."""
    rows = md.split("| where the step goes |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return [float(m.group(1)) for r in rows if (m := re.search(r"\| ([0-9.]+) % \|\s*$", r))]


def _html_bar(html: str) -> list[float]:
    """The widths (%) of the HTML step bar's segments."""
    bar = html.split('<div class="bar"', 1)[1].split("</div>", 1)[0]
    return [float(x) for x in re.findall(r"width:([0-9.]+)%", bar)]


@pytest.mark.parametrize("rel", TRACES)
def test_shares_add_up_in_every_report(rel: str) -> None:
    diag = diagnose([_path(rel)], Options())
    s = diag.result.summary
    mean, shares = s.step_mean_ms, s.shares
    assert mean and mean > 0 and shares is not None
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.005)
    # ms and shares agree: each share is its ms over the mean step
    assert s.compute_ms is not None
    assert shares["compute"] == pytest.approx(s.compute_ms / mean, abs=1e-3)
    for k in Cause:
        assert shares[k] == pytest.approx(s.lost_ms[k] / mean, abs=1e-3)
    assert s.lost_ratio == pytest.approx(1.0 - shares["compute"], abs=1e-3)
    for r in diag.result.ranks:
        assert sum(r.shares.values()) == pytest.approx(1.0, abs=0.005)
    assert sum(_md_pcts(render_markdown(diag.result))) == pytest.approx(100.0, abs=0.5)
    assert sum(_html_bar(render_html(diag))) == pytest.approx(100.0, abs=0.5)


def test_copies_dominate_the_real_2gpu_nsys_window() -> None:
    rep = diagnose([_path("nsys/nsysai_h100_fsdp_2gpu.sqlite")], Options()).result
    lost = rep.summary.lost_ms
    assert max(lost, key=lambda k: lost[k]) == "exposed_copy"
    # 22 ms of kernels, ~920 ms of host-to-device copies in a ~970 ms window
    assert rep.summary.shares is not None and rep.summary.shares["exposed_copy"] > 0.9
    assert rep.summary.compute_ms is not None and rep.summary.compute_ms < 30
    f = rep.findings[0]
    assert f.code == "PP011" and f.cause == "exposed_copy" and f.severity == "high"
    assert f.gain_ms is not None and f.gain_ms > 900
    assert sum(r.exposed_copy_ms for r in rep.ranks) > 1800
