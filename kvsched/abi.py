"""The ragged batch ABI as numpy structured dtypes, byte-identical to the spec's records.

`ITEM_DTYPE` is 32 bytes and `OUTPUT_DTYPE` 16 bytes, little-endian and unpadded, so a batch
lowered into these arrays can be uploaded to a GPU as it stands. A backend may be handed either
form: the spec's lists of records or impl's structured arrays; `item_columns` and
`write_outputs` let one backend serve both.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kvsched.spec.batch import RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt

ITEM_DTYPE = np.dtype(
    [
        ("request_id", "<u8"),
        ("slot", "<u4"),
        ("token_id", "<u4"),
        ("position", "<u4"),
        ("block_table_offset", "<u4"),
        ("logical_pages", "<u4"),
        ("reserved", "<u4"),
    ]
)
OUTPUT_DTYPE = np.dtype([("request_id", "<u8"), ("slot", "<u4"), ("next_token_id", "<u4")])

assert ITEM_DTYPE.itemsize == RaggedBatchItem.SIZE == 32
assert OUTPUT_DTYPE.itemsize == RaggedBatchOutput.SIZE == 16

ItemArray = npt.NDArray[np.void]
OutputArray = npt.NDArray[np.void]
TableArray = npt.NDArray[np.uint32]

ItemsLike = Sequence[RaggedBatchItem] | ItemArray
OutputsLike = MutableSequence[RaggedBatchOutput] | OutputArray


class ArrayDecodeBackend(Protocol):
    """The impl scheduler's backend boundary: the same contract as the spec's
    `RaggedDecodeBackend`, with `items`, `block_tables` and `out` as views of the
    scheduler's structured arrays (`ITEM_DTYPE`, uint32, `OUTPUT_DTYPE`), exactly
    `len(items)` outputs long."""

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt: ...


def empty_items(capacity: int) -> ItemArray:
    """A zeroed item scratch buffer."""
    return np.zeros(capacity, dtype=ITEM_DTYPE)


def empty_outputs(capacity: int) -> OutputArray:
    """A zeroed output scratch buffer."""
    return np.zeros(capacity, dtype=OUTPUT_DTYPE)


def item_columns(items: ItemsLike) -> dict[str, npt.NDArray[np.uint64] | npt.NDArray[np.uint32]]:
    """Every item field as its own array, from either batch form."""
    if isinstance(items, np.ndarray):
        return {name: np.ascontiguousarray(items[name]) for name in ITEM_DTYPE.names or ()}
    columns: dict[str, npt.NDArray[np.uint64] | npt.NDArray[np.uint32]] = {}
    for name in ITEM_DTYPE.names or ():
        values = (getattr(item, name) for item in items)
        if name == "request_id":
            columns[name] = np.fromiter(values, dtype=np.uint64, count=len(items))
        else:
            columns[name] = np.fromiter(values, dtype=np.uint32, count=len(items))
    return columns


def table_array(block_tables: Sequence[int] | TableArray) -> TableArray:
    """The concatenated block tables as a contiguous uint32 array, from either batch form."""
    if isinstance(block_tables, np.ndarray):
        return np.ascontiguousarray(block_tables, dtype=np.uint32)
    return np.fromiter(block_tables, dtype=np.uint32, count=len(block_tables))


def write_outputs(
    out: OutputsLike,
    request_ids: Sequence[int] | npt.NDArray[np.uint64],
    slots: Sequence[int] | npt.NDArray[np.uint32],
    next_tokens: Sequence[int] | npt.NDArray[np.uint32],
) -> None:
    """Write one output per item into either output form, in item order."""
    count = len(request_ids)
    if isinstance(out, np.ndarray):
        out["request_id"][:count] = request_ids
        out["slot"][:count] = slots
        out["next_token_id"][:count] = next_tokens
        return
    for index in range(count):
        out[index] = RaggedBatchOutput(int(request_ids[index]), int(slots[index]), int(next_tokens[index]))
