"""Decode backends for the harness: a well-behaved one that writes ghost KV, and faulty ones.

One class serves both batch forms (the spec's record lists and impl's structured arrays).
`FAULTS` names every way a backend can break the round's contract; the harness checks that each
one is refused and changes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.abi import item_columns, table_array, write_outputs
from kvsched.spec.batch import INVALID_BLOCK, RaggedBatchReceipt
from kvsched.spec.errors import BackendRejected
from kvsched.testing.ghost import GhostMemory

FAULTS = (
    "none",
    "raise",
    "wrong_batch",
    "two_launches",
    "zero_launches",
    "corrupt_identity",
    "wrong_slot",
    "no_write",
    "bad_receipt",
)

Batch = tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]


def compute_next_token(token: int, position: int) -> int:
    """The harness model's greedy next token: deterministic and small."""
    return (token * 7 + position + 1) % 50


class HarnessBackend:
    """Answers every item with `compute_next_token`, writing its KV into the ghost first."""

    def __init__(self, fault: str, page_size: int, ghost: GhostMemory | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault
        self.page_size = page_size
        self.ghost = ghost
        self.calls = 0
        self.seen: Batch | None = None

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> Any:
        self.calls += 1
        columns = item_columns(items)
        tables = table_array(block_tables)
        names = ("request_id", "slot", "token_id", "position", "block_table_offset", "logical_pages", "reserved")
        rows = tuple(zip(*(columns[name].tolist() for name in names), strict=True))
        self.seen = (tuple(tuple(int(v) for v in row) for row in rows), tuple(int(v) for v in tables))
        if self.fault == "raise":
            raise RuntimeError("injected backend fault")
        count = len(rows)
        self._write_kv(rows, tables)
        request_ids = columns["request_id"].astype(np.uint64)
        slots = columns["slot"].astype(np.uint32)
        tokens = np.array(
            [compute_next_token(row[2], row[3]) for row in rows],
            dtype=np.uint32,
        )
        if self.fault == "corrupt_identity":
            request_ids[0] ^= np.uint64(1)
        if self.fault == "wrong_slot":
            slots[-1] += np.uint32(1)
        if self.fault != "no_write":
            write_outputs(out, request_ids, slots, tokens)
        if self.fault == "bad_receipt":
            return None
        batch = count + 1 if self.fault == "wrong_batch" else count
        launches = {"two_launches": 2, "zero_launches": 0}.get(self.fault, 1)
        return RaggedBatchReceipt(batch, launches, count * 16)

    def _write_kv(self, rows: tuple[tuple[int, ...], ...], tables: Any) -> None:
        """Write each item's KV at its position; a position without a page is refused."""
        for request_id, slot, token, position, offset, width, _ in rows:
            logical = position // self.page_size
            page = int(tables[offset + logical]) if logical < width else INVALID_BLOCK
            if page == INVALID_BLOCK:
                raise BackendRejected(f"request {request_id} slot {slot}: position {position} has no page")
            if self.ghost is None:
                continue
            history = self.ghost.histories.get(request_id, ())[:position]
            self.ghost.write(page, position, history + (token,))
