"""Records the real CUDA pipeline runs kept in this folder.

Each run is ``torch.distributed.pipelining`` on one GPU: P processes share the device and talk over
NCCL. NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"), so every rank gets
its own ``NCCL_HOSTID`` and NCCL moves the activations over its socket transport, as it would
between nodes. The traces are written by :func:`ppdiag.recording.profiler` with CUDA activities,
so kernels, copies and NCCL kernels with their metadata are the ones a GPU run leaves.

What each run is, exactly (its stage map, schedule, micro-batches, the fault it carries and the
host-measured step times), goes to ``truth.json`` beside the traces: the tests compare with that.

Usage: ``python tests/data/cuda/record.py OUT_DIR [NAME ...]`` (a GPU machine with NCCL).
``--cpu`` runs the same code on CPU over gloo, to check the script itself on a machine without GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HIDDEN = 8192
ROWS = 256  # rows of one micro-batch: 4 MiB of bf16 activations per transfer
REPEATS = 4  # matmuls per layer: a stage's compute outweighs its transfers, in few events
STEPS = 2  # recorded steps (after one skipped and one warm-up step)
REPO = Path(__file__).resolve().parents[3]

#: name → schedule, ranks, micro-batches, stages per rank, layers per stage, fault.
RUNS: dict[str, dict[str, Any]] = {
    "nccl_1f1b_p4_m8": {"schedule": "1f1b", "pp": 4, "m": 8, "v": 1, "layers": [4, 4, 4, 4]},
    "nccl_gpipe_p4_m4_slow2": {"schedule": "gpipe", "pp": 4, "m": 4, "v": 1, "layers": [4, 4, 8, 4]},
    "nccl_interleaved_p2_v2_m4": {
        "schedule": "interleaved_1f1b",
        "pp": 2,
        "m": 4,
        "v": 2,
        "layers": [2, 2, 2, 2],
    },
    "nccl_1f1b_p2_m8_shapes": {
        "schedule": "1f1b",
        "pp": 2,
        "m": 8,
        "v": 1,
        "layers": [4, 4],
        "record_shapes": True,
    },
    "nccl_1f1b_p8_m16": {"schedule": "1f1b", "pp": 8, "m": 16, "v": 1, "layers": [2] * 8},
    "nccl_zbv_p4_m8": {"schedule": "zbv", "pp": 4, "m": 8, "v": 2, "layers": [2] * 8},
    "nccl_izb_p4_m8": {"schedule": "zero_bubble", "pp": 4, "m": 8, "v": 2, "layers": [2] * 8},
    "nccl_1f1b_p4_m8_slowlink1": {
        "schedule": "1f1b",
        "pp": 4,
        "m": 8,
        "v": 1,
        "layers": [4, 4, 4, 4],
        "slow_link": {"rank": 1, "ms": 6.0},
    },
    "nccl_1f1b_pp2_dp2_m4": {"schedule": "1f1b", "pp": 2, "dp": 2, "m": 4, "v": 1, "layers": [4, 4]},
    "nccl_1f1b_pp2_dp2_m4_hoststall3": {
        "schedule": "1f1b",
        "pp": 2,
        "dp": 2,
        "m": 4,
        "v": 1,
        "layers": [4, 4],
        "host_stall": {"rank": 3, "ms": 4.0},
    },
    "nccl_1f1b_p4_m8_hoststall1": {
        "schedule": "1f1b",
        "pp": 4,
        "m": 8,
        "v": 1,
        "layers": [4, 4, 4, 4],
        "host_stall": {"rank": 1, "ms": 4.0},
    },
}
CLASSES = {
    "1f1b": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "zbv": "ScheduleZBVZeroBubble",
    "zero_bubble": "ScheduleInterleavedZeroBubble",
}


def stages_of(rank: int, pp: int, v: int, schedule: str) -> list[int]:
    """The stages rank ``rank`` holds: looped (stage s on rank s mod P), or V-shaped for ZBV."""
    if schedule == "zbv":
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(v)]


def _hold_sends(ms: float) -> None:
    """Every batch of p2p ops that sends waits ``ms`` on the host first: the rank's sends leave late
    (a slow link as the receivers see it; the rank's own next work waits as well)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules

    real = schedules._batch_p2p  # every schedule's p2p goes through it

    def held(ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
        if any(getattr(op, "op", None) in (dist.isend, dist.send) for op in ops):
            time.sleep(ms / 1e3)
        return real(ops, desc)

    schedules._batch_p2p = held  # type: ignore[assignment]  # same signature; mypy refuses to rebind a def


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(rank: int, pp: int, port: int, cpu: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(pp),
        PYTHONUNBUFFERED="1",
        # the ranks import ppdiag.recording from this checkout, installed or not
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    )
    if not cpu:
        # one "host" per rank: NCCL then allows several ranks on one GPU and uses its socket transport
        env.update(
            NCCL_HOSTID=f"ppdiag-rank{rank}",
            NCCL_SOCKET_IFNAME="lo",
            NCCL_IB_DISABLE="1",
            NCCL_NET="Socket",
            NCCL_DEBUG="WARN",
        )
    return env


def rank_main(name: str, rank: int, out: Path, cpu: bool) -> None:
    """One rank of run ``name``: build its stages, train 4 steps, profile the last 2."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed import pipelining
    from torch.nn import functional

    from ppdiag.recording import profiler

    cfg = RUNS[name]
    pp, v, m, dp = cfg["pp"], cfg["v"], cfg["m"], cfg.get("dp", 1)
    num_stages = pp * v
    world = pp * dp
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    dtype = torch.float32 if cpu else torch.bfloat16
    hidden, rows, repeats = (256, 32, 2) if cpu else (HIDDEN, ROWS, REPEATS)
    if cpu:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    # data parallelism: replica d is pipeline ranks d*P .. d*P+P-1; every rank creates every group
    pp_groups = [dist.new_group(list(range(d * pp, (d + 1) * pp))) for d in range(dp)]
    dp_groups = [dist.new_group([d * pp + s for d in range(dp)]) for s in range(pp)]
    prank, replica = rank % pp, rank // pp

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(hidden, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(repeats):
                x = functional.gelu(self.linear(x))
            return x

    torch.manual_seed(1234 + rank)
    stage_ids = stages_of(prank, pp, v, cfg["schedule"])
    if cfg.get("slow_link") and cfg["slow_link"]["rank"] == rank:
        _hold_sends(cfg["slow_link"]["ms"])
    mods = [nn.Sequential(*[Layer() for _ in range(cfg["layers"][s])]).to(dev, dtype) for s in stage_ids]
    stall = cfg.get("host_stall")
    if stall and stall["rank"] == rank:
        for mod in mods:
            # the host sleeps before each micro-batch's forward: the GPU waits for work
            mod.register_forward_pre_hook(lambda *_: time.sleep(stall["ms"] / 1e3))
    group = pp_groups[replica] if dp > 1 else None
    stages = [
        pipelining.PipelineStage(md, s, num_stages, dev, group=group)
        for md, s in zip(mods, stage_ids, strict=True)
    ]
    params = [p for md in mods for p in md.parameters()]

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return functional.mse_loss(out.float(), target.float())

    cls = getattr(pipelining, CLASSES[cfg["schedule"]])
    sched = cls(stages[0] if v == 1 else stages, n_microbatches=m, loss_fn=loss_fn)
    opt = torch.optim.SGD(params, lr=1e-4)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(rows * m, hidden, generator=gen).to(dev, dtype)
    y = torch.randn(rows * m, hidden, generator=gen).to(dev, dtype)
    steps: list[list[int]] = []
    prof = profiler(
        out,
        steps=STEPS,
        wait=1,
        warmup=1,
        rank=rank,
        cuda=not cpu,
        record_shapes=bool(cfg.get("record_shapes")),
    )
    with prof:
        for it in range(2 + STEPS):
            if not cpu:
                torch.cuda.synchronize()
            t0 = time.time_ns()
            opt.zero_grad()
            args = (x,) if 0 in stage_ids else ()
            kwargs = {"target": y, "losses": []} if num_stages - 1 in stage_ids else {}
            sched.step(*args, **kwargs)
            if dp > 1:
                # the gradients of the stage's replicas, summed in one flat all-reduce
                flat = torch.cat([q.grad.flatten() for q in params if q.grad is not None])
                dist.all_reduce(flat, group=dp_groups[prank])
            opt.step()
            if not cpu:
                torch.cuda.synchronize()
            steps.append([it, t0, time.time_ns()])
            prof.step()
    dist.barrier()
    part = {"rank": rank, "stages": stage_ids, "pid": os.getpid(), "steps": steps[2:]}
    (out / f"truth.rank{rank}.json").write_text(json.dumps(part), encoding="utf-8")
    dist.destroy_process_group()


def record(name: str, out_root: Path, cpu: bool, timeout_s: float) -> bool:
    """Runs ``name``'s ranks as processes; True when every rank wrote its trace in time."""
    cfg = RUNS[name]
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    procs = []
    world = cfg["pp"] * cfg.get("dp", 1)
    for r in range(world):
        cmd = [sys.executable, __file__, "--rank", str(r), "--run", name, str(out_root)]
        if cpu:
            cmd.append("--cpu")
        log = open(out / f"rank{r}.log", "w")  # noqa: SIM115 - closed when the process ends
        procs.append((subprocess.Popen(cmd, env=_env(r, world, port, cpu), stdout=log, stderr=log), log))
    deadline = time.monotonic() + timeout_s
    ok = True
    for p, log in procs:
        try:
            ok = p.wait(timeout=max(1.0, deadline - time.monotonic())) == 0 and ok
        except subprocess.TimeoutExpired:
            ok = False
            for q, _ in procs:
                q.kill()
        log.close()
    parts = sorted(out.glob("truth.rank*.json"))
    truth = {"run": name, **cfg, "ranks": [json.loads(p.read_text()) for p in parts], "complete": ok}
    if not cpu:
        import torch

        truth["torch"] = torch.__version__
        truth["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
        truth["device"] = torch.cuda.get_device_name(0)
    (out / "truth.json").write_text(json.dumps(truth, indent=1), encoding="utf-8")
    for part in parts:
        part.unlink()
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("names", nargs="*", default=list(RUNS))
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--run", default="")
    a = ap.parse_intermixed_args()
    if a.rank >= 0:
        rank_main(a.run, a.rank, a.out / a.run, a.cpu)
        return 0
    failed = 0
    for name in a.names:
        t0 = time.monotonic()
        ok = record(name, a.out, a.cpu, a.timeout)
        failed += not ok
        print(f"{name}: {'ok' if ok else 'FAILED'} in {time.monotonic() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
