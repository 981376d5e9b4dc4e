"""The stage split of a job with many replicas (ppdiag/whatif/replicas.py): PP003's gain is the
what-if of the rebalanced split with each replica's own block costs, against the truth of
re-simulating the op table's own draws with every replica's stages evened out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ppdiag.api import Options, diagnose
from ppdiag.whatif.replicas import layout_ns, rebalanced_costs
from ppsynth.optable import OpTableParams, simulate_optable, write_table


def _tiny() -> np.ndarray:
    """One step, one replica, pp = 2, M = 2 (ms): stage 0 F 1, B 2; stage 1 F 2, B 4."""
    c = np.zeros((1, 1, 2, 3, 2))
    c[0, 0, 0, 0], c[0, 0, 0, 1] = 1.0, 2.0
    c[0, 0, 1, 0], c[0, 0, 1, 1] = 2.0, 4.0
    return c


def test_layout_by_hand() -> None:
    # 1F1B, no latency. Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1:
    # s0F0 0-1, s1F0 1-3, s0F1 1-2, s1B0 3-7, s1F1 7-9, s0B0 7-9, s1B1 9-13, s0B1 13-15
    assert layout_ns(_tiny(), "1f1b", 0.0)[0, 0] == pytest.approx(15.0)
    # evened out: F 1.5 and B 3 on both stages: s0F0 0-1.5, s1F0 1.5-3, s0F1 1.5-3, s1B0 3-6,
    # s1F1 6-7.5, s0B0 6-9, s1B1 7.5-10.5, s0B1 10.5-13.5
    even = rebalanced_costs(_tiny())
    assert np.array_equal(even[0, 0, :, 0], np.full((2, 2), 1.5))
    assert np.array_equal(even[0, 0, :, 1], np.full((2, 2), 3.0))
    assert layout_ns(even, "1f1b", 0.0)[0, 0] == pytest.approx(13.5)
    # a transfer latency of 0.5 across each boundary: s1F0 1.5-3.5, s1B0 3.5-7.5, s1F1 7.5-9.5,
    # s0B0 8-10, s1B1 9.5-13.5, s0B1 14-16
    assert layout_ns(_tiny(), "1f1b", 0.5)[0, 0] == pytest.approx(16.0)


def test_slowest_replica_sets_the_step() -> None:
    # a second replica twice as slow: each replica's end is its own, the step's is the slower one
    c = np.concatenate([_tiny(), 2 * _tiny()], axis=1)
    ends = layout_ns(c, "1f1b", 0.0)
    assert ends[0].tolist() == pytest.approx([15.0, 30.0])
    gain = ends.max(axis=1) - layout_ns(rebalanced_costs(c), "1f1b", 0.0).max(axis=1)
    assert gain[0] == pytest.approx(3.0)  # the slow replica's 30 -> 27


@pytest.mark.parametrize(
    "params",
    [
        # the mean-cost what-if said 6.18 ms for a 1.16 ms truth (2 stages, 32 replicas)
        OpTableParams(pp=2, dp=32, microbatches=8, heavy_stage=(1, 1.3), mb_cv=0.3, steps=(1, 2, 3, 4)),
        OpTableParams(pp=2, dp=8, microbatches=8, heavy_stage=(1, 1.5), mb_cv=0.3, steps=(1, 2, 3, 4)),
        OpTableParams(pp=4, dp=8, microbatches=8, heavy_stage=(0, 1.4), mb_cv=0.2, steps=(1, 2, 3, 4)),
        OpTableParams(pp=4, dp=4, microbatches=8, heavy_stage=(3, 1.3), mb_cv=0.3, seed=5),
        OpTableParams(pp=4, dp=2, microbatches=8, heavy_stage=(0, 1.4)),
    ],
)
def test_pp003_gain_is_the_replicas_rebalance(tmp_path: Path, params: OpTableParams) -> None:
    df, truth = simulate_optable(params)
    path = tmp_path / "ops.csv"
    write_table(df, path)
    rep = diagnose([path], Options(jobs=1)).result
    want = truth.step_ms - truth.rebalanced_ms
    row = next(w for w in rep.whatif if w.fix == "rebalanced")
    assert row.step_ms is not None and rep.summary.step_mean_ms is not None
    gain = rep.summary.step_mean_ms - row.step_ms
    # within a tenth of the truth plus 0.2 % of the step (the blocks' timer noise)
    assert abs(gain - want) <= 0.1 * want + 0.002 * truth.step_ms, (gain, want)
    f = next((x for x in rep.findings if x.code == "PP003"), None)
    if f is not None:
        assert f.gain_ms == pytest.approx(gain, abs=2e-3)
