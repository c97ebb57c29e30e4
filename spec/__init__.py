"""The executable specification of kvsched: request lifecycle and KV-page ownership.

Pure, typed, standard-library Python. Every optimized component in `kvsched.impl` refines the
classes here; every checker (stateful tests, contracts, proofs) is stated against them.

Read top to bottom: `domain` (what an integer argument may be), `errors` and `refusals` (every
refusal, its message and details), `pool` (pages and their references), `table` (one request's
logical pages), `identity` and `prefix` (named shared prefixes), `plan` (what a batch of writes
did), `slots`, `lifecycle` and `round` (requests, their transitions, the decode round),
`scheduler` (the object API), `system` and `invariants` (the whole state and what always holds),
`events` and `step` (every operation as a value, and running one); `engine_config`,
`engine_state`, `model` and `engine` (the continuous-batching engine over all of it); `reserve`
is the evictable reserve, the pool under kvsched's vLLM `BlockPool`; `batch` is the ragged batch
ABI, `batching` and `sequence` seed B's iteration scheduler.

Glossary:
    page          a physical KV page of the pool, holding `page_size` token positions
    logical page  an index into one request's page table; it maps to a page or is unmapped
    reference     one owner's hold on a page (a table, a store entry, an outside holder)
    slot          one of the scheduler's fixed request slots (EMPTY, PREFILL or DECODE)
    entry         one of the prefix store's fixed places for a published page set
    write target  the page holding a decoding request's position `token_count`
    plan          the steps of a batched ensure_writable: per step a target and its action
    round         one ragged decode step over every DECODE slot, one backend call
    event         one public operation and its arguments, as a value (`kvsched.spec.events`)
    step          one engine iteration: a decode round, then prefill chunks and admissions
    chunk         the prompt tokens (or recomputed tokens) one request prefills in one step
    preemption    releasing a running request's pages and requeueing it to be recomputed
    state slot    a recurrent-state slot (hybrid models), held by a running request
    parked page   a free page that keeps its cache keys until reused (the evictable reserve)
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
from kvsched.spec.engine import Engine
from kvsched.spec.engine_config import EngineConfig, EngineRequest, StepOutput
from kvsched.spec.engine_state import EngineState
from kvsched.spec.errors import *  # noqa: F403  (the closed error hierarchy is part of the API)
from kvsched.spec.errors import KvschedError
from kvsched.spec.identity import PrefixIdentity, derive_prefix_identity
from kvsched.spec.model import EngineModel, NullModel, PrefillBackend, PrefillItem
from kvsched.spec.page_keys import CacheSalt, page_keys
from kvsched.spec.paged_config import DEFAULT_BLOCK_SIZE, PagedKvConfig, fill_identity_block_table
from kvsched.spec.plan import WritePlan
from kvsched.spec.pool import Allocated, BlockPool, Copy, CopyOnWrite, Existing, PoolState
from kvsched.spec.prefix import PrefixKvStore, PrefixPageSet, StoreState
from kvsched.spec.prefix_cache import CachedPage, CacheState, CacheStats
from kvsched.spec.scheduler import RequestScheduler
from kvsched.spec.sequence import FinishReason, GenerationSequence, SequenceManager
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
    "CacheSalt",
    "CacheState",
    "CacheStats",
    "CachedPage",
    "Copy",
    "CopyOnWrite",
    "Engine",
    "EngineConfig",
    "EngineModel",
    "EngineRequest",
    "EngineState",
    "Existing",
    "FifoScheduler",
    "FinishReason",
    "GenerationSequence",
    "KvschedError",
    "NullModel",
    "PagedKvConfig",
    "PoolState",
    "PrefillBackend",
    "PrefillChunk",
    "PrefillItem",
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
    "SequenceBlockTable",
    "SequenceManager",
    "StepOutput",
    "StoreState",
    "WritePlan",
    "derive_prefix_identity",
    "fill_identity_block_table",
    "page_keys",
]
