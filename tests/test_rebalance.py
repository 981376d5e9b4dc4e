"""The optimal contiguous split (exact against brute force and an independent exact method) and the
per-block cost files it reads."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ppdiag.cli import app
from ppdiag.errors import InputError
from ppdiag.whatif.layers import measured_from_profile, read_layer_costs
from ppdiag.whatif.rebalance import continuous_balance, even_split, min_max_split, split_costs
from ppdiag.whatif.scenarios import Scenario, WhatifModel, WhatifOptions


def brute_force(
    costs: list[float], k: int, weights: list[float] | None = None, limits: list[float] | None = None
) -> tuple[float, float] | None:
    """(slowest stage, sum of squares) of the best split over every way to cut, or None."""
    n = len(costs)
    best: tuple[float, float] | None = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = [0, *cuts, n]
        if (
            weights is not None
            and limits is not None
            and any(w > lim for w, lim in zip(split_costs(weights, b), limits, strict=True))
        ):
            continue
        sc = split_costs(costs, b)
        cand = (max(sc), sum(x * x for x in sc))
        if best is None or cand < best:
            best = cand
    return best


def greedy_optimum(costs: np.ndarray, k: int) -> float:
    """Independent exact method: the optimum is one of the segment sums; the smallest one for which
    greedy packing (fill each stage as far as the bound allows) needs at most k stages."""

    pre = np.concatenate(([0.0], np.cumsum(costs)))

    def stages_needed(bound: float) -> int:
        # stage costs as prefix differences, exactly as the candidates are computed
        count, j = 0, 0
        while j < costs.size:
            i = int(np.searchsorted(pre, pre[j] + bound, side="right")) - 1
            while i > j and pre[i] - pre[j] > bound:
                i -= 1
            if i == j:
                return 10**9
            count, j = count + 1, i
        return count

    cands = np.unique((pre[None, :] - pre[:, None])[np.triu_indices(costs.size + 1, 1)])
    lo, hi = 0, cands.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if stages_needed(float(cands[mid])) <= k:
            hi = mid
        else:
            lo = mid + 1
    return float(cands[lo])


def test_matches_brute_force_on_small_cases() -> None:
    rng = np.random.default_rng(7)
    for _ in range(400):
        n = int(rng.integers(1, 11))
        k = int(rng.integers(1, n + 1))
        costs = rng.integers(0, 25, n).astype(float).tolist()
        sp = min_max_split(costs, k)
        assert sp.stages == k and sp.bounds[0] == 0 and sp.bounds[-1] == n
        assert all(x >= 1 for x in sp.layers_per_stage)
        assert sp.stage_cost == split_costs(costs, sp.bounds)
        got = (sp.max_cost, sum(x * x for x in sp.stage_cost))
        assert got == brute_force(costs, k), (costs, k, sp.bounds)


def test_matches_brute_force_with_a_memory_limit() -> None:
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(2, 10))
        k = int(rng.integers(1, n + 1))
        costs = rng.integers(0, 20, n).astype(float).tolist()
        weights = rng.integers(0, 8, n).astype(float).tolist()
        limits = rng.integers(4, 30, k).astype(float).tolist()
        want = brute_force(costs, k, weights, limits)
        if want is None:
            with pytest.raises(ValueError, match="no split"):
                min_max_split(costs, k, weights, limits)
            continue
        sp = min_max_split(costs, k, weights, limits)
        assert all(w <= lim for w, lim in zip(split_costs(weights, sp.bounds), limits, strict=True))
        assert (sp.max_cost, sum(x * x for x in sp.stage_cost)) == want


def test_known_split_of_a_slow_stage() -> None:
    # 8 equal layers, the two of stage 2 twice as expensive: the best slowest stage is 3 units
    costs = [1, 1, 1, 1, 2, 2, 1, 1]
    sp = min_max_split(costs, 4)
    assert sp.max_cost == 3
    # among the splits with a slowest stage of 3, 3/2/1/2 (3, 3, 2, 2) is the most even
    assert sp.layers_per_stage == [3, 2, 1, 2]


def test_eighty_blocks_over_eight_stages_is_optimal_and_fast(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    fwd = rng.uniform(0.5, 3.0, 80).round(3)
    bwd = (fwd * rng.uniform(1.5, 2.5, 80)).round(3)
    lines = ["block,fwd_ms,bwd_ms,activation_mb"]
    lines += [f"layers.{i},{f},{b},{100 + i}" for i, (f, b) in enumerate(zip(fwd, bwd, strict=True))]
    path = tmp_path / "blocks.csv"
    path.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    prof = read_layer_costs(path)
    sp = min_max_split(prof.total_ns, 8)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0
    assert prof.n == 80 and prof.names[5] == "layers.5"
    assert prof.act_mb[3] == 103
    want = greedy_optimum(prof.total_ns, 8)
    assert sp.max_cost == pytest.approx(want, rel=1e-12)
    # the whole what-if path (no trace: the file alone) stays fast as well
    t0 = time.perf_counter()
    meas = measured_from_profile(prof, pp=8, microbatches=32, schedule="1f1b")
    pred = WhatifModel(meas, prof, WhatifOptions()).predict(Scenario(rebalance=True))
    assert time.perf_counter() - t0 < 1.0
    assert pred.error is None and pred.split is not None
    assert isinstance(pred.split.layers_per_stage, list) and sum(pred.split.layers_per_stage) == 80
    assert max(pred.stage_ns) == pytest.approx(want, rel=1e-9)
    assert pred.step_ns is not None and pred.step_ns < meas.step_ns


def test_large_inputs_stay_well_under_a_second() -> None:
    rng = np.random.default_rng(5)
    costs = rng.uniform(1, 2, 2000)
    t0 = time.perf_counter()
    sp = min_max_split(costs, 64)
    assert time.perf_counter() - t0 < 1.0
    assert sp.max_cost == pytest.approx(greedy_optimum(costs, 64), rel=1e-12)


def test_bad_requests() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        min_max_split([1.0, 2.0], 3)
    with pytest.raises(ValueError, match=">= 0"):
        min_max_split([1.0, -2.0], 1)
    with pytest.raises(ValueError):
        even_split(3, 4)


def test_even_and_continuous_splits() -> None:
    assert even_split(10, 4) == [0, 3, 6, 8, 10]
    x = continuous_balance([1.0, 1.0, 2.0, 1.0], 4)
    # cumulative cost 0,1,2,4,5: the quarters of 5 (1.25, 2.5, 3.75) fall at units 1.25, 2.25, 2.875
    assert x == pytest.approx([0.0, 1.25, 2.25, 2.875, 4.0])


# ---- per-block cost files -------------------------------------------------------------------


def test_reads_csv_and_json(tmp_path: Path) -> None:
    csv_p = tmp_path / "c.csv"
    csv_p.write_text("Block, fwd_ms, bwd_ms, stage\nemb,1,2,0\nl1,2,4,0\nl2,2,4,1\nhead,3,5,1\n")
    p = read_layer_costs(csv_p)
    assert p.names == ["emb", "l1", "l2", "head"]
    assert p.fwd_ns.tolist() == [1e6, 2e6, 2e6, 3e6]
    assert p.bwd_ns.tolist() == [2e6, 4e6, 4e6, 5e6]
    assert p.bounds == [0, 2, 4]
    assert not p.has_activations
    js = tmp_path / "c.json"
    js.write_text(
        json.dumps(
            {
                "blocks": [
                    {"block": "a", "fwd_ms": 1, "bwd_ms": 2, "activation_mb": 5},
                    {"name": "b", "fwd_ms": 1.5, "bwd_ms": 3, "activation_mb": 6},
                ]
            }
        )
    )
    q = read_layer_costs(js)
    assert q.names == ["a", "b"] and q.act_mb.tolist() == [5, 6] and q.bounds is None


@pytest.mark.parametrize(
    ("name", "text", "msg"),
    [
        ("missing.csv", None, "no such file"),
        ("empty.csv", "", "empty"),
        ("nohead.csv", "block,fwd_ms\nx,1\n", "lacks bwd_ms"),
        ("nan.csv", "block,fwd_ms,bwd_ms\nx,1,abc\n", "line 2: bwd_ms is not a number"),
        ("neg.csv", "block,fwd_ms,bwd_ms\nx,1,2\ny,-1,2\n", "line 3: fwd_ms must be a finite number >= 0"),
        ("noblocks.csv", "block,fwd_ms,bwd_ms\n", "lists no blocks"),
        ("bad.json", '[{"fwd_ms": 1,', "not valid JSON"),
        ("shape.json", '{"a": 1}', "expected a list of objects"),
        ("stage.csv", "block,fwd_ms,bwd_ms,stage\na,1,1,0\nb,1,1,2\n", "contiguous"),
        ("partial.csv", "block,fwd_ms,bwd_ms,activation_mb\na,1,1,3\nb,1,1,\n", "not for all"),
        ("wgrad.csv", "block,fwd_ms,bwd_ms,wgrad_ms\na,1,1,2\n", "cannot exceed"),
    ],
)
def test_bad_files_are_one_clear_input_error(tmp_path: Path, name: str, text: str | None, msg: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(InputError) as err:
        read_layer_costs(path)
    line = str(err.value)
    assert "\n" not in line and str(path) in line and msg in line


def test_cli_bad_layer_cost_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("block,fwd_ms\na,1\n")
    res = CliRunner().invoke(
        app, ["whatif", "--layer-costs", str(path), "--run-pp", "2", "--run-microbatches", "4", "--rebalance"]
    )
    assert res.exit_code == 2
    assert "x.csv" in res.output and "lacks bwd_ms" in res.output
    assert "Traceback" not in res.output


def test_cli_rebalance_from_a_file_without_trace(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    rows = ["block,fwd_ms,bwd_ms,activation_mb,stage"]
    costs = [1, 1, 1, 1, 2, 2, 1, 1]
    rows += [f"layer{i},{c},{2 * c},10,{i // 2}" for i, c in enumerate(costs)]
    path.write_text("\n".join(rows) + "\n")
    res = CliRunner().invoke(
        app,
        [
            "whatif",
            "--layer-costs",
            str(path),
            "--run-pp",
            "4",
            "--run-microbatches",
            "8",
            "--rebalance",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    reb = out["scenarios"][-1]
    assert reb["split"]["layers_per_stage"] == [3, 2, 1, 2]
    assert reb["split"]["current_layers_per_stage"] == [2, 2, 2, 2]
    assert reb["split"]["slowest_stage_before"] == 2
    assert max(reb["stage_ms"]) == pytest.approx(9.0)  # 3 units of 1 + 2 ms
    assert out["scenarios"][0]["stage_ms"] == pytest.approx([6.0, 6.0, 12.0, 6.0])
    # stage 0 now holds 3 layers of activations for 4 micro-batches in flight (1F1B, rank 0)
    assert reb["peak_activation_mb"] == pytest.approx(3 * 10 * 4)
    assert out["scenarios"][0]["peak_activation_mb"] == pytest.approx(2 * 10 * 4)


def test_cli_memory_limit_steers_the_split(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    rows = ["block,fwd_ms,bwd_ms,activation_mb"]
    costs = [1, 1, 1, 1, 2, 2, 1, 1]
    rows += [f"layer{i},{c},{2 * c},10" for i, c in enumerate(costs)]
    path.write_text("\n".join(rows) + "\n")
    args = [
        "whatif",
        "--layer-costs",
        str(path),
        "--run-pp",
        "4",
        "--run-microbatches",
        "8",
        "--rebalance",
        "--json",
    ]
    res = CliRunner().invoke(app, [*args, "--max-activation-mb", "80"])
    assert res.exit_code == 0, res.output
    reb = json.loads(res.output)["scenarios"][-1]
    # rank 0 keeps 4 micro-batches in flight: at most 2 layers of 10 MB fit in 80 MB
    assert reb["split"]["layers_per_stage"][0] <= 2
    assert reb["peak_activation_mb"] <= 80 + 1e-9
    res = CliRunner().invoke(app, [*args, "--max-activation-mb", "30"])
    assert res.exit_code == 0
    reb = json.loads(res.output)["scenarios"][-1]
    assert reb["error"] and "no split" in reb["error"]
