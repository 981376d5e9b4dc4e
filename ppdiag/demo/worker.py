"""The processes of a demo run: one launcher that imports torch once and forks one process per rank.

Run as ``python -m ppdiag.demo.worker WORKDIR FD`` by :func:`ppdiag.demo.recorder.record`.
``WORKDIR/run.json`` holds the config and the output directory; ``FD`` is the write end of a pipe on
which every process reports progress and errors as one JSON object per line (each line is one
``write`` below ``PIPE_BUF``, so lines from several processes never interleave).

Importing torch costs seconds of CPU; forking the ranks from a launcher that has already imported
it pays that once instead of once per rank. The launcher and the ranks die with their parent
(``PR_SET_PDEATHSIG``) and share one process group, so the recorder can end them all at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ppdiag.demo.config import PROFILER_WAIT, PROFILER_WARMUP, SCHEDULE_CLASSES, SINGLE_STAGE, DemoConfig
from ppdiag.demo.groundtruth import IntervalLog, trace_name

#: Test hook: ``"RANK:STEP"`` makes that rank raise at the start of that iteration.
FAIL_ENV = "PPDIAG_DEMO_FAIL"
#: Test hook: ``"RANK:STEP"`` makes that rank hang (sleep) at the start of that iteration.
HANG_ENV = "PPDIAG_DEMO_HANG"
REPORTED = "_ppdiag_reported"  # attribute set on an exception already sent to the recorder


class Channel:
    """Line-oriented JSON messages to the recorder over an inherited pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, **msg: Any) -> None:
        msg.setdefault("t", time.time_ns())
        data = (json.dumps(msg, default=str) + "\n").encode()
        if len(data) > 4000:  # keep each message one atomic pipe write
            msg["message"] = str(msg.get("message", ""))[:2000] + "…"
            data = (json.dumps(msg, default=str)[:3990] + "\n").encode()
        # OSError: the recorder is gone, and the death signal ends this process.
        with contextlib.suppress(OSError):
            os.write(self.fd, data)

    def error(self, rank: int, exc: BaseException) -> None:
        self.send(event="error", rank=rank, message=_one_line(exc))


def _one_line(exc: BaseException) -> str:
    """The most telling single line for an exception: its innermost cause, type and first line."""
    root = exc
    seen = {id(root)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        # Wrappers like pipelining's "failed to run forward" hide the real error in __cause__.
        seen.add(id(nxt))
        root = nxt
    first = next((ln.strip() for ln in str(root).splitlines() if ln.strip()), "")
    return f"{type(root).__name__}: {first}" if first else type(root).__name__


def _set_pdeathsig() -> None:
    """Ask Linux to kill this process when its parent dies (no orphans if the recorder is killed)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _hook(env: str, rank: int, step: int) -> bool:
    spec = os.environ.get(env, "")
    if not spec:
        return False
    try:
        r, s = (int(v) for v in spec.split(":"))
    except ValueError:
        return False
    return r == rank and s == step


@dataclass
class _Pipeline:
    """One rank's part of the pipeline, built: its stages, schedule, optimizer and probe."""

    stage_ids: list[int]
    sched: Any
    opt: Any
    probe: Any
    log: IntervalLog
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def run_rank(cfg: DemoConfig, rank: int, out_dir: Path, workdir: Path, chan: Channel) -> None:
    """Train ``cfg.total_iterations`` steps as ``rank``, profile the active ones, write the truth part."""
    import torch
    import torch.distributed as dist

    from ppdiag.demo.faults import RankFaults

    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    # Rendezvous through a file in the run's private directory: unlike a TCP port picked in advance,
    # it cannot collide with another run starting at the same time. Gloo's own connections use
    # ports the kernel assigns.
    dist.init_process_group(
        "gloo",
        init_method=f"file://{workdir / 'rendezvous'}",
        rank=rank,
        world_size=cfg.pp,
        timeout=timedelta(seconds=cfg.timeout_s),
    )
    faults = RankFaults(cfg, rank)
    try:
        chan.send(event="ready", rank=rank)
        pipe = _build_pipeline(cfg, rank, faults)
        trace_path = out_dir / trace_name(rank)
        step_rows = _train(cfg, rank, pipe, faults, trace_path, chan)
        faults.close()
        pipe.probe.uninstall()
        if not trace_path.exists():
            raise RuntimeError(f"the profiler wrote no trace to {trace_path}")
        part = {
            "rank": rank,
            "stages": pipe.stage_ids,
            "pid": os.getpid(),
            "trace": trace_name(rank),
            "steps": {
                "step": [r[0] for r in step_rows],
                "start_ns": [r[1] for r in step_rows],
                "end_ns": [r[2] for r in step_rows],
            },
            "intervals": pipe.log.to_json(),
        }
        part_path = workdir / f"rank{rank}.gt.json"
        part_path.write_text(json.dumps(part, separators=(",", ":")), encoding="utf-8")
        # Leave together: a rank that exits early closes its gloo pairs under the others.
        dist.barrier()
    except BaseException as exc:
        # Report before any cleanup: tearing down gloo makes the peers fail too, and the
        # recorder blames whichever rank reported first.
        chan.error(rank, exc)
        with contextlib.suppress(AttributeError):
            setattr(exc, REPORTED, True)
        raise
    finally:
        faults.close()
    dist.destroy_process_group()


def _build_pipeline(cfg: DemoConfig, rank: int, faults: Any) -> _Pipeline:
    """The rank's stage modules wrapped as pipelining stages, instrumented, and its schedule."""
    import torch
    from torch.distributed import pipelining
    from torch.distributed.pipelining import schedules

    from ppdiag.demo.model import build_stage_module, held_ns, loss_fn, make_batch
    from ppdiag.demo.probe import Probe

    stage_ids = cfg.stages_of_rank(rank)
    device = torch.device("cpu")
    modules = [build_stage_module(cfg, s) for s in stage_ids]
    stages = [
        pipelining.PipelineStage(m, s, cfg.num_stages, device)
        for m, s in zip(modules, stage_ids, strict=True)
    ]
    log = IntervalLog()
    probe = Probe(log, faults, held_ns)
    for st in stages:
        probe.instrument_stage(st)
    probe.install_p2p(schedules)
    cls = getattr(pipelining, SCHEDULE_CLASSES[cfg.schedule])
    if cfg.schedule in SINGLE_STAGE:
        sched = cls(stages[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    else:
        sched = cls(stages, n_microbatches=cfg.microbatches, loss_fn=loss_fn)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    x, y = make_batch(cfg)
    args: tuple[Any, ...] = (x,) if 0 in stage_ids else ()
    kwargs: dict[str, Any] = {}
    if cfg.num_stages - 1 in stage_ids:
        kwargs = {"target": y, "losses": []}
    return _Pipeline(stage_ids, sched, opt, probe, log, args, kwargs)


def _train(
    cfg: DemoConfig, rank: int, pipe: _Pipeline, faults: Any, trace_path: Path, chan: Channel
) -> list[tuple[int, int, int]]:
    """Every iteration under the profiler; returns (iteration, start ns, end ns) of the recorded ones."""
    from ppdiag.demo.model import start_step
    from ppdiag.recording import profiler

    first_recorded = PROFILER_WAIT + PROFILER_WARMUP
    step_rows: list[tuple[int, int, int]] = []
    # the helper users record with (ppdiag/recording.py), so every demo run tests it
    prof = profiler(
        trace_path.parent,
        steps=cfg.steps,
        wait=PROFILER_WAIT,
        warmup=PROFILER_WARMUP,
        rank=rank,
        cuda=False,
        record_shapes=cfg.record_shapes,
    )
    with prof:
        for it in range(cfg.total_iterations):
            if _hook(FAIL_ENV, rank, it):
                raise RuntimeError(f"injected failure at step {it} ({FAIL_ENV})")
            if _hook(HANG_ENV, rank, it):
                time.sleep(3600)
            recording = it >= first_recorded
            pipe.probe.begin_step(it, recording)
            start_step()
            # The first iteration initialises the pipeline (shape exchange); faults start after it.
            faults.active = it >= 1
            t0 = time.time_ns()
            pipe.opt.zero_grad()
            pipe.sched.step(*pipe.args, **pipe.kwargs)
            pipe.opt.step()
            t1 = time.time_ns()
            if recording:
                step_rows.append((it, t0, t1))
            if "losses" in pipe.kwargs:
                pipe.kwargs["losses"] = []
            prof.step()
            chan.send(event="step", rank=rank, step=it)
    return step_rows


def _launch(workdir: Path, chan: Channel) -> int:
    spec = json.loads((workdir / "run.json").read_text(encoding="utf-8"))
    cfg = DemoConfig.from_dict(spec["config"]).validated()
    out_dir = Path(spec["out_dir"])
    try:
        # Import here, once, before forking: every rank inherits the loaded modules.
        import torch
        import torch.distributed.pipelining
        import torch.profiler

        import ppdiag.demo.model  # registers the hold ops
        import ppdiag.demo.probe  # noqa: F401
    except ImportError as exc:
        chan.send(event="error", rank=-1, message=f"cannot import torch: {exc}")
        return 1
    chan.send(event="imported", rank=-1, torch_version=str(torch.__version__))
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for rank in range(cfg.pp):
        pid = os.fork()
        if pid == 0:  # rank process
            code = 1
            try:
                _set_pdeathsig()
                os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(cfg.pp)})
                run_rank(cfg, rank, out_dir, workdir, chan)
                chan.send(event="done", rank=rank)
                code = 0
            except BaseException as exc:
                if not getattr(exc, REPORTED, False):
                    chan.error(rank, exc)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    failed = False
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        rank = children.pop(pid, -1)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            chan.send(event="exit", rank=rank, code=code)
            if not failed:
                failed = True
                # The others would only hang on the missing peer until the gloo timeout.
                for other in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(other, signal.SIGKILL)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the launcher process."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m ppdiag.demo.worker WORKDIR FD", file=sys.stderr)
        return 2
    _set_pdeathsig()
    chan = Channel(int(args[1]))
    try:
        return _launch(Path(args[0]), chan)
    except BaseException as exc:
        chan.error(-1, exc)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
