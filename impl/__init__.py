"""The certified implementation of kvsched: the spec's API and behaviour, built for speed.

Same classes, results, errors and ordering as `kvsched.spec`, over numpy struct-of-arrays with
every buffer allocated at construction; the decode round and the batched copy-on-write run in
numba kernels and hand a GPU-ready batch (`ITEM_DTYPE`, uint32 tables, `OUTPUT_DTYPE`) to the
backend. Each class's `to_spec()` is its abstraction function (see `kvsched.impl.refinement`).
"""

from kvsched.abi import ITEM_DTYPE, OUTPUT_DTYPE, ArrayDecodeBackend, empty_items, empty_outputs
from kvsched.impl.engine import Engine
from kvsched.impl.null_model import NullModel
from kvsched.impl.pool import BlockPool
from kvsched.impl.prefix import PrefixKvStore
from kvsched.impl.prefix_cache import PrefixCache
from kvsched.impl.scheduler import RequestScheduler
from kvsched.impl.system import ImplSystem, make_impl_system
from kvsched.impl.table import SequenceBlockTable
from kvsched.impl.writes import ALLOCATED, COPY, EXISTING, ArrayWritePlan, WritePlan
from kvsched.spec.batch import INVALID_BLOCK, RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt
from kvsched.spec.engine_config import EngineConfig, EngineRequest, StepOutput
from kvsched.spec.errors import *  # noqa: F403  (the same closed error hierarchy as the spec)
from kvsched.spec.errors import KvschedError
from kvsched.spec.identity import PrefixIdentity, derive_prefix_identity
from kvsched.spec.pool import Allocated, Copy, CopyOnWrite, Existing
from kvsched.spec.prefix import PrefixPageSet
from kvsched.spec.sequence import FinishReason
from kvsched.spec.slots import LIVE, Admission, RequestState, RequestView

__all__ = [
    "ALLOCATED",
    "COPY",
    "EXISTING",
    "INVALID_BLOCK",
    "ITEM_DTYPE",
    "LIVE",
    "OUTPUT_DTYPE",
    "Admission",
    "Allocated",
    "ArrayDecodeBackend",
    "ArrayWritePlan",
    "BlockPool",
    "Copy",
    "CopyOnWrite",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "Existing",
    "FinishReason",
    "ImplSystem",
    "KvschedError",
    "NullModel",
    "PrefixCache",
    "PrefixIdentity",
    "PrefixKvStore",
    "PrefixPageSet",
    "RaggedBatchItem",
    "RaggedBatchOutput",
    "RaggedBatchReceipt",
    "RequestScheduler",
    "RequestState",
    "RequestView",
    "SequenceBlockTable",
    "StepOutput",
    "WritePlan",
    "derive_prefix_identity",
    "empty_items",
    "empty_outputs",
    "make_impl_system",
]
