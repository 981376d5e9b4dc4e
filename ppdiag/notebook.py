"""The notebook API: ``ppdiag.analyze(paths, **options)`` runs the analysis ``ppdiag analyze`` runs
and returns an :class:`Analysis`: the typed report, one pandas DataFrame per question, the HTML
report's plotly figures, and ``to_html``. See docs/python.md.

It sits beside the command line (the same option checks, the same warnings, the same
:func:`ppdiag.api.analyze_run`), so a notebook and the CLI never disagree about a run. pandas and
plotly are imported when a table or a figure is asked for, not by ``import ppdiag``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ppdiag.analysis import Analyzed, context_of
from ppdiag.api import Options
from ppdiag.errors import InputError
from ppdiag.model.timeline import PHASE_NAMES, Phase
from ppdiag.report_types import Cause

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from ppdiag.report_types import Report

#: The keyword options :func:`analyze` takes: the fields of :class:`ppdiag.api.Options`.
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Options))


def analyze(paths: str | Path | Sequence[str | Path], **options: Any) -> Analysis:
    """Analyse one run, as ``ppdiag analyze PATHS`` does.

    ``paths``: a run directory, trace files or one op table (a string or path, or a list of them).
    ``options``: the analysis flags by their Python names (``pp``, ``stage_map``, ``microbatches``,
    ``schedule``, ``steps``, ``hosts``, ``global_batch``, ``micro_batch``, ``tp``, ``jobs``,
    ``scheduler``, ``progress``); an unknown name or a bad value raises
    :class:`ppdiag.errors.InputError` with the message the CLI prints.
    """
    from ppdiag.api import diagnose

    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise InputError(None, f"unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTION_NAMES)}")
    listed = [paths] if isinstance(paths, str | Path) else list(paths)
    opts = Options(**options)
    return Analysis(diagnose([Path(p) for p in listed], opts))


@dataclass(frozen=True)
class Analysis:
    """One analysed run. ``report`` is the typed JSON report (``ppdiag.report_types.Report``);
    ``diagnosis`` what the reporters draw from. Tables are pandas DataFrames, built on first use;
    times in them are milliseconds on the run's common (aligned) clock from the start of the first
    analysed step."""

    diagnosis: Analyzed

    @property
    def report(self) -> Report:
        """The typed report, the same value ``--json`` writes."""
        return self.diagnosis.result

    def __repr__(self) -> str:
        r, s = self.report.run, self.report.summary
        return (
            f"<ppdiag.Analysis {len(self.report.ranks)} ranks, pp={r.pp}, schedule={r.schedule}, "
            f"M={r.microbatches}, step {s.step_ms:.2f} ms, {len(self.report.findings)} findings>"
        )

    @cached_property
    def _origin_ns(self) -> int:
        """The start of the first analysed step on the common clock (0 when the run has none)."""
        return min((int(w.start) for w in self.diagnosis.steps), default=0)

    def _step_numbers(self) -> dict[tuple[int, int], int]:
        """(rank, analysed step index) -> the step's ProfilerStep number (-1 when unnumbered)."""
        return {(w.rank, w.index): w.number for w in self.diagnosis.steps}

    @cached_property
    def ranks(self) -> pd.DataFrame:
        """One row per rank: step time, compute, exposed communication, idle and lost time by
        cause (``lost_ms.<cause>``), as the report's ``ranks[]``."""
        import pandas as pd

        return pd.json_normalize(msgspec.to_builtins(self.report.ranks))

    @cached_property
    def stages(self) -> pd.DataFrame:
        """One row per pipeline stage: its ranks, forward/backward/weight-gradient block times
        (``fwd_ms.median`` …, and the samples), compute and lost time by cause."""
        import pandas as pd

        return pd.json_normalize(msgspec.to_builtins(self.report.stages))

    @cached_property
    def findings(self) -> pd.DataFrame:
        """One row per finding (PP001…): code, cause, title, severity, stages, ranks, gain, evidence
        (a dict) and fixes."""
        import pandas as pd

        cols = [
            "code",
            "cause",
            "title",
            "severity",
            "stages",
            "ranks",
            "gain_ms",
            "gain_pct",
            "evidence",
            "fixes",
        ]
        return pd.DataFrame(msgspec.to_builtins(self.report.findings), columns=cols)

    @cached_property
    def lost(self) -> pd.DataFrame:
        """Every lost interval: rank, step (ProfilerStep number), start/end/duration in ms, its
        cause, and the rank it is blamed on (``<NA>`` when no finding traced it to one rank)."""
        import numpy as np
        import pandas as pd

        steps = self._step_numbers()
        parts = []
        for rank, g in sorted(self.diagnosis.gaps.items()):
            if not len(g):
                continue
            parts.append(
                pd.DataFrame(
                    {
                        "rank": np.full(len(g), rank),
                        "step": [steps.get((rank, int(i)), -1) for i in g.step],
                        "start_ms": (g.start - self._origin_ns) / 1e6,
                        "end_ms": (g.end - self._origin_ns) / 1e6,
                        "duration_ms": (g.end - g.start) / 1e6,
                        "cause": [str(Cause.of(c)) for c in g.cause],
                        "blamed_rank": pd.array([int(b) if b >= 0 else None for b in g.blame], dtype="Int64"),
                    }
                )
            )
        return pd.concat(parts, ignore_index=True) if parts else _empty(LOST_COLUMNS)

    @cached_property
    def blocks(self) -> pd.DataFrame:
        """Every compute block (one micro-batch's forward, backward or weight-gradient run on one
        rank): rank, step, stage (virtual stage), micro-batch, phase, start/end in ms and busy ms."""
        import numpy as np
        import pandas as pd

        pipe = context_of(self.diagnosis).pipeline
        steps = self._step_numbers()
        parts = []
        for rank, b in sorted((pipe.blocks if pipe else {}).items()):
            if not len(b):
                continue
            parts.append(
                pd.DataFrame(
                    {
                        "rank": np.full(len(b), rank),
                        "step": [steps.get((rank, int(i)), -1) for i in b.step],
                        "stage": b.stage,
                        "microbatch": b.mb,
                        "phase": [PHASE_NAMES[Phase(int(p))] for p in b.phase],
                        "start_ms": (b.start - self._origin_ns) / 1e6,
                        "end_ms": (b.end - self._origin_ns) / 1e6,
                        "busy_ms": b.busy / 1e6,
                    }
                )
            )
        return pd.concat(parts, ignore_index=True) if parts else _empty(BLOCK_COLUMNS)

    @cached_property
    def transfers(self) -> pd.DataFrame:
        """Every matched point-to-point transfer: sender, receiver, and both sides' start/end in ms
        on the common clock (the fitted clock offsets applied)."""
        import pandas as pd

        pipe = context_of(self.diagnosis).pipeline
        if pipe is None or not len(pipe.pairs):
            return _empty(TRANSFER_COLUMNS)
        p, off = pipe.pairs, pipe.clocks.offsets
        src_off = pd.Series(p.src).map(lambda r: off.get(int(r), 0)).to_numpy()
        dst_off = pd.Series(p.dst).map(lambda r: off.get(int(r), 0)).to_numpy()
        o = self._origin_ns
        return pd.DataFrame(
            {
                "src": p.src,
                "dst": p.dst,
                "send_start_ms": (p.send_start + src_off - o) / 1e6,
                "send_end_ms": (p.send_end + src_off - o) / 1e6,
                "recv_start_ms": (p.recv_start + dst_off - o) / 1e6,
                "recv_end_ms": (p.recv_end + dst_off - o) / 1e6,
            }
        )

    def timeline(self) -> go.Figure:
        """The pipeline timeline of the HTML report (blocks per rank, gaps coloured by cause, the
        critical path) as a plotly figure."""
        import plotly.graph_objects as go

        from ppdiag.reports.html_model import build_timeline
        from ppdiag.reports.html_timeline import timeline_figure

        return go.Figure(timeline_figure(build_timeline(self.diagnosis)))

    def histograms(self) -> go.Figure | None:
        """The HTML report's per-stage histograms of forward and backward block times (None when
        the run has no stage samples)."""
        import plotly.graph_objects as go

        from ppdiag.reports.html_figures import histogram_figure

        fig = histogram_figure(self.report)
        return None if fig is None else go.Figure(fig)

    def to_html(self, path: str | Path) -> Path:
        """Write the self-contained HTML report (as ``--html``; never over a file ppdiag did not
        write or a trace of the run)."""
        from ppdiag.reports import write_report

        return write_report("html", self.diagnosis, path)

    def to_json(self, path: str | Path) -> Path:
        """Write the JSON report (as ``--json``)."""
        from ppdiag.reports import write_report

        return write_report("json", self.diagnosis, path)


LOST_COLUMNS = ("rank", "step", "start_ms", "end_ms", "duration_ms", "cause", "blamed_rank")
BLOCK_COLUMNS = ("rank", "step", "stage", "microbatch", "phase", "start_ms", "end_ms", "busy_ms")
TRANSFER_COLUMNS = ("src", "dst", "send_start_ms", "send_end_ms", "recv_start_ms", "recv_end_ms")


def _empty(columns: Sequence[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({c: [] for c in columns})


__all__ = ["OPTION_NAMES", "Analysis", "analyze"]
