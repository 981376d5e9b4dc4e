"""A golden finding per registered rule: a small input made for the rule, run through the whole
analysis, and a snapshot of the finding it gives (code, cause, severity, ranks, stages, gain,
title, evidence, fixes) in ``tests/snapshots/rules/<CODE>.json``, one field a line, keys sorted.

Each input also has a clean twin (the same input without the fault) on which the rule stays
quiet, so a rule that fires on everything fails here too. A rule registered without an entry in
:data:`CASES` fails :func:`test_every_rule_has_a_golden_input`.

When a change to a rule's text, gain or evidence is meant, regenerate the snapshots and review
the diff:

    PPDIAG_UPDATE_SNAPSHOTS=1 python3 -m pytest tests/test_rule_golden.py

The inputs are the synthetic runs of ``ppsynth`` (their numbers are the simulator's, the same
on every machine), except PP011's, a hand-built timeline with its expected times worked out below.
Each input is analyzed once per module and shared by its assertions.
"""

from __future__ import annotations

import gzip
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from test_snapshots import UPDATE
from test_snapshots import _check as check_snapshot
from typer.testing import CliRunner

from ppdiag.api import Options, analyze_run, diagnose
from ppdiag.cli import app
from ppdiag.model import Intervals, Kind, NameTable, RangeKind, Ranges, RankTimeline, Run
from ppdiag.report_types import FindingRow, Report
from ppdiag.rules import RULES, load_builtin
from ppdiag.rules.catalog import SECTIONS, catalog_markdown, sections_of
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.memory import with_memory
from ppsynth.optable import OpTableParams, simulate_optable, write_table
from ppsynth.run import SynthRun
from ppsynth.scenario import make_scenario
from ppsynth.truncate import stop_rank

load_builtin()

MS = 1_000_000
BASE = 1_700_000_000_000_000_000  # an epoch-like clock, as Kineto gives

#: The smallest pipeline most inputs use: P=4, M=4, 1F1B, two steps.
SMALL: dict[str, Any] = {"steps": 2, "pp": 4, "microbatches": 4}


# ---- the inputs ---------------------------------------------------------------------------------


def _kineto(run: SynthRun, d: Path, options: Options | None = None) -> Report:
    write_kineto(run, d)
    return diagnose([d], options or Options()).result


def _with_hosts(paths: list[Path], hosts: dict[int, str]) -> None:
    """Kineto's top-level ``host_name`` in each rank's trace (as newer PyTorch writes it)."""
    for p in paths:
        with gzip.open(p, "rt") as fh:
            d = json.load(fh)
        d["host_name"] = hosts[int(d["distributedInfo"]["rank"])]
        with gzip.open(p, "wt") as fh:
            json.dump(d, fh)


def _placed(d: Path, hosts: dict[int, str]) -> Report:
    """PP=2 x DP=2 in Megatron's order (stage 0 = ranks 0, 1; stage 1 = ranks 2, 3), stage 0 sending
    50x slower, on the hosts given."""
    run = make_scenario(pp=2, dp=2, steps=2, microbatches=4, faults=[F.SlowLink(0, factor=50.0)])
    _with_hosts(write_kineto(run, d), hosts)
    return diagnose([d], Options()).result


def _stopped(d: Path, stop: bool) -> Report:
    """Three steps of P=4, M=4; with ``stop``, rank 2 stops in the middle of step 1."""
    run = make_scenario(steps=3, pp=4, microbatches=4)
    if stop:
        w = run.ranks[2].step_windows
        run, _ = stop_rank(run, 2, int(w[1, 0] + 0.5 * (w[1, 1] - w[1, 0])))
    return _kineto(run, d)


def _optable(d: Path, mb_cv: float) -> Report:
    """The op-table generator's default run (PP=4 x DP=2), micro-batch costs spread by ``mb_cv``."""
    df, _ = simulate_optable(OpTableParams(mb_cv=mb_cv))
    d.mkdir(parents=True, exist_ok=True)
    return diagnose([write_table(df, d / "ops.csv")], Options(progress=False, jobs=1)).result


def _memory(d: Path, gpipe: bool) -> Report:
    """P=4 M=8 with allocator events: 1000 MiB of weights, 100 MiB of activations per micro-batch in
    flight. GPipe holds all 8 on stage 0 (1000 + 8 x 100 = 1800 MiB) where 1F1B holds 4 (1400 MiB)."""
    run = make_scenario(schedule="gpipe" if gpipe else "1f1b", steps=2, pp=4, microbatches=8)
    return _kineto(with_memory(run, 1000.0, 100.0), d)


def _copy_rank(copy: bool) -> RankTimeline:
    """One GPU rank, one step [0, 16] ms (the host's ProfilerStep), every kernel on stream 7.

    With ``copy``: compute [1, 5] ms (launched 0.9), a pageable host-to-device copy [5, 13]
    (launched 4.95, queued behind the compute), compute [13, 16] (launched 5.0). Nothing runs
    beside the copy, so the window of 16 ms is 7 ms compute + 8 ms exposed_copy + 0.9 ms host
    (before the first launch) + 0.1 ms unexplained (launch latency): the copies are 8 / 9 of the
    lost time (the dominant loss) and 8 / 16 = 50 % of the step; removing them wins 8 ms.
    Without: the same kernels with the copy left out (compute [1, 5], then [5, 8]).
    """
    rows: list[tuple[float, float, float, Kind]] = [(1.0, 5.0, 0.9, Kind.COMPUTE)]
    if copy:
        rows += [(5.0, 13.0, 4.95, Kind.MEMCPY), (13.0, 16.0, 5.0, Kind.COMPUTE)]
    else:
        rows += [(5.0, 8.0, 4.95, Kind.COMPUTE)]
    names = NameTable()
    gemm, htod = names.id("gemm_kernel"), names.id("Memcpy HtoD (Pageable -> Device)")
    iv = Intervals.from_columns(
        len(rows),
        {
            "start": [BASE + round(a * MS) for a, *_ in rows],
            "end": [BASE + round(b * MS) for _, b, *_ in rows],
            "launch": [BASE + round(c * MS) for *_, c, _ in rows],
            "kind": [int(k) for *_, k in rows],
            "name": [htod if k == Kind.MEMCPY else gemm for *_, k in rows],
            "stream": [7] * len(rows),
            "group": [-1] * len(rows),
            "seq": np.full(len(rows), -1, np.int64),
        },
    ).sorted()
    rg = Ranges.from_columns(
        1,
        {
            "start": [BASE],
            "end": [BASE + 16 * MS],
            "kind": [int(RangeKind.STEP)],
            "name": [names.id("ProfilerStep#3")],
            "num": [3],
        },
    )
    return RankTimeline(0, "rank0.pt.trace.json", "kineto", names.names, iv, rg, device="cuda:0")


def _copies(d: Path, copy: bool) -> Report:
    return analyze_run(Run([_copy_rank(copy)], "kineto"), Options()).result


@dataclass(frozen=True)
class Case:
    """A rule's input: ``make(dir, faulty)`` analyzes it with the fault (True) or without (False)."""

    what: str  # the input, for the snapshot's reader
    make: Callable[[Path, bool], Report]
    # what the input was made to show, checked apart from the snapshot (so a regenerated snapshot
    # cannot quietly move the finding): the ranks and stages it names (None: not checked) and the
    # severities it may have
    ranks: list[int] | None = None
    stages: list[int] | None = None
    severities: tuple[str, ...] = ("high", "medium")
    clean_may_be_low: bool = False  # the clean input may keep a low finding (the cause is inherent)


def _sc(
    faulty: list[F.Fault], clean: list[F.Fault] | None = None, **kw: Any
) -> Callable[[Path, bool], Report]:
    """A synthetic pipeline of :data:`SMALL` (updated by ``kw``) with ``faulty`` or ``clean`` faults."""
    opts = kw.pop("options", None)
    clean_opts = kw.pop("clean_options", opts)
    clean_kw = kw.pop("clean_kw", {})

    def make(d: Path, bad: bool) -> Report:
        prm = {**SMALL, **kw, **({} if bad else clean_kw)}
        faults = faulty if bad else (clean or [])
        return _kineto(make_scenario(faults=faults, **prm), d, opts if bad else clean_opts)

    return make


TWO_HOSTS = {0: "node00", 1: "node00", 2: "node01", 3: "node01"}

CASES: dict[str, Case] = {
    "PP001": Case(
        "1F1B P=4 M=4 (bubble (P-1)/(M+P-1) = 3/7 of the step); clean: M=32, the bubble is the p2p "
        "latency of the fill and drain (low)",
        _sc([], clean_kw={"microbatches": 32}),
        stages=[0, 1, 2, 3],
        clean_may_be_low=True,
    ),
    "PP002": Case(
        "GPipe P=4 M=8; clean: 1F1B P=4 M=8",
        _sc([], schedule="gpipe", microbatches=8, clean_kw={"schedule": "1f1b"}),
        stages=[0, 1, 2, 3],
    ),
    "PP003": Case(
        "1F1B P=4 M=8, stage 1 computes 1.5x slower; clean: no slow stage",
        _sc([F.SlowStage(1, 1.5)], microbatches=8),
        ranks=[1],
        stages=[1],
    ),
    "PP004": Case(
        "1F1B P=4 M=4, rank 2's sends arrive 0.6 ms late; clean: no late link",
        _sc([F.SlowLink(2, delay_ms=0.6)]),
        ranks=[2],
    ),
    "PP005": Case(
        "1F1B P=4 M=4 x DP=2, a 4 ms gradient all-reduce after the last backward; clean: no all-reduce",
        _sc([F.ExposedAllReduce(4.0)], dp=2),
    ),
    "PP006": Case(
        "1F1B P=4 M=4, rank 3's host issues each block 0.5 ms late; clean: no stall",
        _sc([F.HostStall(3, 0.5)]),
        ranks=[3],
    ),
    "PP007": Case(
        "1F1B P=4 M=4, 5 steps, step 2 starts 40 ms late on every rank; clean: no slow step",
        _sc([F.SlowStep(2, 40.0)], steps=5),
    ),
    "PP008": Case(
        "1F1B P=4 M=8 with --global-batch 64 --micro-batch 4 --tp 1 (64 / 4 = 16 micro-batches, the "
        "run has 8); clean: --global-batch 32",
        _sc(
            [],
            microbatches=8,
            options=Options(global_batch=64, micro_batch=4, tp=1),
            clean_options=Options(global_batch=32, micro_batch=4, tp=1),
        ),
    ),
    "PP009": Case(
        "1F1B P=4 M=4 x DP=2 with a 1 ms blocking gradient all-reduce, replica 1 starts each step 3 ms "
        "late; clean: no late replica",
        _sc([F.ExposedAllReduce(1.0), F.LateReplica(1, 3.0)], [F.ExposedAllReduce(1.0)], dp=2),
        # Megatron order (global rank = pp_rank x dp + dp_rank): replica 1 is the odd ranks
        ranks=[1, 3, 5, 7],
    ),
    "PP010": Case(
        "op table (PP=4 x DP=2), micro-batch costs spread with CV 0.3; clean: no spread",
        lambda d, bad: _optable(d, 0.3 if bad else 0.0),
    ),
    "PP011": Case(
        "hand-built rank: an 8 ms pageable copy with nothing beside it in a 16 ms step; clean: no copy",
        _copies,
        ranks=[0],
    ),
    "PP012": Case(
        "GPipe P=4 M=8 with 1000 MiB weights and 100 MiB activations per micro-batch; clean: 1F1B",
        _memory,
        # every stage s holds 8 where 1F1B holds 4 - s; far below the 80 GiB device: medium
        ranks=[0, 1, 2, 3],
        stages=[0, 1, 2, 3],
        severities=("medium",),
    ),
    "PP013": Case(
        "P=4 M=4, rank 2 stops in the middle of step 1 of 3; clean: the complete run",
        _stopped,
        severities=("high",),
    ),
    "PP014": Case(
        "PP=2 x DP=2, stage 0 on node00 and stage 1 on node01, the link between them 50x slower; "
        "clean: every rank on node00",
        lambda d, bad: _placed(d, TWO_HOSTS if bad else dict.fromkeys(range(4), "node00")),
        ranks=[0, 1, 2, 3],
    ),
    "PP015": Case(
        "1F1B P=4 M=4, forward 1 ms per micro-batch on every stage, backward 2 ms except stage 2's "
        "3 ms (its forward recomputed); clean: backward 2 ms on every stage",
        _sc([], bwd_ms=[2.0, 2.0, 3.0, 2.0], clean_kw={"bwd_ms": 2.0}),
        ranks=[2],
        stages=[2],
    ),
}


# ---- one analysis per input ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], Report]:
    """The report of a rule's input (with the fault or without), analyzed once per module."""
    reports: dict[tuple[str, bool], Report] = {}

    def get(code: str, bad: bool) -> Report:
        key = (code, bad)
        if key not in reports:
            d = tmp_path_factory.mktemp(f"{code}-{'fault' if bad else 'clean'}")
            reports[key] = CASES[code].make(d, bad)
        return reports[key]

    return get


def _of(rep: Report, code: str) -> list[FindingRow]:
    return [f for f in rep.findings if f.code == code]


def _rounded(v: Any) -> Any:
    """Floats to 3 decimals, recursively (the evidence's own numbers are rounded so already)."""
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, dict):
        return {str(k): _rounded(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_rounded(x) for x in v]
    return v


def golden_text(code: str, f: FindingRow) -> str:
    """The snapshot of a finding: JSON, one field a line, keys sorted; the gain to 0.01 ms and its
    share to 0.1 %, every other float to 3 decimals."""
    d: dict[str, Any] = msgspec.to_builtins(f)
    d = _rounded(d)
    if f.gain_ms is not None:
        d["gain_ms"] = round(f.gain_ms, 2)
    if f.gain_pct is not None:
        d["gain_pct"] = round(f.gain_pct, 1)
    d["input"] = CASES[code].what
    return json.dumps(d, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# ---- the tests ----------------------------------------------------------------------------------

CODES = sorted(RULES)


def test_every_rule_has_a_golden_input() -> None:
    """A new rule comes with its input (and a snapshot): a rule without one fails here."""
    assert len(CODES) >= 14
    missing = sorted(set(CODES) - set(CASES))
    assert not missing, f"rules without a golden input in tests/test_rule_golden.py CASES: {missing}"
    assert not sorted(set(CASES) - set(CODES)), "CASES names a rule that is not registered"


@pytest.mark.parametrize("code", CODES)
def test_golden_finding(
    code: str, analyzed: Callable[[str, bool], Report], tmp_path_factory: pytest.TempPathFactory
) -> None:
    case = CASES.get(code)
    assert case is not None, f"{code} has no golden input: add one to CASES"
    rep = analyzed(code, True)
    found = _of(rep, code)
    assert len(found) == 1, (code, [x.code for x in rep.findings])
    (f,) = found
    assert f.title and f.fixes
    # the rule's own evidence type (its fields in the module, the common ones stamped on it)
    assert type(f.evidence) is RULES[code].evidence and f.evidence.steps_used, f.evidence
    assert f.severity in case.severities, f
    if case.ranks is not None:
        assert f.ranks == case.ranks, f
    if case.stages is not None:
        assert f.stages == case.stages, f
    check_snapshot(f"rules/{code}.json", golden_text(code, f), tmp_path_factory.getbasetemp(), __file__)


@pytest.mark.parametrize("code", CODES)
def test_clean_input_does_not_fire(code: str, analyzed: Callable[[str, bool], Report]) -> None:
    """The same input without the fault: no finding of the rule (a low one where the cause is part
    of every such run, as the fill and drain of a pipeline)."""
    case = CASES.get(code)
    assert case is not None, f"{code} has no golden input: add one to CASES"
    found = _of(analyzed(code, False), code)
    if case.clean_may_be_low:
        assert all(f.severity == "low" for f in found), found
    else:
        assert not found, found


def test_pp011_handbuilt_times(analyzed: Callable[[str, bool], Report]) -> None:
    """The hand-built copy input gives the times worked out in :func:`_copy_rank`."""
    rep = analyzed("PP011", True)
    lost = rep.summary.lost_ms
    assert rep.summary.step_ms == pytest.approx(16.0)
    assert lost["exposed_copy"] == pytest.approx(8.0)
    assert lost["host"] == pytest.approx(0.9) and lost["unexplained"] == pytest.approx(0.1)
    (f,) = _of(rep, "PP011")
    assert f.gain_ms == pytest.approx(8.0) and f.ranks == [0]
    assert "dominant" in f.title
    ev: dict[str, Any] = f.evidence.as_dict()
    assert ev["copy_ms_by_name"] == {"Memcpy HtoD (Pageable -> Device)": 8.0}
    assert "pinned" in f.fixes[0]  # pageable copies: pinned memory first


def test_snapshot_compare_is_exact(analyzed: Callable[[str, bool], Report]) -> None:
    """One changed figure in a finding is a different snapshot text."""
    if UPDATE:
        pytest.skip("regenerating")
    (f,) = _of(analyzed("PP011", True), "PP011")
    text = golden_text("PP011", f)
    want = (Path(__file__).parent / "snapshots" / "rules" / "PP011.json").read_text(encoding="utf-8")
    assert text == want
    other = msgspec.structs.replace(f, gain_ms=(f.gain_ms or 0.0) + 0.01)
    assert golden_text("PP011", other) != want


# ---- documentation ------------------------------------------------------------------------------


DOCS_RULES = Path(__file__).resolve().parents[1] / "docs" / "rules.md"


def test_rules_documented_in_docs_as_generated() -> None:
    """docs/rules.md is generated from the rule modules (regenerated under PPDIAG_UPDATE_SNAPSHOTS=1)."""
    text = catalog_markdown()
    if UPDATE:
        DOCS_RULES.write_text(text, encoding="utf-8")
    regenerate = "PPDIAG_UPDATE_SNAPSHOTS=1 python3 -m pytest tests/test_rule_golden.py -k documented"
    assert DOCS_RULES.read_text(encoding="utf-8") == text, f"docs/rules.md is stale: {regenerate}"


@pytest.mark.parametrize("code", CODES)
def test_every_rule_is_documented(code: str) -> None:
    """Each registered rule has a name, a summary and the four docstring sections, ``ppdiag rules
    CODE`` (run in-process) prints them, and docs/rules.md holds its section with the same text."""
    rule = RULES[code]
    doc = type(rule).__doc__ or ""
    sections = SECTIONS
    page = DOCS_RULES.read_text(encoding="utf-8")
    assert f"\n## {code} {rule.name}\n" in page, f"{code} has no section in docs/rules.md"
    own = page.split(f"\n## {code} {rule.name}\n", 1)[1].split("\n## ", 1)[0]
    for head, body in sections_of(inspect.cleandoc(doc)).items():
        assert f"**{head}.**\n\n{body}\n" in own + "\n", (code, head)
    for section in sections:
        assert f"{section}:" in doc, (code, section)
    assert rule.summary.strip() and rule.name.strip() and rule.code == code
    res = CliRunner().invoke(app, ["rules", code], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert code in out and " ".join(rule.summary.split()) in out
    for section in sections:
        # the heading and the first line of its text
        body = doc.split(f"{section}:", 1)[1].strip().splitlines()[0]
        assert f"{section}:" in out and " ".join(body.split()) in out, (code, section)
