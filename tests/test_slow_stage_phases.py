"""Block phases of the first stage when a slower stage downstream paces its backward.

In GPipe with a slow stage, the first stage's backward blocks wait for gradients that arrive at
the slow stage's pace: its compute stream idles between them, on receives posted long before,
and each block's kernels start the instant the receive it waits on completes. With no pipeline
labels and no host-side NCCL ranges (an nsys export without the NCCL domain), the receive ends
are the only boundaries between those blocks. A receive that ends exactly when the next compute
run starts was once taken for one that completed inside that run, so the eight backward blocks
of a step merged into one (a 16 ms "backward" against a 1 ms forward: PP015, and PP003 claiming
more time than the step).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ablate import ALL_NSYS, NSYS_LABELS, strip_kineto_dir, strip_nsys_dir

from ppdiag.api import Options, diagnose
from ppdiag.model import Direction, Intervals, Kind, Phase, Ranges, RankTimeline
from ppdiag.pipeline.blocks import build_blocks
from ppdiag.pipeline.steps import LocalStep
from ppdiag.report_types import Report
from ppsynth import faults as F
from ppsynth.kineto import write_kineto
from ppsynth.nsys import write_nsys
from ppsynth.scenario import make_scenario

US = 1000


def _stage0(recv_to_compute_us: int) -> RankTimeline:
    """Stage 0's backward of one step, as the first stage of a GPipe run with a slow stage 1 sees it.

    Gradients arrive every 3000 µs (the slow stage's backward); each backward block is two kernels
    of 1000 µs, starting ``recv_to_compute_us`` after its receive completes; the receives sit on their
    own stream, each posted when the previous one completed. Peers and directions are unknown except
    through the overlay the test passes (receives from rank 1).
    """
    starts, ends, kinds, phases, streams = [], [], [], [], []
    arrive = [3000 * (i + 1) for i in range(4)]  # receive ends: 3000, 6000, 9000, 12000 µs
    prev = 0
    for a in arrive:
        starts.append(prev * US)
        ends.append(a * US)
        kinds.append(int(Kind.P2P))
        phases.append(0)
        streams.append(20)
        prev = a
        b0 = a + recv_to_compute_us
        for k in range(2):
            starts.append((b0 + 1000 * k) * US)
            ends.append((b0 + 1000 * (k + 1)) * US)
            kinds.append(int(Kind.COMPUTE))
            phases.append(int(Phase.BWD))
            streams.append(7)
    n = len(starts)
    iv = Intervals.from_columns(
        n,
        {
            "start": starts,
            "end": ends,
            "stream": streams,
            "kind": kinds,
            "name": [0] * n,
            "peer": [-1] * n,
            "direction": [0] * n,
            "phase": phases,
            "launch": [-1] * n,
        },
    )
    return RankTimeline(0, "rank0", "nsys", [""], iv, Ranges.empty(), world_size=None)


@pytest.mark.parametrize("delay_us", [0, 3])
def test_receive_ending_as_a_block_starts_cuts_it(delay_us: int) -> None:
    # compute runs [3000+d, 5000+d], [6000+d, 8000+d], ... µs; receives end at 3000, 6000, 9000,
    # 12000 µs after 1000 µs of idle compute stream: four backward blocks of 2000 µs each, whether
    # the block starts the instant its data lands (d = 0) or a few µs later (d = 3)
    tl = _stage0(delay_us)
    iv = tl.intervals
    p2p = iv.kind == int(Kind.P2P)
    overlay = (np.where(p2p, 1, -1).astype(np.int32), np.where(p2p, int(Direction.RECV), 0).astype(np.int8))
    blocks = build_blocks(tl, [LocalStep(0, 0, 20_000 * US)], 0, None, 1, overlay)
    assert len(blocks) == 4
    assert (blocks.phase == int(Phase.BWD)).all()
    assert blocks.busy.tolist() == [2000 * US] * 4
    assert (blocks.start // US).tolist() == [3000 + delay_us + 3000 * i for i in range(4)]
    assert blocks.mb.tolist() == [0, 1, 2, 3]


# ------------------------------------------------------------------ the synthetic run, every form

FORMS = [
    (fmt, labels, peers) for fmt in ("kineto", "nsys") for labels in (True, False) for peers in (True, False)
]


def _write(root: Path, fmt: str, labels: bool, peers: bool) -> Path:
    run = make_scenario(
        pp=4,
        microbatches=8,
        steps=3,
        clock_skew_ms=0.0,
        schedule="gpipe",
        seed=4,
        faults=[F.SlowStage(2, 1.5)],
        annotations="pp" if labels else None,
    )
    raw = root / "raw"
    out = root / "run"
    if fmt == "kineto":
        write_kineto(run, raw)
        # without peers: no comm args, process groups or nccl:* names (the labels stay as written)
        strip_kineto_dir(raw, out, () if peers else ("comm_args", "param_comms", "pg", "nvtx_names"))
    else:
        write_nsys(run, raw)
        strip_nsys_dir(raw, out, () if peers else ALL_NSYS)
    (out / "groundtruth.json").unlink(missing_ok=True)
    return out


def _stage_phases(rep: Report) -> list[tuple[float, int, float, int]]:
    return [
        (s.fwd_ms.mean, s.fwd_ms.n, s.bwd_ms.mean, s.bwd_ms.n) for s in rep.stages if s.fwd_ms and s.bwd_ms
    ]


@pytest.mark.parametrize(("fmt", "labels", "peers"), FORMS)
def test_gpipe_slow_stage_every_form(fmt: str, labels: bool, peers: bool, tmp_path: Path) -> None:
    # stage costs per micro-batch: F 1 ms / B 2 ms, stage 2 slowed 1.5x (F 1.5 / B 3 ms); 3 steps
    # of 8 micro-batches: 24 blocks of each phase per stage, every step about 46.4 ms
    src = _write(tmp_path, fmt, labels, peers)
    rep = diagnose([src], Options(progress=False, jobs=1)).result  # strict report check (conftest)
    assert rep.run.pp == 4
    assert rep.run.schedule == "gpipe"
    assert rep.run.microbatches == 8
    phases = _stage_phases(rep)
    assert len(phases) == 4
    for s, (f, nf, b, nb) in enumerate(phases):
        want_f, want_b = (1.5, 3.0) if s == 2 else (1.0, 2.0)
        assert (nf, nb) == (24, 24), (s, phases)
        assert f == pytest.approx(want_f, rel=0.02), (s, phases)
        assert b == pytest.approx(want_b, rel=0.02), (s, phases)
    codes = [f.code for f in rep.findings]
    assert "PP015" not in codes
    slow = [f for f in rep.findings if f.code == "PP003"]
    assert len(slow) == 1 and slow[0].ranks == [2]
    step_ms = rep.summary.step_ms
    assert step_ms is not None and 45.0 < step_ms < 48.0
    assert slow[0].gain_ms is not None and 0 < slow[0].gain_ms <= step_ms


def test_nsys_labels_stripped_is_the_unlabelled_form(tmp_path: Path) -> None:
    # the ablation's label stripping on an nsys export written with labels gives the same report's
    # structure as one written without them (the run above, labels=False)
    src = _write(tmp_path / "a", "nsys", True, False)
    strip_nsys_dir(src, tmp_path / "b", (NSYS_LABELS,))
    a = diagnose([tmp_path / "b"], Options(progress=False, jobs=1)).result
    b = diagnose([_write(tmp_path / "c", "nsys", False, False)], Options(progress=False, jobs=1)).result
    assert _stage_phases(a) == _stage_phases(b)
    assert [(f.code, f.ranks) for f in a.findings] == [(f.code, f.ranks) for f in b.findings]
