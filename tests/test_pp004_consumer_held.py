"""PP004 and a consumer held in its own send call (docs/rules.md, PP004).

A gloo send completes once its receive is posted, and the producer issues its next send after
it. A consumer held inside its own send call (a transport that takes the post only late) posts no
receive meanwhile: the producer's next send waits for that call, and PP004 counted the wait as
data held on its way over the link, naming the held rank's neighbour. Such waits do not time
the link; a link that is slow of its own is still named.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from handbuilt_blocks import blocks_us
from test_causes_cpu_posting import NAMES, Row, _tl

from ppdiag.attribution.causes import Attribution, attribute, rank_step
from ppdiag.model import Direction, Kind, Phase
from ppdiag.pipeline.clocks import p2p_ops
from ppdiag.rules.pp004_comm_wait import _rule_links, _slow_senders

US = 1000
MS = 1_000_000
F, B = int(Phase.FWD), int(Phase.BWD)
SEND, RECV = int(Direction.SEND), int(Direction.RECV)
C, P = Kind.COMPUTE, Kind.P2P
assert NAMES[1:5] == ["c10d::send", "c10d::recv_", "gloo:send", "gloo:recv"]


def _two_stages(held_call: bool) -> list[tuple[int, int, int, int, bool]]:
    """Two stages, M = 2, F = B = 1000 µs, gloo, µs on one clock; the replay's waits as
    (producer, consumer, transfer µs, held µs, consumer held).

    Stage 0 runs F0 (0-1000) and sends it (call 1000-1050, span 1040), runs F1 (1050-2050) and
    waits for its first send to complete (its span's tail) until stage 1 posts the receive of
    F1's activation at 5110: it issues that send at 5100-5150 (span 5140), 3050 µs after F1
    ended with nothing of its own running. Stage 1 runs F0 and B0 and sends B0's gradient: with
    ``held_call`` the call is held 3150-5100 (1950 µs, its span opens at 5090; one of its two
    send calls: a rank that holds its sends in the call), else it returns at 3200 (span 3190)
    and stage 1 waits for it (span tail) to 5100 as well."""
    r0: list[Row] = [
        (0, 1000, C, 5, -1, 0),
        (1000, 1050, P, 1, 1, SEND),
        (1050, 2050, C, 5, -1, 0),
        (2050, 5100, P, 3, 1, SEND),
        (5100, 5150, P, 1, 1, SEND),
        (5150, 5200, P, 2, 1, RECV),
        (5200, 5210, P, 4, 1, RECV),
        (5210, 6210, C, 5, -1, 0),
        (6210, 6260, P, 2, 1, RECV),
        (6260, 7450, P, 4, 1, RECV),
        (7450, 8450, C, 5, -1, 0),
        (8450, 8550, Kind.COLLECTIVE, 0, -1, 0),
    ]
    r0_spans: list[Row] = [
        (1040, 5100, P, 3, 1, SEND),
        (5140, 5300, P, 3, 1, SEND),
        (5160, 5210, P, 4, 1, RECV),
        (6220, 7450, P, 4, 1, RECV),
    ]
    held: list[Row] = [(3150, 5100, P, 1, 0, SEND)]
    send0 = held if held_call else [(3150, 3200, P, 1, 0, SEND), (3200, 5100, P, 3, 0, SEND)]
    r1: list[Row] = [
        (0, 50, P, 2, 0, RECV),
        (50, 1150, P, 4, 0, RECV),
        (1150, 2150, C, 5, -1, 0),
        (2150, 3150, C, 5, -1, 0),
        *send0,
        (5110, 5160, P, 2, 0, RECV),
        (5160, 5300, P, 4, 0, RECV),
        (5300, 6300, C, 5, -1, 0),
        (6300, 7300, C, 5, -1, 0),
        (7300, 7350, P, 1, 0, SEND),
        (7350, 8550, Kind.COLLECTIVE, 0, -1, 0),
    ]
    r1_spans: list[Row] = [
        (10, 1150, P, 4, 0, RECV),
        (5090 if held_call else 3190, 5200, P, 3, 0, SEND),
        (5120, 5300, P, 4, 0, RECV),
        (7340, 7450, P, 3, 0, SEND),
    ]
    tls = {0: _tl(0, r0, r0_spans), 1: _tl(1, r1, r1_spans)}
    blocks = {
        0: [(0, 1000, F, 0, 0), (1050, 2050, F, 1, 0), (5210, 6210, B, 0, 0), (7450, 8450, B, 1, 0)],
        1: [(1150, 2150, F, 0, 1), (2150, 3150, B, 0, 1), (5300, 6300, F, 1, 1), (6300, 7300, B, 1, 1)],
    }
    steps = [rank_step(tls[r], 0, 0, 0, 8550 * US, blocks_us(blocks[r])) for r in (0, 1)]
    att = attribute(steps, tls, {r: p2p_ops(tl) for r, tl in tls.items()}, 1, True)
    rows = zip(att.edges.tolist(), att.edge_held.tolist(), att.edge_consumer_held.tolist(), strict=True)
    return sorted((p, c, t // US, h // US, bool(o)) for (p, c, t, _), h, o in rows)


def test_the_replay_flags_a_wait_whose_consumer_was_held_in_its_own_call() -> None:
    # (producer, consumer, transfer µs, held µs, consumer held): F0's activation 1150 - 1040 =
    # 110; F1's issued 5100 - 2050 = 3050 after its block (held), received 5300 - 5160 = 140
    # after stage 1 posted; the gradients 5210 - 5200 = 10 and 7450 - 7340 = 110. Stage 1 spent
    # 1950 µs (> 1 ms) of F1's 2050-5300 in its own held call: that wait is flagged, and only it
    held_call = _two_stages(held_call=True)
    assert held_call == [
        (0, 1, 110, 0, False),
        (0, 1, 140, 3050, True),
        (1, 0, 10, 0, False),
        (1, 0, 110, 0, False),
    ]
    # the same run whose send call returns at once (held on its way, not in the call): the
    # same waits and holds, none flagged (the producer's wait is not the consumer's own call)
    assert _two_stages(held_call=False) == [(p, c, t, h, False) for p, c, t, h, _ in held_call]


def _links(waits: list[tuple[int, int, int, int, bool]]) -> Any:
    """A rule context with just the attribution's edges of ``waits`` = (producer, consumer,
    transfer ns, held ns, consumer held), as PP004's link timing reads them."""
    w = np.array([(p, c, t, t) for p, c, t, _, _ in waits], np.int64)
    held = np.array([h for *_, h, _ in waits], np.int64)
    own = np.array([o for *_, o in waits], np.bool_)
    whole = np.zeros(len(waits), np.bool_)
    att = Attribution({}, {}, 0, {}, edges=w, edge_held=held, edge_whole=whole, edge_consumer_held=own)
    return SimpleNamespace(attribution=att)


def _run(held_rank_in_call: bool, slow_link: bool) -> list[tuple[int, int, int, int, bool]]:
    """A 4-stage run's waits, 3 steps of 8 micro-batches per link and direction; every transfer
    takes 100 µs plus a 0-35 µs jitter. ``held_rank_in_call``: rank 1 holds its sends 20 ms in
    the call (its own links are timed from the span's open: on time), and rank 0's activations
    to it wait for that call after the first of each step (20 ms held, the consumer held);
    ``slow_link``: rank 2's sends to rank 3 are held 10 ms on their way (20 of 24 held)."""
    jit = [(7 * i) % 36 for i in range(24)]
    out: list[tuple[int, int, int, int, bool]] = []
    for p, c in ((0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)):
        for i, j in enumerate(jit):
            late = i % 8 != 0
            held = 20 * MS if held_rank_in_call and (p, c) == (0, 1) and late else 0
            held = 10 * MS if slow_link and (p, c) == (2, 3) and i % 6 != 0 else held
            out.append((p, c, (100 + j) * US, held, held == 20 * MS))
    return out


def test_a_wait_for_the_consumers_own_held_call_names_no_neighbour() -> None:
    run = _run(held_rank_in_call=True, slow_link=False)
    # timed from rank 0's block end, 0->1 is 20.1 ms late in 21 of its 24 transfers: its lateness
    # (the mean of all but the latest fifth: 3 on time, 17 held) is 17.1 ms beyond the others'
    # (0.1 ms): taken as the link's, PP004 named rank 0, the held rank's neighbour
    blind = _links([(p, c, t, h, False) for p, c, t, h, _ in run])
    slow = _rule_links(blind).slow()
    assert list(slow) == [(0, 1)] and slow[(0, 1)] > 16.9 * MS
    assert _slow_senders(slow) == [0]
    # those waits are the consumer's own call's: no link is slow
    assert _rule_links(_links(run)).slow() == {}


def test_a_slow_link_is_still_named_beside_a_held_call() -> None:
    # rank 2's sends to rank 3 held 10 ms on their way (20 of 24 transfers 10.1 ms late; of the
    # 20 kept, 4 on time and 16 held: 8 ms beyond the others'): the link is slow and rank 2
    # named, with rank 1's held call's waits left out as above
    for held_rank_in_call in (False, True):
        slow = _rule_links(_links(_run(held_rank_in_call, slow_link=True))).slow()
        assert list(slow) == [(2, 3)] and slow[(2, 3)] > 7.9 * MS
        assert _slow_senders(slow) == [2]
