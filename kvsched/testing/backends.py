"""The harness's decode backend: a well-behaved one that writes ghost KV, or one that breaks the
round's contract in a chosen way (`kvsched.spec.events.Fault`).

One class serves both batch forms (the spec's record lists and impl's structured arrays). The
harness checks that every fault is refused and changes nothing.

Where the model does not matter, tests use the null model (`kvsched.impl.NullModel`). A check
that needs its own next-token rule keeps it, for one reason each:
- this backend, `compute_next_token(token, position)`: its tokens are part of the explored
  system states (another rule would change the explorer's state space and golden programs);
- the engine harness's model, `history_token(history)` (`engine_model`): the token is derived
  from the KV the model reads, so a wrong read changes what the request streams;
- safety mode, `next_token(tokens)` (`safety`): a function of the whole sequence with a small
  vocabulary, so prompts and pages repeat; the programs it prints are pinned (the README's,
  nano-vllm #163's);
- the originals' `token + 1` (`tests/helpers.py`): the seed tests reproduce their values exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.abi import item_columns, table_array, write_outputs
from kvsched.spec.batch import INVALID_BLOCK, RaggedBatchReceipt
from kvsched.spec.errors import BackendRejected
from kvsched.spec.events import DecodeOverlapping, DecodeRound, Event, Fault
from kvsched.testing.ghost import GhostMemory

FAULTS = tuple(Fault)
Batch = tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]
COLUMNS = ("request_id", "slot", "token_id", "position", "block_table_offset", "logical_pages", "reserved")


def compute_next_token(token: int, position: int) -> int:
    """The harness model's greedy next token: deterministic and small."""
    return (token * 7 + position + 1) % 50


class HarnessBackend:
    """Answers every item with `compute_next_token`, writing its KV into the ghost first.

    `fault` breaks the contract: a corrupted output is the one at `position`, modulo the batch
    (by default the first for a corrupted identity, the last for a wrong slot, so a bad later
    output meets earlier matching ones);
    with a `page_size`, an item whose position has no page in its table is refused, as a real
    backend must refuse to write nowhere."""

    def __init__(
        self,
        fault: Fault = Fault.NONE,
        page_size: int | None = None,
        ghost: GhostMemory | None = None,
        position: int | None = None,
    ) -> None:
        self.fault = Fault(fault)
        self.page_size = page_size
        self.ghost = ghost
        self.position = position
        self.calls = 0
        self.seen: Batch | None = None

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> Any:
        self.calls += 1
        columns = item_columns(items)
        tables = table_array(block_tables)
        rows = tuple(zip(*(columns[name].tolist() for name in COLUMNS), strict=True))
        self.seen = (tuple(tuple(int(v) for v in row) for row in rows), tuple(int(v) for v in tables))
        if self.fault is Fault.RAISE:
            raise RuntimeError("injected backend fault")
        if self.fault is Fault.REJECT:
            raise BackendRejected("bucket too small")
        count = len(rows)
        tokens = np.array(self.answer(rows, tables), dtype=np.uint32)
        request_ids = columns["request_id"].astype(np.uint64)
        slots = columns["slot"].astype(np.uint32)
        if self.fault is Fault.CORRUPT_IDENTITY:
            request_ids[self._at(0, count)] ^= np.uint64(1)
        if self.fault is Fault.WRONG_SLOT:
            slots[self._at(-1, count)] += np.uint32(1)
        written = {Fault.NO_WRITE: 0, Fault.PARTIAL: count // 2}.get(self.fault, count)
        write_outputs(out, request_ids[:written], slots[:written], tokens[:written])
        if self.fault is Fault.BAD_RECEIPT:
            return None
        batch = count + 1 if self.fault is Fault.WRONG_BATCH else count
        launches = {Fault.TWO_LAUNCHES: 2, Fault.ZERO_LAUNCHES: 0}.get(self.fault, 1)
        return RaggedBatchReceipt(batch, launches, count * 16)

    def answer(self, rows: tuple[tuple[int, ...], ...], tables: Any) -> list[int]:
        """Write every item's KV and compute its next token (what a subclass's model changes)."""
        if self.page_size is not None:
            self._write_kv(rows, tables, self.page_size)
        return [compute_next_token(row[2], row[3]) for row in rows]

    def _at(self, default: int, count: int) -> int:
        return (default if self.position is None else self.position) % count

    def _write_kv(self, rows: tuple[tuple[int, ...], ...], tables: Any, page_size: int) -> None:
        """Write each item's KV at its position; a position without a page is refused."""
        for request_id, slot, token, position, offset, width, _ in rows:
            logical = position // page_size
            page = int(tables[offset + logical]) if logical < width else INVALID_BLOCK
            if page == INVALID_BLOCK:
                raise BackendRejected(f"request {request_id} slot {slot}: position {position} has no page")
            if self.ghost is None:
                continue
            history = self.ghost.histories.get(request_id, ())[:position]
            self.ghost.write(page, position, history + (token,))


def backend_for(event: Event, page_size: int | None, ghost: GhostMemory | None = None) -> HarnessBackend | None:
    """The backend the round an event runs calls, with the event's fault (None: no round)."""
    if isinstance(event, DecodeRound):
        return HarnessBackend(event.fault, page_size, ghost)
    if isinstance(event, DecodeOverlapping):
        return HarnessBackend(Fault.NONE, page_size, ghost)
    return None
