"""Metamorphic tests: rewrites of an input that must not change its diagnosis (see ``metamorphic.py``).

Every input is diagnosed once per session (its :class:`Sig` cached); each (input, relation) pair
rewrites the input, diagnoses the rewrite and requires the same pp, stage map, schedule, M and
findings (codes and ranks, through the renumbering where ranks were renumbered) and every time
(summary, per rank, per stage) within 1.5 % of the step; per-stage relations (a duplicated replica)
compare the stages and the summary only, and the formats of one job agree within 1 % of the step.

Inputs: every real trace in ``../shared/traces`` (each file alone and each multi-file run as its
directory), a synthetic op-table job in its table and timeline forms, a synthetic GPU run written
as Kineto and as nsys, and a recorded demo run (slow). ``NOT_APPLICABLE`` says, per input kind,
which relation cannot hold and why; the matrix test checks that every (input, relation) pair is
either run or listed there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SHARED_TRACES
from metamorphic import (
    COMPRESSION,
    KEYS,
    NAMES,
    ORDER,
    RELATIONS,
    RENUMBER,
    REPEAT,
    REPLICA,
    UNRELATED,
    Rewrite,
    Sig,
    compression,
    differences,
    duplicate_replica,
    json_keys,
    json_order,
    kineto_renumber,
    kineto_unrelated,
    opaque_names,
    per_file,
    renumber_ranks,
    repeat_steps,
    reverse_columns,
    shuffle_rows,
    sig_of,
    table_rewrite,
)

from ppdiag.api import Options, diagnose
from ppsynth.optable import OpTableParams, simulate_optable, write_chrome, write_table

# which relation cannot hold for which kind of input, and why (asserted complete below)
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "kineto": {
        RENUMBER: "one rank per file: a lone trace has no other rank to swap with (the 2-rank runs do it)",
        REPLICA: "no DP structure a rewrite can copy: a copied rank's NCCL kernels would need new "
        "communicators, process groups and correlation ids to be another replica",
        REPEAT: "a ProfilerStep copied later needs every correlation / flow / external id renumbered; "
        "the op tables carry the relation",
    },
    "nsys": {
        ORDER: "rows are read through SQL with ORDER BY: the file has no event order to change",
        KEYS: "SQLite is binary: there are no keys or whitespace",
        COMPRESSION: "an export is read by SQLite in place; compressed exports are not a format nsys writes",
        RENUMBER: "the rank comes from the capture's environment (RANK, SLURM_PROCID) in binary rows",
        REPLICA: "as for Kineto: a copied process needs its own NCCL communicators",
        UNRELATED: "an added process needs consistent rows in a dozen tables (strings, threads, "
        "processes); the synthetic runs' per-process split is tested in test_nsys.py",
        REPEAT: "as for Kineto",
    },
    "optable": {
        UNRELATED: "a table holds only its ranks' ops: there is no process or thread to add",
    },
    "chrome": {
        RENUMBER: "the timeline names no global rank (pid = DP rank, lanes = stage / TP rank)",
        REPLICA: "the table form carries it (the same rows)",
        REPEAT: "the table form carries it (the same rows)",
    },
    "gloo_dir": {
        REPLICA: "a 2-rank point-to-point run: no data-parallel replica",
        REPEAT: "as for Kineto",
    },
    "gpu": {
        REPLICA: "one pipeline: no data-parallel replica",
        REPEAT: "as for Kineto",
    },
    "demo": {
        REPLICA: "one pipeline: no data-parallel replica",
        REPEAT: "as for Kineto",
    },
}

_CACHE: dict[str, Sig] = {}


def _sig(key: str, paths: list[Path]) -> Sig:
    if key not in _CACHE:
        _CACHE[key] = sig_of(diagnose(paths, Options(progress=False, jobs=1)).result)
    return _CACHE[key]


def _check(
    key: str,
    paths: list[Path],
    rewrite: Rewrite,
    out: Path,
    perm: dict[int, int] | None = None,
    per_rank: bool = True,
    tol: float = 0.015,
) -> None:
    base = _sig(key, paths)
    new = sig_of(diagnose(rewrite(paths, out), Options(progress=False, jobs=1)).result)
    diff = differences(base, new, tol=tol, perm=perm, per_rank=per_rank)
    assert not diff, diff


# ---- real traces --------------------------------------------------------------------------------

KINETO_FILES = sorted(
    str(p.relative_to(SHARED_TRACES)) for p in SHARED_TRACES.glob("kineto/**/*") if p.is_file()
)
KINETO_DIRS = sorted(str(p.relative_to(SHARED_TRACES)) for p in SHARED_TRACES.glob("kineto/*") if p.is_dir())
NSYS_FILES = sorted(str(p.relative_to(SHARED_TRACES)) for p in SHARED_TRACES.glob("nsys/*.sqlite"))

_KINETO_REWRITES: dict[str, Rewrite] = {
    ORDER: per_file(json_order),
    KEYS: per_file(json_keys),
    COMPRESSION: per_file(compression),
    NAMES: opaque_names,
    UNRELATED: per_file(kineto_unrelated),
}


def _real(rel: str) -> Path:
    p = SHARED_TRACES / rel
    if not p.exists():
        pytest.skip(f"shared trace {rel} not available")
    return p


@pytest.mark.slow
@pytest.mark.parametrize("relation", list(_KINETO_REWRITES))
@pytest.mark.parametrize("rel", KINETO_FILES + KINETO_DIRS)
def test_real_kineto(rel: str, relation: str, tmp_path: Path) -> None:
    p = _real(rel)
    _check(f"real:{rel}", [p], _KINETO_REWRITES[relation], tmp_path / "new")


@pytest.mark.parametrize("relation", [*_KINETO_REWRITES, RENUMBER])
def test_real_gloo_run(relation: str, tmp_path: Path) -> None:
    # the small real CPU run, as its directory (fast): every Kineto relation plus the rank swap
    p = _real("kineto/gloo_cpu_2rank")
    if relation == RENUMBER:
        perm = {0: 1, 1: 0}
        _check("real:kineto/gloo_cpu_2rank", [p], per_file(kineto_renumber(perm)), tmp_path / "n", perm)
        return
    _check("real:kineto/gloo_cpu_2rank", [p], _KINETO_REWRITES[relation], tmp_path / "new")


@pytest.mark.slow
@pytest.mark.parametrize("rel", NSYS_FILES)
def test_real_nsys_names(rel: str, tmp_path: Path) -> None:
    _check(f"real:{rel}", [_real(rel)], opaque_names, tmp_path / "new")


# ---- a synthetic op-table job -------------------------------------------------------------------

JOB = OpTableParams(pp=4, dp=2, microbatches=6, steps=(3, 5, 9), slow_worker=(1, 2, 1.3), mb_cv=0.1, seed=5)
PERM = {r: 7 - r for r in range(8)}  # every rank renumbered (reversed)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("job")
    df, _ = simulate_optable(JOB)
    write_table(df, d / "ops.csv")
    write_table(df, d / "ops.jsonl")
    write_table(df, d / "ops.parquet")
    write_chrome(df, d / "timeline.json")
    for meta in ("last", "middle", "none"):
        write_chrome(df, d / f"timeline-{meta}.json", meta=meta)
    write_chrome(df, d / "timeline-relative.json", relative=True)
    write_chrome(df, d / "timeline-cut.json", meta="last", transfer_ms=0.05)
    one, _ = simulate_optable(OpTableParams(pp=4, dp=2, microbatches=6, steps=(3,), seed=5))
    write_table(one, d / "one-step.csv")
    # replicas alike (a stage heavy in every replica): a copy of one leaves every stage's mean
    alike, _ = simulate_optable(OpTableParams(pp=4, dp=2, microbatches=6, steps=(3, 5), heavy_stage=(3, 1.3)))
    write_table(alike, d / "alike.csv")
    return d


_TABLE_REWRITES: dict[str, tuple[Rewrite, dict[int, int] | None]] = {
    ORDER: (table_rewrite(shuffle_rows), None),
    KEYS: (table_rewrite(reverse_columns), None),
    COMPRESSION: (per_file(compression), None),
    NAMES: (opaque_names, None),
    RENUMBER: (table_rewrite(renumber_ranks(PERM)), PERM),
}


@pytest.mark.parametrize("relation", list(_TABLE_REWRITES))
def test_op_table(job_dir: Path, relation: str, tmp_path: Path) -> None:
    rewrite, perm = _TABLE_REWRITES[relation]
    _check("job:csv", [job_dir / "ops.csv"], rewrite, tmp_path / "new", perm)


def test_op_table_replica_duplicated(job_dir: Path, tmp_path: Path) -> None:
    # a third replica, a copy of replica 0 of a job whose replicas are alike: every per-stage
    # figure and the summary stay; the copy's ranks are new, so the stages are compared row by row
    # (a slow worker's stage would rightly change its mean)
    _check(
        "job:alike",
        [job_dir / "alike.csv"],
        table_rewrite(duplicate_replica),
        tmp_path / "new",
        per_rank=False,
    )


def test_op_table_step_repeated(job_dir: Path, tmp_path: Path) -> None:
    # a one-step job and the same step three times: every per-step figure stays
    _check("job:one-step", [job_dir / "one-step.csv"], table_rewrite(repeat_steps(3)), tmp_path / "new")


_CHROME_REWRITES: dict[str, Rewrite] = {
    ORDER: per_file(json_order),
    KEYS: per_file(json_keys),
    COMPRESSION: per_file(compression),
    NAMES: opaque_names,
    UNRELATED: per_file(kineto_unrelated),
}


@pytest.mark.parametrize("relation", list(_CHROME_REWRITES))
def test_chrome_timeline(job_dir: Path, relation: str, tmp_path: Path) -> None:
    _check("job:chrome", [job_dir / "timeline.json"], _CHROME_REWRITES[relation], tmp_path / "new")


@pytest.mark.parametrize(
    "form",
    [
        "ops.jsonl",
        "ops.parquet",
        "timeline.json",
        "timeline-last.json",
        "timeline-middle.json",
        "timeline-none.json",
        "timeline-relative.json",
        "timeline-cut.json",
    ],
)
def test_one_job_every_table_form(job_dir: Path, form: str) -> None:
    # one job as CSV, JSON Lines, Parquet (float32 seconds) and the Chrome timeline with its
    # metadata first, last, in the middle or absent, with step-relative times, and with every
    # send / receive / collective drawn as its last 50 µs (the waits cut out): within 1 %
    if form.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    base = _sig("job:csv", [job_dir / "ops.csv"])
    new = sig_of(diagnose([job_dir / form], Options(progress=False, jobs=1)).result)
    diff = differences(base, new, tol=0.01)
    assert not diff, diff


# ---- a synthetic GPU run, as Kineto and as nsys -------------------------------------------------


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from ppsynth import faults as F
    from ppsynth.kineto import write_kineto
    from ppsynth.nsys import write_nsys
    from ppsynth.scenario import make_scenario

    run = make_scenario("1f1b", pp=4, microbatches=8, faults=[F.SlowStage(2, 1.5)], steps=2, seed=3)
    kd, nd = tmp_path_factory.mktemp("gpu_kineto"), tmp_path_factory.mktemp("gpu_nsys")
    write_kineto(run, kd)
    write_nsys(run, nd, per_rank_files=True)
    for d in (kd, nd):
        (d / "groundtruth.json").unlink(missing_ok=True)
    return kd, nd


@pytest.mark.parametrize("relation", [*_KINETO_REWRITES, "nsys"])
def test_synthetic_gpu_run(gpu_run: tuple[Path, Path], relation: str, tmp_path: Path) -> None:
    kd, nd = gpu_run
    if relation == "nsys":
        # the same job written as Nsight Systems exports: within 1 % of the step
        base = _sig("gpu:kineto", [kd])
        diff = differences(base, sig_of(diagnose([nd], Options(progress=False, jobs=1)).result), tol=0.01)
        assert not diff, diff
        return
    _check("gpu:kineto", [kd], _KINETO_REWRITES[relation], tmp_path / "new")


def test_synthetic_gpu_run_renumbered(gpu_run: tuple[Path, Path], tmp_path: Path) -> None:
    # ranks reversed: rank 3 now runs stage 0; every process group lists its ranks sorted, so the
    # stage order must come from the transfers' direction, not from the group's listing
    perm = {0: 3, 1: 2, 2: 1, 3: 0}
    _check("gpu:kineto", [gpu_run[0]], per_file(kineto_renumber(perm)), tmp_path / "n", perm)


# ---- a recorded demo run (slow) -----------------------------------------------------------------


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from ppdiag.demo.config import DemoConfig
    from ppdiag.demo.recorder import record

    d = tmp_path_factory.mktemp("demo_metamorphic")
    record(DemoConfig(schedule="1f1b", microbatches=4, steps=3, slow_stage=2, slow_factor=2.0), d)
    for own in ("groundtruth.json",):
        (d / own).unlink(missing_ok=True)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("relation", [*_KINETO_REWRITES, RENUMBER])
def test_recorded_demo_run(demo_run: Path, relation: str, tmp_path: Path) -> None:
    if relation == RENUMBER:
        perm = {0: 2, 1: 3, 2: 0, 3: 1}
        _check("demo", [demo_run], per_file(kineto_renumber(perm)), tmp_path / "n", perm)
        return
    _check("demo", [demo_run], _KINETO_REWRITES[relation], tmp_path / "new")


# ---- the matrix is complete ---------------------------------------------------------------------

_RUN: dict[str, set[str]] = {
    "kineto": set(_KINETO_REWRITES),
    "nsys": {NAMES},
    "optable": set(_TABLE_REWRITES) | {REPLICA, REPEAT},
    "chrome": set(_CHROME_REWRITES),
    "gloo_dir": set(_KINETO_REWRITES) | {RENUMBER},
    "demo": set(_KINETO_REWRITES) | {RENUMBER},
    "gpu": set(_KINETO_REWRITES) | {RENUMBER},
}


@pytest.mark.parametrize("kind", list(_RUN))
def test_every_relation_is_run_or_explained(kind: str) -> None:
    # no relation is skipped silently: each one runs on this kind of input, or the table above says
    # why it cannot hold there (and a relation that runs is not also excused)
    run, excused = _RUN[kind], set(NOT_APPLICABLE.get(kind, {}))
    assert run | excused == set(RELATIONS), sorted(set(RELATIONS) - run - excused)
    assert not run & excused, sorted(run & excused)
