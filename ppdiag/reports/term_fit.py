"""Tables that fit the terminal with whole header words.

rich folds a header mid-word when a table is narrower than its headers ("unexplaine" / "d"), and a
column's ``min_width`` does not help: rich narrows the widest columns past it and then widens them
back, so the table ends wider than the console and is cut. Here the column widths are chosen before
rich lays the table out:

- no column narrower than its longest header word or its longest cell word (a number never folds;
  a cell word counts up to :data:`CELL_WORD_CAP` characters, so a long list of ranks may fold);
- when the table is too wide, the widest columns give up width first, down to that floor;
- when even the floors do not fit, the table is split into parts, each repeating the key columns
  (rank, stage, scenario) so that every row can still be read across parts.
"""

from __future__ import annotations

import copy

from rich.cells import cell_len
from rich.table import Column, Table

#: A cell word longer than this may fold (a stage's list of 64 ranks), rather than widen its column.
CELL_WORD_CAP = 16


def _words(value: object) -> list[str]:
    return str(value).split()


def _floor(col: Column) -> int:
    """The narrowest the column may be: its longest header word, its longest cell word (capped)."""
    head = max((cell_len(w) for w in _words(col.header)), default=1)
    cells = max((cell_len(w) for c in col.cells for w in _words(c)), default=0)
    return max(head, min(cells, CELL_WORD_CAP), 1)


def _natural(col: Column) -> int:
    """The width the column takes when nothing constrains it: its widest line of header or cell."""
    texts = [str(col.header), *(str(c) for c in col.cells)]
    return max((cell_len(line) for x in texts for line in x.splitlines()), default=1)


def _span(t: Table, widths: list[int]) -> int:
    """The table's width on screen for these column content widths (padding, rules and edges)."""
    _, right, _, left = t.padding
    rules = (len(widths) - 1 if t.box else 0) + (2 if t.box and t.show_edge else 0)
    return sum(widths) + (left + right) * len(widths) + rules


def _shrink(t: Table, width: int) -> Table:
    """Fix the column widths of ``t`` (whose floors fit ``width``): the widest columns narrow first."""
    widths = [_natural(c) for c in t.columns]
    if _span(t, widths) <= width:
        return t  # rich lays it out unconstrained: nothing folds
    floors = [_floor(c) for c in t.columns]
    excess = _span(t, widths) - width
    while excess > 0:
        i = max(
            (j for j in range(len(widths)) if widths[j] > floors[j]), key=lambda j: widths[j], default=None
        )
        if i is None:
            break
        widths[i] -= 1
        excess -= 1
    for c, w in zip(t.columns, widths, strict=True):
        c.width, c.min_width = w, None
    return t


def _part(t: Table, cols: list[int], first: bool, last: bool) -> Table:
    """A table of the columns ``cols`` of ``t``, with its rows; the title marks a continuation."""
    p = copy.copy(t)
    p.columns = []
    for i in cols:
        c = copy.copy(t.columns[i])
        c._cells = list(t.columns[i].cells)
        c._index = len(p.columns)
        p.columns.append(c)
    p.rows = list(t.rows)
    if not first and t.title:
        p.title = f"{t.title} (continued)"
    if not last:
        p.caption = None
    return p


def _groups(t: Table, floors: list[int], width: int, keys: int) -> list[list[int]]:
    """Column indices of each part: the ``keys`` first columns, then as many others as fit."""
    key_cols = list(range(keys)) if _span(t, [*floors[:keys], max(floors)]) <= width else []
    groups: list[list[int]] = []
    cur = list(key_cols)
    for i in range(len(key_cols), len(floors)):
        if len(cur) > len(key_cols) and _span(t, [floors[j] for j in [*cur, i]]) > width:
            groups.append(cur)
            cur = list(key_cols)
        cur.append(i)
    groups.append(cur)
    return groups


def fit_table(t: Table, width: int, keys: int = 1) -> list[Table]:
    """``t`` laid out for ``width`` columns with every header word whole: the table itself with
    chosen column widths, or parts of it that each repeat the first ``keys`` columns."""
    floors = [_floor(c) for c in t.columns]
    if not t.columns or _span(t, floors) <= width:
        return [_shrink(t, width)]
    groups = _groups(t, floors, width, keys)
    n = len(groups)
    return [_shrink(_part(t, g, i == 0, i == n - 1), width) for i, g in enumerate(groups)]


__all__ = ["CELL_WORD_CAP", "fit_table"]
