"""The executable specification of kvsched: request lifecycle and KV-page ownership.

Pure, typed, standard-library Python. Every optimized component in `kvsched.impl` refines the
classes here; every checker (stateful tests, contracts, proofs) is stated against them.
"""

from kvsched.spec.batch import (
    INVALID_BLOCK,
    UNANSWERED,
    RaggedBatchItem,
    RaggedBatchOutput,
    RaggedBatchReceipt,
    RaggedDecodeBackend,
)
from kvsched.spec.batching import (
    BatchConfig,
    FifoScheduler,
    PrefillChunk,
    Scheduler,
    SchedulerDecision,
    SeqId,
    SeqIdCounter,
)
from kvsched.spec.errors import *  # noqa: F403  (the closed error hierarchy is part of the API)
from kvsched.spec.errors import KvschedError
from kvsched.spec.paged_config import DEFAULT_BLOCK_SIZE, PagedKvConfig, fill_identity_block_table
from kvsched.spec.plan import WritePlan
from kvsched.spec.pool import Allocated, BlockPool, Copy, CopyOnWrite, Existing, PoolState
from kvsched.spec.prefix import (
    PrefixIdentity,
    PrefixKvStore,
    PrefixPageSet,
    StoreState,
    derive_prefix_identity,
)
from kvsched.spec.scheduler import RequestScheduler
from kvsched.spec.sequence import FinishReason, Sequence, SequenceManager
from kvsched.spec.slots import LIVE, Admission, RequestState, RequestView, SchedulerState
from kvsched.spec.table import SequenceBlockTable

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "INVALID_BLOCK",
    "LIVE",
    "UNANSWERED",
    "Admission",
    "Allocated",
    "BatchConfig",
    "BlockPool",
    "Copy",
    "CopyOnWrite",
    "Existing",
    "FifoScheduler",
    "FinishReason",
    "KvschedError",
    "PagedKvConfig",
    "PoolState",
    "PrefillChunk",
    "PrefixIdentity",
    "PrefixKvStore",
    "PrefixPageSet",
    "RaggedBatchItem",
    "RaggedBatchOutput",
    "RaggedBatchReceipt",
    "RaggedDecodeBackend",
    "RequestScheduler",
    "RequestState",
    "RequestView",
    "Scheduler",
    "SchedulerDecision",
    "SchedulerState",
    "SeqId",
    "SeqIdCounter",
    "Sequence",
    "SequenceBlockTable",
    "SequenceManager",
    "StoreState",
    "WritePlan",
    "derive_prefix_identity",
    "fill_identity_block_table",
]
