"""The pipeline schedule names every command accepts, and their aliases, in one place.

``analyze``/``check`` (``--schedule`` overrides the detected schedule), ``whatif`` (schedules to
predict), ``whatif bubble``/``batch`` and ``demo`` all resolve a name through
:func:`parse_schedule`, so a name one command takes is a name every command takes. What a
command can *do* with a schedule may still differ: the simulator has no model of looped BFS and
predicts it as interleaved 1F1B, saying so (:data:`SIMULATED_AS`).
"""

from __future__ import annotations

from ppdiag.compat import StrEnum
from ppdiag.errors import InputError


class Schedule(StrEnum):
    """A pipeline schedule (the value is the name shown in reports and the JSON, ``run.schedule``).

    The last two members name no schedule, only what the analysis found: ``unknown`` (blocks that
    fit no schedule) and ``none`` (no pipeline parallelism). No command accepts them as input
    (:data:`SCHEDULES`)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"
    LOOPED_BFS = "looped_bfs"
    ZERO_BUBBLE = "zero_bubble"
    ZBV = "zbv"
    DUALPIPEV = "dualpipev"
    UNKNOWN = "unknown"
    NONE = "none"


#: The schedules a command accepts (every member but ``unknown`` and ``none``).
SCHEDULES: tuple[Schedule, ...] = tuple(s for s in Schedule if s not in (Schedule.UNKNOWN, Schedule.NONE))
#: Every accepted schedule name, in the order help texts list them.
SCHEDULE_NAMES: tuple[str, ...] = tuple(s.value for s in SCHEDULES)

# Other spellings (torch.distributed.pipelining class names, papers, Megatron), compared after
# lower-casing and dropping "-", "_" and spaces.
_ALIASES: dict[str, Schedule] = {
    "interleaved": Schedule.INTERLEAVED_1F1B,
    "scheduleinterleaved1f1b": Schedule.INTERLEAVED_1F1B,
    "schedule1f1b": Schedule.ONE_F_ONE_B,
    "schedulegpipe": Schedule.GPIPE,
    "looped": Schedule.LOOPED_BFS,
    "scheduleloopedbfs": Schedule.LOOPED_BFS,
    "zb": Schedule.ZERO_BUBBLE,
    "zbh1": Schedule.ZERO_BUBBLE,
    "interleavedzerobubble": Schedule.ZERO_BUBBLE,
    "scheduleinterleavedzerobubble": Schedule.ZERO_BUBBLE,
    "zbvzerobubble": Schedule.ZBV,
    "schedulezbvzerobubble": Schedule.ZBV,
    "scheduledualpipev": Schedule.DUALPIPEV,
}
_BY_KEY: dict[str, Schedule] = {s.value.replace("_", ""): s for s in SCHEDULES} | _ALIASES

#: Schedules the simulator has no model of, and the one it predicts them as (same chunks per rank
#: and the same closed-form bubble, another block order).
SIMULATED_AS: dict[Schedule, Schedule] = {Schedule.LOOPED_BFS: Schedule.INTERLEAVED_1F1B}
#: The note a prediction carries when it used :data:`SIMULATED_AS`.
SIMULATED_NOTE: dict[Schedule, str] = {
    Schedule.LOOPED_BFS: "looped BFS is simulated as interleaved 1F1B (same chunks, other order)"
}


def _key(name: str) -> str:
    return "".join(ch for ch in name.strip().lower() if ch not in "-_ ")


def parse_schedule(name: str) -> Schedule:
    """The :class:`Schedule` ``name`` spells (case, ``-``, ``_`` and spaces ignored, aliases
    resolved); ValueError naming the known schedules otherwise."""
    s = _BY_KEY.get(_key(name))
    if s is None:
        raise ValueError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULE_NAMES)}")
    return s


def schedule_option(name: str | None, flag: str = "--schedule") -> Schedule | None:
    """A schedule flag's value resolved (None stays None); InputError naming the flag if unknown."""
    if name is None:
        return None
    try:
        return parse_schedule(name)
    except ValueError as exc:
        raise InputError(None, f"{flag}: {exc}") from None
