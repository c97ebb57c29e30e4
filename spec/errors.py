"""The closed set of kvsched errors, shared by spec and impl.

A violation is an error: releasing a page nobody holds, an unknown request, a backend that
breaks the round's contract. Every public operation raises one of these leaf classes (never a
bare built-in) and, when it raises, has changed nothing. The hierarchy flattens the originals'
nested enums (`SchedulerError::Prefix(PrefixKvError::Table(TableError::Pool(Exhausted)))` is
simply `Exhausted`); the intermediate classes let a caller catch a whole family.

    KvschedError
    ├── InvalidArgument, InvalidConfig        (also ValueError)
    ├── PoolError        Exhausted, InvalidBlock, ReferenceOverflow, DoubleRelease
    ├── TableError       OutOfRange, TargetNotEmpty, TableOutputTooSmall
    ├── RegistryError    EmptyPageSet, PageCapacity, RegistryFull, CacheInUse
    ├── SchedulerError   DuplicateRequest, Full, UnknownRequest, OutputTooSmall, InvalidState
    ├── DecodeRoundError ItemBufferTooSmall, BlockTableBufferTooSmall, OutputBufferTooSmall,
    │                    MissingInputToken, UnpreparedWrite, BackendFailed,
    │                    BackendLaunchCount, OutputIdentityMismatch
    ├── RaggedBackendError  BackendOutputTooSmall, BackendRejected   (raised by backends)
    ├── EngineError      QueueFull, RequestTooLarge                  (the engine's intake)
    └── TierError        UnknownTransfer, UnknownLease, CopyPending, NotWritten
                                                   (the host tier, copies in flight, leases)
"""

from __future__ import annotations


class KvschedError(Exception):
    """Base of every error kvsched raises.

    Besides its message, an error carries what an engine acts on, as typed attributes, each
    None where it does not apply: `request_id` and `slot` (the request the call was for),
    `logical_page` and `page` (where in its table, which physical page), `holders` (that page's
    reference count), `needed` and `free` (the new pages the call needed, and the pages free
    now, after the rollback). `kvsched.spec.refusals` builds every error with them.
    """

    def __init__(
        self,
        message: str = "",
        *,
        request_id: int | None = None,
        slot: int | None = None,
        logical_page: int | None = None,
        page: int | None = None,
        holders: int | None = None,
        needed: int | None = None,
        free: int | None = None,
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.slot = slot
        self.logical_page = logical_page
        self.page = page
        self.holders = holders
        self.needed = needed
        self.free = free

    def details(self) -> dict[str, int | None]:
        """The typed attributes, by name (what a lockstep comparison checks besides the type)."""
        return {name: getattr(self, name) for name in DETAILS}


DETAILS = ("request_id", "slot", "logical_page", "page", "holders", "needed", "free")


class InvalidArgument(KvschedError, ValueError):
    """A value outside its domain: a negative id, a token id above 2**32 - 1, a wrong type."""


class InvalidConfig(KvschedError, ValueError):
    """A constructor or configuration value that cannot describe a working system."""


class PoolError(KvschedError):
    """A physical-page operation the pool refuses."""


class Exhausted(PoolError):
    """No free physical page is left."""


class InvalidBlock(PoolError):
    """The page id is out of range, or names a free page where a held one is required."""


class ReferenceOverflow(PoolError):
    """Retaining would push a page's reference count past the pool's maximum."""


class DoubleRelease(PoolError):
    """Releasing a page whose reference count is already zero."""


class TableError(KvschedError):
    """A logical page-table operation the table refuses."""


class OutOfRange(TableError):
    """A logical page index or page list outside the table's fixed capacity."""


class TargetNotEmpty(TableError):
    """Installing or forking into a table that already maps a page."""


class TableOutputTooSmall(TableError):
    """A caller-provided table buffer is shorter than the table it must hold."""


class RegistryError(KvschedError):
    """A prefix-registry operation the registry refuses."""


class EmptyPageSet(RegistryError):
    """A prefix page set with no pages or no tokens."""


class PageCapacity(RegistryError):
    """A prefix page set longer than the store's per-entry page capacity."""


class RegistryFull(RegistryError):
    """The registry has no entry to place a prefix in (a store with zero entries)."""


class CacheInUse(RegistryError):
    """Resetting the prefix cache while a request or named prefix still holds a cached page."""


class SchedulerError(KvschedError):
    """A request-lifecycle operation the scheduler refuses."""


class DuplicateRequest(SchedulerError):
    """The request id is already live in another slot."""


class Full(SchedulerError):
    """Every request slot is occupied."""


class UnknownRequest(SchedulerError):
    """No live slot holds this request id."""


class OutputTooSmall(SchedulerError):
    """A caller-provided view buffer is shorter than the number of live requests."""


class InvalidState(SchedulerError):
    """The request is live but not in a state where this operation is allowed."""


class DecodeRoundError(KvschedError):
    """A decode round that did not commit; no request changed."""


class ItemBufferTooSmall(DecodeRoundError):
    """The item scratch buffer cannot hold one item per decoding request."""


class BlockTableBufferTooSmall(DecodeRoundError):
    """The block-table scratch buffer cannot hold every decoding request's table."""


class OutputBufferTooSmall(DecodeRoundError):
    """The output scratch buffer cannot hold one output per decoding request."""


class MissingInputToken(DecodeRoundError):
    """A decoding request has no seeded input token."""


class UnpreparedWrite(DecodeRoundError):
    """A decoding request's write target (the page holding position `token_count`) is unmapped or
    held by another owner too; `prepare_decode_round` makes it writable. Carries the request,
    its slot, the logical page (None without a page size), the page (None when unmapped) and
    its holders."""


class BackendFailed(DecodeRoundError):
    """The backend raised or returned something that is not a receipt; the cause is chained."""


class BackendLaunchCount(DecodeRoundError):
    """The backend reports a number of launches other than exactly one."""


class OutputIdentityMismatch(DecodeRoundError):
    """The outputs do not answer the items: wrong batch size, request id, slot or token."""


class RaggedBackendError(KvschedError):
    """Raised by a backend to refuse a batch (the scheduler wraps it in `BackendFailed`)."""


class BackendOutputTooSmall(RaggedBackendError):
    """The output buffer handed to the backend is shorter than the batch."""


class BackendRejected(RaggedBackendError):
    """The backend cannot run this batch (shape, bucket or table range)."""


class EngineError(KvschedError):
    """A request the engine's intake refuses (its lifecycle errors are the scheduler's)."""


class QueueFull(EngineError):
    """The intake queue already holds `max_queue` requests."""


class RequestTooLarge(EngineError):
    """The request can never run: its prompt plus `max_new_tokens` exceeds `max_seq_len`, one
    table's `logical_pages x page_size` tokens, or needs more pages than the whole pool."""


class TierError(KvschedError):
    """A call on the host tier, a transfer or a lease the tiered cache refuses."""


class UnknownTransfer(TierError):
    """No copy in flight has this id (it completed, or it was never issued)."""


class UnknownLease(TierError):
    """No lease has this id (it ended, or it was never taken)."""


class CopyPending(TierError):
    """A page the call would read is the destination of a copy that has not completed."""


class NotWritten(TierError):
    """A lease or copy would read a page whose content no one has written yet."""
