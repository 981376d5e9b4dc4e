"""The replay graph's waits resolved as arrays (``replay_waits``) against one wait at a time.

With :func:`ppdiag.attribution.replay_waits.common_waits` resolving none, every wait goes through
``ReplayGraph._resolve_wait`` (the per-wait path it replaced for the common waits): on synthetic
runs with slow links, host stalls, p2p on the compute stream and data parallelism, in both trace
formats, the graph must hold the same producers, issue delays, transfers, leads, own-send waits
and observed waits, in the same order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_parts import replay_args

from ppdiag.api import Options, diagnose
from ppdiag.attribution import replay_graph
from ppdiag.attribution.replay_run import Replay
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

CASES: dict[str, dict[str, Any]] = {
    "slow_link": dict(pp=4, microbatches=8, faults=[F.SlowLink(1, delay_ms=0.3)]),
    "host_stall_interleaved": dict(
        schedule="interleaved_1f1b", virtual=2, pp=2, microbatches=4, faults=[F.HostStall(1, 0.5)]
    ),
    "comm_on_compute_dp2": dict(
        pp=4, microbatches=4, dp=2, faults=[F.CommOnCompute(), F.ExposedAllReduce(1.0)]
    ),
}


def _graph_facts(rp: Replay) -> tuple[Any, ...]:
    nc = rp.cols
    return (
        dict(sorted(nc.obs.items())),
        dict(sorted(nc.obs_abs.items())),
        dict(sorted(nc.release.items())),
        dict(sorted(nc.lead.items())),
        dict(sorted(nc.issue_copy.items())),
        dict(sorted(nc.issue_held.items())),
        sorted(nc.send_wait),
        sorted(nc.false_wait),
        rp.waits.tolist(),
        rp.held.tolist(),
        (rp.untraced_waits, rp.false_waits, rp.dropped_edges),
    )


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
@pytest.mark.parametrize("name", list(CASES))
def test_waits_as_arrays_equal_one_wait_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, fmt: str
) -> None:
    run = make_scenario(steps=2, **CASES[name])
    (write_kineto if fmt == "kineto" else write_nsys)(run, tmp_path)
    diag = diagnose([tmp_path], Options())
    args = replay_args(diag)
    fast = Replay(*args)
    assert fast.waits.size, "the case has waits"

    def none_fast(g: Any, w: Any, *rest: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(w.nid.size, np.bool_), np.zeros(w.nid.size, np.int64)

    # resolve no wait as arrays: the same graph again, every wait one at a time
    monkeypatch.setattr(replay_graph, "common_waits", none_fast)
    slow = Replay(*args)
    assert _graph_facts(fast) == _graph_facts(slow)
