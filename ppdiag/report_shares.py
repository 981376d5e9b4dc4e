"""What the reports read off a finished report alone: the slowest stage's row and each cause's share
of the step. Apart from :mod:`ppdiag.facts` (numpy, the pipeline) so that the terminal and Markdown
reports render a report without the analysis loaded (a re-run served by :mod:`ppdiag.result_cache`)."""

from __future__ import annotations

from ppdiag.report_types import Report, Summary


def report_slowest_stage(report: Report) -> int | None:
    """Index in ``report.stages`` of the report's slowest stage (``summary.slowest_stage``, the
    :attr:`StageBalance.slowest` the analysis wrote), or None when no stage stands out."""
    slow = report.summary.slowest_stage
    return next((i for i, s in enumerate(report.stages) if s.stage == slow), None)


def share_of(summary: Summary, key: str) -> float | None:
    """``compute`` or a cause as a fraction of the mean step (``summary.shares``, the one
    denominator of every report); from ``lost_ms`` / ``step_mean_ms`` when the shares are absent."""
    if summary.shares is not None and key in summary.shares:
        return summary.shares[key]
    v = summary.compute_ms if key == "compute" else summary.lost_ms.get(key)
    st = summary.step_mean_ms or summary.step_ms
    return v / st if (v is not None and st) else None


def step_share_text(summary: Summary, key: str) -> str:
    """``compute`` or a cause as a share of the mean step in words ("64% of the step"): the one
    rendering of :func:`share_of` that titles and sentences quote (``ppdiag.report_check`` reads
    it back)."""
    share = share_of(summary, key)
    return f"{100 * (share or 0.0):.0f}% of the step"
