"""The engine's rows: each running request's fields and tokens in its scheduler slot's row, and
the kernel that commits a decode round to them.

    tokens  <u4[requests, width]      prompt + generated (little-endian, so a row's bytes are
                                      the page hash's input as they are)
    fields  int64[requests, FIELDS]   LENGTH, LIMIT (prompt + max_new_tokens), EOS (-1: none),
                                      COMPUTED, DECODING, ADMITTED, STATE_SLOT (-1: none)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.impl.jit import jit

LENGTH, LIMIT, EOS, COMPUTED, DECODING, ADMITTED, STATE_SLOT = range(7)
FIELDS = 7
NO_TOKEN = -1
TOKEN = np.dtype("<u4")


FILLED = 4  # a filled page's row: ADMITTED of its request, its slot, its depth, its page


@jit
def commit_round(
    slots: Any, sampled: Any, fields: Any, tokens: Any, tables: Any, page_size: int, filled: Any, done: Any
) -> tuple[int, int, int]:
    """Append `sampled[i]` to the row of `slots[i]` for every output of a decode round: LENGTH
    grows by one and COMPUTED becomes the old LENGTH. Writes a row (ADMITTED, slot, depth, page)
    into `filled` for each request whose round filled a page (COMPUTED a multiple of
    `page_size`; `tables` maps it), and the outputs whose request finished (its EOS sampled, or
    its LIMIT reached) into `done`: (-1, filled, done). Checks every output first, and writes
    nothing when one fails: (i, 0, 0) for the first whose slot is outside the arrays, not above
    the one before (a round's slots ascend), or whose row is full."""
    rows, width = tokens.shape
    count = slots.shape[0]
    if page_size <= 0 or fields.shape[0] != rows or tables.shape[0] != rows:
        return 0 if count else -1, 0, 0
    if filled.shape[0] < count or filled.shape[1] != FILLED or done.shape[0] < count:
        return 0 if count else -1, 0, 0
    for index in range(count):
        slot = slots[index]
        if slot < 0 or slot >= rows or (index > 0 and slot <= slots[index - 1]):
            return index, 0, 0
        length = fields[slot, LENGTH]
        if length < 0 or length >= width or length // page_size > tables.shape[1]:
            return index, 0, 0
    filled_count = 0
    done_count = 0
    for index in range(count):
        slot = slots[index]
        token = sampled[index]
        length = fields[slot, LENGTH]
        tokens[slot, length] = token
        fields[slot, LENGTH] = length + 1
        fields[slot, COMPUTED] = length
        if length % page_size == 0 and length > 0:
            depth = length // page_size - 1
            filled[filled_count, 0] = fields[slot, ADMITTED]
            filled[filled_count, 1] = slot
            filled[filled_count, 2] = depth
            filled[filled_count, 3] = tables[slot, depth]
            filled_count += 1
        if token == fields[slot, EOS] or length + 1 >= fields[slot, LIMIT]:
            done[done_count] = index
            done_count += 1
    return -1, filled_count, done_count
