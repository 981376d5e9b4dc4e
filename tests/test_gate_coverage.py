"""``ppdiag check`` never passes on partial data: a rank's trace cut by a killed profiler (plain or
gzip), a missing last rank in traces that state no world size, and a rank with many negative
durations, and a run whose analysis left steps out as partial (a lost transfer, events written twice:
every rank holds every step, but a receive has no send) each give exit 3 with the reason in the
gate's own output and ``gate.partial``;
``--allow-partial`` gives the previous verdict with a warning. Inputs are synthetic runs
(ppsynth) damaged here the way the profiler or the file system damages real ones.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ppsynth.kineto import write_kineto
from ppsynth.scenario import make_scenario

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PPDIAG_NO_CACHE": "1"}
N_NEGATIVE = 40


def _check(run: Path, budget: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = run.parent / f"{run.name}.report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ppdiag",
            "check",
            str(run),
            "--budget",
            str(budget),
            "-q",
            "--json",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    return proc, doc


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    d = tmp_path_factory.mktemp("gatecov") / "whole"
    paths = write_kineto(make_scenario(pp=4, microbatches=4, steps=4), d, gzip=False, groundtruth=False)
    return d, paths


@pytest.fixture(scope="module")
def budget(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("budget") / "ppdiag.toml"
    p.write_text("[budget]\nmax_lost_ratio = 0.95\n")
    return p


def _copy(whole: tuple[Path, list[Path]], name: str) -> tuple[Path, list[Path]]:
    src, paths = whole
    dst = src.parent / name
    shutil.copytree(src, dst)
    return dst, [dst / p.name for p in paths]


def _cut(whole: tuple[Path, list[Path]], gz: bool) -> Path:
    """Rank 2's file cut at 65 % of its bytes, as a profiler killed mid-write leaves it."""
    d, paths = _copy(whole, f"cut_{'gz' if gz else 'json'}")
    p = paths[2]
    data = p.read_bytes()[: int(p.stat().st_size * 0.65)]
    p.unlink()
    if gz:
        p.with_name(p.name + ".gz").write_bytes(gzip.compress(data))
    else:
        p.write_bytes(data)
    return d


_PG_ARGS = (
    "Process Group Ranks",
    "Process Group Name",
    "Process Group Description",
    "Process Group ID",
    "Group size",
    "Global rank start",
    "Global rank stride",
)


def _missing_last(whole: tuple[Path, list[Path]]) -> Path:
    """The last rank's file gone, and nothing stating the world size or a group's members (no
    distributedInfo world_size or pg_config, no process-group args on the ops): only the peers
    the p2p ops name tell that a rank 3 exists."""
    d, paths = _copy(whole, "missing_last")
    paths[-1].unlink()
    for p in paths[:-1]:
        doc = json.loads(p.read_text())
        for k in ("world_size", "pg_config", "pg_count"):
            doc["distributedInfo"].pop(k, None)
        for e in doc["traceEvents"]:
            args = e.get("args")
            if isinstance(args, dict):
                for k in _PG_ARGS:
                    args.pop(k, None)
        p.write_text(json.dumps(doc))
    return d


def _missing_last_groups(whole: tuple[Path, list[Path]]) -> Path:
    """The last rank's file gone and no world size stated, no peer named on the p2p ops: only the
    process groups' member lists (distributedInfo pg_config, the ops' group args) hold a rank 3."""
    d, paths = _copy(whole, "missing_last_groups")
    paths[-1].unlink()
    for p in paths[:-1]:
        doc = json.loads(p.read_text())
        doc["distributedInfo"].pop("world_size", None)
        for e in doc["traceEvents"]:
            args = e.get("args")
            if isinstance(args, dict):
                for k in ("Src Rank", "Dst Rank"):
                    args.pop(k, None)
        p.write_text(json.dumps(doc))
    return d


def _negative(whole: tuple[Path, list[Path]]) -> Path:
    """N_NEGATIVE kernels of rank 1 with a negative duration."""
    d, paths = _copy(whole, "negative")
    doc = json.loads(paths[1].read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("dur", 0) > 0]
    for e in kernels[:N_NEGATIVE]:
        e["dur"] = -e["dur"]
    paths[1].write_text(json.dumps(doc))
    return d


def _lost_transfer(whole: tuple[Path, list[Path]]) -> Path:
    """One p2p kernel of rank 1 (in its last step) with a duration over a week: the parser drops
    that one event (well under the stated share of lost events), every rank still holds every
    step, and the analysis finds a receive whose send never came and leaves the step out."""
    d, paths = _copy(whole, "lost_transfer")
    doc = json.loads(paths[1].read_text())
    p2p = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "SendRecv" in e.get("name", "")]
    p2p[-1]["dur"] = 1e30
    paths[1].write_text(json.dumps(doc))
    return d


def _events_twice(whole: tuple[Path, list[Path]]) -> Path:
    """Every event of rank 1 written twice (a profiler that flushed its buffer twice)."""
    d, paths = _copy(whole, "events_twice")
    doc = json.loads(paths[1].read_text())
    doc["traceEvents"] = doc["traceEvents"] + doc["traceEvents"]
    paths[1].write_text(json.dumps(doc))
    return d


def test_the_whole_run_passes(whole: tuple[Path, list[Path]], budget: Path) -> None:
    proc, doc = _check(whole[0], budget)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["gate"]["partial"] == []
    assert "PASS" in proc.stdout


def _cut_json(whole: tuple[Path, list[Path]]) -> Path:
    return _cut(whole, gz=False)


def _cut_gz(whole: tuple[Path, list[Path]]) -> Path:
    return _cut(whole, gz=True)


CASES: dict[str, tuple[Callable[[tuple[Path, list[Path]]], Path], str]] = {
    "cut_json": (_cut_json, r"rank 2 has \d+ complete step\(s\), others up to 4"),
    "cut_gz": (_cut_gz, r"rank 2 has \d+ complete step\(s\), others up to 4"),
    "missing_last": (
        _missing_last,
        r"1 rank\(s\) 3 of world size 4 \(inferred from the peers the traces name\) have no trace",
    ),
    "missing_last_groups": (
        _missing_last_groups,
        r"1 rank\(s\) 3 of world size 4 .*have no trace",
    ),
    "negative_dur": (_negative, rf"rank 1: {N_NEGATIVE} of \d+ events lost or altered"),
    "lost_transfer": (
        _lost_transfer,
        r"the analysis found the run (cut mid-step|hung).* \(PP013\); step\(s\) 8 left out",
    ),
    "events_twice": (
        _events_twice,
        r"the analysis found the run (cut mid-step|hung).* \(PP013\); step\(s\) [\d-]+ left out",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_partial_run_is_inconclusive_unless_allowed(
    case: str, whole: tuple[Path, list[Path]], budget: Path
) -> None:
    import re

    make, reason = CASES[case]
    run = make(whole)
    proc, doc = _check(run, budget)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    head = proc.stdout.splitlines()[0]
    assert head.startswith("ppdiag check INCONCLUSIVE: partial data"), head
    assert re.search(reason, head), head
    gate = doc["gate"]
    assert gate["status"] == "inconclusive" and gate["exit_code"] == 3
    assert any(re.search(reason, p) for p in gate["partial"]), gate["partial"]
    # the checks themselves were computed: only the coverage keeps the gate from passing
    assert [c["state"] for c in gate["checks"]] == ["pass"]

    proc2, doc2 = _check(run, budget, "--allow-partial")
    assert proc2.returncode == 0, proc2.stdout + proc2.stderr
    assert "warning: --allow-partial: the gate judged partial data" in proc2.stderr
    assert "partial data accepted by --allow-partial" in proc2.stdout
    assert doc2["gate"]["status"] == "pass" and doc2["gate"]["partial"] == gate["partial"]
    assert doc2["summary"] == doc["summary"]
