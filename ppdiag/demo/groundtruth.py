"""Ground truth of a recorded demo run: what ran where and when, measured inside the ranks.

``groundtruth.json`` sits next to the traces ``rank{r}.pt.trace.json.gz``. Times are integer
nanoseconds on the trace clock, ``time.time_ns()``, which on one host matches Kineto's
``baseTimeNanoseconds + ts * 1000`` within ~25 µs. Only the profiled (active) steps are recorded.

Schema (``schema_version`` 1)::

    {
      "schema": "ppdiag.demo.groundtruth",
      "schema_version": 1,
      "clock": "unix_ns",
      "torch_version": "2.13.0+cpu",
      "config": {... DemoConfig fields ...},
      "schedule": "1f1b",                 # canonical name (DemoConfig.schedule)
      "schedule_class": "Schedule1F1B",
      "compute": "sleep" | "real",
      "pp": 4, "world_size": 4, "microbatches": 8,
      "num_stages": 4, "stages_per_rank": 1,
      "stage_to_rank": [0, 1, 2, 3],      # rank of every stage
      "stage_layers": [2, 2, 2, 2],       # blocks per stage
      "stage_costs_ms": [{"fwd": 4.0, "bwd": 8.0, "bwd_input": 4.0, "wgrad": 4.0}, ...],
                                          # nominal per micro-batch (sleep mode), null in real mode
      "faults": [{"kind": "slow_stage", "stage": 2, "rank": 2, "factor": 2.0},
                 {"kind": "comm_delay", "rank": 1, "delay_ms": 10.0, "sync": false, "peers": [0, 2]},
                 {"kind": "host_stall", "rank": 3, "stall_ms": 10.0}],
      "steps": [2, 3, 4],                 # recorded iterations, = N of ProfilerStep#N
      "ranks": [
        {
          "rank": 0, "stages": [0], "pid": 1234, "trace": "rank0.pt.trace.json.gz",
          "steps": {"step": [2, 3, 4], "start_ns": [...], "end_ns": [...]},
          "intervals": {                  # one column per key, all the same length, rows by start
            "kind":      ["fwd", "wait", ...],
            "step":      [2, 2, ...],     # iteration the interval belongs to
            "stage":     [0, 0, ...],     # global stage index, -1 when none
            "mb":        [0, 1, ...],     # micro-batch, -1 when none
            "start_ns":  [...], "end_ns": [...],
            "peer":      [-1, 1, ...],    # global rank of the p2p partner, -1 when none
            "direction": ["", "recv", ...],   # "send" | "recv" | ""
            "payload":   ["", "act", ...],    # "act" (activations) | "grad" (gradients) | ""
            "held_ns":   [4000123, 0, ...]    # time held by the sleep op inside (sleep mode)
          }
        }, ...
      ]
    }

Interval kinds:

``fwd``
    ``forward_one_chunk`` of (stage, mb): the stage's forward compute of one micro-batch.
``bwd``
    ``backward_one_chunk`` with the full backward (input and weight gradients).
``bwd_input``
    ``backward_one_chunk(full_backward=False)``: input gradients only (zero-bubble I block). Stage 0
    has no input gradient to send, so torch runs its whole backward in the W block.
``wgrad``
    ``backward_weight_one_chunk``: weight gradients (zero-bubble W block).
``wait``
    One blocking wait on one p2p transfer (``Work.wait()``): from the call to its return. A gloo send
    completes only when the receiver has posted its receive, so sends can wait too.
``send`` / ``recv``
    A transfer handed to the pipelining library: ``start_ns`` when the schedule issued it, ``end_ns``
    when it was posted to gloo (later than ``start_ns`` only for the slow-link fault's delayed sends).
``stall``
    The injected host stall before a forward: the host held with no operator running.

Step windows are measured around ``optimizer.zero_grad()``, ``schedule.step()`` and
``optimizer.step()`` of each iteration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppdiag.errors import InputError
from ppdiag.recording import trace_file

SCHEMA = "ppdiag.demo.groundtruth"
SCHEMA_VERSION = 1
FILENAME = "groundtruth.json"

KINDS = ("fwd", "bwd", "bwd_input", "wgrad", "wait", "send", "recv", "stall")
#: Kinds that are the stage's own compute (the pipeline's F, B, I and W blocks).
COMPUTE_KINDS = ("fwd", "bwd", "bwd_input", "wgrad")

INT_COLUMNS = ("step", "stage", "mb", "start_ns", "end_ns", "peer", "held_ns")
STR_COLUMNS = ("kind", "direction", "payload")
COLUMNS = ("kind", "step", "stage", "mb", "start_ns", "end_ns", "peer", "direction", "payload", "held_ns")


#: One kind or several.
Kinds = str | tuple[str, ...] | list[str]


def trace_name(rank: int) -> str:
    """File name of one rank's trace in a demo run directory."""
    return trace_file(".", rank).name


class IntervalLog:
    """Append-only column lists a rank fills while it runs (a few rows per micro-batch)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}

    def add(
        self,
        kind: str,
        step: int,
        stage: int,
        mb: int,
        start_ns: int,
        end_ns: int,
        *,
        peer: int = -1,
        direction: str = "",
        payload: str = "",
        held_ns: int = 0,
    ) -> None:
        c = self.cols
        c["kind"].append(kind)
        c["step"].append(step)
        c["stage"].append(stage)
        c["mb"].append(mb)
        c["start_ns"].append(start_ns)
        c["end_ns"].append(end_ns)
        c["peer"].append(peer)
        c["direction"].append(direction)
        c["payload"].append(payload)
        c["held_ns"].append(held_ns)

    def __len__(self) -> int:
        return len(self.cols["kind"])

    def to_json(self) -> dict[str, list[Any]]:
        """Columns with rows in time order (they are logged when known, e.g. a send when waited)."""
        order = sorted(range(len(self)), key=lambda i: (self.cols["start_ns"][i], self.cols["end_ns"][i]))
        return {k: [v[i] for i in order] for k, v in self.cols.items()}


@dataclass
class RankTruth:
    """One rank's ground truth as numpy columns."""

    rank: int
    stages: list[int]
    trace: str
    pid: int
    step: npt.NDArray[np.int64]
    step_start: npt.NDArray[np.int64]
    step_end: npt.NDArray[np.int64]
    cols: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.cols["start_ns"].shape[0])

    def mask(self, kinds: Kinds, step: int | None = None) -> npt.NDArray[np.bool_]:
        """Rows of the given kind(s), optionally of one step."""
        ks = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        m = np.isin(self.cols["kind"], np.asarray(ks, dtype=object))
        if step is not None:
            m &= self.cols["step"] == step
        return m

    def durations(self, kinds: Kinds, step: int | None = None) -> npt.NDArray[np.int64]:
        m = self.mask(kinds, step)
        return np.asarray(self.cols["end_ns"][m] - self.cols["start_ns"][m], dtype=np.int64)

    def total_ns(self, kinds: Kinds, step: int | None = None) -> int:
        """Summed duration of the given kind(s)."""
        return int(self.durations(kinds, step).sum())

    def compute_ns(self, step: int | None = None) -> int:
        """Summed duration of this rank's F, B, I and W blocks."""
        return self.total_ns(COMPUTE_KINDS, step)


@dataclass
class GroundTruth:
    """A parsed ``groundtruth.json``."""

    path: Path
    header: dict[str, Any]
    ranks: list[RankTruth]

    @property
    def schedule(self) -> str:
        return str(self.header["schedule"])

    @property
    def pp(self) -> int:
        return int(self.header["pp"])

    @property
    def microbatches(self) -> int:
        return int(self.header["microbatches"])

    @property
    def stage_to_rank(self) -> list[int]:
        return [int(r) for r in self.header["stage_to_rank"]]

    @property
    def steps(self) -> list[int]:
        return [int(s) for s in self.header["steps"]]

    @property
    def faults(self) -> list[dict[str, Any]]:
        return list(self.header.get("faults", []))

    def rank(self, r: int) -> RankTruth:
        for rt in self.ranks:
            if rt.rank == r:
                return rt
        raise KeyError(r)

    def trace_path(self, r: int) -> Path:
        return self.path.parent / self.rank(r).trace


def _rank_from_json(path: Path, d: dict[str, Any]) -> RankTruth:
    try:
        iv = d["intervals"]
        n = len(iv["kind"])
        cols: dict[str, np.ndarray] = {}
        for c in COLUMNS:
            vals = iv[c]
            if len(vals) != n:
                raise InputError(
                    str(path),
                    f"ground truth rank {d.get('rank')}: column {c} has {len(vals)} rows, expected {n}",
                )
            cols[c] = np.asarray(vals, dtype=np.int64) if c in INT_COLUMNS else np.asarray(vals, dtype=object)
        st = d["steps"]
        return RankTruth(
            rank=int(d["rank"]),
            stages=[int(s) for s in d["stages"]],
            trace=str(d["trace"]),
            pid=int(d.get("pid", -1)),
            step=np.asarray(st["step"], dtype=np.int64),
            step_start=np.asarray(st["start_ns"], dtype=np.int64),
            step_end=np.asarray(st["end_ns"], dtype=np.int64),
            cols=cols,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            str(path), f"ground truth rank entry is malformed ({type(exc).__name__}: {exc})"
        ) from None


def load(path: str | Path) -> GroundTruth:
    """Read a ``groundtruth.json`` (or the directory holding one); :class:`InputError` when unusable."""
    p = Path(path)
    if p.is_dir():
        p = p / FILENAME
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(p), "no such ground-truth file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(str(p), f"not a readable ground-truth JSON file ({exc})") from None
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise InputError(str(p), f"not a ppdiag demo ground-truth file (schema is not {SCHEMA!r})")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise InputError(
            str(p),
            f"ground-truth schema_version {raw.get('schema_version')!r} is not "
            f"supported (expected {SCHEMA_VERSION})",
        )
    for key in ("schedule", "pp", "microbatches", "stage_to_rank", "steps", "ranks"):
        if key not in raw:
            raise InputError(str(p), f"ground truth lacks {key!r}")
    ranks = raw.pop("ranks")
    if not isinstance(ranks, list):
        raise InputError(str(p), "ground truth 'ranks' is not a list")
    return GroundTruth(
        path=p, header=raw, ranks=sorted((_rank_from_json(p, d) for d in ranks), key=lambda r: r.rank)
    )


def write(path: str | Path, header: dict[str, Any], ranks: list[dict[str, Any]]) -> Path:
    """Write a ground-truth file from a header and per-rank JSON parts (as the ranks produce them)."""
    p = Path(path)
    doc = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "clock": "unix_ns",
        **header,
        "ranks": sorted(ranks, key=lambda d: int(d["rank"])),
    }
    tmp = p.with_name(p.name + ".tmp")
    # Write then rename, so a reader never sees half a file.
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    tmp.replace(p)
    return p
