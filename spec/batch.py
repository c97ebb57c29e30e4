"""The ragged decode batch ABI: flat records one backend call consumes per round.

The scheduler lowers every decoding request, in slot order, into one `RaggedBatchItem` and one
copy of its whole logical page table; the tables are concatenated and each item carries the
offset of its own. A backend answers one `RaggedBatchOutput` per item, in the same order.

    items:        [ item0 | item1 | item2 ]           (32 bytes each)
    block_tables: [ t0 t0 t0 t0 | t1 t1 t1 t1 | ... ] (u32, INVALID_BLOCK for unmapped entries)
                    ^ item0.block_table_offset = 0
                                  ^ item1.block_table_offset = logical_pages

The byte layout (little-endian, no padding) is the ABI a GPU upload takes as-is;
`INVALID_BLOCK` appears only at this boundary: inside the spec an unmapped entry is `None`.
"""

from __future__ import annotations

import struct
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

INVALID_BLOCK = 2**32 - 1
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

_ITEM_FORMAT = struct.Struct("<QIIIIII")
_OUTPUT_FORMAT = struct.Struct("<QII")


@dataclass(frozen=True, slots=True)
class RaggedBatchItem:
    """One decoding request in a round: the token to consume and where its KV lives."""

    request_id: int = 0
    slot: int = 0
    token_id: int = 0
    position: int = 0
    block_table_offset: int = 0
    logical_pages: int = 0
    reserved: int = 0

    SIZE: ClassVar[int] = _ITEM_FORMAT.size

    def to_bytes(self) -> bytes:
        """The record's 32 ABI bytes."""
        return _ITEM_FORMAT.pack(
            self.request_id,
            self.slot,
            self.token_id,
            self.position,
            self.block_table_offset,
            self.logical_pages,
            self.reserved,
        )


@dataclass(frozen=True, slots=True)
class RaggedBatchOutput:
    """A backend's answer for one item: who it is for and the next token."""

    request_id: int = 0
    slot: int = 0
    next_token_id: int = 0

    SIZE: ClassVar[int] = _OUTPUT_FORMAT.size

    def to_bytes(self) -> bytes:
        """The record's 16 ABI bytes."""
        return _OUTPUT_FORMAT.pack(self.request_id, self.slot, self.next_token_id)


UNANSWERED = RaggedBatchOutput(request_id=0, slot=U32_MAX, next_token_id=0)
"""What every output position holds when the backend is called: slot 2**32 - 1, which no
scheduler has (slots are below 2**16), so an output the backend never writes fails the identity
check whatever request and slot it stands for (a zeroed record would pass for request 0 in slot 0)."""


@dataclass(frozen=True, slots=True)
class RaggedBatchReceipt:
    """What a backend reports about the round it ran (not part of the byte ABI)."""

    batch_size: int = 0
    backend_launches: int = 0
    device_to_host_bytes: int = 0


class RaggedDecodeBackend(Protocol):
    """One continuous-batching decode round behind one call.

    `items` and `block_tables` are the caller's storage, read-only; `out` has exactly
    `len(items)` entries and the backend writes one output per item, in item order.
    A backend must not keep a reference to any argument after it returns; it reports
    failure by raising (the scheduler wraps the exception, never swallows it).
    """

    def execute_ragged(
        self,
        items: Sequence[RaggedBatchItem],
        block_tables: Sequence[int],
        out: MutableSequence[RaggedBatchOutput],
    ) -> RaggedBatchReceipt:
        """Run one decode round over every decoding request.

        Each item is one request: its `request_id` and scheduler `slot`, the `token_id` it
        consumes at `position` (its KV is written there), and where its page table lies in
        `block_tables`: `logical_pages` page ids from `block_table_offset` on, in logical order.
        `block_tables` is the items' page tables concatenated. The engine has made every page an
        item writes exclusively its own before the call (copy-on-write done, `copy_pages`).

        Write one `RaggedBatchOutput(request_id, slot, next_token)` per item into `out`, in item
        order (the engine checks every identity before it changes anything), and return a
        `RaggedBatchReceipt(batch_size, backend_launches, bytes)`: `batch_size == len(items)`
        and exactly one launch. Raise to report a failure; the engine is then left exactly as
        before the step. In impl the arguments are numpy structured arrays of the ABI dtypes
        (`kvsched.abi`); in the spec, lists of the records.
        """
        ...
