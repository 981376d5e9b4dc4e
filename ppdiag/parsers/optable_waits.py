"""Waits that a timeline writer cut out of its communication ops, put back.

Some writers of the Chrome form draw a send, receive or collective as its transfer only: the op
starts when the data started to move, not when the rank called it, so the time the rank waited
for its peers is an unlabelled gap before the op. The table form of the same run keeps the call
time. Cut ops are recognised by their collectives: members of one collective instance (the
gradient clip of a step on every rank, a stage's reduce-scatter across replicas) that arrive at
different times start together only when the waits were cut; where no instance shows members
arriving apart, each communication op is extended back to the end of its rank's previous op in
the step (the earliest the rank could have called it, which is when a sequential rank does),
and the number of ops extended is said in a warning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ppdiag.parsers.optable_ranks import COMM_OPTYPES

if TYPE_CHECKING:
    import pandas as pd

# members whose starts (or ends) lie closer than this arrived (or finished) together
_TOGETHER_NS = 50_000
_MIN_INSTANCES = 4


def waits_cut(df: pd.DataFrame) -> bool:
    """True when the collectives' members all start together although their ends show the ops
    as synchronising (no instance with members arriving apart, at least a few instances)."""
    coll = df[df["optype"].isin(("optimizer-clip-main-grad", "grads-reduce-scatter", "params-all-gather"))]
    if not len(coll):
        return False
    clip = (coll["optype"] == "optimizer-clip-main-grad").to_numpy()
    # an instance: the clip of a step (every rank); a stage's reduce-scatter / all-gather by seq
    key_stage = np.where(clip, -1, coll["stage"].to_numpy())
    keys = [coll["step"].to_numpy(), coll["optype"].to_numpy(), key_stage, coll["seq_id"].to_numpy()]
    t0 = coll["t0"].to_numpy()
    t1 = t0 + coll["dur"].to_numpy()
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    g = pd.DataFrame({"a": t0, "b": t1}).groupby(keys)
    size = g.size().to_numpy()
    start_spread = (g["a"].max() - g["a"].min()).to_numpy()[size > 1]
    end_spread = (g["b"].max() - g["b"].min()).to_numpy()[size > 1]
    if start_spread.size < _MIN_INSTANCES:
        return False
    apart = start_spread > np.maximum(_TOGETHER_NS, 2 * end_spread)
    return not bool(apart.any())


def restore_waits(df: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """``df`` with every communication op that starts after a gap extended back to the end of its
    rank's previous op in the same step (times ``t0`` / ``dur`` in ns)."""
    order = np.lexsort((df["t0"].to_numpy(), df["step"].to_numpy(), df["rank"].to_numpy()))
    t0 = df["t0"].to_numpy()[order]
    end = t0 + df["dur"].to_numpy()[order]
    key = df["rank"].to_numpy()[order] * (1 << 32) + df["step"].to_numpy()[order]
    first = np.r_[True, key[1:] != key[:-1]]
    seg = np.cumsum(first) - 1
    # the latest end of the earlier ops of the same rank and step: a running maximum per segment
    import pandas as pd  # here, not at import: detecting formats must not load pandas

    prev_end = pd.Series(end).groupby(seg).cummax().groupby(seg).shift(1).fillna(0).to_numpy(np.int64)
    comm = df["optype"].isin(COMM_OPTYPES).to_numpy()[order]
    grow = comm & ~first & (prev_end < t0)
    if not grow.any():
        return df
    new_t0 = t0.copy()
    new_t0[grow] = prev_end[grow]
    out = df.copy()
    t0_col = out["t0"].to_numpy().copy()
    dur_col = out["dur"].to_numpy().copy()
    idx = order[grow]
    dur_col[idx] += t0_col[idx] - new_t0[grow]
    t0_col[idx] = new_t0[grow]
    out["t0"], out["dur"] = t0_col, dur_col
    warnings.append(
        f"communication ops drawn as their transfer only (collective members start together): "
        f"{int(grow.sum())} sends / receives / collectives extended back to their rank's previous op "
        "(the wait for the peers)"
    )
    return out
