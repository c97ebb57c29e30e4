"""Seed A's scheduler tests (V1 `scheduler/tests.rs`), ported with their exact expected values."""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence

import pytest

from kvsched.spec import (
    BackendFailed,
    BlockPool,
    Copy,
    DuplicateRequest,
    Full,
    OutputIdentityMismatch,
    PrefixIdentity,
    PrefixKvStore,
    PrefixPageSet,
    RaggedBatchItem,
    RaggedBatchOutput,
    RaggedBatchReceipt,
    RequestScheduler,
    RequestState,
    RequestView,
)
from tests.helpers import OneLaunchBackend, scratch, whole_state


def test_ragged_batch_abi_is_flat_and_uploadable() -> None:
    assert RaggedBatchItem.SIZE == 32
    assert RaggedBatchOutput.SIZE == 16
    assert len(RaggedBatchItem().to_bytes()) == 32
    assert len(RaggedBatchOutput().to_bytes()) == 16
    item = RaggedBatchItem(0x0102030405060708, 1, 2, 3, 4, 5, 0)
    expected = bytes.fromhex("0807060504030201") + b"".join(n.to_bytes(4, "little") for n in (1, 2, 3, 4, 5, 0))
    assert item.to_bytes() == expected
    assert RaggedBatchOutput(7, 8, 9).to_bytes() == (7).to_bytes(8, "little") + bytes([8, 0, 0, 0, 9, 0, 0, 0])


def test_graph_prefix_admission_cow_and_cancellation_are_owned_by_scheduler() -> None:
    pool = BlockPool(8)
    page = pool.allocate()  # the producer's own reference
    identity = PrefixIdentity((42, 42, 42, 42))
    store = PrefixKvStore(2, 4)
    store.publish(PrefixPageSet(identity, (page,), 16), pool)
    assert pool.ref_count(page) == 2
    scheduler = RequestScheduler(2, 4)
    admission = scheduler.admit_with_prefix(100, identity, store, pool)
    assert admission.prefix_hit
    assert admission.prefix_tokens == 16
    assert pool.ref_count(page) == 3  # producer, registry, request
    action = scheduler.ensure_writable(100, 0, pool)
    assert isinstance(action, Copy)
    assert action.source == page
    scheduler.finish(100, pool)
    assert scheduler.active_count() == 0
    assert pool.ref_count(page) == 2


def test_admission_collection_and_finish_leave_no_residue() -> None:
    # The original asserts zero allocations; the observable Python contract is that a full
    # admit / collect / finish cycle returns every object to exactly its constructed state.
    pool, store, scheduler = BlockPool(4), PrefixKvStore(1, 2), RequestScheduler(2, 2)
    before = whole_state(pool, store, scheduler)
    scheduler.admit_with_prefix(7, None, store, pool)
    views: list[RequestView] = [RequestView(0, 0, RequestState.EMPTY, 0, 0)] * 2
    assert scheduler.runnable_into(views) == 1
    scheduler.finish(7, pool)
    assert whole_state(pool, store, scheduler) == before


def test_duplicate_and_capacity_fail_closed() -> None:
    pool, store, scheduler = BlockPool(4), PrefixKvStore(1, 1), RequestScheduler(1, 1)
    scheduler.admit_with_prefix(1, None, store, pool)
    before = whole_state(pool, store, scheduler)
    with pytest.raises(DuplicateRequest):
        scheduler.admit_with_prefix(1, None, store, pool)
    with pytest.raises(Full):
        scheduler.admit_with_prefix(2, None, store, pool)
    assert whole_state(pool, store, scheduler) == before


def _two_decoding_requests() -> tuple[BlockPool, PrefixKvStore, RequestScheduler]:
    pool, store, scheduler = BlockPool(8), PrefixKvStore(1, 1), RequestScheduler(3, 4)
    for request_id in (11, 22):
        scheduler.admit_with_prefix(request_id, None, store, pool)
        scheduler.mark_prefill_complete(request_id)
        scheduler.seed_decode_token(request_id, request_id)
    scheduler.ensure_writable(11, 0, pool)
    scheduler.ensure_writable(22, 0, pool)
    return pool, store, scheduler


def test_decode_round_lowers_ragged_tables_and_calls_backend_once() -> None:
    _, _, scheduler = _two_decoding_requests()
    backend = OneLaunchBackend()
    items, tables, outputs = scratch(3, 12, 3)
    receipt = scheduler.execute_decode_round(backend, items, tables, outputs)
    assert receipt.batch_size == 2
    assert receipt.backend_launches == 1
    assert backend.calls == 1
    assert (items[0].request_id, items[0].block_table_offset) == (11, 0)
    assert (items[1].request_id, items[1].block_table_offset) == (22, 4)
    assert tables[:8] == [0, 2**32 - 1, 2**32 - 1, 2**32 - 1, 1, 2**32 - 1, 2**32 - 1, 2**32 - 1]
    views = [RequestView(0, 0, RequestState.EMPTY, 0, 0)] * 3
    assert scheduler.runnable_into(views) == 2
    assert [view.token_count for view in views[:2]] == [1, 1]
    assert [output.next_token_id for output in outputs[:2]] == [12, 23]


def test_decode_round_rejects_mismatched_outputs_before_mutating_requests() -> None:
    pool, store, scheduler = _two_decoding_requests()
    before = whole_state(pool, store, scheduler)
    with pytest.raises(OutputIdentityMismatch):
        scheduler.execute_decode_round(OneLaunchBackend(corrupt_identity=True), *scratch(3, 12, 3))
    views = [RequestView(0, 0, RequestState.EMPTY, 0, 0)] * 3
    scheduler.runnable_into(views)
    assert views[0].token_count == 0
    assert whole_state(pool, store, scheduler) == before


def test_backend_exception_is_wrapped_not_swallowed() -> None:
    class Exploding:
        def execute_ragged(
            self,
            items: Sequence[RaggedBatchItem],
            block_tables: Sequence[int],
            out: MutableSequence[RaggedBatchOutput],
        ) -> RaggedBatchReceipt:
            raise RuntimeError("device lost")

    pool, store, scheduler = _two_decoding_requests()
    before = whole_state(pool, store, scheduler)
    with pytest.raises(BackendFailed, match="device lost") as caught:
        scheduler.execute_decode_round(Exploding(), *scratch(3, 12, 3))
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert whole_state(pool, store, scheduler) == before
