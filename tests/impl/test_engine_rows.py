"""The decode round's commit kernel: what it writes, and that an output outside the arrays is
refused before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

from kvsched.impl.engine_rows import ADMITTED, COMPUTED, EOS, FIELDS, FILLED, LENGTH, LIMIT, TOKEN, commit_round

ROWS, WIDTH, PAGE = 3, 8, 2


def arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    fields = np.zeros((ROWS, FIELDS), dtype=np.int64)
    fields[:, LENGTH] = (2, 3, 4)
    fields[:, LIMIT] = (8, 4, 8)
    fields[:, EOS] = (-1, -1, 9)
    fields[:, ADMITTED] = (5, 3, 4)
    tokens = np.zeros((ROWS, WIDTH), dtype=TOKEN)
    tables = np.arange(ROWS * WIDTH // PAGE, dtype=np.uint32).reshape(ROWS, WIDTH // PAGE) + 100
    return fields, tokens, tables, np.zeros((ROWS, FILLED), dtype=np.int64), np.zeros(ROWS, dtype=np.intp)


def test_a_round_appends_notes_filled_pages_and_finished_requests() -> None:
    fields, tokens, tables, filled, done = arrays()
    slots, sampled = np.array([0, 1, 2], dtype=np.uint32), np.array([7, 8, 9], dtype=np.uint32)
    at, filled_count, done_count = commit_round(slots, sampled, fields, tokens, tables, PAGE, filled, done)
    assert (at, filled_count, done_count) == (-1, 2, 2)
    assert tokens[0, 2] == 7 and tokens[1, 3] == 8 and tokens[2, 4] == 9
    assert fields[:, LENGTH].tolist() == [3, 4, 5] and fields[:, COMPUTED].tolist() == [2, 3, 4]
    assert filled[:2].tolist() == [[5, 0, 0, 100], [4, 2, 1, 109]]  # slots 0 and 2 filled a page
    assert done[:2].tolist() == [1, 2]  # slot 1 reached its limit, slot 2 sampled its EOS


@pytest.mark.parametrize(
    ("slots", "lengths", "refused_at"),
    [
        ((0, 3), (2, 3, 4), 1),  # a slot past the rows
        ((1, 0), (2, 3, 4), 1),  # not ascending
        ((0, 0), (2, 3, 4), 1),  # twice
        ((0, 2), (2, 3, WIDTH), 1),  # a full row: its token would land past the last column
        ((0,), (-1, 3, 4), 0),  # a negative length
    ],
)
def test_an_output_outside_the_arrays_writes_nothing(
    slots: tuple[int, ...], lengths: tuple[int, ...], refused_at: int
) -> None:
    fields, tokens, tables, filled, done = arrays()
    fields[:, LENGTH] = lengths
    before = fields.copy(), tokens.copy()
    sampled = np.arange(len(slots), dtype=np.uint32)
    at, _, _ = commit_round(np.array(slots, dtype=np.int64), sampled, fields, tokens, tables, PAGE, filled, done)
    assert at == refused_at
    assert np.array_equal(fields, before[0]) and np.array_equal(tokens, before[1])


def test_buffers_too_small_or_a_bad_page_size_write_nothing() -> None:
    fields, tokens, tables, filled, done = arrays()
    slots, sampled = np.array([0, 1], dtype=np.int64), np.array([1, 2], dtype=np.uint32)
    for page_size, filled_buffer in ((0, filled), (PAGE, filled[:1]), (PAGE, np.zeros((ROWS, 3), dtype=np.int64))):
        at, _, _ = commit_round(slots, sampled, fields, tokens, tables, page_size, filled_buffer, done)
        assert at == 0
    assert fields[:, LENGTH].tolist() == [2, 3, 4]
