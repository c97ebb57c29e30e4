"""Every refusal's message and typed details, written once for spec and impl.

Each function builds the error an operation raises (it does not raise it), so the spec and the
implementation refuse the same input with the same type, message and details
(`KvschedError.details`). Messages name the request and state the pool as it is after the
rollback: the caller reads them after nothing changed.
"""

from __future__ import annotations

from kvsched.spec.domain import as_int
from kvsched.spec.errors import (
    BackendFailed,
    BackendLaunchCount,
    BlockTableBufferTooSmall,
    CacheInUse,
    CopyPending,
    DoubleRelease,
    DuplicateRequest,
    Exhausted,
    Full,
    InvalidArgument,
    InvalidBlock,
    InvalidConfig,
    InvalidState,
    ItemBufferTooSmall,
    MissingInputToken,
    NotWritten,
    OutOfRange,
    OutputBufferTooSmall,
    OutputIdentityMismatch,
    OutputTooSmall,
    PageCapacity,
    QueueFull,
    ReferenceOverflow,
    RegistryFull,
    RequestTooLarge,
    TargetNotEmpty,
    UnknownLease,
    UnknownRequest,
    UnknownTransfer,
    UnpreparedWrite,
)

# -- the pool ----------------------------------------------------------------------------------


def page_out_of_range(page: int, pages: int) -> InvalidBlock:
    return InvalidBlock(f"page {page} is out of range for a pool of {pages} pages", page=page)


def no_free_page(pages: int) -> Exhausted:
    return Exhausted(f"no free page: all {pages} pages are held", needed=1, free=0)


def not_enough_free(needed: int, free: int) -> Exhausted:
    return Exhausted(f"cannot allocate {needed} pages: {free} are free", needed=needed, free=free)


def cache_free_page(page: int) -> InvalidBlock:
    return InvalidBlock(f"page {page} is not held: only a held page can be cached", page=page, holders=0)


def early_publication(pages: int, page_size: int, tokens: int, lookahead: int) -> InvalidArgument:
    return InvalidArgument(
        f"cannot publish {pages} pages of {page_size} tokens: their keys cover {lookahead} tokens past"
        f" the last page, and {tokens} tokens exist (publish once {pages * page_size + lookahead} do)"
    )


def retain_free_page(page: int) -> InvalidBlock:
    return InvalidBlock(f"page {page} is free: only a held page can be retained", page=page, holders=0)


def write_free_page(page: int) -> InvalidBlock:
    return InvalidBlock(f"page {page} is free: a table cannot write a page it does not hold", page=page, holders=0)


def reference_overflow(page: int, holders: int) -> ReferenceOverflow:
    return ReferenceOverflow(f"page {page} already has {holders} references, the maximum", page=page, holders=holders)


def double_release(page: int) -> DoubleRelease:
    return DoubleRelease(f"page {page} is already free", page=page, holders=0)


# -- tables ------------------------------------------------------------------------------------


def logical_page_out_of_range(logical_page: int, width: int) -> OutOfRange:
    return OutOfRange(f"logical page {logical_page} is outside a table of {width} pages", logical_page=logical_page)


def fork_width_mismatch(source: int, target: int) -> OutOfRange:
    return OutOfRange(f"cannot fork a table of {source} pages into one of {target}")


def fork_target_not_empty() -> TargetNotEmpty:
    return TargetNotEmpty("the fork target already maps pages")


def prefix_too_long(pages: int, width: int) -> OutOfRange:
    return OutOfRange(f"a prefix of {pages} pages does not fit a table of {width}")


def prefix_target_not_empty() -> TargetNotEmpty:
    return TargetNotEmpty("a shared prefix can only be installed into an empty table")


# -- requests ----------------------------------------------------------------------------------


def unknown_request(request_id: int) -> UnknownRequest:
    return UnknownRequest(f"request {request_id} is not live", request_id=request_id)


def duplicate_request(request_id: int) -> DuplicateRequest:
    return DuplicateRequest(f"request {request_id} is already live", request_id=request_id)


def unreported_cancel(request_id: int) -> DuplicateRequest:
    return DuplicateRequest(
        f"request {request_id} is cancelled and no step has reported it yet: its id is free after the next step",
        request_id=request_id,
    )


def scheduler_full(request_id: int, requests: int) -> Full:
    return Full(f"all {requests} request slots are occupied; request {request_id} refused", request_id=request_id)


def not_prefilling(request_id: int, slot: int, state: str) -> InvalidState:
    return InvalidState(f"request {request_id} is in {state}, not prefill", request_id=request_id, slot=slot)


def not_page_aligned(request_id: int, slot: int, tokens: int, page_size: int) -> InvalidState:
    return InvalidState(
        f"request {request_id} (slot {slot}) counts {tokens} tokens, not exactly its mapped pages of {page_size}: "
        "shared pages cannot follow",
        request_id=request_id,
        slot=slot,
    )


def views_too_small(length: int, live: int) -> OutputTooSmall:
    return OutputTooSmall(f"view buffer holds {length}, {live} requests are live")


def no_page_for(
    request_id: int, slot: int, logical_page: int, *, needed: int, free: int, pages: int, batch: bool
) -> Exhausted:
    """The request in `slot` found no free page for `logical_page`; the call (one step, or a
    whole batch) needs `needed` new pages and `free` of the pool's `pages` are free."""
    call = "the batch needs" if batch else "it needs"
    return Exhausted(
        f"no free page for request {request_id} in slot {slot} (logical page {logical_page}): "
        f"{call} {needed} new page{'s' if needed != 1 else ''}, {free} of {pages} pages are free",
        request_id=request_id,
        slot=slot,
        logical_page=logical_page,
        needed=needed,
        free=free,
    )


# -- the decode round --------------------------------------------------------------------------


def items_too_small(length: int, decoding: int) -> ItemBufferTooSmall:
    return ItemBufferTooSmall(f"item buffer holds {length}, {decoding} requests decode")


def outputs_too_small(length: int, decoding: int) -> OutputBufferTooSmall:
    return OutputBufferTooSmall(f"output buffer holds {length}, {decoding} requests decode")


def tables_too_small(length: int, decoding: int, needed: int) -> BlockTableBufferTooSmall:
    return BlockTableBufferTooSmall(f"block-table buffer holds {length}, {decoding} tables need {needed}")


def missing_input_token(request_id: int, slot: int) -> MissingInputToken:
    return MissingInputToken(
        f"request {request_id} in slot {slot} has no seeded input token", request_id=request_id, slot=slot
    )


def unprepared_write(
    request_id: int, slot: int, token_count: int, page_size: int | None, page: int | None, holders: int, width: int
) -> UnpreparedWrite:
    """The refusal of a round whose request in `slot` cannot write at `token_count`: into `page`
    (None: unmapped), which `holders` owners hold; with no page size, `page` is a shared page of
    its table, any of which could be the target."""
    where = f"request {request_id} in slot {slot}"
    if page_size is None:
        return UnpreparedWrite(
            f"{where} shares page {page} with another owner ({holders} hold it), and the scheduler has no "
            f"page size to tell its write target from its shared pages: construct it with page_size",
            request_id=request_id,
            slot=slot,
            page=page,
            holders=holders,
        )
    logical = token_count // page_size
    if logical >= width:
        what = f"logical page {logical}, past its table of {width}"
    elif page is None:
        what = f"logical page {logical}, which is unmapped"
    else:
        what = f"page {page} (logical page {logical}), which {holders} owners hold"
    return UnpreparedWrite(
        f"{where} writes position {token_count} into {what}: prepare_decode_round makes it writable",
        request_id=request_id,
        slot=slot,
        logical_page=logical,
        page=page,
        holders=holders,
    )


def backend_raised(error: BaseException) -> BackendFailed:
    return BackendFailed(f"backend raised {type(error).__name__}: {error}")


def not_a_receipt(receipt: object) -> BackendFailed:
    return BackendFailed(f"backend returned {type(receipt).__name__}, not a RaggedBatchReceipt")


def answered_count(answered: int, items: int) -> OutputIdentityMismatch:
    return OutputIdentityMismatch(f"backend answered {answered} items of {items}")


def launch_count(launches: int) -> BackendLaunchCount:
    return BackendLaunchCount(f"backend reported {launches} launches, not 1")


def outputs_resized(length: int, count: int) -> OutputIdentityMismatch:
    return OutputIdentityMismatch(f"backend resized the output list to {length} from {count}")


def wrong_answer(position: int, answered: tuple[int, int], expected: tuple[int, int]) -> OutputIdentityMismatch:
    """Output `position` answers (request, slot) `answered` where the item was `expected`."""
    return OutputIdentityMismatch(
        f"output {position} answers request {answered[0]} slot {answered[1]}, "
        f"expected request {expected[0]} slot {expected[1]}",
        request_id=expected[0],
        slot=expected[1],
    )


# -- arguments of the wrong kind ---------------------------------------------------------------


def wrong_kind(name: str, expected: str, value: object) -> InvalidArgument:
    """`value` was passed as `name`, which must be a `expected`."""
    return InvalidArgument(f"{name} must be a {expected}, not {type(value).__name__}")


def repeated_page(pages: tuple[object, ...]) -> InvalidArgument:
    return InvalidArgument(f"prefix pages {pages} repeat a page: one page cannot hold two positions")


# -- the prefix store --------------------------------------------------------------------------


def set_over_capacity(pages: int, capacity: int) -> PageCapacity:
    return PageCapacity(f"{pages} pages exceed this store's {capacity}-page entries")


def store_without_entries() -> RegistryFull:
    return RegistryFull("this store has no entries")


def cache_in_use(pages: list[int]) -> CacheInUse:
    return CacheInUse(f"cannot reset the prefix cache: cached pages {pages[:8]} are still held")


# -- the engine's intake -------------------------------------------------------------------------


def queue_full(request_id: int, queued: int) -> QueueFull:
    return QueueFull(f"request {request_id}: the intake queue already holds {queued} requests", request_id=request_id)


def request_too_large(request_id: int, why: str) -> RequestTooLarge:
    return RequestTooLarge(f"request {request_id} can never run: {why}", request_id=request_id)


def require_published_tokens(request_id: int, tokens: object, computed: int) -> int:
    """`tokens` as a count of the request's tokens with KV written (1..`computed`), else
    `InvalidArgument`."""
    count = as_int(tokens)
    if count is None or not 1 <= count <= computed:
        raise InvalidArgument(f"request {request_id} has KV for {computed} tokens: cannot publish {tokens!r}")
    return count


def require_chunk_page_size(page_size: int | None) -> int:
    """The scheduler's page size, which `record_chunk` needs to find a chunk's pages."""
    if page_size is None:
        raise InvalidArgument("record_chunk needs the scheduler's page_size (given at construction)")
    return page_size


def batch_full(request_id: int, limit: int) -> Full:
    return Full(f"request {request_id} cannot run now: all {limit} batch seats are taken", request_id=request_id)


def no_state_slot(request_id: int, slots: int) -> Full:
    return Full(f"request {request_id} cannot run now: all {slots} state slots are held", request_id=request_id)


def prefill_answer(answered: int, chunks: int) -> OutputIdentityMismatch:
    return OutputIdentityMismatch(f"prefill backend answered {answered} tokens for {chunks} chunks")


def copies_not_answered(answer: object, copies: int) -> OutputIdentityMismatch:
    return OutputIdentityMismatch(
        f"copies_done answered {answer!r:.80}, not one True, False or None for each of {copies} copies"
    )


def model_cannot_copy(missing: str) -> InvalidConfig:
    return InvalidConfig(f"a host tier needs a model that copies between tiers: it has no {missing}")


def prefill_not_tokens(answer: object) -> OutputIdentityMismatch:
    return OutputIdentityMismatch(
        f"prefill backend answered a {type(answer).__name__}, not a sequence of tokens (one per chunk)"
    )


def prefill_bad_token(chunk: int, token: object) -> OutputIdentityMismatch:
    return OutputIdentityMismatch(f"prefill backend answered {token!r} for chunk {chunk}: not a token (u32)")


# -- the tiered cache --------------------------------------------------------------------------


def repeated_key(keys: tuple[object, ...]) -> InvalidArgument:
    return InvalidArgument(f"{len(keys)} keys repeat a key: a sequence's pages hold distinct chains")


def copy_pending(request_id: int, page: int) -> CopyPending:
    return CopyPending(
        f"request {request_id} cannot read page {page} yet: the copy into it has not completed",
        request_id=request_id,
        page=page,
    )


def unknown_transfer(transfer_id: int) -> UnknownTransfer:
    return UnknownTransfer(f"no copy {transfer_id} is in flight")


def unknown_lease(lease_id: object) -> UnknownLease:
    return UnknownLease(f"no lease {lease_id!r} is held")


def not_written(page: int) -> NotWritten:
    return NotWritten(f"page {page} holds nothing written yet: no one may read it", page=page)


# -- KV events and the router's index ----------------------------------------------------------


def malformed_events(why: str) -> InvalidArgument:
    """A batch, snapshot or event is not well formed."""
    return InvalidArgument(f"malformed KV events: {why}")


# -- KV groups (sliding windows, recurrent state, drafts) ---------------------------------------


def bad_layout(why: str) -> InvalidConfig:
    """A layout of KV groups that cannot be built; nothing is."""
    return InvalidConfig(f"KV groups: {why}")


def drafts_pending(request_id: int) -> InvalidState:
    return InvalidState(
        f"request {request_id} has draft tokens awaiting accept: nothing else runs for it first",
        request_id=request_id,
    )


def not_sampling(request_id: int, left: int) -> InvalidState:
    return InvalidState(
        f"request {request_id} has {left} known tokens left to compute and no drafts: nothing was sampled",
        request_id=request_id,
    )


def bad_count(request_id: int, count: int, left: int) -> InvalidArgument:
    return InvalidArgument(
        f"request {request_id} cannot compute {count} tokens: {left} of its known tokens are left",
        request_id=request_id,
    )


def bad_drafts(request_id: int, drafts: int, limit: int, rest: bool) -> InvalidArgument:
    where = "" if rest else ", and drafts follow a pass over every known token left"
    return InvalidArgument(
        f"request {request_id} cannot write {drafts} draft tokens: at most {limit}{where}", request_id=request_id
    )


def pass_too_long(request_id: int, tokens: int, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"request {request_id}'s pass computes {tokens} tokens; a pass computes at most {limit}", request_id=request_id
    )


def bad_accept(request_id: int, accepted: int, drafts: int) -> InvalidArgument:
    return InvalidArgument(
        f"request {request_id} cannot keep {accepted} drafts: it wrote {drafts}", request_id=request_id
    )


def too_many_tokens(request_id: int, tokens: int, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"request {request_id} would hold {tokens} tokens; the layout allows {limit}", request_id=request_id
    )
