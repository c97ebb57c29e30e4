"""The request scheduler as an object: fixed request slots over one pool and one prefix store.

`RequestScheduler` holds a `SchedulerState` (`kvsched.spec.slots`) and runs the pure
transitions of `kvsched.spec.lifecycle` and `kvsched.spec.round` on it, committing the pool's
and store's new states only when a transition returns. Every operation is atomic: on any error
the scheduler, pool and store are exactly as before. It is bound to one pool and one store
(`kvsched.spec.binding`): those it is constructed with, or the first a call succeeds with. Its
rounds find each request's write target with the page size fixed at construction.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence

from kvsched.spec import refusals
from kvsched.spec.batch import UNANSWERED, RaggedBatchItem, RaggedBatchOutput, RaggedBatchReceipt, RaggedDecodeBackend
from kvsched.spec.binding import Binding, bind_together
from kvsched.spec.identity import PrefixIdentity
from kvsched.spec.lifecycle import (
    admit,
    attach_pages,
    ensure_writable,
    ensure_writable_batch,
    finish,
    fork,
    mark_prefill_complete,
    prepare_decode_round,
    record_chunk,
    record_token,
    record_tokens,
    require_request,
    seed_decode_token,
)
from kvsched.spec.plan import WritePlan
from kvsched.spec.pool import BlockPool, CopyOnWrite
from kvsched.spec.prefix import PrefixKvStore
from kvsched.spec.round import call_round, commit_round, lower_round, require_round_buffers
from kvsched.spec.slots import (
    Admission,
    RequestView,
    SchedulerState,
    get_active_count,
    get_decoding_slots,
    get_views,
    initial_scheduler,
    require_page_size,
)
from kvsched.spec.table import Table


class RequestScheduler:
    """Fixed-capacity request scheduler; `requests` is the hard concurrent request bound. Bound
    to one pool and one prefix store (`kvsched.spec.binding`): those it is constructed with, or
    the first a call succeeds with. Its rounds find each write target with `page_size`, fixed at
    construction (without one, a decoding request's pages must all be its own)."""

    def __init__(
        self,
        requests: int,
        logical_pages: int,
        *,
        pool: BlockPool | None = None,
        prefixes: PrefixKvStore | None = None,
        page_size: int | None = None,
    ) -> None:
        self._state = initial_scheduler(requests, logical_pages)
        self._pool = Binding(BlockPool, "scheduler")
        self._store = Binding(PrefixKvStore, "scheduler")
        self._page_size = None if page_size is None else require_page_size(page_size)
        bind_together(self._pool, self._store, pool, prefixes)

    def check_pool(self, pool: object) -> BlockPool:
        """`pool`, if this scheduler may work with it; else `InvalidArgument`."""
        return self._pool.check("pool", pool)

    def _bind(self, pool: BlockPool | None, store: PrefixKvStore | None = None) -> None:
        """Record the bindings of a call that succeeded."""
        if pool is not None:
            self._pool.bind(pool)
        if store is not None:
            self._store.bind(store)
            if pool is not None:
                store.bind_pool(pool)

    @property
    def state(self) -> SchedulerState:
        """The whole scheduler state (a frozen value)."""
        return self._state

    def commit(self, state: SchedulerState) -> None:
        """Install a state produced by a spec transition."""
        self._state = state

    @property
    def requests(self) -> int:
        """The number of request slots."""
        return len(self._state.slots)

    @property
    def logical_pages(self) -> int:
        """Every request table's capacity."""
        return len(self._state.slots[0].table)

    def active_count(self) -> int:
        """How many requests are live."""
        return get_active_count(self._state)

    def admit_with_prefix(
        self, request_id: int, identity: PrefixIdentity | None, prefixes: PrefixKvStore, pool: BlockPool
    ) -> Admission:
        """Admit a request and atomically attach its prefix pages when published."""
        prefixes = self._store.check("prefixes", prefixes)
        pool = prefixes.check_pool(self._pool.check("pool", pool))
        self._state, pool_state, store_state, admission = admit(
            self._state, pool.state, prefixes.state, request_id, identity
        )
        pool.commit(pool_state)
        prefixes.commit(store_state)
        self._bind(pool, prefixes)
        return admission

    def attach_pages(self, request_id: int, pages: Sequence[int], pool: BlockPool) -> None:
        """Share cached full pages holding the request's next tokens into its table and count
        them (`lifecycle.attach_pages`). Needs the scheduler's `page_size`."""
        pool = self._pool.check("pool", pool)
        page_size = refusals.require_chunk_page_size(self._page_size)
        self._state, pool_state = attach_pages(self._state, pool.state, request_id, pages, page_size)
        pool.commit(pool_state)
        self._bind(pool)

    def fork(self, parent_id: int, child_id: int, pool: BlockPool) -> int:
        """Admit `child_id` sharing every page of `parent_id` (copy-on-write on first write)."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, slot = fork(self._state, pool.state, parent_id, child_id)
        pool.commit(pool_state)
        self._bind(pool)
        return slot

    def ensure_writable(self, request_id: int, logical_page: int, pool: BlockPool) -> CopyOnWrite:
        """Make a logical page writable; a `Copy` tells the backend to copy the KV page first."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, action = ensure_writable(self._state, pool.state, request_id, logical_page)
        pool.commit(pool_state)
        self._bind(pool)
        return action

    def ensure_writable_batch(
        self, request_ids: Sequence[int], logical_pages: Sequence[int], pool: BlockPool
    ) -> WritePlan:
        """`ensure_writable` for every pair in order, all or nothing; the steps' plan."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, plan = ensure_writable_batch(self._state, pool.state, request_ids, logical_pages)
        pool.commit(pool_state)
        self._bind(pool)
        return plan

    def prepare_decode_round(self, pool: BlockPool, page_size: int) -> WritePlan:
        """Make room for every decoding request's next token, in slot order, all or nothing."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state, plan = prepare_decode_round(self._state, pool.state, page_size)
        pool.commit(pool_state)
        self._bind(pool)
        return plan

    def mark_prefill_complete(self, request_id: int) -> None:
        """Move a PREFILL request to DECODE."""
        self._state = mark_prefill_complete(self._state, request_id)

    def seed_decode_token(self, request_id: int, token_id: int) -> None:
        """Publish the token consumed by the request's next decode step."""
        self._state = seed_decode_token(self._state, request_id, token_id)

    def record_token(self, request_id: int) -> int:
        """Count one token written outside a decode round; the new count."""
        self._state, count = record_token(self._state, request_id)
        return count

    def record_tokens(self, request_id: int, tokens: int) -> int:
        """Count a chunk of `tokens` tokens written outside a decode round; the new count."""
        self._state, count = record_tokens(self._state, request_id, tokens)
        return count

    def record_chunk(self, request_id: int, tokens: int, pool: BlockPool) -> WritePlan:
        """A prefill chunk of `tokens` tokens in one call: make room for its positions (from the
        request's token count) and count them, all or nothing; the make-room plan. Needs the
        scheduler's `page_size`."""
        pool = self._pool.check("pool", pool)
        page_size = refusals.require_chunk_page_size(self._page_size)
        self._state, pool_state, plan = record_chunk(self._state, pool.state, request_id, tokens, page_size)
        pool.commit(pool_state)
        self._bind(pool)
        return plan

    def page_table(self, request_id: int) -> Table:
        """The request's logical page table (`None` where unmapped)."""
        return self._state.slots[require_request(self._state, request_id)].table

    def runnable_into(self, out: MutableSequence[RequestView]) -> int:
        """Write every live request into `out` in slot order; how many were written."""
        views = get_views(self._state)
        if len(out) < len(views):
            raise refusals.views_too_small(len(out), len(views))
        for index, view in enumerate(views):
            out[index] = view
        return len(views)

    def execute_decode_round(
        self,
        backend: RaggedDecodeBackend,
        item_scratch: MutableSequence[RaggedBatchItem],
        block_table_scratch: MutableSequence[int],
        output_scratch: MutableSequence[RaggedBatchOutput],
    ) -> RaggedBatchReceipt:
        """Run one ragged decode round with exactly one backend call.

        DECODE requests are lowered in slot order; their whole tables are concatenated into
        `block_table_scratch` and each item carries its offset. The outputs are checked as a
        complete batch before any request changes; an empty round calls no backend.
        """
        require_round_buffers(item_scratch, block_table_scratch, output_scratch)
        count, width = len(get_decoding_slots(self._state)), self.logical_pages
        if len(item_scratch) < count:
            raise refusals.items_too_small(len(item_scratch), count)
        if len(output_scratch) < count:
            raise refusals.outputs_too_small(len(output_scratch), count)
        if len(block_table_scratch) < count * width:
            raise refusals.tables_too_small(len(block_table_scratch), count, count * width)
        bound = self._pool.bound  # None: no request was ever admitted, none decodes
        lowered, tables = lower_round(self._state, None if bound is None else bound.state, self._page_size)
        item_scratch[:count] = lowered
        block_table_scratch[: count * width] = tables
        if count == 0:
            return RaggedBatchReceipt()
        items = tuple(item_scratch[:count])
        outputs = [UNANSWERED] * count
        try:
            receipt = call_round(backend, items, tuple(block_table_scratch[: count * width]), outputs)
        finally:
            for position in range(min(count, len(outputs))):
                output_scratch[position] = outputs[position]
        self._state = commit_round(self._state, outputs)
        return receipt

    def finish(self, request_id: int, pool: BlockPool) -> None:
        """Release the request's pages and empty its slot; cancellation is identical."""
        pool = self._pool.check("pool", pool)
        self._state, pool_state = finish(self._state, pool.state, request_id)
        pool.commit(pool_state)
        self._bind(pool)
