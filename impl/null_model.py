"""The null model for both batch forms: the spec's `NullModel` (`kvsched.spec.model`), vectorized.

Its next token is `null_next_token(token, position)`, computed for a whole round in numpy over
impl's structured arrays or the spec's record lists alike; prefill and copies are as the spec's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvsched.abi import item_columns, write_outputs
from kvsched.spec.batch import RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.model import NullModel as SpecNullModel


class NullModel(SpecNullModel):
    """`kvsched.spec.model.NullModel`, serving impl's arrays as well as the spec's records."""

    def execute_ragged(self, items: Any, block_tables: Any, out: Any) -> RaggedBatchReceipt:
        if isinstance(items, np.ndarray) and isinstance(out, np.ndarray):  # impl's arrays: in place
            count = items.shape[0]
            tokens = items["token_id"].astype(np.int64) * 31 + items["position"].astype(np.int64) * 7 + 1
            out["request_id"][:count] = items["request_id"]
            out["slot"][:count] = items["slot"]
            out["next_token_id"][:count] = tokens % self.vocab
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
        return RaggedBatchReceipt(count, 1, count * RaggedBatchOutput.SIZE)
