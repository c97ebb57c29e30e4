"""The null model for both batch forms: the spec's `NullModel` (`kvsched.spec.model`), vectorized.

Its next token is `null_next_token(token, position)`, computed for a whole round by one kernel
over impl's structured arrays, or in numpy over other item forms (the spec's record lists); prefill
and copies are as the spec's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.abi import ITEM_DTYPE, OUTPUT_DTYPE, item_columns, write_outputs
from kvsched.impl.jit import jit
from kvsched.spec.batch import RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.model import NullModel as SpecNullModel


@jit
def null_round(items: Any, out: Any, vocab: int) -> int:
    """Answer every item of `items` in `out` (request, slot, `null_next_token`): how many, or -1
    (nothing written) when `out` is shorter than `items`."""
    count: int = items.shape[0]
    if out.shape[0] < count:
        return -1
    for index in range(count):
        item = items[index]
        answer = out[index]
        answer["request_id"] = item["request_id"]
        answer["slot"] = item["slot"]
        answer["next_token_id"] = (np.int64(item["token_id"]) * 31 + np.int64(item["position"]) * 7 + 1) % vocab
    return count


class NullModel(SpecNullModel):
    """`kvsched.spec.model.NullModel`, serving impl's arrays as well as the spec's records."""

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
        if _arrays(items, out) and 0 < self.vocab <= 2**32:  # impl's arrays: one kernel call, in place
            count = null_round(items, out, self.vocab)
            if count < 0:
                raise ValueError(f"{out.shape[0]} outputs cannot answer {items.shape[0]} items")
            self.tokens += count
            return RaggedBatchReceipt(count, 1, count * RaggedBatchOutput.SIZE)
        columns = item_columns(items)
        tokens = columns["token_id"].astype(np.int64)
        positions = columns["position"].astype(np.int64)
        next_tokens = (tokens * 31 + positions * 7 + 1) % self.vocab  # null_next_token, vectorized
        write_outputs(
            out,
            columns["request_id"].astype(np.uint64),
            columns["slot"].astype(np.uint32),
            next_tokens.astype(np.uint32),
        )
        count = int(tokens.shape[0])
        self.tokens += count
        return RaggedBatchReceipt(count, 1, count * RaggedBatchOutput.SIZE)


def _arrays(items: Any, out: Any) -> bool:
    """Both are impl's 1-D structured arrays (items, outputs)."""
    return (
        isinstance(items, np.ndarray)
        and isinstance(out, np.ndarray)
        and items.dtype == ITEM_DTYPE
        and out.dtype == OUTPUT_DTYPE
        and items.ndim == out.ndim == 1
    )
